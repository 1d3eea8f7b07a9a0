"""The console's own pages: the overview and the settings page, made of the sections apps register
(gpusweep.registry; console.overview)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from console import overview
from gpusweep import registry
from gpusweep.pages import cached_figures, installed
from gpusweep.responses import cached
from gpusweep.roles import user_roles


def home(request: HttpRequest) -> HttpResponse:
    """The landing page: how exposed the fleet is, what is overdue, and what is being done about it."""
    sections = list(registry.overview)
    # The fleet-wide figures take a second or two on 100,000 nodes: served from the cache, at most
    # GPUSWEEP_CONSOLE_FIGURES_S old (the page says as of when).
    figures, computed_at = cached_figures("console:overview", lambda: overview.figures(sections, timezone.now()),
                                          settings.GPUSWEEP_CONSOLE_FIGURES_S)
    counts = cached("console:overview-counts", overview.tables(sections),
                    lambda: overview.counts(sections, timezone.now()))
    roles = sorted(user_roles(request.user))
    live = [s.live(counts.get(s.name, {})) for s in sections if s.live is not None]
    return render(request, "console/home.html", {
        **registry.merged([figures, *counts.values(), *live]),
        "as_of": dt.datetime.fromtimestamp(computed_at, tz=dt.UTC),
        "roles": roles,
        "headlines": [s for s in sections if s.headline],
        "rows": overview.rows(sections),
        "fragment_key": overview.fragment_key(sections, counts, computed_at, roles),
        "fragment_s": max(600, 10 * settings.GPUSWEEP_CONSOLE_FIGURES_S) if settings.GPUSWEEP_CONSOLE_FIGURES_S else 0,
    })


def settings_page(request: HttpRequest) -> HttpResponse:
    """The settings each app shows (the deadline policy, the clusters) and links to its own pages."""
    parts: list[tuple[registry.PageSection, Any]] = []
    for section in registry.settings_page:
        values = section.context(request)
        if isinstance(values, HttpResponse):  # the section took the request (its form saved)
            return values
        parts.append((section, values))
    return render(request, "console/settings.html", {
        **registry.merged(values for _section, values in parts),
        "sections": [section for section, _values in parts],
        "more": [(link.name, link.path) for link in registry.settings_links if installed(link.path)],
    })
