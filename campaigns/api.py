"""REST API under /api/v1/campaigns/: campaigns and their actions, node sweeps, evidence.

Operators create, plan, start, pause, resume and abort; approvers approve (never their own
campaign); every role reads.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

import django_filters
from django.contrib.auth.models import User
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from advisories.identifiers import PublicAdvisoryField
from campaigns import board, evidence, services
from campaigns.choices import CampaignStatus
from campaigns.models import Campaign, EvidenceEvent, NodeSweep, Plan, WorkloadMove
from gpusweep.filters import FilterSet, MultipleChoiceFilter
from gpusweep.roles import Role
from gpusweep.routers import ApiRouter

WEEK_S = 7 * 24 * 3600

APPROVAL_SUMMARY = inline_serializer("ApprovalSummary", {
    "user": serializers.CharField(), "plan": serializers.IntegerField(), "at": serializers.DateTimeField()},
    many=True)


class CampaignSerializer(serializers.ModelSerializer):
    requested_by = serializers.CharField(source="requested_by.username", read_only=True, default=None,
                                         allow_null=True)
    approvals = serializers.SerializerMethodField()
    # Public ids in and out (["nvidia-5703"]): an advisory's database id is no part of the API.
    advisories = PublicAdvisoryField(many=True, required=False)

    class Meta:
        model = Campaign
        fields = [
            "id", "name", "description", "advisories", "requested_by", "status", "status_reason", "clusters", "pools",
            "canary", "soak_s", "wave_growth", "growth_step", "soak_started_at",
            "node_selector", "last_group", "target_versions", "parallelism_per_cluster", "parallelism_per_pool",
            "windows", "blackouts", "error_budget", "workload_policy", "wait_limit", "cold_restart_allowed",
            "workload_placement", "held_nodes", "workload_overrides", "approvals_required", "deadline",
            "step_timeout_s", "node_estimate_s", "dcgm_level", "site_checks", "after_rollback", "rollback_of",
            "approved_plan", "approvals", "started_at", "finished_at", "evidence_seq", "evidence_head", "created_at",
        ]
        read_only_fields = ["status", "status_reason", "approved_plan", "started_at", "finished_at", "soak_started_at",
                            "rollback_of",
                            "evidence_seq", "evidence_head", "created_at"]
        # Bounded: a larger duration overflows SQLite's integer column, and the planner's times
        # must stay dates (a server error either way).
        extra_kwargs = {"wait_limit": {"max_value": timedelta(days=366), "min_value": timedelta(0)},
                        "step_timeout_s": {"min_value": 1, "max_value": WEEK_S},
                        "node_estimate_s": {"min_value": 1, "max_value": WEEK_S}}

    @extend_schema_field(APPROVAL_SUMMARY)
    def get_approvals(self, obj: Campaign) -> list[dict[str, Any]]:
        return [{"user": str(a.user), "plan": a.plan_id, "at": a.at} for a in obj.approvals.all()]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # The services' own check, so the API and the UI refuse exactly the same campaigns.
        checked = {k: v for k, v in attrs.items() if k in services.DEFINITION_FIELDS}
        if "pools" in checked and "clusters" not in checked and self.instance is not None:
            checked["clusters"] = self.instance.clusters
        errors = services.definition_errors(checked)
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class PlanSerializer(serializers.ModelSerializer):
    class Meta:
        model = Plan
        fields = ["id", "campaign", "version", "created_at", "created_by", "summary", "content"]


class MoveSerializer(serializers.ModelSerializer):
    target_node = serializers.CharField(source="target_node.name", read_only=True, default=None, allow_null=True)

    class Meta:
        model = WorkloadMove
        fields = ["workload_ref", "workload_name", "gpus", "policy", "state", "target_node", "checkpoint_id",
                  "checkpoint_sha256", "steps_before", "steps_after", "new_workload_ref", "detail"]


class NodeSweepSerializer(serializers.ModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True)
    moves = MoveSerializer(many=True, read_only=True)

    class Meta:
        model = NodeSweep
        fields = ["id", "campaign", "node", "node_name", "wave", "position", "state", "target", "planned",
                  "versions_before",
                  "versions_after", "attempt", "step_started_at", "step_deadline", "patched_at", "waiting_since",
                  "error", "moves"]


class EventSerializer(serializers.ModelSerializer):
    class Meta:
        model = EvidenceEvent
        fields = ["id", "campaign", "sweep", "seq", "node_seq", "kind", "actor", "at", "data", "prev_hash", "hash"]


class CampaignFilter(FilterSet):
    status = MultipleChoiceFilter(choices=CampaignStatus.choices())
    name = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Campaign
        fields = ["status", "name"]


class NodeSweepFilter(FilterSet):
    state = MultipleChoiceFilter(choices=NodeSweep._meta.get_field("state").choices)

    class Meta:
        model = NodeSweep
        fields = ["campaign", "node", "state", "wave"]


class EventFilter(FilterSet):
    class Meta:
        model = EvidenceEvent
        fields = ["campaign", "sweep", "kind"]


class LastGroupSerializer(serializers.Serializer):
    nodes = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=2**63 - 1), required=False)


def _user(request: Request) -> User:
    return cast(User, request.user)


def _body(request: Request) -> dict[str, Any]:
    return request.data if isinstance(request.data, dict) else {}


def _error(exc: services.CampaignError) -> Response:
    return Response({"detail": str(exc)}, status=exc.status)


class CampaignViewSet(viewsets.ModelViewSet):
    queryset = Campaign.objects.select_related("requested_by").prefetch_related("approvals__user")
    serializer_class = CampaignSerializer
    filterset_class = CampaignFilter
    ordering_fields = ["created_at", "deadline", "status", "name", "started_at", "finished_at"]
    search_fields = ["name", "description"]
    extra_query_params = {"compare": {"old", "new"}}
    write_roles = {Role.OPERATOR}
    # The console's table of who may do what (campaigns.board), so the UI and the API agree.
    action_roles = {**{name: {role} for name, role in board.ACTION_ROLES.items()},
                    "seal": {Role.OPERATOR, Role.APPROVER}}
    http_method_names = ["get", "post", "patch", "put", "head", "options"]

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        values, advisories = _definition(serializer.validated_data)
        try:
            campaign = services.create_campaign(_user(request), values, advisories)
        except services.CampaignError as exc:
            return _error(exc)
        return Response(self.get_serializer(Campaign.objects.get(pk=campaign.pk)).data, status=status.HTTP_201_CREATED)

    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        campaign = self.get_object()
        serializer = self.get_serializer(campaign, data=request.data, partial=kwargs.get("partial", False))
        serializer.is_valid(raise_exception=True)
        values, advisories = _definition(serializer.validated_data)
        try:
            # An edit voids the plan's approvals: the campaign goes back to draft.
            services.update_campaign(campaign.pk, _user(request), values,
                                     advisories if "advisories" in serializer.validated_data else None)
        except services.CampaignError as exc:
            return _error(exc)
        return Response(self.get_serializer(Campaign.objects.get(pk=campaign.pk)).data)

    @extend_schema(request=LastGroupSerializer)
    @action(detail=True, methods=["post"])
    def add_last_group(self, request: Request, pk: str | None = None) -> Response:
        """Take the plan's offer: {"nodes": [ids]} (default: the newest plan's exposed receivers)."""
        campaign = self.get_object()
        body = LastGroupSerializer(data=_body(request))
        body.is_valid(raise_exception=True)
        nodes = body.validated_data.get("nodes")
        if nodes is None:
            newest = campaign.plans.order_by("-version").first()
            nodes = [r["node"] for r in (newest.content.get("exposed_receivers", []) if newest else [])]
        if not isinstance(nodes, list) or not nodes:
            return Response({"detail": "nodes: a non-empty list of node ids (or a plan with exposed receivers)"},
                            status=400)
        try:
            services.add_last_group(campaign.pk, _user(request), nodes)
        except services.CampaignError as exc:
            return _error(exc)
        return Response(self.get_serializer(Campaign.objects.get(pk=campaign.pk)).data)

    @extend_schema(
        request=inline_serializer("PlanRequest", {"dry_run": serializers.BooleanField(required=False)}),
        responses={201: PlanSerializer, 200: inline_serializer("PlanPreview", {
            "dry_run": serializers.BooleanField(), "content": serializers.JSONField()})})
    @action(detail=True, methods=["post"])
    def plan(self, request: Request, pk: str | None = None) -> Response:
        """Plan: stored as a new version; with {"dry_run": true} only previewed."""
        campaign = self.get_object()
        try:
            if _body(request).get("dry_run"):
                return Response({"dry_run": True, "content": services.compute_plan(campaign)})
            stored = services.make_plan(campaign.pk, _user(request))
        except services.CampaignError as exc:
            return _error(exc)
        return Response(PlanSerializer(stored).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses=PlanSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)
    def plans(self, request: Request, pk: str | None = None) -> Response:
        campaign = self.get_object()
        return Response(PlanSerializer(campaign.plans.order_by("-version"), many=True).data)

    @extend_schema(parameters=[OpenApiParameter("old", int), OpenApiParameter("new", int)],
                   responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["get"])
    def compare(self, request: Request, pk: str | None = None) -> Response:
        """?old=1&new=2 compares two versions; without `new`, the newest (or `old`) with a fresh re-plan."""
        campaign = self.get_object()
        try:
            old = int(request.query_params["old"]) if "old" in request.query_params else None
            new = int(request.query_params["new"]) if "new" in request.query_params else None
        except ValueError:
            return Response({"detail": "old and new are plan version numbers"}, status=400)
        try:
            return Response(services.compare_plans(campaign, old, new))
        except services.CampaignError as exc:
            return _error(exc)

    @extend_schema(request=inline_serializer("ApproveRequest", {"comment": serializers.CharField(required=False)}))
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        self.get_object()  # 404 for an unknown or malformed id
        try:
            campaign = services.approve(int(pk or 0), _user(request), str(_body(request).get("comment", "")))
        except services.CampaignError as exc:
            return _error(exc)
        return Response(self.get_serializer(Campaign.objects.get(pk=campaign.pk)).data)

    def _lifecycle(self, request: Request, pk: str | None, name: str) -> Response:
        self.get_object()
        user = _user(request)
        try:
            if name == "abort":
                campaign = services.abort(int(pk or 0), user, str(_body(request).get("reason", "")))
            else:
                campaign = getattr(services, name)(int(pk or 0), user)
        except services.CampaignError as exc:
            return _error(exc)
        return Response(self.get_serializer(Campaign.objects.get(pk=campaign.pk)).data)

    @extend_schema(request=None)
    @action(detail=True, methods=["post"])
    def start(self, request: Request, pk: str | None = None) -> Response:
        return self._lifecycle(request, pk, "start")

    @extend_schema(request=None)
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, pk: str | None = None) -> Response:
        return self._lifecycle(request, pk, "pause")

    @extend_schema(request=None)
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str | None = None) -> Response:
        return self._lifecycle(request, pk, "resume")

    @extend_schema(request=inline_serializer("AbortRequest", {"reason": serializers.CharField(required=False)}))
    @action(detail=True, methods=["post"])
    def abort(self, request: Request, pk: str | None = None) -> Response:
        return self._lifecycle(request, pk, "abort")

    @extend_schema(request=None, responses={201: CampaignSerializer(many=True)})
    @action(detail=True, methods=["post"], url_path="rollback-completed")
    def rollback_completed(self, request: Request, pk: str | None = None) -> Response:
        """New draft campaigns taking this halted campaign's completed nodes back to their previous versions."""
        self.get_object()
        try:
            created = services.rollback_completed(int(pk or 0), _user(request))
        except services.CampaignError as exc:
            return _error(exc)
        return Response(self.get_serializer(Campaign.objects.filter(pk__in=[c.pk for c in created]).order_by("pk"),
                                            many=True).data, status=201)

    @extend_schema(responses=inline_serializer("EvidenceExport", {
        "format": serializers.CharField(), "campaign": serializers.DictField(),
        "sweeps": serializers.ListField(child=serializers.DictField()),
        "events": serializers.ListField(child=serializers.DictField()),
        "seals": serializers.ListField(child=serializers.DictField()), "public_key": serializers.CharField(),
        "key_id": serializers.CharField(), "verify_with": serializers.CharField(),
        "intact": serializers.BooleanField(), "problems": serializers.ListField(child=serializers.CharField())}))
    @action(detail=True, methods=["get"])
    def evidence(self, request: Request, pk: str | None = None) -> Response:
        """The whole log with its signed seals and, for events after the newest stored seal, an "export" seal
        signed now and not stored (a GET writes nothing; POST .../seal/ stores one). The auditor's export:
        check it offline with `python -m campaigns.verify --digests`; and the result of checking it now."""
        campaign = self.get_object()
        exported = evidence.export_for_reading(campaign.pk)  # a GET writes nothing (seal: POST .../seal/)
        problems = evidence.verify_campaign(campaign)
        return Response({**exported, "intact": not problems, "problems": problems})

    @extend_schema(request=None, responses={201: inline_serializer("Seal", {
        "number": serializers.IntegerField(), "body": serializers.DictField(), "signature": serializers.CharField(),
        "key_id": serializers.CharField()})})
    @action(detail=True, methods=["post"])
    def seal(self, request: Request, pk: str | None = None) -> Response:
        """Sign the current chain heads now (stored and recorded in the campaign chain)."""
        campaign = self.get_object()
        services.seal_now(campaign.pk, _user(request))
        newest = campaign.seals.order_by("-number").first()
        assert newest is not None
        return Response({"number": newest.number, "body": newest.body, "signature": newest.signature,
                         "key_id": newest.key_id}, status=status.HTTP_201_CREATED)


def _definition(validated: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
    values = {k: v for k, v in validated.items() if k in services.DEFINITION_FIELDS}
    advisories = [a.pk for a in validated.get("advisories", [])]
    return values, advisories


class NodeSweepViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = NodeSweep.objects.select_related("node").prefetch_related("moves__target_node")
    serializer_class = NodeSweepSerializer
    filterset_class = NodeSweepFilter
    ordering_fields = ["wave", "position", "state", "updated_at"]


class EvidenceEventViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = EvidenceEvent.objects.all()
    serializer_class = EventSerializer
    filterset_class = EventFilter
    ordering_fields = ["seq", "at"]


router = ApiRouter()
router.register("campaigns", CampaignViewSet)
router.register("sweeps", NodeSweepViewSet)
router.register("events", EvidenceEventViewSet)
