"""Security-team pages: which bulletins hit which nodes, and by when they must be patched."""

from __future__ import annotations

import datetime as dt
import functools
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Case, Count, F, IntegerField, Min, OuterRef, Q, QuerySet, Subquery, Value, When
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from advisories import components, counts, coverage, display, findings, services
from advisories.choices import ExposureState, ReviewState, Severity, VexJustification
from advisories.identifiers import resolve
from advisories.models import CVE, Advisory, AffectedRange, DeadlinePolicy, Exposure, ReviewItem
from gpusweep.middleware import accepts_token
from gpusweep.pages import csv_response, installed, paginate
from gpusweep.roles import Role, has_role
from inventory.models import Cluster

SEVERITY_ORDER = Case(*(When(severity=v, then=Value(rank)) for v, rank in Severity.RANK.items()),
                      default=Value(-1), output_field=IntegerField())
ADVISORY_SORTS = {
    "updated": ("-current_release_date", "-id"), "published": ("-initial_release_date", "-id"),
    "severity": ("-severity_rank", "-current_release_date"), "exposed": ("-exposed_nodes", "-current_release_date"),
    "cvss": ("-max_cvss", "-current_release_date"), "bulletin": ("publisher", "publisher_id"),
}


def advisory_list(request: HttpRequest) -> HttpResponse:
    filters = {key: request.GET.get(key, "").strip() for key in
               ("q", "severity", "component", "affects", "needs_review", "integrity", "sort")}
    advisories = Advisory.objects.annotate(
        open_review=Subquery(ReviewItem.objects.filter(advisory=OuterRef("pk"), state=ReviewState.OPEN).values(
            "advisory").annotate(n=Count("id")).values("n")[:1]),
        max_cvss=Subquery(CVE.objects.filter(advisories=OuterRef("pk")).order_by(
            F("base_score").desc(nulls_last=True)).values("base_score")[:1]),
        severity_rank=SEVERITY_ORDER,
    )
    if filters["q"]:
        q = filters["q"]
        advisories = advisories.filter(Q(publisher_id__icontains=q) | Q(title__icontains=q)
                                       | Q(pk__in=CVE.advisories.through.objects.filter(
                                           cve__cve_id__icontains=q).values("advisory_id")))
    if filters["severity"]:
        advisories = advisories.filter(severity=filters["severity"])
    if filters["component"]:
        advisories = advisories.filter(pk__in=AffectedRange.objects.filter(
            component=filters["component"]).values("advisory_id"))
    if filters["needs_review"]:
        advisories = advisories.filter(open_review__gt=0)
    if filters["integrity"]:
        advisories = advisories.filter(integrity=filters["integrity"])
    # Advisories are few: the exposed counts (one GROUP BY, cached) are joined and sorted on here.
    found = counts.cached()
    rows = []
    for advisory in advisories:
        c = found.get(advisory.pk, counts.Counts())
        for name in ("exposed_nodes", "presumed_nodes", "open_exposures"):
            setattr(advisory, name, getattr(c, name))  # shown and sorted on like the annotations
        affects = bool(c.exposed_nodes or c.presumed_nodes)
        if (filters["affects"] in ("1", "yes", "true") and not affects) or (
                filters["affects"] in ("0", "no", "false") and affects):
            continue
        rows.append(advisory)
    sort = filters["sort"] if filters["sort"] in ADVISORY_SORTS else "updated"
    for field in reversed(ADVISORY_SORTS[sort]):  # stable sorts, last key first
        rows.sort(key=functools.partial(_sort_key, field.lstrip("-")), reverse=field.startswith("-"))
    query = request.GET.copy()
    query.pop("page", None)
    page = paginate(request, rows)
    found_coverage = coverage.of_advisories([a.pk for a in page])
    for advisory in page:
        advisory.coverage = found_coverage[advisory.pk]
    return render(request, "advisories/advisory_list.html", {
        "page": page, "filters": filters, "severities": Severity.choices(),
        "components": [(c.name, c.label) for c in components.REGISTRY], "sorts": list(ADVISORY_SORTS),
        "sort": sort, "query": query.urlencode(),
    })


def _sort_key(name: str, advisory: Advisory) -> tuple[int, Any]:
    """Sortable whatever the type; empty values first in ascending order (last when reversed)."""
    value = getattr(advisory, name)
    if value is None or value == "":
        return (0, 0)
    return (1, value)


def advisory_detail(request: HttpRequest, public_id: str) -> HttpResponse:
    advisory = resolve(public_id)
    if advisory is None:
        raise Http404("no advisory with this public id (e.g. nvidia-5703)")
    active = advisory.exposures.filter(state__in=[ExposureState.OPEN, ExposureState.PRESUMED])
    by_cluster = list(active.values("node__cluster__name").annotate(
        nodes=Count("node", distinct=True), earliest=Min("deadline")).order_by("node__cluster__name"))
    ranges = advisory.ranges.prefetch_related("cves").order_by("component", "os_family", "branch", "product_line")
    cves = advisory.cves.order_by("-base_score", "cve_id")
    return render(request, "advisories/advisory_detail.html", {
        "advisory": advisory,
        "cves": cves,
        "max_cvss": max((c.base_score for c in cves if c.base_score is not None), default=None),
        "by_cluster": by_cluster,
        # A node is in one cluster: the per-cluster counts add up, and the earliest deadline is theirs.
        "exposed_total": sum(row["nodes"] for row in by_cluster),
        "deadline": min((row["earliest"] for row in by_cluster if row["earliest"]), default=None),
        "policy_days": DeadlinePolicy.current().days_for(advisory.severity),
        "ranges": [(r, display.range_text(r)) for r in ranges],
        "exposures": advisory.exposures.select_related("node__cluster", "affected_range", "risk_approver").order_by(
            "state", "deadline", "node__name")[:500],
        "review_items": advisory.review_items.select_related("resolved_by").order_by("state", "kind", "key"),
        "coverage": coverage.of_advisory(advisory),
        "now": timezone.now(),
        "is_admin": has_role(request.user, Role.ADMIN),
        "is_approver": has_role(request.user, Role.APPROVER),
        "can_plan": has_role(request.user, Role.OPERATOR),
        "justifications": VexJustification.choices(),
        "component_names": [c.name for c in components.REGISTRY],
        "reports": [(fmt.upper(), f"/advisories/{advisory.public_id}/report.{fmt}") for fmt in ("pdf", "csv", "json")
                    if installed(f"/advisories/{advisory.public_id}/report.{fmt}")],
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
    return redirect("advisories-ui:advisory-detail", public_id=exposure.advisory.public_id)


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
    return redirect("advisories-ui:advisory-detail", public_id=item.advisory.public_id)


EXPOSURE_SORTS = {
    "deadline": ("deadline", "id"), "-deadline": ("-deadline", "id"), "node": ("node__name", "id"),
    "severity": ("-severity_rank", "deadline", "id"), "advisory": ("advisory__publisher_id", "deadline", "id"),
    "first_seen": ("first_seen", "id"), "cluster": ("node__cluster__name", "node__name", "id"),
}
GROUPS = {"advisory": ("advisory__publisher_id",), "cluster": ("node__cluster__name",)}


def _filtered_exposures(request: HttpRequest) -> tuple[QuerySet[Exposure], dict[str, str]]:
    exposures = Exposure.objects.select_related("node__cluster", "advisory", "affected_range").annotate(
        severity_rank=SEVERITY_ORDER)
    filters = {key: request.GET.get(key, "").strip() for key in
               ("state", "severity", "cluster", "overdue", "due_within", "q", "advisory", "sort", "group", "source")}
    state = filters["state"] or ExposureState.OPEN
    filters["state"] = state
    if state != "all":
        exposures = exposures.filter(state=state)
    if filters["source"] in dict(findings.SOURCES):  # one source's own rows, those merged into a finding too
        exposures = exposures.filter(findings.source_q(filters["source"]))
    else:  # one row per node and CVE: an NVIDIA row a distribution row decides is listed within it
        filters["source"] = ""
        exposures = exposures.exclude(findings.merged())
    if filters["severity"]:
        exposures = exposures.filter(severity=filters["severity"])
    if filters["cluster"]:
        exposures = exposures.filter(cluster__name=filters["cluster"])  # the exposure's copy: no node join
    if filters["advisory"]:  # a public id; one that no advisory has lists nothing
        named = resolve(filters["advisory"])
        exposures = exposures.filter(advisory_id=named.pk) if named else exposures.none()
    now = timezone.now()
    if filters["overdue"] in ("1", "true", "yes", "on"):
        exposures = exposures.filter(state__in=[ExposureState.OPEN, ExposureState.PRESUMED], deadline__lt=now)
    if filters["due_within"].isdigit():
        exposures = exposures.filter(state__in=[ExposureState.OPEN, ExposureState.PRESUMED], deadline__gte=now,
                                     deadline__lt=now + dt.timedelta(days=int(filters["due_within"])))
    if filters["q"]:
        q = filters["q"]
        exposures = exposures.filter(
            Q(node__name__icontains=q) | Q(advisory__publisher_id__icontains=q) | Q(advisory__title__icontains=q)
            | Q(affected_range__in=AffectedRange.cves.through.objects.filter(cve__cve_id__icontains=q).values(
                "affectedrange_id")) | Q(detected_version__icontains=q))
    sort = EXPOSURE_SORTS.get(filters["sort"]) or EXPOSURE_SORTS["deadline"]
    group = GROUPS.get(filters["group"], ())
    return exposures.order_by(*group, *sort), filters


def _cves_of(exposures: list[Exposure]) -> dict[int, list[str]]:
    """range id -> its CVE ids, for a page of exposures, in one query."""
    found: dict[int, list[str]] = {}
    for range_id, cve in AffectedRange.cves.through.objects.filter(
            affectedrange_id__in={e.affected_range_id for e in exposures}).values_list(
            "affectedrange_id", "cve__cve_id").order_by("cve__cve_id"):
        found.setdefault(range_id, []).append(cve)
    return found


def _days_overdue(exposure: Exposure, now: dt.datetime) -> int | None:
    if exposure.state not in (ExposureState.OPEN, ExposureState.PRESUMED) or exposure.deadline is None:
        return None
    late = (now - exposure.deadline).days
    return late if exposure.deadline < now else None


@accepts_token  # ?format=csv is an export a script may fetch with a token
def exposure_list(request: HttpRequest) -> HttpResponse:
    exposures, filters = _filtered_exposures(request)
    now = timezone.now()
    if request.GET.get("format") == "csv":
        return _exposures_csv(exposures, now)
    # The page's ids first (a narrow sort of the exposures alone), then those rows with their joins:
    # sorting 500,000 joined rows to show 100 took seconds.
    page = paginate(request, exposures.values_list("id", flat=True))
    ids = list(page.object_list)
    found = Exposure.objects.select_related("node__cluster", "advisory", "affected_range").in_bulk(ids)
    rows = [found[i] for i in ids if i in found]
    cves = _cves_of(rows)
    joined = findings.joined({e.node_id for e in rows})
    key = {"advisory": lambda e: f"{e.advisory.publisher} {e.advisory.publisher_id}: {e.advisory.title}",
           "cluster": lambda e: e.node.cluster.name}.get(filters["group"])
    groups: list[dict[str, Any]] = []
    for e in rows:
        label = key(e) if key else ""
        if not groups or groups[-1]["label"] != label:
            groups.append({"label": label, "rows": []})
        groups[-1]["rows"].append({"e": e, "cves": cves.get(e.affected_range_id, []),
                                   "overdue": _days_overdue(e, now),
                                   "finding": findings.of_row(e, joined, cves.get(e.affected_range_id, []))})
    query = request.GET.copy()
    query.pop("page", None)
    return render(request, "advisories/exposure_list.html", {
        "page": page, "groups": groups, "filters": filters,
        "states": [*ExposureState.choices(), ("all", "All")],
        "severities": Severity.choices(),
        "sources": findings.SOURCES,
        "clusters": Cluster.objects.values_list("name", flat=True).order_by("name"),
        "sorts": [("deadline", "deadline, soonest first"), ("-deadline", "deadline, latest first"),
                  ("severity", "severity"), ("node", "node"), ("cluster", "cluster"), ("advisory", "advisory"),
                  ("first_seen", "first seen")],
        "now": now,
        "query": query.urlencode(),
        "is_approver": has_role(request.user, Role.APPROVER),
        "can_plan": has_role(request.user, Role.OPERATOR),
        "policy": DeadlinePolicy.objects.filter(pk=1).first(),
        # The pending patches report (reports app), of the cluster filtered on.
        "pending_report": installed("/advisories/pending.pdf"),
    })


def _exposures_csv(exposures: QuerySet[Exposure], now: dt.datetime) -> HttpResponse:
    def chunks() -> Any:
        chunk: list[Exposure] = []
        for exposure in exposures.iterator(chunk_size=2000):
            chunk.append(exposure)
            if len(chunk) == 2000:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    def rows() -> Any:
        for chunk in chunks():
            cves = _cves_of(chunk)
            for e in chunk:
                late = _days_overdue(e, now)
                yield (e.node.cluster.name, e.node.name, e.node.pool,
                       f"{e.advisory.publisher} {e.advisory.publisher_id}",
                       " ".join(cves.get(e.affected_range_id, [])), e.component, e.detected_version,
                       e.affected_range.fixed_version, e.severity, e.state, e.first_seen.isoformat(),
                       e.deadline.isoformat() if e.deadline else "", e.deadline_source,
                       "" if late is None else late, e.fixed_by_version,
                       e.remediated_at.isoformat() if e.remediated_at else "")

    return csv_response(
        "exposures.csv",
        ["cluster", "node", "pool", "advisory", "cves", "component", "detected_version", "fixed_version", "severity",
         "state", "first_seen", "deadline", "deadline_source", "days_overdue", "fixed_by_version", "remediated_at"],
        rows(),
    )


@require_POST
def exposure_bulk(request: HttpRequest) -> HttpResponse:
    """The exposure list's bulk actions: plan a campaign for the chosen ones, or accept their risk."""
    ids = [int(i) for i in request.POST.getlist("exposure") if i.isdigit()]
    back = request.POST.get("back", "")
    back = back if back.startswith("/advisories/exposures/") else "/advisories/exposures/"
    if not ids:
        messages.error(request, "Choose at least one exposure first.")
        return redirect(back)
    chosen = Exposure.objects.filter(pk__in=ids).select_related("node__cluster", "advisory")
    action = request.POST.get("action", "")
    if action == "plan":
        _checked(request, Role.OPERATOR)
        params = QueryDict(mutable=True)
        params.setlist("advisories", sorted({e.advisory.public_id for e in chosen}))  # public ids, never the pk
        params.setlist("clusters", sorted({e.node.cluster.name for e in chosen}))
        params["nodes"] = ",".join(sorted({e.node.name for e in chosen}))
        return redirect(f"/campaigns/new/?{params.urlencode()}")
    if action == "accept_risk":
        _checked(request, Role.APPROVER)
        reason = request.POST.get("reason", "").strip()
        try:
            days = int(request.POST.get("days") or 30)
            if len(reason) < 10:
                raise services.DecisionError("give a reason of at least 10 characters")
            if not 1 <= days <= 365:
                raise services.DecisionError("accept a risk for 1 to 365 days")
            accepted = services.accept_risks(ids, request.user, reason, timezone.now() + dt.timedelta(days=days))
        except (services.DecisionError, ValueError) as exc:
            messages.error(request, f"Nothing was accepted: {exc}")
        else:
            messages.success(request, f"Risk accepted for {len(accepted)} exposure{'s' if len(accepted) != 1 else ''}"
                                      f" until {(timezone.now() + dt.timedelta(days=days)):%Y-%m-%d}.")
        return redirect(back)
    return HttpResponse(f"unknown action {action!r}", status=400)
