"""What users hand in, read the same way by the commands and the pages.

Moments (`2025-03-01T08:00`, a date, or ISO with a zone), sacct or trace files (told apart by
their header), the simulator's parameters from text, and the deadline of a severity or of an
advisory in the database. Every error names the field or line it is about.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from costs import sacct, trace
from costs.model import HELP, ModelError, Params

SEVERITIES = ("critical", "high", "medium", "low")


class InputError(ValueError):
    pass


def zone_of(name: str) -> tzinfo:
    try:
        return UTC if name.upper() == "UTC" else ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InputError(f"time zone {name!r} is unknown (use e.g. UTC or Europe/Berlin)") from None


def parse_moment(text: str, zone: tzinfo = UTC, what: str = "time") -> datetime:
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InputError(f"{what} {text!r} is not a date or time like 2025-03-01T08:00") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=zone)
    return moment.astimezone(UTC)


def is_sacct(text: str) -> bool:
    first = text.lstrip("\ufeff").split("\n", 1)[0]
    return "|" in first and "JobID" in first


def read_accounting(text: str, zone: tzinfo = UTC) -> sacct.Accounting:
    return sacct.parse(text.splitlines(), zone)


def read_trace(text: str, params: Params, origin: datetime = trace.DEFAULT_ORIGIN, zone: tzinfo = UTC,
               source: str = "trace") -> trace.Trace:
    """sacct output (by its header) or a pod/task CSV such as Alibaba's openb trace."""
    if is_sacct(text):
        return trace.from_sacct(read_accounting(text, zone), params)
    return trace.from_openb(text, params, origin=origin, source=source)


def tunable() -> list[tuple[str, str, Any]]:
    """(name, help, default as text) of every parameter a user may set."""
    out = []
    defaults = Params()
    for f in dataclasses.fields(Params):
        if f.name in ("release_s", "severity", "deadline_days"):
            continue  # set from the advisory and the release field
        out.append((f.name, HELP[f.name], _text(getattr(defaults, f.name))))
    return out


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, dict):
        return ",".join(f"{k}={v:g}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def params_from(values: Mapping[str, str], **fixed: Any) -> Params:
    """Params from text fields (blank keeps the default; "none" or 0 unsets an optional one);
    raises ModelError naming the field."""
    kinds = {f.name: str(f.type) for f in dataclasses.fields(Params)}
    changes: dict[str, Any] = dict(fixed)
    for name, raw in values.items():
        if name not in kinds:
            raise ModelError(f"{name}: no such parameter")
        text = str(raw).strip()
        kind = kinds[name]
        try:
            if text == "":
                continue
            if kind == "float | None":
                changes[name] = None if text.lower() in ("0", "none") else float(text)
            elif kind == "float":
                changes[name] = float(text)
            elif kind == "int":
                changes[name] = int(text)
            elif kind.startswith("tuple"):
                changes[name] = tuple(part.strip() for part in text.split(",") if part.strip())
            elif kind.startswith("dict"):
                pairs = [part.split("=", 1) for part in text.split(",") if part.strip()]
                if any(len(pair) != 2 for pair in pairs):
                    raise ValueError("expected NAME=NUMBER,...")
                changes[name] = {k.strip(): float(v) for k, v in pairs}
            else:
                changes[name] = text
        except ValueError as exc:
            raise ModelError(f"{name}={text!r}: {exc}") from None
    return Params(**changes)


def release_at(text: str, tr: trace.Trace, zone: tzinfo = UTC) -> float | None:
    """'' (the middle), a number of days after the trace's start, or a moment."""
    value = text.strip()
    if not value:
        return None
    try:
        return float(value.removesuffix("d")) * 86400
    except ValueError:
        pass
    return tr.clock(parse_moment(value, zone, "release"))


def deadline_days(severity: str) -> float:
    """Days the deadline policy gives a severity (the database's policy, its defaults without one)."""
    from django.db import DatabaseError

    from advisories.models import DeadlinePolicy

    if severity not in SEVERITIES:
        raise InputError(f"severity {severity!r}: use one of {', '.join(SEVERITIES)}")
    try:
        policy = DeadlinePolicy.objects.filter(pk=1).first() or DeadlinePolicy()
    except DatabaseError:
        policy = DeadlinePolicy()  # no database (the benchmark): the policy's defaults
    return float(policy.days_for(severity))


def advisory(publisher_id: str) -> tuple[str, str, datetime | None]:
    """(label, severity, published) of an advisory in the database."""
    from advisories.models import Advisory

    found = Advisory.objects.filter(publisher_id=publisher_id).first()
    if found is None:
        raise InputError(f"no advisory {publisher_id!r} in the database (ingest_advisories first)")
    if found.severity not in SEVERITIES:
        raise InputError(f"advisory {found} has no severity")
    return str(found), found.severity, found.initial_release_date


def prepare(trace_text: str, values: Mapping[str, str], *, severity: str = "", advisory_id: str = "",
            release: str = "", origin: datetime = trace.DEFAULT_ORIGIN, zone: tzinfo = UTC,
            source: str = "trace", campaign_id: int | None = None) -> tuple[trace.Trace, Params, str]:
    """The trace, the parameters and a label of the advisory, from what a user handed in.

    A real advisory gives the severity and, when it falls inside the trace and no release is
    given, the release time. A campaign gives its policy (`campaign_policy`); a parameter the user
    sets explicitly still wins."""
    published = None
    label = severity or "high"
    if advisory_id:
        label, severity, published = advisory(advisory_id)
    severity = severity or "high"
    policy = campaign_policy(campaign_id) if campaign_id is not None else {}
    base = params_from(values, severity=severity, deadline_days=deadline_days(severity), **policy)
    tr = read_trace(trace_text, base, origin=origin, zone=zone, source=source)
    at = release_at(release, tr, zone)
    if at is None and published is not None and 0 <= tr.clock(published) <= tr.end:
        at = tr.clock(published)
    return tr, base.with_(release_s=at), label



def campaign_policy(campaign_id: int) -> dict[str, Any]:
    """The simulator's parameters that a campaign's policy sets, so the sweep simulated is the one it runs.

    The planner's part comes from `campaigns.services.policy_of` (parallelism, canary, soak, wave
    growth, the node estimate, cold restarts), the rest from the campaign as the engine reads it: its
    workload policy (a campaign that waits or cold-restarts checkpoints nothing), its wait limit,
    and the engine's look interval for waited jobs (`campaigns.policy.WAIT_POLL_S`)."""
    from campaigns import policy
    from campaigns.models import Campaign
    from campaigns.services import policy_of
    from inventory.choices import WorkloadPolicy

    campaign = Campaign.objects.filter(pk=campaign_id).first()
    if campaign is None:
        raise InputError(f"no campaign {campaign_id} in the database")
    planned = policy_of(campaign)
    changes: dict[str, Any] = {
        "parallelism": (planned.per_cluster,), "canary": planned.canary, "soak_minutes": planned.soak_s / 60,
        "wave_growth": planned.growth, "growth_step": planned.growth_step,
        "patch_minutes": planned.node_seconds / 60,
        "last_group": "cold_restart" if planned.cold_restart_allowed else "wait",
        "not_checkpointable": "wait" if campaign.workload_policy == WorkloadPolicy.WAIT else "cold_restart",
        "wait_limit_h": campaign.wait_limit.total_seconds() / 3600 if campaign.wait_limit else None,
        "wait_poll_s": policy.WAIT_POLL_S,
        # The engine's dispatch: a node holds its slot until it is done, and the wave order except while it
        # waits for a receiver alone (campaigns.policy.admits).
        "wave_order": "strict",
    }
    if campaign.workload_policy != WorkloadPolicy.CHECKPOINT:
        changes["checkpointable_share"] = 0.0
    return changes


def campaign_params(campaign_id: int, base: Params | None = None) -> Params:
    """`base` (the defaults) with the campaign's policy (`campaign_policy`)."""
    return (base or Params()).with_(**campaign_policy(campaign_id))
