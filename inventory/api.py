"""REST API under /api/v1/inventory/: clusters, nodes, workloads, changes, agent heartbeats.

Reads need any role, writes need admin (gpusweep.roles.RolePermission). Node filters include
component version ranges compared in the database through the sortable keys:
`?component=driver&version_gte=570.0&version_lt=570.195.03`, plus `branch=R570` and
`flagged=true` (versions stored raw because their format is unknown).
"""

from __future__ import annotations

from typing import Any

import django_filters
from django.db import transaction
from django.db.models import Count, Exists, OuterRef, Q, QuerySet
from django.urls import URLPattern, URLResolver, path
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from gpusweep import registry, secret_env
from gpusweep.filters import BooleanFilter, DateTimeFilter, FilterSet, IntegerFilter, MultipleChoiceFilter
from gpusweep.narrow import NarrowListMixin, Times, among, json_column, json_value
from gpusweep.responses import CachedListMixin
from gpusweep.routers import ApiRouter
from inventory import agent
from inventory.choices import ChangeAction, ChangeSource, CheckpointEngine, ClusterKind, ServiceState
from inventory.models import ChangeLog, Cluster, Node, NodeComponent, Workload
from inventory.services import InventoryError, check_labels
from inventory.versions import VersionError, normalize_component, parse_version

# --- serializers ---------------------------------------------------------------------------

SECRET_WORDS = ("token", "password", "secret", "private", "credential", "apikey", "api_key")


class ClusterSerializer(serializers.ModelSerializer):
    node_count = serializers.SerializerMethodField(help_text="nodes not gone")

    class Meta:
        model = Cluster
        fields = ["id", "name", "kind", "description", "connection", "secret_env", "sync_enabled", "last_synced_at",
                  "last_sync_error", "created_at", "node_count"]
        read_only_fields = ["last_synced_at", "last_sync_error", "created_at"]

    def validate_connection(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise ValidationError("expected an object of connection settings")
        secret_like = sorted(k for k in value if any(w in k.lower() for w in SECRET_WORDS))
        if secret_like:
            raise ValidationError(
                f"{', '.join(secret_like)}: secrets never go in the database; name an environment variable "
                "in secret_env instead"
            )
        if "executor" in value and (problem := registry.executor_problem(value["executor"])):
            raise ValidationError(f"connection.executor: {problem}")
        return value

    def validate_secret_env(self, value: Any) -> dict[str, str]:
        # Names of environment variables only: a value that looks like a secret is refused.
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v.replace("_", "").isalnum() and v.upper() == v
            for k, v in value.items()
        ):
            raise ValidationError("map each secret to the NAME of an environment variable "
                                  "(e.g. GPUSWEEP_SECRET_KUBE_TOKEN)")
        problems = [f"{k}: {p}" for k, v in value.items() if (p := secret_env.problem(v))]
        if problems:
            raise ValidationError(problems)
        return value

    def get_node_count(self, obj: Cluster) -> int:
        annotated = getattr(obj, "live_nodes", None)
        return annotated if annotated is not None else obj.nodes.exclude(service_state=ServiceState.GONE).count()


class ComponentSerializer(serializers.ModelSerializer):
    flagged = serializers.BooleanField(read_only=True)

    class Meta:
        model = NodeComponent
        fields = ["component", "version", "branch", "flagged", "source", "updated_at"]


class NodeSerializer(serializers.ModelSerializer):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    components = ComponentSerializer(many=True, read_only=True)
    # Empty when the node has no agent, so not a URI in the schema.
    agent_endpoint = serializers.CharField(read_only=True, help_text="the agent's URL; empty when none")

    class Meta:
        model = Node
        fields = ["id", "cluster", "cluster_name", "name", "pool", "labels", "gpu_model", "gpu_count", "product_line",
                  "os_family", "cpu_milli", "memory_mib", "scheduler_state", "service_state", "agent_endpoint",
                  "fact_sources", "fact_conflicts", "last_seen", "gone_at", "created_at", "updated_at", "components"]
        # Sources own what they observe; people may set grouping and availability.
        read_only_fields = ["cluster", "name", "gpu_model", "gpu_count", "product_line", "os_family", "cpu_milli",
                            "memory_mib", "scheduler_state", "agent_endpoint", "fact_sources", "fact_conflicts",
                            "last_seen", "gone_at", "created_at", "updated_at"]

    def validate_labels(self, value: Any) -> dict[str, str]:
        try:
            check_labels(value)
        except InventoryError as exc:
            raise ValidationError(str(exc)) from None
        return value


class WorkloadSerializer(serializers.ModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True, default=None, allow_null=True)
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    node_names: serializers.SlugRelatedField[Node] = serializers.SlugRelatedField(
        source="nodes", slug_field="name", many=True, read_only=True
    )

    class Meta:
        model = Workload
        fields = ["id", "cluster", "cluster_name", "node", "node_name", "node_names", "kind", "scheduler_id", "name",
                  "user", "state",
                  "gpus", "started_at", "time_limit", "checkpoint_engine", "policy", "owner", "engine",
                  "engine_version", "model_name", "model_version", "last_seen", "gone_at"]
        read_only_fields = [f for f in fields if f not in ("policy", "checkpoint_engine")]

    def validate_checkpoint_engine(self, value: Any) -> str:
        # The registered engines only (executors.portability): any other name made every later plan a 500.
        if not isinstance(self.initial_data.get("checkpoint_engine"), str) or value not in CheckpointEngine.values():
            raise ValidationError(f"one of the registered checkpoint engines: {', '.join(CheckpointEngine.values())}")
        return str(value)


class ChangeLogSerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="user.username", read_only=True, default=None, allow_null=True)

    class Meta:
        model = ChangeLog
        fields = ["id", "time", "source", "action", "object_type", "object_id", "object_repr", "changes", "user"]


# --- filters -------------------------------------------------------------------------------


class ClusterFilter(FilterSet):
    class Meta:
        model = Cluster
        fields = {"name": ["exact"], "kind": ["exact"], "sync_enabled": ["exact"]}


class NodeFilter(FilterSet):
    cluster = django_filters.CharFilter(field_name="cluster__name")
    cluster_id = IntegerFilter(field_name="cluster_id", min_value=1)
    pool = django_filters.CharFilter()
    gpu_model = django_filters.CharFilter()
    state = MultipleChoiceFilter(field_name="service_state", choices=ServiceState.choices())
    name = django_filters.CharFilter(lookup_expr="icontains")
    component = django_filters.CharFilter(method="filter_noop", help_text="component for the version filters")
    version = django_filters.CharFilter(method="filter_noop", help_text="exact version of `component`")
    version_gte = django_filters.CharFilter(method="filter_noop")
    version_gt = django_filters.CharFilter(method="filter_noop")
    version_lte = django_filters.CharFilter(method="filter_noop")
    version_lt = django_filters.CharFilter(method="filter_noop")
    branch = django_filters.CharFilter(method="filter_noop", help_text="driver branch, e.g. R570")
    flagged = BooleanFilter(method="filter_noop", help_text="versions in an unknown format")

    class Meta:
        model = Node
        fields = ["cluster", "cluster_id", "pool", "gpu_model", "state", "name"]

    def filter_noop(self, queryset: QuerySet[Node], name: str, value: Any) -> QuerySet[Node]:
        return queryset  # applied together in filter_queryset (one EXISTS per component)

    def filter_queryset(self, queryset: QuerySet[Node]) -> QuerySet[Node]:
        queryset = super().filter_queryset(queryset)
        data = self.form.cleaned_data
        ranges = {k: data.get(k) for k in ("version", "version_gte", "version_gt", "version_lte", "version_lt")}
        branch, flagged = data.get("branch"), data.get("flagged")
        component = data.get("component")
        if not component:
            if any(ranges.values()) or flagged is not None:
                raise ValidationError({"component": "required with version filters"})
            component = "driver" if branch else None
        if component is None:
            return queryset
        try:
            component = normalize_component(component)
        except VersionError as exc:
            raise ValidationError({"component": str(exc)}) from None
        match = NodeComponent.objects.filter(node=OuterRef("pk"), component=component)
        lookups = {"version": "exact", "version_gte": "gte", "version_gt": "gt", "version_lte": "lte",
                   "version_lt": "lt"}
        for param, raw in ranges.items():
            if not raw:
                continue
            try:
                parsed = parse_version(component, raw)
            except VersionError as exc:
                raise ValidationError({param: str(exc)}) from None
            if parsed.key is None:
                raise ValidationError({param: f"{raw!r} is not a comparable {component} version"})
            match = match.filter(**{f"version_key__{lookups[param]}": parsed.key})
        if branch:
            match = match.filter(branch=branch.upper())
        if flagged is not None:
            match = match.filter(version_key__isnull=flagged)
        return queryset.filter(Exists(match))


class WorkloadFilter(FilterSet):
    cluster = django_filters.CharFilter(field_name="cluster__name")
    node = django_filters.CharFilter(field_name="nodes__name", distinct=True, help_text="any node the workload holds")
    active = BooleanFilter(field_name="gone_at", lookup_expr="isnull")

    class Meta:
        model = Workload
        fields = ["cluster", "node", "kind", "checkpoint_engine", "policy", "active"]


class ChangeLogFilter(FilterSet):
    since = DateTimeFilter(field_name="time", lookup_expr="gte")

    class Meta:
        model = ChangeLog
        fields = ["source", "action", "object_type", "object_id", "since"]


# --- viewsets ------------------------------------------------------------------------------


class ClusterViewSet(viewsets.ModelViewSet):
    queryset = Cluster.objects.annotate(live_nodes=Count("nodes", filter=~Q(nodes__service_state=ServiceState.GONE)))
    serializer_class = ClusterSerializer
    filterset_class = ClusterFilter

    @extend_schema(request=None, responses={202: inline_serializer("SyncQueued", {"queued": serializers.CharField()})})
    @action(detail=True, methods=["post"])
    def sync(self, request: Request, pk: str | None = None) -> Response:
        """Queue a sync of this cluster now (202); the result lands on the cluster and in the change log."""
        from inventory.tasks import sync_cluster_task

        cluster = self.get_object()
        if cluster.kind == ClusterKind.STATIC:
            raise ValidationError({"kind": "static clusters are fed by files (manage.py import_nodes)"})
        transaction.on_commit(lambda: sync_cluster_task.delay(cluster.pk))
        return Response({"queued": cluster.name}, status=status.HTTP_202_ACCEPTED)


# The list's columns, read in one statement (NodeSerializer's fields; cluster__name joined).
NODE_COLUMNS = ("id", "cluster_id", "cluster__name", "name", "pool", "labels", "gpu_model", "gpu_count", "product_line",
                "os_family", "cpu_milli", "memory_mib", "scheduler_state", "service_state", "agent_endpoint",
                "fact_sources", "fact_conflicts", "last_seen", "gone_at", "created_at", "updated_at")
NODE_TIMES = ("last_seen", "gone_at", "created_at", "updated_at")
NODE_JSON = ("labels", "fact_sources", "fact_conflicts")


def node_rows(ids: list[int]) -> list[dict[str, Any]]:
    """NodeSerializer's rows for these nodes, in this order, from two narrow reads (gpusweep.narrow)."""
    times = Times()
    write = times.write
    components: dict[int, list[dict[str, Any]]] = {i: [] for i in ids}
    for node_id, component, version, branch, flagged, source, updated in NodeComponent.objects.filter(
            among("node_id", ids)).order_by("node_id", "component").annotate(
            unknown=Q(version_key__isnull=True), updated=times.column("updated_at")).values_list(
            "node_id", "component", "version", "branch", "unknown", "source", "updated"):
        components[node_id].append({"component": component, "version": version, "branch": branch,
                                    "flagged": flagged, "source": source, "updated_at": write(updated)})
    found = {}
    read = {**{name: times.column(name) for name in NODE_TIMES}, **{name: json_column(name) for name in NODE_JSON}}
    columns = [f"{name}_" if name in read else name for name in NODE_COLUMNS]
    names = tuple("cluster" if n == "cluster_id" else "cluster_name" if n == "cluster__name" else n
                  for n in NODE_COLUMNS)
    converters = [(i, write if name in NODE_TIMES else json_value) for i, name in enumerate(NODE_COLUMNS)
                  if name in read]
    for values in Node.objects.filter(among("id", ids)).order_by().annotate(
            **{f"{name}_": column for name, column in read.items()}).values_list(*columns):
        values = list(values)
        for i, convert in converters:
            values[i] = convert(values[i])
        row = dict(zip(names, values, strict=True))
        row["components"] = components[row["id"]]
        found[row["id"]] = {name: row[name] for name in NodeSerializer.Meta.fields}
    return [found[i] for i in ids if i in found]


class NodeViewSet(CachedListMixin, NarrowListMixin, mixins.UpdateModelMixin, viewsets.ReadOnlyModelViewSet):
    # Every table the list (its filters, ordering, search and serializer) reads (gpusweep.responses).
    cache_tables = ("inventory_node", "inventory_cluster", "inventory_nodecomponent")
    queryset = Node.objects.select_related("cluster").prefetch_related("components")
    serializer_class = NodeSerializer
    filterset_class = NodeFilter
    ordering_fields = ["name", "last_seen", "gpu_count", "pool", "gpu_model", "service_state", "cluster__name",
                       "updated_at"]
    search_fields = ["name", "pool", "gpu_model", "cluster__name"]

    def narrow_rows(self, ids: list[int]) -> list[dict[str, Any]]:
        return node_rows(ids)

    def perform_update(self, serializer: serializers.BaseSerializer[Node]) -> None:
        with transaction.atomic():
            node = Node.objects.select_for_update().get(pk=serializer.instance.pk)  # type: ignore[union-attr]
            before = {f: getattr(node, f) for f in serializer.validated_data}
            saved = serializer.save()
            changes = {f: [before[f], getattr(saved, f)] for f in before if before[f] != getattr(saved, f)}
            if changes:
                ChangeLog.objects.create(
                    source=ChangeSource.API, action=ChangeAction.UPDATE, object_type="node", object_id=saved.pk,
                    object_repr=f"{saved.cluster.name}/{saved.name}", changes=changes,
                    user_id=self.request.user.pk,
                )


class WorkloadViewSet(mixins.UpdateModelMixin, viewsets.ReadOnlyModelViewSet):
    queryset = Workload.objects.select_related("cluster", "node").prefetch_related("nodes")
    serializer_class = WorkloadSerializer
    filterset_class = WorkloadFilter


class ChangeLogViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = ChangeLog.objects.select_related("user")
    serializer_class = ChangeLogSerializer
    filterset_class = ChangeLogFilter


class InventoryRouter(ApiRouter):
    """The viewsets, plus the agent heartbeat at the exact path the agents post to (no slash)."""

    def get_urls(self) -> list[URLPattern | URLResolver]:
        return [path("agent/heartbeat", agent.heartbeat, name="agent-heartbeat"), *super().get_urls()]


router = InventoryRouter()
router.register("clusters", ClusterViewSet)
router.register("nodes", NodeViewSet)
router.register("workloads", WorkloadViewSet)
router.register("changes", ChangeLogViewSet)
