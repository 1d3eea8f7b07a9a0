"""The console's Reports page (/reports/): every report gpusweep makes, found by filters.

The pending patches (all clusters or one), each advisory's report, each campaign's report and its
evidence log, each with its formats. Filters: what kind of report, an advisory (its public id: that
advisory's report and the campaigns that name it), free text (advisory and campaign names), a
campaign's status, a cluster (the pending patches) and a date range (campaigns created or finished
in it, advisories updated in it); each narrows the kinds it applies to and leaves the others. The
reports themselves are reports.views'.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django.core.paginator import Page, Paginator
from django.db.models import Q
from django.http import HttpRequest

from advisories import counts
from advisories.identifiers import resolve
from advisories.models import Advisory
from campaigns.choices import CampaignStatus
from campaigns.models import Campaign
from inventory.models import Cluster
from reports import render

KINDS = [("", "every report"), ("pending", "pending patches"), ("advisory", "advisory reports"),
         ("campaign", "campaign reports"), ("evidence", "evidence logs")]
EVIDENCE_FORMATS = ("json", "csv")
PER_PAGE = 50


@dataclass
class Filters:
    kind: str = ""
    q: str = ""
    advisory: str = ""
    status: str = ""
    cluster: str = ""
    since: dt.date | None = None
    until: dt.date | None = None
    problems: list[str] = field(default_factory=list)

    def shows(self, kind: str) -> bool:
        return not self.kind or self.kind == kind or (self.kind == "evidence" and kind == "campaign")


def _date(value: str, name: str, problems: list[str]) -> dt.date | None:
    if not value:
        return None
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        problems.append(f"{name}: {value!r} is no date (YYYY-MM-DD); ignored")
        return None


def read_filters(query: Any) -> Filters:
    problems: list[str] = []
    kind = query.get("kind", "").strip()
    if kind not in dict(KINDS):
        problems.append(f"kind: {kind!r} is not one of {', '.join(k for k, _ in KINDS if k)}; showing every report")
        kind = ""
    status = query.get("status", "").strip()
    if status and status not in dict(CampaignStatus.CHOICES):
        problems.append(f"status: {status!r} is no campaign status; ignored")
        status = ""
    return Filters(kind=kind, q=query.get("q", "").strip(), advisory=query.get("advisory", "").strip().lower(),
                   status=status, cluster=query.get("cluster", "").strip(),
                   since=_date(query.get("since", "").strip(), "from", problems),
                   until=_date(query.get("until", "").strip(), "to", problems), problems=problems)


def _bounds(filters: Filters) -> tuple[dt.datetime | None, dt.datetime | None]:
    """The date range as moments in UTC: from the start of `since` to the end of `until`."""
    start = dt.datetime.combine(filters.since, dt.time.min, dt.UTC) if filters.since else None
    end = dt.datetime.combine(filters.until, dt.time.min, dt.UTC) + dt.timedelta(days=1) if filters.until else None
    return start, end


def _links(prefix: str, formats: tuple[str, ...], query: str = "") -> list[tuple[str, str]]:
    return [(fmt.upper(), f"{prefix}.{fmt}{query}") for fmt in formats]


def pending_rows(filters: Filters) -> list[dict[str, Any]]:
    clusters = list(Cluster.objects.order_by("name").values_list("name", flat=True))
    if filters.cluster:
        clusters = [c for c in clusters if c == filters.cluster]
    rows = [] if filters.cluster else [{"label": "All clusters", "cluster": "",
                                        "links": _links("/advisories/pending", render.FORMATS)}]
    return rows + [{"label": f"Cluster {name}", "cluster": name,
                    "links": _links("/advisories/pending", render.FORMATS, "?" + urlencode({"cluster": name}))}
                   for name in clusters]


def advisory_rows(filters: Filters, advisory: Advisory | None, page_number: str | None) -> Page[Any]:
    found = Advisory.objects.order_by("-current_release_date", "-id")
    if advisory is not None:
        found = found.filter(pk=advisory.pk)
    if filters.q:
        found = found.filter(Q(publisher_id__icontains=filters.q) | Q(title__icontains=filters.q))
    start, end = _bounds(filters)
    if start:
        found = found.filter(current_release_date__gte=start)
    if end:
        found = found.filter(current_release_date__lt=end)
    exposed = counts.cached()
    page: Page[Any] = Paginator(found, PER_PAGE).get_page(page_number)
    page.object_list = [
        {"advisory": a, "exposed": (exposed[a.pk].exposed_nodes + exposed[a.pk].presumed_nodes) if a.pk in exposed
         else 0, "links": _links(f"/advisories/{a.public_id}/report", render.FORMATS)}
        for a in page.object_list]
    return page


def campaign_rows(filters: Filters, advisory: Advisory | None, page_number: str | None) -> Page[Any]:
    found = Campaign.objects.order_by("-created_at", "-pk")
    if advisory is not None:
        found = found.filter(advisories=advisory)
    if filters.q:
        found = found.filter(name__icontains=filters.q)
    if filters.status:
        found = found.filter(status=filters.status)
    start, end = _bounds(filters)
    if start or end:  # created or finished in the range
        created, finished = Q(), Q(finished_at__isnull=False)
        if start:
            created, finished = created & Q(created_at__gte=start), finished & Q(finished_at__gte=start)
        if end:
            created, finished = created & Q(created_at__lt=end), finished & Q(finished_at__lt=end)
        found = found.filter(created | finished)
    page: Page[Any] = Paginator(found.prefetch_related("advisories"), PER_PAGE).get_page(page_number)
    page.object_list = [
        {"campaign": c, "advisories": sorted(a.public_id for a in c.advisories.all()),
         "report": _links(f"/campaigns/{c.pk}/report", render.FORMATS) if filters.kind != "evidence" else [],
         "evidence": _links(f"/campaigns/{c.pk}/evidence", EVIDENCE_FORMATS) if filters.kind != "campaign" else []}
        for c in page.object_list]
    return page


def context(request: HttpRequest) -> dict[str, Any]:
    filters = read_filters(request.GET)
    advisory = None
    if filters.advisory:
        advisory = resolve(filters.advisory)
        if advisory is None:
            filters.problems.append(f"advisory: no advisory {filters.advisory!r} (advisories are named by their "
                                    "public id, e.g. nvidia-5703); ignored")
    kept = {k: v for k, v in request.GET.items() if v}
    return {
        "filters": filters, "kinds": KINDS, "statuses": CampaignStatus.CHOICES,
        "clusters": list(Cluster.objects.order_by("name").values_list("name", flat=True)),
        "advisory_ids": [a.public_id for a in Advisory.objects.order_by("publisher", "publisher_id")],
        # A filter narrows the kinds of report it applies to and leaves the others as they are.
        "pending": pending_rows(filters) if filters.shows("pending") else None,
        "advisories": advisory_rows(filters, advisory, request.GET.get("advisory_page"))
        if filters.shows("advisory") else None,
        "campaigns": campaign_rows(filters, advisory, request.GET.get("campaign_page"))
        if filters.shows("campaign") else None,
        # Each section's pager keeps the filters and the other section's page.
        "advisory_query": urlencode({k: v for k, v in kept.items() if k != "advisory_page"}),
        "campaign_query": urlencode({k: v for k, v in kept.items() if k != "campaign_page"}),
        "filtered": any(k not in ("advisory_page", "campaign_page") for k in kept),
    }
