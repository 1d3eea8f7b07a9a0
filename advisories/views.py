"""Security-team pages: which bulletins hit which nodes, and by when they must be patched."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from advisories import components, services
from advisories.choices import ExposureState, ReviewState, Severity, VexJustification
from advisories.models import Advisory, DeadlinePolicy, Exposure, ReviewItem
from gpusweep.pages import csv_response, paginate
from gpusweep.roles import Role, has_role
from inventory.models import Cluster


def advisory_list(request: HttpRequest) -> HttpResponse:
    advisories = Advisory.objects.annotate(
        open_exposures=Count("exposures", filter=Q(exposures__state=ExposureState.OPEN)),
        exposed_nodes=Count("exposures__node", filter=Q(exposures__state=ExposureState.OPEN), distinct=True),
        presumed_nodes=Count("exposures__node", filter=Q(exposures__state=ExposureState.PRESUMED), distinct=True),
        open_review=Count("review_items", filter=Q(review_items__state=ReviewState.OPEN), distinct=True),
    ).order_by("-current_release_date", "-id")
    severity = request.GET.get("severity", "")
    if severity:
        advisories = advisories.filter(severity=severity)
    if request.GET.get("needs_review"):
        advisories = advisories.filter(open_review__gt=0)
    return render(request, "advisories/advisory_list.html", {
        "page": paginate(request, advisories), "severity": severity, "severities": Severity.choices(),
        "needs_review": bool(request.GET.get("needs_review")),
    })


def advisory_detail(request: HttpRequest, pk: int) -> HttpResponse:
    advisory = get_object_or_404(Advisory, pk=pk)
    return render(request, "advisories/advisory_detail.html", {
        "advisory": advisory,
        "cves": advisory.cves.order_by("-base_score", "cve_id"),
        "ranges": advisory.ranges.prefetch_related("cves").order_by("component", "os_family", "branch"),
        "exposures": advisory.exposures.select_related("node__cluster", "affected_range", "risk_approver").order_by(
            "state", "deadline")[:500],
        "review_items": advisory.review_items.select_related("resolved_by").order_by("state", "kind", "key"),
        "now": timezone.now(),
        "is_admin": has_role(request.user, Role.ADMIN),
        "is_approver": has_role(request.user, Role.APPROVER),
        "justifications": VexJustification.choices(),
        "component_names": [c.name for c in components.REGISTRY],
    })


def _checked(request: HttpRequest, role: Role) -> None:
    if not has_role(request.user, role):
        raise PermissionDenied(f"this needs the {role.value} role")


@require_POST
def exposure_decide(request: HttpRequest, pk: int) -> HttpResponse:
    """An approver's decision from the advisory page: not affected, accept risk, revoke."""
    _checked(request, Role.APPROVER)
    exposure = get_object_or_404(Exposure, pk=pk)
    decision, reason = request.POST.get("decision", ""), request.POST.get("reason", "").strip()
    try:
        if len(reason) < 10 and decision != "revoke_risk":
            raise services.DecisionError("give a reason of at least 10 characters")
        if decision == "not_affected":
            services.mark_not_affected(pk, request.user, request.POST.get("justification", ""), reason)
        elif decision == "accept_risk":
            days = int(request.POST.get("days") or 30)
            services.accept_risk(pk, request.user, reason, timezone.now() + dt.timedelta(days=days))
        elif decision == "revoke_risk":
            services.revoke_risk(pk, request.user)
        else:
            raise services.DecisionError(f"unknown decision {decision!r}")
    except (services.DecisionError, ValueError) as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Exposure of {exposure.node.name}: {decision.replace('_', ' ')} recorded.")
    return redirect("advisories-ui:advisory-detail", pk=exposure.advisory_id)


@require_POST
def review_resolve(request: HttpRequest, pk: int) -> HttpResponse:
    """An admin maps a review item to a range, or dismisses it, from the advisory page."""
    _checked(request, Role.ADMIN)
    item = get_object_or_404(ReviewItem, pk=pk)
    reason = request.POST.get("reason", "").strip()
    try:
        if len(reason) < 10:
            raise services.DecisionError("give a reason of at least 10 characters")
        if request.POST.get("resolution") == "map":
            mapping: dict[str, Any] = {k: request.POST.get(k, "").strip() for k in
                                       ("component", "os_family", "branch", "product_line", "lower", "upper",
                                        "fixed_version")}
            mapping["upper_inclusive"] = request.POST.get("upper_inclusive") == "on"
            services.map_review_item(pk, request.user, {k: v for k, v in mapping.items() if v not in ("",)}, reason)
        else:
            services.dismiss_review_item(pk, request.user, reason)
    except services.DecisionError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Review item {item.key}: resolved.")
    return redirect("advisories-ui:advisory-detail", pk=item.advisory_id)


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
        exposures = exposures.filter(state__in=[ExposureState.OPEN, ExposureState.PRESUMED],
                                     deadline__lt=timezone.now())
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
        "policy": DeadlinePolicy.objects.filter(pk=1).first(),
    })
