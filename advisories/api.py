"""REST API under /api/v1/advisories/: advisories, CVEs, ranges, exposures, deadline policy."""

from __future__ import annotations

from typing import Any

import django_filters
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from advisories.choices import ExposureState, Severity
from advisories.exposure import assign_deadlines
from advisories.models import CVE, Advisory, AffectedRange, ClusterDeadlineOverride, DeadlinePolicy, Exposure
from gpusweep.filters import DateTimeFilter, FilterSet
from gpusweep.roles import Role
from gpusweep.routers import ApiRouter

# --- serializers ---------------------------------------------------------------------------

MAX_DEADLINE_DAYS = 3650


class CVESerializer(serializers.ModelSerializer):
    class Meta:
        model = CVE
        fields = ["id", "cve_id", "description", "cvss_vector", "base_score", "severity", "cwe_id", "cwe_name",
                  "release_date"]


class AffectedRangeSerializer(serializers.ModelSerializer):
    cves: serializers.SlugRelatedField[CVE] = serializers.SlugRelatedField(
        slug_field="cve_id", many=True, read_only=True
    )
    advisory = serializers.CharField(source="advisory.publisher_id", read_only=True)

    class Meta:
        model = AffectedRange
        fields = ["id", "advisory", "product_id", "product_name", "architecture", "component", "os_family", "branch",
                  "product_line", "raw", "lower_version", "lower_inclusive", "upper_version", "upper_inclusive",
                  "fixed_version", "severity", "cves"]


class AdvisorySerializer(serializers.ModelSerializer):
    cves: serializers.SlugRelatedField[CVE] = serializers.SlugRelatedField(
        slug_field="cve_id", many=True, read_only=True
    )
    open_exposures = serializers.IntegerField(read_only=True, required=False)

    class Meta:
        model = Advisory
        fields = ["id", "publisher", "publisher_id", "title", "tracking_version", "status", "revision_history",
                  "initial_release_date", "current_release_date", "severity", "summary", "source_kind", "source",
                  "content_sha256", "published_sha256", "integrity", "unparsed", "ranges_unknown", "history",
                  "cves", "open_exposures", "created_at", "updated_at"]


class AdvisoryDetailSerializer(AdvisorySerializer):
    ranges = AffectedRangeSerializer(many=True, read_only=True)

    class Meta(AdvisorySerializer.Meta):
        fields = [*AdvisorySerializer.Meta.fields, "ranges"]


class ExposureSerializer(serializers.ModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True)
    cluster = serializers.CharField(source="node.cluster.name", read_only=True)
    advisory_id = serializers.CharField(source="advisory.publisher_id", read_only=True)
    fixed_version = serializers.CharField(source="affected_range.fixed_version", read_only=True)
    cves = serializers.SerializerMethodField()
    overdue = serializers.SerializerMethodField()
    risk_approver = serializers.CharField(source="risk_approver.username", read_only=True, default=None,
                                          allow_null=True)

    class Meta:
        model = Exposure
        fields = ["id", "node", "node_name", "cluster", "advisory", "advisory_id", "affected_range", "component",
                  "detected_version", "fixed_version", "severity", "cves", "state", "first_seen", "deadline",
                  "deadline_source", "overdue", "fixed_by_version", "remediated_at", "remediated_by", "risk_approver",
                  "risk_reason", "risk_expires_at"]
        read_only_fields = fields

    def get_cves(self, obj: Exposure) -> list[str]:
        return sorted(c.cve_id for c in obj.affected_range.cves.all())

    def get_overdue(self, obj: Exposure) -> bool:
        return obj.state == ExposureState.OPEN and obj.deadline is not None and obj.deadline < timezone.now()


class RiskAcceptanceSerializer(serializers.Serializer):
    reason = serializers.CharField(min_length=10)
    expires_at = serializers.DateTimeField()

    def validate_expires_at(self, value: Any) -> Any:
        if value <= timezone.now():
            raise serializers.ValidationError("expiry must be in the future")
        return value


class DeadlinePolicySerializer(serializers.ModelSerializer):
    class Meta:
        model = DeadlinePolicy
        fields = ["critical_days", "high_days", "medium_days", "low_days", "basis", "use_kev", "updated_at"]
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
    severity = django_filters.MultipleChoiceFilter(choices=Severity.choices())
    cve = django_filters.CharFilter(field_name="cves__cve_id", lookup_expr="iexact")
    published_after = DateTimeFilter(field_name="initial_release_date", lookup_expr="gte")

    class Meta:
        model = Advisory
        fields = ["publisher", "publisher_id", "severity", "integrity", "ranges_unknown", "source_kind"]


class CVEFilter(FilterSet):
    severity = django_filters.MultipleChoiceFilter(choices=Severity.choices())
    advisory = django_filters.CharFilter(field_name="advisories__publisher_id")

    class Meta:
        model = CVE
        fields = ["cve_id", "severity", "cwe_id"]


class AffectedRangeFilter(FilterSet):
    advisory = django_filters.CharFilter(field_name="advisory__publisher_id")

    class Meta:
        model = AffectedRange
        fields = ["component", "os_family", "branch", "product_line"]


class ExposureFilter(FilterSet):
    severity = django_filters.MultipleChoiceFilter(choices=Severity.choices())
    state = django_filters.MultipleChoiceFilter(choices=ExposureState.choices())
    cluster = django_filters.CharFilter(field_name="node__cluster__name")
    advisory = django_filters.CharFilter(field_name="advisory__publisher_id")
    overdue = django_filters.BooleanFilter(method="filter_overdue")

    class Meta:
        model = Exposure
        fields = ["node", "component", "severity", "state"]

    def filter_overdue(self, queryset: QuerySet[Exposure], name: str, value: bool | None) -> QuerySet[Exposure]:
        late = Q(state=ExposureState.OPEN, deadline__lt=timezone.now())
        if value is None:
            return queryset
        return queryset.filter(late) if value else queryset.exclude(late)


# --- viewsets -----------------------------------------------------------------------------------


class AdvisoryViewSet(viewsets.ReadOnlyModelViewSet):
    filterset_class = AdvisoryFilter
    ordering_fields = ["initial_release_date", "current_release_date", "severity", "publisher_id"]

    def get_queryset(self) -> QuerySet[Advisory]:
        from django.db.models import Count

        return Advisory.objects.prefetch_related("cves").annotate(
            open_exposures=Count("exposures", filter=Q(exposures__state=ExposureState.OPEN))
        )

    def get_serializer_class(self) -> type[serializers.BaseSerializer]:
        return AdvisoryDetailSerializer if self.action == "retrieve" else AdvisorySerializer


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


class ExposureViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Exposure.objects.select_related(
        "node__cluster", "advisory", "affected_range", "risk_approver").prefetch_related("affected_range__cves")
    serializer_class = ExposureSerializer
    filterset_class = ExposureFilter
    ordering_fields = ["deadline", "first_seen", "severity"]
    action_roles = {"accept_risk": {Role.APPROVER}, "revoke_risk": {Role.APPROVER}}

    @extend_schema(request=RiskAcceptanceSerializer)
    @action(detail=True, methods=["post"])
    def accept_risk(self, request: Request, pk: str | None = None) -> Response:
        """An approver accepts the risk until an expiry, with a reason; the exposure stays listed."""
        body = RiskAcceptanceSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        with transaction.atomic():
            updated = Exposure.objects.filter(pk=self.get_object().pk, state__in=ExposureState.ACTIVE).update(
                state=ExposureState.RISK_ACCEPTED, risk_approver=request.user,
                risk_reason=body.validated_data["reason"], risk_expires_at=body.validated_data["expires_at"],
                updated_at=timezone.now(),
            )
        exposure = self.get_object()
        if not updated:
            return Response({"detail": f"exposure {pk} is {exposure.state}; only open exposures can be accepted"},
                            status=status.HTTP_409_CONFLICT)
        return Response(self.get_serializer(exposure).data)

    @extend_schema(request=None)
    @action(detail=True, methods=["post"])
    def revoke_risk(self, request: Request, pk: str | None = None) -> Response:
        Exposure.objects.filter(pk=self.get_object().pk, state=ExposureState.RISK_ACCEPTED).update(
            state=ExposureState.OPEN, updated_at=timezone.now())
        return Response(self.get_serializer(self.get_object()).data)


class DeadlinePolicyViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """GET the policy; PUT/PATCH /deadline-policy/current/ (admins) and every deadline follows."""

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
            assign_deadlines(refresh=True)
        return Response(serializer.data)


class ClusterDeadlineOverrideViewSet(viewsets.ModelViewSet):
    queryset = ClusterDeadlineOverride.objects.all()
    serializer_class = ClusterDeadlineOverrideSerializer
    filterset_fields = ["cluster", "severity"]
    write_roles = {Role.ADMIN}

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        with transaction.atomic():
            serializer.save()
            assign_deadlines(refresh=True)

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        with transaction.atomic():
            serializer.save()
            assign_deadlines(refresh=True)

    def perform_destroy(self, instance: ClusterDeadlineOverride) -> None:
        with transaction.atomic():
            instance.delete()
            assign_deadlines(refresh=True)


router = ApiRouter()
router.register("advisories", AdvisoryViewSet, basename="advisory")
router.register("cves", CVEViewSet, basename="cve")
router.register("ranges", AffectedRangeViewSet, basename="range")
router.register("exposures", ExposureViewSet, basename="exposure")
router.register("deadline-policy", DeadlinePolicyViewSet, basename="deadline-policy")
router.register("deadline-overrides", ClusterDeadlineOverrideViewSet, basename="deadline-override")
