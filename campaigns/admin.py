from django.contrib import admin

from campaigns.models import Approval, Campaign, EvidenceEvent, EvidenceSeal, NodeSweep, Plan, WorkloadMove
from gpusweep.admin import ReadOnlyAdmin


@admin.register(Campaign)
class CampaignAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "status", "requested_by", "deadline", "started_at", "finished_at")
    list_filter = ("status",)
    search_fields = ("name",)
    readonly_fields = ("status", "approved_plan", "evidence_seq", "evidence_head", "started_at", "finished_at")


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = ("campaign", "version", "created_at", "created_by")
    readonly_fields = ("content", "summary")


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    """Read only: an approval is given through services.approve, with its evidence event."""

    list_display = ("campaign", "plan", "user", "at")


@admin.register(NodeSweep)
class NodeSweepAdmin(admin.ModelAdmin):
    list_display = ("campaign", "node", "wave", "state", "attempt", "step_deadline", "patched_at")
    list_filter = ("state",)
    search_fields = ("node__name",)


@admin.register(WorkloadMove)
class WorkloadMoveAdmin(admin.ModelAdmin):
    list_display = ("sweep", "workload_name", "policy", "state", "target_node", "checkpoint_id")
    list_filter = ("state", "policy")


@admin.register(EvidenceEvent)
class EvidenceEventAdmin(ReadOnlyAdmin):
    """Read only: the log is append-only and hash-chained."""

    list_display = ("campaign", "seq", "sweep", "node_seq", "kind", "actor", "at")
    list_filter = ("kind",)


@admin.register(EvidenceSeal)
class EvidenceSealAdmin(ReadOnlyAdmin):
    """Read only: signed statements of the chain heads."""

    list_display = ("campaign", "number", "reason", "at", "key_id")
