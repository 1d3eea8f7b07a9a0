from django.contrib import admin

from inventory.models import ChangeLog, Cluster, Node, NodeComponent, Workload


class NodeComponentInline(admin.TabularInline):
    model = NodeComponent
    extra = 0
    readonly_fields = ("version_key", "branch", "source", "updated_at")


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "sync_enabled", "last_synced_at")
    list_filter = ("kind",)


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "cluster", "pool", "gpu_model", "gpu_count", "service_state", "last_seen")
    list_filter = ("cluster", "service_state", "gpu_model")
    search_fields = ("name",)
    inlines = [NodeComponentInline]


@admin.register(NodeComponent)
class NodeComponentAdmin(admin.ModelAdmin):
    list_display = ("node", "component", "version", "branch", "version_key")
    list_filter = ("component", "branch")
    search_fields = ("node__name", "version")


@admin.register(Workload)
class WorkloadAdmin(admin.ModelAdmin):
    list_display = ("scheduler_id", "kind", "cluster", "node", "gpus", "state", "checkpoint_engine", "policy")
    list_filter = ("kind", "cluster", "checkpoint_engine", "policy")
    search_fields = ("scheduler_id", "name")


@admin.register(ChangeLog)
class ChangeLogAdmin(admin.ModelAdmin):
    list_display = ("time", "source", "action", "object_type", "object_repr")
    list_filter = ("source", "action", "object_type")
    readonly_fields = [f.name for f in ChangeLog._meta.fields]
