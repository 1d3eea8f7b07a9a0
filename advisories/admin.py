from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from advisories.models import (
    CVE,
    Advisory,
    AdvisoryEvent,
    AffectedRange,
    ClusterDeadlineOverride,
    DeadlinePolicy,
    Exposure,
    KevEntry,
    ReviewItem,
    SourceState,
)
from advisories.services import deadlines_changed
from gpusweep.admin import ReadOnlyAdmin


class AffectedRangeInline(admin.TabularInline):
    model = AffectedRange
    extra = 0
    fields = ("component", "os_family", "branch", "product_line", "raw", "basis", "fixed_version", "severity")
    readonly_fields = fields
    can_delete = False


@admin.register(Advisory)
class AdvisoryAdmin(admin.ModelAdmin):
    list_display = ("publisher_id", "title", "severity", "tracking_version", "integrity", "ranges_unknown",
                    "initial_release_date")
    list_filter = ("severity", "integrity", "ranges_unknown", "source_kind")
    search_fields = ("publisher_id", "title", "cves__cve_id")
    readonly_fields = ("content_sha256", "published_sha256", "integrity", "history", "revision_history")
    inlines = [AffectedRangeInline]


@admin.register(ReviewItem)
class ReviewItemAdmin(admin.ModelAdmin):
    """Read-only here: items are resolved through advisories.services (the API and the advisory
    page), which write the evidence event and recompute exposures."""

    list_display = ("advisory", "kind", "key", "component", "state", "resolved_by", "resolved_at")
    list_filter = ("state", "kind", "component")
    search_fields = ("key", "raw", "advisory__publisher_id")

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(CVE)
class CVEAdmin(admin.ModelAdmin):
    list_display = ("cve_id", "severity", "base_score", "cwe_id")
    list_filter = ("severity",)
    search_fields = ("cve_id", "description")


@admin.register(AffectedRange)
class AffectedRangeAdmin(admin.ModelAdmin):
    list_display = ("advisory", "component", "os_family", "branch", "product_line", "raw", "basis", "fixed_version")
    list_filter = ("component", "basis", "os_family", "product_line", "branch")
    search_fields = ("product_id", "advisory__publisher_id")


@admin.register(Exposure)
class ExposureAdmin(ReadOnlyAdmin):
    """Read only: states change through advisories.exposure (remediation with evidence) and the
    risk acceptance API (an approver, a reason, an expiry)."""

    list_display = ("node", "advisory", "component", "detected_version", "severity", "state", "deadline",
                    "fixed_by_version", "remediated_at")
    list_filter = ("state", "severity", "component")
    search_fields = ("node__name", "advisory__publisher_id")
    raw_id_fields = ("node", "advisory", "affected_range", "risk_approver")


@admin.register(DeadlinePolicy)
class DeadlinePolicyAdmin(admin.ModelAdmin):
    list_display = ("__str__", "updated_at", "recomputing", "recomputed_at")
    readonly_fields = ("generation", "recomputed_generation", "recomputed_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return not DeadlinePolicy.objects.exists()

    def save_model(self, request: HttpRequest, obj: DeadlinePolicy, form: object, change: bool) -> None:
        super().save_model(request, obj, form, change)
        deadlines_changed()


@admin.register(ClusterDeadlineOverride)
class ClusterDeadlineOverrideAdmin(admin.ModelAdmin):
    list_display = ("cluster", "severity", "days")

    def save_model(self, request: HttpRequest, obj: ClusterDeadlineOverride, form: object, change: bool) -> None:
        super().save_model(request, obj, form, change)
        deadlines_changed()

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ClusterDeadlineOverride]) -> None:
        super().delete_queryset(request, queryset)
        deadlines_changed()


@admin.register(KevEntry)
class KevEntryAdmin(admin.ModelAdmin):
    list_display = ("cve_id", "name", "date_added", "due_date")
    search_fields = ("cve_id", "name")


@admin.register(SourceState)
class SourceStateAdmin(admin.ModelAdmin):
    list_display = ("url", "etag", "last_modified", "fetched_at")


@admin.register(AdvisoryEvent)
class AdvisoryEventAdmin(admin.ModelAdmin):
    list_display = ("time", "kind", "advisory", "user", "document", "message")
    list_filter = ("kind",)
    readonly_fields = ("time", "kind", "advisory", "user", "document", "message", "details")
