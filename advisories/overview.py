"""What advisories shows on the overview page (gpusweep.registry): its figures, each a GROUP BY or
two however large the fleet, its exact counts, and the sections that show them.

An exposure counts as exposed from `first_seen` until it is remediated (`remediated_at`) or an
approver sets it not affected (its `updated_at`); an accepted risk is still exposed (the
ExposureState.ACTIVE rule). A node is exposed from its first exposure until its last one ends.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import Any

from django.db.models import Count, Max, Min, Q
from django.db.models.functions import TruncDate

from advisories import counts
from advisories.choices import ExposureState, ReviewState
from advisories.models import Advisory, Exposure, ReviewItem
from gpusweep.registry import Counts, OverviewSection
from inventory.choices import ServiceState
from inventory.models import Node

SEVERITIES = ("critical", "high", "medium", "low", "")


def exposed_by_severity() -> list[tuple[str, int, int]]:
    """(severity, exposed nodes, open exposures), most severe first; presumed ones included."""
    rows = dict(
        (sev, (nodes, n)) for sev, nodes, n in Exposure.objects.filter(
            state__in=[ExposureState.OPEN, ExposureState.PRESUMED]).values("severity").annotate(
            nodes=Count("node", distinct=True), n=Count("id")).values_list("severity", "nodes", "n"))
    return [(sev, *rows.get(sev, (0, 0))) for sev in SEVERITIES if sev or sev in rows]


def deadlines(now: dt.datetime, soon_days: int = 7) -> dict[str, int]:
    active = Exposure.objects.filter(state__in=[ExposureState.OPEN, ExposureState.PRESUMED])
    return active.aggregate(
        overdue=Count("id", filter=Q(deadline__lt=now)),
        overdue_nodes=Count("node", filter=Q(deadline__lt=now), distinct=True),
        due_soon=Count("id", filter=Q(deadline__gte=now, deadline__lt=now + dt.timedelta(days=soon_days))),
        due_soon_nodes=Count("node", filter=Q(deadline__gte=now, deadline__lt=now + dt.timedelta(days=soon_days)),
                             distinct=True),
        exposed_nodes=Count("node", distinct=True),
    )


def compliance_by_cluster() -> list[dict[str, Any]]:
    """Per cluster: nodes, nodes with an open or presumed exposure, and the percent compliant."""
    totals = dict(Node.objects.exclude(service_state=ServiceState.GONE).values("cluster__name").annotate(
        n=Count("id")).values_list("cluster__name", "n"))
    exposed = dict(Exposure.objects.filter(
        state__in=[ExposureState.OPEN, ExposureState.PRESUMED]).exclude(
        node__service_state=ServiceState.GONE).values("node__cluster__name").annotate(
        n=Count("node", distinct=True)).values_list("node__cluster__name", "n"))
    rows = []
    for cluster, total in sorted(totals.items()):
        bad = exposed.get(cluster, 0)
        rows.append({"cluster": cluster, "nodes": total, "exposed": bad,
                     "percent": round(100 * (total - bad) / total, 1) if total else 100.0})
    return rows


def _days(start: dt.date, end: dt.date) -> list[dt.date]:
    return [start + dt.timedelta(days=i) for i in range((end - start).days + 1)]


def burn_down(now: dt.datetime, days: int = 30) -> dict[str, Any]:
    """Per day of the last `days`: exposures still exposed at the day's end, exposed nodes, and
    the node-days of exposure accumulated since the first day."""
    today = now.date()
    first = today - dt.timedelta(days=days - 1)
    dates = _days(first, today)
    opened = defaultdict(int, Exposure.objects.annotate(d=TruncDate("first_seen")).values("d").annotate(
        n=Count("id")).values_list("d", "n"))
    closed: defaultdict[dt.date, int] = defaultdict(int)
    for field, state in (("remediated_at", ExposureState.REMEDIATED), ("updated_at", ExposureState.NOT_AFFECTED)):
        for day, n in Exposure.objects.filter(state=state).annotate(d=TruncDate(field)).values("d").annotate(
                n=Count("id")).values_list("d", "n"):
            closed[day] += n
    # Before the window, then day by day.
    level = sum(n for d, n in opened.items() if d is not None and d < first) - sum(
        n for d, n in closed.items() if d is not None and d < first)
    open_series = []
    for day in dates:
        level += opened.get(day, 0) - closed.get(day, 0)
        open_series.append(level)
    nodes_series = _exposed_nodes(dates)
    node_days, total = [], 0
    for n in nodes_series:
        total += n
        node_days.append(total)
    return {"dates": dates, "open": open_series, "nodes": nodes_series, "node_days": node_days}


def _exposed_nodes(dates: list[dt.date]) -> list[int]:
    """Nodes exposed at the end of each day, from each node's first exposure to the end of its last."""
    change: defaultdict[dt.date, int] = defaultdict(int)
    first, last = dates[0], dates[-1]
    ended = Q(state=ExposureState.REMEDIATED) | Q(state=ExposureState.NOT_AFFECTED)
    for start, active, rem, upd in Exposure.objects.values("node").annotate(
            start=Min("first_seen"), active=Count("id", filter=~ended), rem=Max("remediated_at"),
            upd=Max("updated_at", filter=Q(state=ExposureState.NOT_AFFECTED))).values_list(
            "start", "active", "rem", "upd"):
        begins = max(start.date(), first)
        if begins > last:
            continue
        change[begins] += 1
        if not active:
            end = max(d for d in (rem, upd) if d is not None).date() if (rem or upd) else start.date()
            if end < first:
                change[begins] -= 1
            elif end <= last:
                change[end] -= 1
    series, level = [], 0
    for day in dates:
        level += change.get(day, 0)
        series.append(level)
    return series


def charts(now: dt.datetime) -> list[dict[str, Any]]:
    """The overview's charts in the spec costs/static/costs/charts.js draws."""
    data = burn_down(now)
    xs = list(range(len(data["dates"])))
    last = len(xs) - 1
    ticks = {i: d.strftime("%m-%d") for i, d in enumerate(data["dates"]) if (i % 7 == 0 and last - i >= 4) or i == last}
    labels = [d.isoformat() for d in data["dates"]]
    return [
        {"id": "chart-burn-down", "title": "Open exposures and exposed nodes, last 30 days", "xlabel": "day (UTC)",
         "ylabel": "count", "kind": "line", "x": xs, "xticks": ticks,
         "series": [{"label": "open exposures", "values": data["open"]},
                    {"label": "exposed nodes", "values": data["nodes"]}],
         "rows": [list(r) for r in zip(labels, data["open"], data["nodes"], strict=True)]},
        {"id": "chart-node-days", "title": "Node-days of exposure, accumulated over the last 30 days",
         "xlabel": "day (UTC)", "ylabel": "node-days", "kind": "line", "x": xs, "xticks": ticks,
         "series": [{"label": "node-days", "values": data["node_days"]}],
         "rows": [list(r) for r in zip(labels, data["node_days"], strict=True)]},
    ]


def needing_review() -> list[dict[str, Any]]:
    """Advisories with review items open or nodes presumed exposed, newest first."""
    review = dict(ReviewItem.objects.filter(state=ReviewState.OPEN).values("advisory_id").annotate(
        n=Count("id")).values_list("advisory_id", "n"))
    presumed = {pk: c.presumed_nodes for pk, c in counts.cached().items() if c.presumed_nodes}
    ids = set(review) | set(presumed)
    return [{"pk": a.pk, "public_id": a.public_id, "publisher": a.publisher, "publisher_id": a.publisher_id,
             "title": a.title,
             "severity": a.severity, "open_review": review.get(a.pk, 0), "presumed": presumed.get(a.pk, 0)}
            for a in Advisory.objects.filter(pk__in=ids).order_by("-current_release_date")[:20]]


def figures(now: dt.datetime) -> dict[str, Any]:
    """Everything fleet-wide advisories shows on the overview, computed together (the page caches it)."""
    return {"by_severity": exposed_by_severity(), "summary": deadlines(now), "compliance": compliance_by_cluster(),
            "charts": charts(now), "review": needing_review(),
            "needs_review": ReviewItem.objects.filter(state=ReviewState.OPEN).values("advisory").distinct().count(),
            "presumed_nodes": Exposure.objects.filter(state=ExposureState.PRESUMED).values("node").distinct().count()}


EXPIRING_DAYS = 7


def exact_counts(now: dt.datetime) -> Counts:
    """The advisories, mismatches and accepted risks (read on every visit, so kept until their tables
    are written), and when `expiring` next changes by itself: when the first risk ending later than
    a week from now comes within the week."""
    soon = now + dt.timedelta(days=EXPIRING_DAYS)
    accepted = Exposure.objects.filter(state=ExposureState.RISK_ACCEPTED)
    later = accepted.filter(risk_expires_at__gte=soon).aggregate(first=Min("risk_expires_at"))["first"]
    return {
        "advisories": Advisory.objects.count(),
        "mismatches": Advisory.objects.filter(integrity="mismatch").count(),
        "accepted": accepted.aggregate(n=Count("id"), expiring=Count("id", filter=Q(risk_expires_at__lt=soon))),
    }, later - dt.timedelta(days=EXPIRING_DAYS) if later is not None else None


SECTIONS = (
    OverviewSection("advisories", order=20, headline="advisories/_overview_headline.html",
                    template="advisories/_overview_exposed.html", figures=figures, counts=exact_counts,
                    reads=(Advisory, Exposure)),
    OverviewSection("compliance", order=40, template="advisories/_overview_compliance.html", half=True),
    OverviewSection("review", order=60, template="advisories/_overview_review.html"),
)
