"""Campaigns: what to patch, how, approved by whom; per-node sweeps and their evidence."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from campaigns.choices import (
    AfterRollback,
    CampaignStatus,
    EvidenceKind,
    HeldNodes,
    MoveState,
    Placement,
    SweepState,
    WaveGrowth,
)
from inventory.choices import WorkloadPolicy


class Campaign(models.Model):
    """A rolling sweep over a scope of nodes towards target versions, under a policy.

    Limits such as parallelism and the error budget are written "3" (nodes) or "25%" (of the
    scope, rounded down, at least 1 for parallelism). Windows are
    ``[{"days": [0..6 Monday first], "start": "22:00", "end": "06:00", "tz": "Europe/Berlin"}]``
    (an end before the start crosses midnight); blackouts are ``[{"start": iso, "end": iso}]``.
    Target versions are ``{"driver": "580.95.05"}`` (everyone to that version, which may be a
    move to another branch) or ``{"driver": {"R570": "570.195.03", "R580": "580.95.05"}}`` (each
    node within its own branch); left empty, they come from the advisories' fixed versions.
    """

    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    advisories = models.ManyToManyField("advisories.Advisory", blank=True, related_name="campaigns")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="requested_campaigns", null=True, blank=True
    )
    # Everyone who changed the campaign's definition: none of them may approve its plans.
    editors = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="edited_campaigns")
    status = models.CharField(
        max_length=20, choices=CampaignStatus.choices(), default=CampaignStatus.DRAFT, db_index=True
    )
    # Scope.
    clusters = models.JSONField(default=list, blank=True, help_text="cluster names; empty for all")
    pools = models.JSONField(default=list, blank=True, help_text="pool names; empty for all")
    node_selector = models.JSONField(default=dict, blank=True, help_text='{"label": "value"} or {"names": [...]}')
    # Nodes added beyond the selection, swept after every other node (e.g. exposed receivers).
    last_group = models.JSONField(default=list, blank=True, help_text="node ids swept as the last group")
    target_versions = models.JSONField(default=dict, blank=True)
    # Policy. The first wave is a canary ("auto": one node per driver group and cluster; "N" nodes;
    # "0" none), then a soak before any other node is drained; later waves grow by `wave_growth`.
    canary = models.CharField(max_length=10, default="auto")
    soak_s = models.PositiveIntegerField(default=600, help_text="seconds after the canary before the next wave")
    wave_growth = models.CharField(max_length=12, choices=WaveGrowth.choices(), default=WaveGrowth.FIXED)
    growth_step = models.PositiveSmallIntegerField(default=2, help_text="+n per wave (linear) or x n (exponential)")
    # When the canary came to rest and its soak began (the engine's clock for the soak).
    soak_started_at = models.DateTimeField(null=True, blank=True)
    parallelism_per_cluster = models.CharField(max_length=10, default="1")
    parallelism_per_pool = models.CharField(max_length=10, blank=True)
    windows = models.JSONField(default=list, blank=True)
    blackouts = models.JSONField(default=list, blank=True)
    error_budget = models.CharField(max_length=10, default="1")
    workload_policy = models.CharField(
        max_length=20, choices=WorkloadPolicy.choices(), default=WorkloadPolicy.CHECKPOINT
    )
    wait_limit = models.DurationField(null=True, blank=True, help_text="how long to wait for a workload to end")
    cold_restart_allowed = models.BooleanField(default=False)
    workload_placement = models.CharField(max_length=10, choices=Placement.choices(), default=Placement.MOVE)
    held_nodes = models.CharField(max_length=10, choices=HeldNodes.choices(), default=HeldNodes.SKIP)
    # Health gates after the reboot (agent/src/gpusweep_agent/health/): DCGM diagnostics level, and
    # the nodes' configured site checks by name (empty: every one a node has).
    dcgm_level = models.PositiveSmallIntegerField(default=1, help_text="dcgmi diag -r LEVEL (0 none, 1-4)")
    site_checks = models.JSONField(default=list, blank=True, help_text="names of the nodes' site checks; [] all")
    # A failed patch or health gate is reverted; then the node stays out, or returns if healthy.
    after_rollback = models.CharField(max_length=10, choices=AfterRollback.choices(), default=AfterRollback.STAY_OUT)
    # The campaign this one rolls back ("roll back completed nodes"), if any.
    rollback_of = models.ForeignKey("self", on_delete=models.SET_NULL, null=True, blank=True,
                                    related_name="rollbacks")
    workload_overrides = models.JSONField(default=dict, blank=True, help_text="{workload id or name: policy}")
    approvals_required = models.PositiveSmallIntegerField(default=1)
    deadline = models.DateTimeField(null=True, blank=True)
    step_timeout_s = models.PositiveIntegerField(default=900, help_text="a step older than this is re-driven")
    node_estimate_s = models.PositiveIntegerField(default=1800, help_text="planning estimate for one node")
    # Execution.
    approved_plan = models.ForeignKey(
        "campaigns.Plan", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    # The approved plan's parallelism limits as numbers, copied at start (read by every dispatch).
    limits = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    status_reason = models.TextField(blank=True)
    # Head of the campaign's own evidence chain (campaign-level events; each node sweep keeps its
    # own): removing the last event is detectable too.
    evidence_seq = models.PositiveIntegerField(default=0)
    evidence_head = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"


class Plan(models.Model):
    """One stored, versioned plan of a campaign (content as the planner returned it)."""

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="plans")
    version = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    content = models.JSONField(default=dict)
    summary = models.JSONField(default=dict)

    class Meta:
        ordering = ["campaign_id", "-version"]
        constraints = [models.UniqueConstraint(fields=["campaign", "version"], name="plan_version_unique")]

    def __str__(self) -> str:
        return f"{self.campaign_id} v{self.version}"


class Approval(models.Model):
    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="approvals")
    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, related_name="approvals")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    comment = models.TextField(blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["campaign_id", "at"]
        constraints = [models.UniqueConstraint(fields=["plan", "user"], name="approval_once_per_plan")]

    def __str__(self) -> str:
        return f"{self.user} approved plan {self.plan_id}"


class NodeSweep(models.Model):
    """One node's way through a campaign: a state machine moved by conditional updates only."""

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="sweeps")
    node = models.ForeignKey("inventory.Node", on_delete=models.PROTECT, related_name="sweeps")
    wave = models.PositiveIntegerField()
    position = models.PositiveIntegerField(default=0, help_text="order within the plan")
    state = models.CharField(max_length=20, choices=SweepState.choices(), default=SweepState.PENDING, db_index=True)
    target = models.JSONField(default=dict, help_text="{component: version}")
    # The approved plan's explanation of this node (moves, expected times, risks), copied at start.
    planned = models.JSONField(default=dict, blank=True)
    versions_before = models.JSONField(default=dict, blank=True)
    versions_after = models.JSONField(default=dict, blank=True)
    attempt = models.PositiveIntegerField(default=0)
    # The worker holding the current step and until when; a step past its deadline is re-driven.
    lease_owner = models.CharField(max_length=64, blank=True)
    step_started_at = models.DateTimeField(null=True, blank=True)
    step_deadline = models.DateTimeField(null=True, blank=True, db_index=True)
    patched_at = models.DateTimeField(null=True, blank=True)
    # Set while the node waits, untouched, for a receiver for one of its workloads (engine.steps._wait_first:
    # no node could take its checkpoint now) and for nothing else; cleared by the look that lets it go on
    # (before any checkpoint) and by any other end of its step.
    # Such a node keeps its parallelism slot but holds no wave order (policy.admits): receivers are
    # checked again at every look, so later waves may start meanwhile.
    waiting_since = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    # Head of this node's own evidence chain, and its signature once the sweep has ended.
    evidence_seq = models.PositiveIntegerField(default=0)
    evidence_head = models.CharField(max_length=64, blank=True)
    signed_seq = models.PositiveIntegerField(null=True, blank=True)
    head_signature = models.CharField(max_length=300, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["campaign_id", "wave", "position"]
        constraints = [
            models.UniqueConstraint(fields=["campaign", "node"], name="sweep_node_once_per_campaign"),
            # A node is in at most one active campaign.
            models.UniqueConstraint(
                fields=["node"], condition=Q(state__in=sorted(SweepState.ACTIVE)), name="sweep_one_active_per_node"
            ),
        ]

    def __str__(self) -> str:
        return f"campaign {self.campaign_id} node {self.node_id}: {self.state}"


class WorkloadMove(models.Model):
    """Where one workload of a swept node went, how, and that it resumed there."""

    sweep = models.ForeignKey(NodeSweep, on_delete=models.CASCADE, related_name="moves")
    workload = models.ForeignKey("inventory.Workload", on_delete=models.SET_NULL, null=True, blank=True)
    workload_ref = models.CharField(max_length=200, help_text="the workload's id on its source node")
    workload_name = models.CharField(max_length=200, blank=True)
    gpus = models.PositiveIntegerField(default=0)
    policy = models.CharField(max_length=20, choices=WorkloadPolicy.choices())
    state = models.CharField(max_length=20, choices=MoveState.choices(), default=MoveState.PLANNED)
    target_node = models.ForeignKey(
        "inventory.Node", on_delete=models.SET_NULL, null=True, blank=True, related_name="incoming_moves"
    )
    checkpoint_id = models.CharField(max_length=200, blank=True)
    checkpoint_sha256 = models.CharField(max_length=64, blank=True)
    steps_before = models.BigIntegerField(null=True, blank=True)
    steps_after = models.BigIntegerField(null=True, blank=True)
    new_workload_ref = models.CharField(max_length=200, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["sweep_id", "id"]
        constraints = [models.UniqueConstraint(fields=["sweep", "workload_ref"], name="move_once_per_workload")]

    def __str__(self) -> str:
        return f"{self.workload_name or self.workload_ref}: {self.state}"


class EvidenceEvent(models.Model):
    """Append-only and hash-chained: a campaign-level event (``sweep`` empty) is number ``seq`` of its
    campaign's chain, a node event number ``node_seq`` of its sweep's chain.

    ``hash = sha256(prev_hash + canonical JSON of the event)``; see campaigns.evidence and, for
    checking an export without the database, campaigns.verify.
    """

    campaign = models.ForeignKey(Campaign, on_delete=models.PROTECT, related_name="events")
    sweep = models.ForeignKey(NodeSweep, on_delete=models.PROTECT, null=True, blank=True, related_name="events")
    seq = models.PositiveIntegerField(null=True, blank=True)
    node_seq = models.PositiveIntegerField(null=True, blank=True)
    kind = models.CharField(max_length=40, choices=EvidenceKind.choices())
    actor = models.CharField(max_length=200)
    at = models.DateTimeField()
    data = models.JSONField(default=dict)
    prev_hash = models.CharField(max_length=64, blank=True)
    hash = models.CharField(max_length=64)

    class Meta:
        ordering = ["campaign_id", "at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["campaign", "seq"], name="event_seq_unique"),
            models.UniqueConstraint(fields=["sweep", "node_seq"], name="event_node_seq_unique"),
            models.CheckConstraint(
                condition=(Q(sweep__isnull=True, seq__isnull=False, node_seq__isnull=True)
                           | Q(sweep__isnull=False, seq__isnull=True, node_seq__isnull=False)),
                name="event_in_one_chain",
            ),
        ]

    def __str__(self) -> str:
        where = f"#{self.seq}" if self.sweep_id is None else f"sweep {self.sweep_id} #{self.node_seq}"
        return f"{self.campaign_id} {where} {self.kind}"

    def save(self, *args: object, **kwargs: object) -> None:
        if self.pk is not None and not kwargs.get("force_insert"):
            raise ValueError("evidence events are append-only")
        super().save(*args, **kwargs)  # type: ignore[arg-type]

    def delete(self, *args: object, **kwargs: object) -> tuple[int, dict[str, int]]:
        raise ValueError("evidence events are append-only")


class EvidenceSeal(models.Model):
    """A signed statement of a campaign's chain heads at one moment (campaigns.evidence.seal).

    ``body`` holds the campaign chain's head and every node chain's head with their Merkle root;
    ``signature`` is Ed25519 over the body's canonical JSON, by a key that is not in the database.
    """

    campaign = models.ForeignKey(Campaign, on_delete=models.PROTECT, related_name="seals")
    number = models.PositiveIntegerField()
    at = models.DateTimeField()
    reason = models.CharField(max_length=40)
    body = models.JSONField()
    signature = models.CharField(max_length=200)
    key_id = models.CharField(max_length=64)

    class Meta:
        ordering = ["campaign_id", "number"]
        constraints = [models.UniqueConstraint(fields=["campaign", "number"], name="seal_number_unique")]

    def __str__(self) -> str:
        return f"{self.campaign_id} seal {self.number} ({self.reason})"
