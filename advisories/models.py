"""Bulletins, their CVEs and affected ranges; which nodes they hit, and by when to patch."""

from __future__ import annotations

import functools
import re
from typing import Any

from django.conf import settings
from django.db import models

from advisories.choices import (
    DeadlineBasis,
    EventKind,
    ExposureState,
    Integrity,
    RangeBasis,
    ReviewKind,
    ReviewState,
    Severity,
    SourceKind,
    VexJustification,
)
from inventory.models import Cluster, Node


class CVE(models.Model):
    cve_id = models.CharField(max_length=32, unique=True)
    description = models.TextField(blank=True)
    cvss_vector = models.CharField(max_length=200, blank=True)
    base_score = models.DecimalField(max_digits=3, decimal_places=1, null=True, blank=True)
    severity = models.CharField(max_length=10, choices=Severity.choices(), blank=True, db_index=True)
    cwe_id = models.CharField(max_length=20, blank=True)
    cwe_name = models.CharField(max_length=300, blank=True)
    release_date = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["cve_id"]
        verbose_name = "CVE"

    def __str__(self) -> str:
        return self.cve_id


@functools.lru_cache(maxsize=4096)  # a pure function the exposure list calls for each row (two regex passes)
def public_id(publisher: str, publisher_id: str) -> str:
    """`<publisher>-<bulletin id>`, lower case: the publisher part has no hyphen, so the first one splits."""
    name = re.sub(r"[^a-z0-9]", "", publisher.lower()) or "advisory"
    return f"{name}-{re.sub(r'[^a-z0-9._-]+', '-', publisher_id.lower()).strip('-')}"


class Advisory(models.Model):
    publisher = models.CharField(max_length=50, default="NVIDIA")
    publisher_id = models.CharField(max_length=50, help_text="The publisher's bulletin id, e.g. 5703")
    title = models.CharField(max_length=500)
    tracking_version = models.CharField(max_length=30, blank=True)
    status = models.CharField(max_length=20, blank=True)
    revision_history = models.JSONField(default=list, blank=True)
    initial_release_date = models.DateTimeField(null=True, blank=True)
    current_release_date = models.DateTimeField(null=True, blank=True)
    severity = models.CharField(max_length=10, choices=Severity.choices(), blank=True, db_index=True)
    summary = models.TextField(blank=True)
    source_kind = models.CharField(max_length=10, choices=SourceKind.choices())
    source = models.CharField(max_length=1000, help_text="Path or URL the document came from")
    content_sha256 = models.CharField(max_length=64, blank=True)
    published_sha256 = models.CharField(max_length=64, blank=True)
    integrity = models.CharField(max_length=10, choices=Integrity.choices(), default=Integrity.ABSENT, db_index=True)
    ranges_unknown = models.BooleanField(
        default=False,
        help_text="Known only from NVIDIA's index: no CSAF yet, so affected ranges are unknown (not harmless).",
    )
    # When exposures were last matched against this advisory's ranges; None after a change, so
    # a batch whose exposure step failed is caught up by the next ingest.
    exposures_at = models.DateTimeField(null=True, blank=True)
    # Earlier revisions we ingested: [{tracking_version, content_sha256, source, ingested_at}].
    history = models.JSONField(default=list, blank=True)
    # Every product row of the document ({product_id: version text}, fixed rows too) and those whose
    # version text decoded: with the ranges and review items, what advisories.coverage counts.
    product_rows = models.JSONField(default=dict, blank=True)
    read_rows = models.JSONField(default=list, blank=True)
    cves = models.ManyToManyField(CVE, related_name="advisories", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-initial_release_date", "publisher_id"]
        verbose_name_plural = "advisories"
        constraints = [
            models.UniqueConstraint(fields=["publisher", "publisher_id"], name="advisory_unique_per_publisher")
        ]

    def __str__(self) -> str:
        return f"{self.publisher} {self.publisher_id}"

    @property
    def public_id(self) -> str:
        """The one identifier that leaves the service (API, URLs, webhooks, reports): `nvidia-5703`."""
        return public_id(self.publisher, self.publisher_id)


class AffectedRange(models.Model):
    """One affected product row of a bulletin, with bounds as inventory.versions sort keys.

    Empty os_family / product_line mean "any". Bounds compare as strings in SQL; a driver row's
    branch is its lower bound (Windows R535 drivers are 538.x), so `branch` is its label.
    `component` is an `advisories.components` name (free text: a new component needs no
    migration). `scope` names the product among its component's ({"gpu_model": "h100"},
    {"platform": "dgx_a100"}): a node whose fact differs is not in it, one whose fact is unknown is
    presumed. `condition` limits the row to nodes whose facts have one of some values
    ({"container_toolkit_mode": ["cdi"]}); an unknown fact counts as met. A `basis` in
    RangeBasis.PRESUMED makes its exposures `presumed`.
    """

    advisory = models.ForeignKey(Advisory, on_delete=models.CASCADE, related_name="ranges")
    product_id = models.CharField(max_length=300)
    product_name = models.CharField(max_length=200, blank=True)
    architecture = models.CharField(max_length=300, blank=True)
    component = models.CharField(max_length=63)
    os_family = models.CharField(max_length=20, blank=True)
    branch = models.CharField(max_length=16, blank=True)
    product_line = models.CharField(max_length=40, blank=True)
    raw = models.CharField(max_length=300, help_text="The version text as the publisher wrote it")
    lower_version = models.CharField(max_length=64, blank=True)
    lower_key = models.CharField(max_length=200, null=True, blank=True)
    lower_inclusive = models.BooleanField(default=True)
    upper_version = models.CharField(max_length=64, blank=True)
    upper_key = models.CharField(max_length=200, null=True, blank=True)
    upper_inclusive = models.BooleanField(default=False)
    fixed_version = models.CharField(max_length=64, blank=True)
    basis = models.CharField(max_length=20, choices=RangeBasis.choices(), default=RangeBasis.DECODED)
    scope = models.JSONField(default=dict, blank=True)
    condition = models.JSONField(default=dict, blank=True)
    remediation = models.CharField(max_length=300, blank=True)
    severity = models.CharField(max_length=10, choices=Severity.choices(), blank=True)
    cves = models.ManyToManyField(CVE, related_name="ranges", blank=True)

    class Meta:
        ordering = ["advisory_id", "component", "os_family", "branch", "product_line"]
        constraints = [
            models.UniqueConstraint(
                fields=["advisory", "product_id", "os_family", "product_line"], name="range_unique_per_advisory"
            )
        ]
        indexes = [models.Index(fields=["component", "branch"], name="range_component_idx")]

    def __str__(self) -> str:
        return f"{self.advisory} {self.component} {self.os_family}/{self.branch}/{self.product_line} {self.raw}"


class Exposure(models.Model):
    """A node inside an affected range. One row per (node, range); CVEs are the range's."""

    # Exposures are derived data, recomputable at any time, written hundreds of thousands at once.
    # Each index and each foreign-key trigger costs on every row, so only the indexes queries use
    # exist (the unique constraint covers node lookups), and the references are
    # kept by Django's on_delete cascade and the full recompute (which drops orphans) rather than
    # by database triggers: with them a fleet-wide recompute took three times as long.
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="exposures", db_index=False,
                             db_constraint=False)
    advisory = models.ForeignKey(Advisory, on_delete=models.CASCADE, related_name="exposures", db_index=False,
                                 db_constraint=False)
    # The node's cluster, copied so the exposure list's cluster filter reads no node row (with the
    # join, a page of one cluster's exposures probed ten nodes per row shown: bench/api.py). Written
    # with every new exposure (the recompute's inserts, save()) and moved with its node in the
    # transaction that moves it (inventory.services.move_node -> advisories.signals). The rows
    # go with their node (its cascade), never with the cluster directly.
    cluster = models.ForeignKey(Cluster, on_delete=models.DO_NOTHING, related_name="+", db_index=False,
                                db_constraint=False)
    affected_range = models.ForeignKey(AffectedRange, on_delete=models.CASCADE, related_name="exposures",
                                       db_index=False, db_constraint=False)
    component = models.CharField(max_length=63)
    detected_version = models.CharField(max_length=128)
    severity = models.CharField(max_length=10, choices=Severity.choices(), blank=True)
    state = models.CharField(max_length=20, choices=ExposureState.choices(), default=ExposureState.OPEN)
    first_seen = models.DateTimeField()
    deadline = models.DateTimeField(null=True, blank=True)
    deadline_source = models.CharField(max_length=100, blank=True)
    # Evidence of remediation: the version seen outside the range, and when.
    fixed_by_version = models.CharField(max_length=128, blank=True)
    remediated_at = models.DateTimeField(null=True, blank=True)
    # What made the change that remediated it: "campaign 12, sweep 34" for a campaign's verified
    # patch, or the inventory source ("agent", "slurm", ...) that reported the new version.
    remediated_by = models.CharField(max_length=200, blank=True)
    # Why an OS package exposure stands as it does: "reboot pending" (the fixed kernel is installed,
    # an older one runs), "livepatch" (remediated by a livepatch), the binary package matched.
    note = models.CharField(max_length=200, blank=True, default="", db_default="")
    # The approver's decision: an accepted risk (until risk_expires_at) or not affected (with a
    # CSAF/VEX justification); who decided and why.
    risk_approver = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    risk_reason = models.TextField(blank=True)
    risk_expires_at = models.DateTimeField(null=True, blank=True)
    justification = models.CharField(max_length=60, choices=VexJustification.choices(), blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["deadline", "node_id"]
        constraints = [
            models.UniqueConstraint(fields=["node", "affected_range"], name="exposure_unique_per_node_range")
        ]
        # Every extra index slows the fleet-wide insert, so there are two. Accepted risks are few:
        # their expiry check runs on every recompute, so it gets a small partial index. The exposure
        # list filters by state and severity and sorts by deadline (the console's and the API's
        # usual query): without an index a page of it sorted 480,000 rows (bench/api.py).
        indexes = [
            models.Index(fields=["risk_expires_at"], condition=models.Q(state="risk_accepted"),
                         name="exposure_risk_expiry_idx"),
            models.Index(fields=["state", "severity", "deadline"], name="exposure_list_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.node} {self.advisory} {self.state}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.cluster_id is None and self.node_id is not None:  # the node's, unless given
            self.cluster_id = self.node.cluster_id
        super().save(*args, **kwargs)


class DeadlinePolicy(models.Model):
    """Days to patch per severity. One row (pk=1)."""

    critical_days = models.PositiveIntegerField(
        default=15,
        help_text="PCI DSS 4.0.1 (6.3.3) wants critical patches within one month; FedRAMP Rev5 gives "
        "High/Critical 30 days; CISA KEV due dates default to 2 weeks. 15 keeps inside all of them.",
    )
    high_days = models.PositiveIntegerField(default=30, help_text="FedRAMP Rev5: High within 30 days.")
    medium_days = models.PositiveIntegerField(default=90, help_text="FedRAMP Rev5: Moderate within 90 days.")
    low_days = models.PositiveIntegerField(default=180, help_text="FedRAMP Rev5: Low within 180 days.")
    basis = models.CharField(
        max_length=20, choices=DeadlineBasis.choices(), default=DeadlineBasis.PUBLICATION,
        help_text="Count from the bulletin's publication or from when gpusweep first saw the node exposed.",
    )
    use_kev = models.BooleanField(
        default=True, help_text="A CVE in CISA's Known Exploited Vulnerabilities catalogue takes its due date."
    )
    risk_max_days = models.PositiveIntegerField(
        default=365, help_text="The longest an approver may accept a risk for, in days (set in the admin).")
    updated_at = models.DateTimeField(auto_now=True)
    # Every change to the policy or an override raises `generation`; the recompute that follows (a
    # task, advisories.exposure.refresh_deadlines) records the generation it applied. Until they are
    # equal the deadlines are being recomputed, and a recompute superseded by a later change yields.
    generation = models.PositiveBigIntegerField(default=0)
    recomputed_generation = models.PositiveBigIntegerField(default=0)
    recomputed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "deadline policy"

    def __str__(self) -> str:
        return (f"Critical {self.critical_days}d, High {self.high_days}d, Medium {self.medium_days}d, "
                f"Low {self.low_days}d from {self.basis}")

    @property
    def recomputing(self) -> bool:
        return self.recomputed_generation < self.generation

    @classmethod
    def current(cls) -> DeadlinePolicy:
        policy, _ = cls.objects.get_or_create(pk=1)
        return policy

    def days_for(self, severity: str) -> int:
        return {
            Severity.CRITICAL: self.critical_days,
            Severity.HIGH: self.high_days,
            Severity.MEDIUM: self.medium_days,
            Severity.LOW: self.low_days,
        }.get(severity, self.low_days)


class ClusterDeadlineOverride(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="deadline_overrides")
    severity = models.CharField(max_length=10, choices=Severity.choices())
    days = models.PositiveIntegerField()

    class Meta:
        ordering = ["cluster_id", "severity"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "severity"], name="deadline_override_unique")
        ]

    def __str__(self) -> str:
        return f"{self.cluster}: {self.severity} {self.days}d"


class KevEntry(models.Model):
    """One row of CISA's Known Exploited Vulnerabilities catalogue."""

    cve_id = models.CharField(max_length=32, unique=True)
    name = models.CharField(max_length=300, blank=True)
    date_added = models.DateField(null=True, blank=True)
    due_date = models.DateField()
    imported_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-date_added", "cve_id"]
        verbose_name = "KEV entry"
        verbose_name_plural = "KEV entries"

    def __str__(self) -> str:
        return f"{self.cve_id} due {self.due_date}"


class SourceState(models.Model):
    """Validators per URL so the next fetch is conditional (ETag / Last-Modified)."""

    url = models.CharField(max_length=1000, unique=True)
    etag = models.CharField(max_length=300, blank=True)
    last_modified = models.CharField(max_length=100, blank=True)
    content_sha256 = models.CharField(max_length=64, blank=True)
    fetched_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["url"]

    def __str__(self) -> str:
        return self.url


class ReviewItem(models.Model):
    """Something in a bulletin gpusweep could not decode or map: the advisory needs review until
    an admin resolves every item, mapping it to a range or dismissing it with a reason."""

    advisory = models.ForeignKey(Advisory, on_delete=models.CASCADE, related_name="review_items")
    key = models.CharField(max_length=300, help_text="The product_id, or a synthetic key for a skipped branch")
    kind = models.CharField(max_length=20, choices=ReviewKind.choices())
    raw = models.CharField(max_length=500, blank=True, help_text="As the bulletin wrote it")
    reason = models.TextField()
    component = models.CharField(max_length=63, blank=True, help_text="The component it would map to, if known")
    state = models.CharField(max_length=10, choices=ReviewState.choices(), default=ReviewState.OPEN, db_index=True)
    # The admin's resolution: a range (for `mapped`: component, os_family, branch, product_line,
    # lower, lower_inclusive, upper, upper_inclusive, fixed_version, scope, condition) and why.
    mapping = models.JSONField(default=dict, blank=True)
    resolution = models.TextField(blank=True)
    resolved_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    resolved_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["advisory_id", "kind", "key"]
        constraints = [models.UniqueConstraint(fields=["advisory", "key"], name="review_item_unique_per_advisory")]

    def __str__(self) -> str:
        return f"{self.advisory} {self.kind} {self.key} ({self.state})"


class AdvisoryEvent(models.Model):
    """What happened to an advisory and its exposures, and who did it: the evidence of every
    ingest and every approver's or admin's decision."""

    time = models.DateTimeField(auto_now_add=True, db_index=True)
    advisory = models.ForeignKey(Advisory, null=True, blank=True, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=30, choices=EventKind.choices())
    document = models.CharField(max_length=1000, blank=True)
    message = models.TextField()
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="+")
    # What the decision was about and what it changed: {"exposure": id, "node": name, "from": state, ...}.
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-time", "-id"]

    def __str__(self) -> str:
        return f"{self.time:%Y-%m-%d %H:%M} {self.kind} {self.document}"
