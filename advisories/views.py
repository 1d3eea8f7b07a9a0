"""Security-team pages: which bulletins hit which nodes, and by when they must be patched."""

from __future__ import annotations

from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone

from advisories.choices import ExposureState, Severity
from advisories.models import Advisory, Exposure
from gpusweep.pages import csv_response, paginate
from inventory.models import Cluster


def advisory_list(request: HttpRequest) -> HttpResponse:
    advisories = Advisory.objects.annotate(
        open_exposures=Count("exposures", filter=Q(exposures__state=ExposureState.OPEN)),
        exposed_nodes=Count("exposures__node", filter=Q(exposures__state=ExposureState.OPEN), distinct=True),
    ).order_by("-current_release_date", "-id")
    severity = request.GET.get("severity", "")
    if severity:
        advisories = advisories.filter(severity=severity)
    return render(request, "advisories/advisory_list.html", {
        "page": paginate(request, advisories), "severity": severity, "severities": Severity.choices(),
    })


def advisory_detail(request: HttpRequest, pk: int) -> HttpResponse:
    advisory = get_object_or_404(Advisory, pk=pk)
    return render(request, "advisories/advisory_detail.html", {
        "advisory": advisory,
        "cves": advisory.cves.order_by("-base_score", "cve_id"),
        "ranges": advisory.ranges.prefetch_related("cves").order_by("component", "os_family", "branch"),
        "exposures": advisory.exposures.select_related("node__cluster").order_by("state", "deadline")[:500],
        "now": timezone.now(),
    })


def _filtered_exposures(request: HttpRequest) -> tuple[QuerySet[Exposure], dict[str, str]]:
    exposures = Exposure.objects.select_related("node__cluster", "advisory").order_by("deadline", "id")
    filters = {key: request.GET.get(key, "") for key in ("state", "severity", "cluster", "overdue")}
    state = filters["state"] or ExposureState.OPEN
    filters["state"] = state
    if state != "all":
        exposures = exposures.filter(state=state)
    if filters["severity"]:
        exposures = exposures.filter(severity=filters["severity"])
    if filters["cluster"]:
        exposures = exposures.filter(node__cluster__name=filters["cluster"])
    if filters["overdue"]:
        exposures = exposures.filter(state=ExposureState.OPEN, deadline__lt=timezone.now())
    return exposures, filters


def exposure_list(request: HttpRequest) -> HttpResponse:
    exposures, filters = _filtered_exposures(request)
    if request.GET.get("format") == "csv":
        return csv_response(
            "exposures.csv",
            ["cluster", "node", "advisory", "component", "detected_version", "severity", "state", "first_seen",
             "deadline", "deadline_source", "fixed_by_version", "remediated_at"],
            (
                (e.node.cluster.name, e.node.name, f"{e.advisory.publisher} {e.advisory.publisher_id}", e.component,
                 e.detected_version, e.severity, e.state, e.first_seen.isoformat(),
                 e.deadline.isoformat() if e.deadline else "", e.deadline_source, e.fixed_by_version,
                 e.remediated_at.isoformat() if e.remediated_at else "")
                for e in exposures.iterator()
            ),
        )
    return render(request, "advisories/exposure_list.html", {
        "page": paginate(request, exposures),
        "filters": filters,
        "states": [*ExposureState.choices(), ("all", "All")],
        "severities": Severity.choices(),
        "clusters": Cluster.objects.values_list("name", flat=True),
        "now": timezone.now(),
        "query": request.GET.urlencode(),
    })
