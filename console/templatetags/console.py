"""Template helpers of the console: navigation, severity badges, readable times and versions.

Pages never print a Python repr: dicts of versions, ISO timestamps and durations go through
these filters.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from django import template
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html

register = template.Library()


@register.simple_tag(takes_context=True)
def nav_link(context: template.Context, href: str, label: str) -> str:
    """A navigation link, marked as the current page for screen readers when it is."""
    request = context.get("request")
    path = request.path if request is not None else ""
    current = path == href if href == "/" else path.startswith(href) and not (
        href == "/advisories/" and path.startswith("/advisories/exposures/"))
    if current:
        return format_html('<a href="{}" aria-current="page">{}</a>', href, label)
    return format_html('<a href="{}">{}</a>', href, label)


@register.filter
def sev(severity: str | None) -> str:
    """A severity badge; the text says the severity, the colour only repeats it."""
    name = (severity or "").lower()
    return format_html('<span class="sev sev-{}">{}</span>', name or "none", name.capitalize() or "Unrated")


def as_datetime(value: Any) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value
    if isinstance(value, str) and value:
        return parse_datetime(value)
    return None


@register.filter
def when(value: Any) -> str:
    """'2026-03-04 22:00 UTC' from a datetime or an ISO string; '—' for none."""
    moment = as_datetime(value)
    if moment is None:
        return "—"
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, dt.UTC)
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


ISO_MOMENT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2})?(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})?")


@register.filter
def readable_times(text: Any) -> str:
    """Every ISO 8601 moment inside a sentence ("past deadline 2025-11-08T00:00:00Z") made readable."""
    return ISO_MOMENT.sub(lambda m: when(m.group(0).replace("Z", "+00:00")), str(text))


@register.filter
def duration(seconds: Any) -> str:
    """'2 h 05 min', '45 s' from a number of seconds or a timedelta."""
    if isinstance(seconds, dt.timedelta):
        seconds = seconds.total_seconds()
    if seconds in (None, ""):
        return "—"
    total = int(float(seconds))
    sign = "-" if total < 0 else ""
    total = abs(total)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{sign}{days} d {hours} h"
    if hours:
        return f"{sign}{hours} h {minutes:02d} min"
    if minutes:
        return f"{sign}{minutes} min {secs:02d} s"
    return f"{sign}{secs} s"


@register.filter
def versions(value: Any) -> str:
    """{"driver": "570.195.03", "cuda": "12.8"} as 'driver 570.195.03, cuda 12.8'."""
    if isinstance(value, dict):
        # One order whatever order the versions were reported or stored in (a back end's facts, jsonb):
        # the driver first, then by name, so before and after read side by side.
        items = sorted(value.items(), key=lambda kv: (kv[0] != "driver", kv[0]))
        return ", ".join(f"{k} {_plain(v)}" for k, v in items if v not in (None, "")) or "—"
    return _plain(value) if value not in (None, "") else "—"


def _plain(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(_plain(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {_plain(v)}" for k, v in value.items())
    return str(value)


@register.filter
def humanize_key(value: Any) -> str:
    """'cold_starts' as 'cold starts'."""
    return str(value).replace("_", " ")


@register.filter
def get(mapping: Any, key: Any) -> Any:
    """mapping[key] in a template ({{ counts|get:state }})."""
    if isinstance(mapping, dict):
        return mapping.get(key, mapping.get(str(key)))
    return None
