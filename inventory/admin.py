from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from gpusweep import registry, secret_env
from gpusweep.admin import ReadOnlyAdmin
from inventory.choices import CheckpointEngine
from inventory.models import ChangeLog, Cluster, Node, NodeComponent, Package, PackageSet, Workload


class ClusterForm(forms.ModelForm):
    """The API's checks on what an admin writes: a registered executor, allowed secret names
    (the admin builds the form's fields from the ModelAdmin)."""

    def clean_connection(self) -> Any:
        value = self.cleaned_data.get("connection") or {}
        chosen = value.get("executor") if isinstance(value, dict) else None
        if chosen is not None and (problem := registry.executor_problem(chosen)):
            raise forms.ValidationError(problem)
        return value

    def clean_secret_env(self) -> Any:
        value = self.cleaned_data.get("secret_env") or {}
        if not isinstance(value, dict):
            raise forms.ValidationError("an object mapping each secret to an environment variable's name")
        problems = [f"{k}: {p}" for k, v in value.items() if (p := secret_env.problem(str(v)))]
        if problems:
            raise forms.ValidationError(problems)
        return value


class WorkloadForm(forms.ModelForm):
    """Only a registered checkpoint engine (the model's field has no choices: engines register)."""
    def clean_checkpoint_engine(self) -> str:
        value = str(self.cleaned_data.get("checkpoint_engine") or "")
        if value not in CheckpointEngine.values():
            raise forms.ValidationError(f"one of the registered engines: {', '.join(CheckpointEngine.values())}")
        return value


class NodeComponentInline(admin.TabularInline):
    model = NodeComponent
    extra = 0
    readonly_fields = ("version_key", "branch", "source", "updated_at")


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    form = ClusterForm
    list_display = ("name", "kind", "sync_enabled", "last_synced_at")
    list_filter = ("kind",)


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "cluster", "pool", "gpu_model", "gpu_count", "service_state", "last_seen")
    list_filter = ("cluster", "service_state", "gpu_model")
    search_fields = ("name",)
    inlines = [NodeComponentInline]

    def get_readonly_fields(self, request: HttpRequest, obj: Node | None = None) -> tuple[str, ...]:
        # A node changes cluster through inventory.services.move_node only: its exposures keep a copy.
        return ("cluster",) if obj is not None else ()


@admin.register(NodeComponent)
class NodeComponentAdmin(admin.ModelAdmin):
    list_display = ("node", "component", "version", "branch", "version_key")
    list_filter = ("component", "branch")
    search_fields = ("node__name", "version")


@admin.register(Workload)
class WorkloadAdmin(admin.ModelAdmin):
    form = WorkloadForm
    list_display = ("scheduler_id", "kind", "cluster", "node", "gpus", "state", "checkpoint_engine", "policy")
    list_filter = ("kind", "cluster", "checkpoint_engine", "policy")
    search_fields = ("scheduler_id", "name")


@admin.register(ChangeLog)
class ChangeLogAdmin(admin.ModelAdmin):
    list_display = ("time", "source", "action", "object_type", "object_repr")
    list_filter = ("source", "action", "object_type")
    readonly_fields = [f.name for f in ChangeLog._meta.fields]


# Package sets come from the agents' reports (inventory.packages): shown, never edited by hand.
@admin.register(PackageSet)
class PackageSetAdmin(ReadOnlyAdmin):
    list_display = ("digest", "ecosystem", "package_count", "created_at")
    list_filter = ("ecosystem",)
    search_fields = ("digest",)


@admin.register(Package)
class PackageAdmin(ReadOnlyAdmin):
    list_display = ("name", "version", "arch", "source", "source_version", "package_set")
    search_fields = ("name", "source")
