"""REST API under /api/v1/advisories/: advisories (with their review items and a CSAF VEX view),
CVEs, ranges, exposures (approvers' decisions), review items (admins' resolutions), deadline policy."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import django_filters
from django.db import models, transaction
from django.db.models import Count, Q, QuerySet
from django.db.models.functions import Coalesce
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from advisories import coverage, findings, services
from advisories.choices import ExposureState, ReviewState, Severity, VexJustification
from advisories.identifiers import PublicAdvisoryFilter, resolve
from advisories.models import (
    CVE,
    Advisory,
    AffectedRange,
    ClusterDeadlineOverride,
    DeadlinePolicy,
    Exposure,
    ReviewItem,
)
from advisories.models import public_id as advisory_public_id
from advisories.osv import OS_PACKAGE
from advisories.vex import vex_document
from gpusweep.filters import BooleanFilter, DateTimeFilter, FilterSet, MultipleChoiceFilter, parse_bool
from gpusweep.narrow import NarrowListMixin, Times, among
from gpusweep.responses import CachedListMixin
from gpusweep.roles import Role
from gpusweep.routers import ApiRouter
from inventory.models import NODE_IDENTITY

# --- serializers ---------------------------------------------------------------------------

MAX_DEADLINE_DAYS = 3650
PUBLIC = "the advisory's public id, e.g. nvidia-5703 (its database id never leaves the service)"
# The publisher's own bulletin number (5703), kept beside the public id for existing clients.
BULLETIN = "the publisher's bulletin number, e.g. 5703"


class CVESerializer(serializers.ModelSerializer):
    class Meta:
        model = CVE
        fields = ["id", "cve_id", "description", "cvss_vector", "base_score", "severity", "cwe_id", "cwe_name",
                  "release_date"]


class AffectedRangeSerializer(serializers.ModelSerializer):
    cves: serializers.SlugRelatedField[CVE] = serializers.SlugRelatedField(
        slug_field="cve_id", many=True, read_only=True
    )
    advisory = serializers.CharField(source="advisory.public_id", read_only=True, help_text=PUBLIC)

    class Meta:
        model = AffectedRange
        fields = ["id", "advisory", "product_id", "product_name", "architecture", "component", "os_family", "branch",
                  "product_line", "raw", "lower_version", "lower_inclusive", "upper_version", "upper_inclusive",
                  "fixed_version", "basis", "scope", "condition", "remediation", "severity", "cves"]


class ReviewItemSerializer(serializers.ModelSerializer):
    advisory = serializers.CharField(source="advisory.public_id", read_only=True, help_text=PUBLIC)
    advisory_id = serializers.CharField(source="advisory.publisher_id", read_only=True, help_text=BULLETIN)
    resolved_by = serializers.CharField(source="resolved_by.username", read_only=True, default=None, allow_null=True)

    class Meta:
        model = ReviewItem
        fields = ["id", "advisory", "advisory_id", "key", "kind", "raw", "reason", "component", "state", "mapping",
                  "resolution", "resolved_by", "resolved_at"]
        read_only_fields = fields


class AdvisorySerializer(serializers.ModelSerializer):
    cves: serializers.SlugRelatedField[CVE] = serializers.SlugRelatedField(
        slug_field="cve_id", many=True, read_only=True
    )
    id = serializers.CharField(source="public_id", read_only=True, help_text=PUBLIC)
    open_exposures = serializers.IntegerField(read_only=True, required=False)
    presumed_exposures = serializers.IntegerField(read_only=True, required=False)
    open_review_items = serializers.IntegerField(read_only=True, required=False)
    needs_review = serializers.SerializerMethodField()
    coverage = serializers.SerializerMethodField()

    class Meta:
        model = Advisory
        fields = ["id", "publisher", "publisher_id", "title", "tracking_version", "status", "revision_history",
                  "initial_release_date", "current_release_date", "severity", "summary", "source_kind", "source",
                  "content_sha256", "published_sha256", "integrity", "ranges_unknown", "history",
                  "cves", "open_exposures", "presumed_exposures", "open_review_items", "needs_review",
                  "coverage", "created_at", "updated_at"]

    def get_needs_review(self, obj: Advisory) -> bool:
        return bool(getattr(obj, "open_review_items", 0))

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_coverage(self, obj: Advisory) -> dict[str, Any]:
        """Rows decoded / presumed / under review, and the nodes each class touches."""
        found = self.context.get("coverage") or {}
        return (found.get(obj.pk) or coverage.of_advisory(obj)).as_dict()


class AdvisoryDetailSerializer(AdvisorySerializer):
    ranges = AffectedRangeSerializer(many=True, read_only=True)
    review_items = ReviewItemSerializer(many=True, read_only=True)

    class Meta(AdvisorySerializer.Meta):
        fields = [*AdvisorySerializer.Meta.fields, "ranges", "review_items"]


class ExposureSerializer(serializers.ModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True)
    cluster = serializers.CharField(source="node.cluster.name", read_only=True)
    advisory = serializers.CharField(source="advisory.public_id", read_only=True, help_text=PUBLIC)
    advisory_id = serializers.CharField(source="advisory.publisher_id", read_only=True, help_text=BULLETIN)
    fixed_version = serializers.CharField(source="affected_range.fixed_version", read_only=True)
    remediation = serializers.CharField(source="affected_range.remediation", read_only=True)
    cves = serializers.SerializerMethodField()
    overdue = serializers.SerializerMethodField()
    finding = serializers.SerializerMethodField(help_text=(
        "where NVIDIA's bulletin and the distribution's advisory both name this node and CVE: the finding's "
        "state (decided by the distribution's package where it packages the software) and every source"))
    risk_approver = serializers.CharField(source="risk_approver.username", read_only=True, default=None,
                                          allow_null=True)
    # Empty until an approver sets the exposure not affected: the schema must allow "" too.
    justification = serializers.ChoiceField(choices=VexJustification.choices(), allow_blank=True, read_only=True)

    class Meta:
        model = Exposure
        fields = ["id", "node", "node_name", "cluster", "advisory", "advisory_id", "affected_range", "component",
                  "detected_version", "fixed_version", "severity", "cves", "state", "first_seen", "deadline",
                  "deadline_source", "overdue", "fixed_by_version", "remediated_at", "remediated_by", "risk_approver",
                  "risk_reason", "risk_expires_at", "justification", "remediation", "source", "finding"]
        read_only_fields = fields

    # The API's name for it; a declared field leaves the class (DRF's metaclass), Field.source is untouched.
    source = serializers.SerializerMethodField(  # type: ignore[assignment]
        help_text="nvidia (NVIDIA's bulletins) or distribution (OSV)")

    def get_cves(self, obj: Exposure) -> list[str]:
        return sorted(c.cve_id for c in obj.affected_range.cves.all())

    def get_source(self, obj: Exposure) -> str:
        return findings.DISTRIBUTION if obj.component == OS_PACKAGE else findings.NVIDIA

    @extend_schema_field({"type": "object", "nullable": True})
    def get_finding(self, obj: Exposure) -> dict[str, Any] | None:
        holder = self.parent if self.parent is not None else self  # the page's list serializer
        joined = getattr(holder, "_joined", None)
        if joined is None:  # once for the page: the findings of its nodes
            page = holder.instance if self.parent is not None else [obj]
            joined = findings.joined({e.node_id for e in page or [obj]})
            holder._joined = joined  # type: ignore[attr-defined]
        return findings.of_row(obj, joined, self.get_cves(obj))

    def get_overdue(self, obj: Exposure) -> bool:
        return (obj.state in (ExposureState.OPEN, ExposureState.PRESUMED) and obj.deadline is not None
                and obj.deadline < timezone.now())


class RiskAcceptanceSerializer(serializers.Serializer):
    reason = serializers.CharField(min_length=10)
    expires_at = serializers.DateTimeField()

    def validate_expires_at(self, value: Any) -> Any:
        if value <= timezone.now():
            raise serializers.ValidationError("expiry must be in the future")
        return value


class NotAffectedSerializer(serializers.Serializer):
    justification = serializers.ChoiceField(choices=VexJustification.choices())
    reason = serializers.CharField(min_length=10)


class ResolutionSerializer(serializers.Serializer):
    reason = serializers.CharField(min_length=10)
    mapping = serializers.DictField(required=False)


class DeadlinePolicySerializer(serializers.ModelSerializer):
    # True from a change until its recompute (a task) has set every deadline.
    recomputing = serializers.BooleanField(read_only=True)

    class Meta:
        model = DeadlinePolicy
        fields = ["critical_days", "high_days", "medium_days", "low_days", "basis", "use_kev", "updated_at",
                  "generation", "recomputing", "recomputed_at"]
        read_only_fields = ["generation", "recomputing", "recomputed_at"]
        # Bounded so a deadline stays a date (timedelta overflows past ~2.7 million days).
        extra_kwargs = {name: {"min_value": 0, "max_value": MAX_DEADLINE_DAYS}
                        for name in ("critical_days", "high_days", "medium_days", "low_days")}


class ClusterDeadlineOverrideSerializer(serializers.ModelSerializer):
    class Meta:
        model = ClusterDeadlineOverride
        fields = ["id", "cluster", "severity", "days"]
        extra_kwargs = {"days": {"min_value": 0, "max_value": MAX_DEADLINE_DAYS}}


# --- filters ----------------------------------------------------------------------------------


class AdvisoryFilter(FilterSet):
    severity = MultipleChoiceFilter(choices=Severity.choices())
    cve = django_filters.CharFilter(field_name="cves__cve_id", lookup_expr="iexact")
    published_after = DateTimeFilter(field_name="initial_release_date", lookup_expr="gte")
    needs_review = BooleanFilter(method="filter_needs_review", help_text="has open review items")
    affects_fleet = BooleanFilter(method="filter_affects_fleet", help_text="has open or presumed exposures")

    class Meta:
        model = Advisory
        fields = ["publisher", "publisher_id", "severity", "integrity", "ranges_unknown", "source_kind"]

    def filter_needs_review(self, queryset: QuerySet[Advisory], name: str, value: bool | None) -> QuerySet[Advisory]:
        if value is None:
            return queryset
        # open_review_items is the viewset's annotation
        wanted = {"open_review_items__gt": 0}
        return queryset.filter(**wanted) if value else queryset.exclude(**wanted)

    def filter_affects_fleet(self, queryset: QuerySet[Advisory], name: str, value: bool | None) -> QuerySet[Advisory]:
        if value is None:
            return queryset
        live = Exposure.objects.filter(advisory=models.OuterRef("pk"),
                                       state__in=[ExposureState.OPEN, ExposureState.PRESUMED])
        return queryset.filter(models.Exists(live)) if value else queryset.exclude(models.Exists(live))


class CVEFilter(FilterSet):
    severity = MultipleChoiceFilter(choices=Severity.choices())
    advisory = PublicAdvisoryFilter(field_name="advisories")

    class Meta:
        model = CVE
        fields = ["cve_id", "severity", "cwe_id"]


class AffectedRangeFilter(FilterSet):
    advisory = PublicAdvisoryFilter(field_name="advisory")

    class Meta:
        model = AffectedRange
        fields = ["component", "os_family", "branch", "product_line"]


class ExposureFilter(FilterSet):
    severity = MultipleChoiceFilter(choices=Severity.choices())
    state = MultipleChoiceFilter(choices=ExposureState.choices())
    # The exposure's copy of its node's cluster (Exposure.cluster): no join to the nodes.
    cluster = django_filters.CharFilter(field_name="cluster__name")
    advisory = PublicAdvisoryFilter(field_name="advisory")
    overdue = BooleanFilter(method="filter_overdue", help_text="open and past its deadline")
    source = django_filters.ChoiceFilter(choices=findings.SOURCES, method="filter_source", help_text=(
        "nvidia: NVIDIA's bulletins; distribution: the distribution's advisories (OSV); each source's own rows"))
    joined = BooleanFilter(method="filter_joined", help_text=(
        "true (the default without `source`): one row per node and CVE, an NVIDIA row that a distribution row "
        "decides listed within it (its `finding`); false: every source's own row"))

    class Meta:
        model = Exposure
        fields = ["node", "component", "severity", "state"]

    def filter_source(self, queryset: QuerySet[Exposure], name: str, value: str) -> QuerySet[Exposure]:
        return queryset.filter(findings.source_q(value)) if value else queryset

    def filter_joined(self, queryset: QuerySet[Exposure], name: str, value: bool | None) -> QuerySet[Exposure]:
        return queryset  # applied by the list (ExposureViewSet.filter_queryset), which knows its default

    def filter_overdue(self, queryset: QuerySet[Exposure], name: str, value: bool | None) -> QuerySet[Exposure]:
        late = Q(state=ExposureState.OPEN, deadline__lt=timezone.now())
        if value is None:
            return queryset
        return queryset.filter(late) if value else queryset.exclude(late)


# --- viewsets -----------------------------------------------------------------------------------


BY_PUBLIC_ID = extend_schema(parameters=[OpenApiParameter("id", OpenApiTypes.STR, OpenApiParameter.PATH,
                                                          description=PUBLIC)])


@extend_schema_view(retrieve=BY_PUBLIC_ID, vex=BY_PUBLIC_ID)
class AdvisoryViewSet(viewsets.ReadOnlyModelViewSet):
    filterset_class = AdvisoryFilter
    ordering_fields = ["initial_release_date", "current_release_date", "severity", "publisher_id", "title",
                       "open_exposures", "presumed_exposures"]
    search_fields = ["publisher_id", "title", "=cves__cve_id"]

    def get_queryset(self) -> QuerySet[Advisory]:
        open_items = ReviewItem.objects.filter(advisory=models.OuterRef("pk"), state=ReviewState.OPEN)
        queryset = Advisory.objects.prefetch_related("cves").annotate(
            open_exposures=Count("exposures", filter=Q(exposures__state=ExposureState.OPEN)),
            presumed_exposures=Count("exposures", filter=Q(exposures__state=ExposureState.PRESUMED)),
            open_review_items=Coalesce(models.Subquery(
                open_items.values("advisory").annotate(n=Count("id")).values("n")[:1]), 0),
        )
        return queryset

    def get_object(self) -> Advisory:
        """By public id (`/advisories/nvidia-5703/`): the database id is no address."""
        advisory = resolve(str(self.kwargs.get(self.lookup_url_kwarg or self.lookup_field, "")))
        if advisory is None:
            raise NotFound("no advisory with this public id (e.g. nvidia-5703)")
        found = self.get_queryset().get(pk=advisory.pk)
        self.check_object_permissions(self.request, found)
        return found

    def get_serializer_class(self) -> type[serializers.BaseSerializer]:
        return AdvisoryDetailSerializer if self.action == "retrieve" else AdvisorySerializer

    def get_serializer(self, *args: Any, **kwargs: Any) -> serializers.BaseSerializer:
        # A page of advisories: their coverage in four queries, not four per advisory.
        if kwargs.get("many") and args:
            kwargs["context"] = {**self.get_serializer_context(),
                                 "coverage": coverage.of_advisories([a.pk for a in args[0]])}
        return super().get_serializer(*args, **kwargs)

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    @action(detail=True, methods=["get"])
    def vex(self, request: Request, pk: str | None = None) -> Response:
        """The fleet's status for this bulletin as a CSAF 2.0 VEX document."""
        return Response(vex_document([self.get_object()]))


class CVEViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = CVE.objects.all()
    serializer_class = CVESerializer
    filterset_class = CVEFilter
    lookup_field = "cve_id"
    ordering_fields = ["cve_id", "base_score"]


class AffectedRangeViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = AffectedRange.objects.select_related("advisory").prefetch_related("cves")
    serializer_class = AffectedRangeSerializer
    filterset_class = AffectedRangeFilter


# The list's columns, read in one statement with their joins (ExposureSerializer's fields).
EXPOSURE_COLUMNS = (
    "id", "node_id", "node__name", "node__cluster__name", "advisory__publisher", "advisory__publisher_id",
    "affected_range_id", "component", "detected_version", "affected_range__fixed_version",
    "affected_range__remediation", "severity", "state", "first_seen", "deadline", "deadline_source",
    "fixed_by_version", "remediated_at", "remediated_by", "risk_approver__username", "risk_reason",
    "risk_expires_at", "justification")
EXPOSURE_TIMES = ("first_seen", "deadline", "remediated_at", "risk_expires_at")
LATE_STATES = (ExposureState.OPEN, ExposureState.PRESUMED)


def exposure_rows(ids: list[int]) -> list[dict[str, Any]]:
    """ExposureSerializer's rows for these exposures, in this order, from narrow reads (gpusweep.narrow)."""
    times = Times()
    columns = [f"{name}_" if name in EXPOSURE_TIMES else name for name in EXPOSURE_COLUMNS]
    rows = Exposure.objects.filter(among("id", ids)).order_by().annotate(
        **{f"{name}_": times.column(name) for name in EXPOSURE_TIMES},
        late=Q(state__in=LATE_STATES, deadline__lt=timezone.now()))
    raw = [dict(zip((*EXPOSURE_COLUMNS, "late"), values, strict=True)) for values in rows.values_list(*columns, "late")]
    cves: dict[int, list[str]] = {}
    for range_id, cve_id in AffectedRange.cves.through.objects.filter(
            affectedrange_id__in={r["affected_range_id"] for r in raw}).values_list("affectedrange_id", "cve__cve_id"):
        cves.setdefault(range_id, []).append(cve_id)
    joined = findings.joined({r["node_id"] for r in raw})  # one query where no node has two sources
    found = {}
    for r in raw:
        named = sorted(cves.get(r["affected_range_id"], []))
        found[r["id"]] = {
            "id": r["id"], "node": r["node_id"], "node_name": r["node__name"], "cluster": r["node__cluster__name"],
            "advisory": advisory_public_id(r["advisory__publisher"], r["advisory__publisher_id"]),
            "advisory_id": r["advisory__publisher_id"], "affected_range": r["affected_range_id"],
            "component": r["component"], "detected_version": r["detected_version"],
            "fixed_version": r["affected_range__fixed_version"], "severity": r["severity"], "cves": named,
            "state": r["state"], "first_seen": times.write(r["first_seen"]), "deadline": times.write(r["deadline"]),
            "deadline_source": r["deadline_source"], "overdue": bool(r["late"]),
            "fixed_by_version": r["fixed_by_version"], "remediated_at": times.write(r["remediated_at"]),
            "remediated_by": r["remediated_by"], "risk_approver": r["risk_approver__username"],
            "risk_reason": r["risk_reason"], "risk_expires_at": times.write(r["risk_expires_at"]),
            "justification": r["justification"], "remediation": r["affected_range__remediation"],
            "source": findings.DISTRIBUTION if r["component"] == OS_PACKAGE else findings.NVIDIA,
            "finding": findings.of_row(Exposure(node_id=r["node_id"]), joined, named) if joined else None,
        }
    return [found[i] for i in ids if i in found]


class ExposureViewSet(CachedListMixin, NarrowListMixin, viewsets.ReadOnlyModelViewSet):
    queryset = Exposure.objects.select_related(
        "node__cluster", "advisory", "affected_range", "risk_approver").prefetch_related("affected_range__cves")
    # Every table the list (its filters, ordering, search and serializer) reads (gpusweep.responses).
    # Of the nodes only their identity (id, name, cluster): heartbeats and campaign steps leave it cached.
    cache_tables = ("advisories_exposure", NODE_IDENTITY, "inventory_cluster", "advisories_advisory",
                    "advisories_affectedrange", "advisories_affectedrange_cves", "advisories_cve", "auth_user")
    # `overdue` compares with the clock: which rows match changes as deadlines pass.
    cache_uncacheable_params = ("overdue",)
    serializer_class = ExposureSerializer
    filterset_class = ExposureFilter
    ordering_fields = ["deadline", "first_seen", "severity", "state", "component", "node__name",
                       "node__cluster__name", "advisory__publisher_id"]
    search_fields = ["node__name", "advisory__publisher_id", "advisory__title", "component", "detected_version"]
    action_roles = {"accept_risk": {Role.APPROVER}, "revoke_risk": {Role.APPROVER}, "not_affected": {Role.APPROVER}}

    def filter_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        rows = super().filter_queryset(queryset)
        params = self.request.query_params
        joined = parse_bool(params.get("joined")) if params.get("joined") else not params.get("source")
        if self.action == "list" and joined:  # one row per finding (VEX reads every source itself)
            rows = rows.exclude(findings.merged())
        return rows

    def narrow_rows(self, ids: list[int]) -> list[dict[str, Any]]:
        return exposure_rows(ids)

    def cache_valid_until(self, rows: list[Any], started: dt.datetime) -> dt.datetime | None:
        # `overdue` flips when a deadline passes: the answer holds until the first one still ahead.
        # The page is its rows' ids (the list reads narrow: gpusweep.narrow), else the exposures.
        if rows and not isinstance(rows[0], Exposure):
            rows = list(Exposure.objects.filter(pk__in=rows).only("state", "deadline"))
        ahead = [e.deadline for e in rows if e.state in LATE_STATES and e.deadline is not None
                 and e.deadline >= started]
        return min(ahead, default=None)

    def _decide(self, decide: Callable[[], Any]) -> Response:
        return decision_response(self, decide)

    @extend_schema(request=RiskAcceptanceSerializer)
    @action(detail=True, methods=["post"])
    def accept_risk(self, request: Request, pk: str | None = None) -> Response:
        """An approver accepts the risk until an expiry, with a reason; the exposure stays listed."""
        body = RiskAcceptanceSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return self._decide(lambda: services.accept_risk(
            int(pk or 0), request.user, body.validated_data["reason"], body.validated_data["expires_at"]))

    @extend_schema(request=None)
    @action(detail=True, methods=["post"])
    def revoke_risk(self, request: Request, pk: str | None = None) -> Response:
        return self._decide(lambda: services.revoke_risk(int(pk or 0), request.user))

    @action(detail=True, methods=["post"])
    def not_affected(self, request: Request, pk: str | None = None) -> Response:
        """An approver sets a (presumed) exposure not affected, with a CSAF/VEX justification and a reason."""
        body = NotAffectedSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return self._decide(lambda: services.mark_not_affected(
            int(pk or 0), request.user, body.validated_data["justification"], body.validated_data["reason"]))

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    @action(detail=False, methods=["get"])
    def vex(self, request: Request) -> Response:
        """CSAF 2.0 VEX for the filtered exposures' bulletins (e.g. ?advisory=nvidia-5703&cluster=prod)."""
        exposures = self.filter_queryset(self.get_queryset())
        advisories = Advisory.objects.filter(id__in=exposures.values("advisory_id")).prefetch_related("cves")
        named = resolve(request.query_params.get("advisory") or "")
        if named is not None:  # an unknown one was refused by the filter
            advisories = Advisory.objects.filter(pk=named.pk).prefetch_related("cves")
        # Filtered to some exposures (a state, a cluster ...): those only, not the rest of the inventory.
        unfiltered = set(request.query_params) <= {"advisory", "format"}
        return Response(vex_document(advisories.order_by("publisher_id"), exposures, inventory=unfiltered))


class ReviewItemFilter(FilterSet):
    advisory = PublicAdvisoryFilter(field_name="advisory")

    class Meta:
        model = ReviewItem
        fields = ["kind", "state", "component"]


class ReviewItemViewSet(viewsets.ReadOnlyModelViewSet):
    """What the parser could not decode or map; admins map (to a range) or dismiss each item."""

    queryset = ReviewItem.objects.select_related("advisory", "resolved_by")
    serializer_class = ReviewItemSerializer
    filterset_class = ReviewItemFilter
    action_roles = {"map": {Role.ADMIN}, "dismiss": {Role.ADMIN}}

    @action(detail=True, methods=["post"])
    def map(self, request: Request, pk: str | None = None) -> Response:
        """Body: {"mapping": {"component", "upper" or "fixed_version", ...}, "reason"}."""
        body = ResolutionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if not body.validated_data.get("mapping"):
            return Response({"mapping": ["required: the range this row means"]}, status=status.HTTP_400_BAD_REQUEST)
        return decision_response(self, lambda: services.map_review_item(
            int(pk or 0), request.user, body.validated_data["mapping"], body.validated_data["reason"]))

    @action(detail=True, methods=["post"])
    def dismiss(self, request: Request, pk: str | None = None) -> Response:
        body = ResolutionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return decision_response(self, lambda: services.dismiss_review_item(
            int(pk or 0), request.user, body.validated_data["reason"]))


def decision_response(view: viewsets.GenericViewSet, decide: Callable[[], Any]) -> Response:
    """Run a decision service for the view's object: its new state, 409 when it was in another
    state already, 400 when the input is wrong (nothing changed either way)."""
    view.get_object()  # 404 for an unknown id
    try:
        decided = decide()
    except services.DecisionError as exc:
        return Response({"detail": str(exc)},
                        status=status.HTTP_409_CONFLICT if exc.conflict else status.HTTP_400_BAD_REQUEST)
    return Response(view.get_serializer(view.get_queryset().get(pk=decided.pk)).data)


class DeadlinePolicyViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """GET the policy; PUT/PATCH /deadline-policy/current/ (admins): answered at once, every
    deadline follows in a task while the policy reads `recomputing: true`."""

    serializer_class = DeadlinePolicySerializer
    write_roles = {Role.ADMIN}

    def get_queryset(self) -> QuerySet[DeadlinePolicy]:
        DeadlinePolicy.current()
        return DeadlinePolicy.objects.filter(pk=1)

    def get_object(self) -> DeadlinePolicy:
        return DeadlinePolicy.current()

    @action(detail=False, methods=["get", "put", "patch"])
    def current(self, request: Request) -> Response:
        policy = self.get_object()
        if request.method == "GET":
            return Response(self.get_serializer(policy).data)
        serializer = self.get_serializer(policy, data=request.data, partial=request.method == "PATCH")
        serializer.is_valid(raise_exception=True)
        with transaction.atomic():
            serializer.save()
            services.deadlines_changed()
        return Response(self.get_serializer(self.get_object()).data)


class ClusterDeadlineOverrideViewSet(viewsets.ModelViewSet):
    queryset = ClusterDeadlineOverride.objects.all()
    serializer_class = ClusterDeadlineOverrideSerializer
    filterset_fields = ["cluster", "severity"]
    write_roles = {Role.ADMIN}

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        with transaction.atomic():
            serializer.save()
            services.deadlines_changed()

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        with transaction.atomic():
            serializer.save()
            services.deadlines_changed()

    def perform_destroy(self, instance: ClusterDeadlineOverride) -> None:
        with transaction.atomic():
            instance.delete()
            services.deadlines_changed()


router = ApiRouter()
router.register("advisories", AdvisoryViewSet, basename="advisory")
router.register("cves", CVEViewSet, basename="cve")
router.register("ranges", AffectedRangeViewSet, basename="range")
router.register("exposures", ExposureViewSet, basename="exposure")
router.register("review-items", ReviewItemViewSet, basename="review-item")
router.register("deadline-policy", DeadlinePolicyViewSet, basename="deadline-policy")
router.register("deadline-overrides", ClusterDeadlineOverrideViewSet, basename="deadline-override")
