"""Campaign life cycle: plan, approve, start, pause, resume, abort. Typed, atomic, evidenced.

Every change locks the campaign row first (evidence.lock_campaign), changes state with a
conditional UPDATE, and appends its evidence event in the same transaction. Work for Celery
is enqueued with transaction.on_commit, so a task never sees a row that was rolled back.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from campaigns import evidence
from campaigns.choices import CampaignStatus, SweepState, WorkloadPolicyChoice
from campaigns.models import Approval, Campaign, NodeSweep, Plan
from campaigns.planner import (
    PlanError,
    PlanNode,
    PlanWorkload,
    Policy,
    compare,
    parse_blackouts,
    parse_limit,
    parse_windows,
)
from campaigns.planner import plan as run_planner
from inventory.choices import CheckpointEngine, ServiceState
from inventory.models import Node
from inventory.versions import DRIVER, parse_version


class CampaignError(Exception):
    """A request that cannot be honoured in the campaign's state; the message says why."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


# -- enqueueing: on commit, through a hook the benchmark can replace ---------------------
def _celery_enqueue(task: str, object_id: int, countdown: float = 0) -> None:
    from campaigns.tasks import advance_sweep, dispatch_campaign

    chosen = advance_sweep if task == "advance" else dispatch_campaign
    # The queue is read at call time, so a deployment (or a test) sharing a broker keeps its own.
    options: dict[str, Any] = {"queue": settings.CELERY_TASK_DEFAULT_QUEUE}
    if countdown:
        options["countdown"] = countdown
    chosen.apply_async((object_id,), **options)


ENQUEUE: list[Callable[[str, int, float], None]] = [_celery_enqueue]


def enqueue(task: str, object_id: int, countdown: float = 0) -> None:
    transaction.on_commit(lambda: ENQUEUE[0](task, object_id, countdown))


def actor_of(user: User | None) -> str:
    return f"user:{user.get_username()}" if user is not None else "system"


# -- targets and scope -------------------------------------------------------------------
def _newer(version: str, than: str, component: str) -> bool:
    a, b = parse_version(component, version), parse_version(component, than)
    if a.key is None or b.key is None:
        return version != than
    return a.key > b.key


def _advisory_ids(campaign: Campaign) -> list[int] | None:
    manager = getattr(campaign, "advisories", None)
    if manager is None or campaign.pk is None:
        return None
    return list(manager.values_list("pk", flat=True))


def _exposures(nodes: list[Node], campaign: Campaign) -> dict[int, list[tuple[str, str, Any]]]:
    """node id -> [(component, fixed version, deadline)] of its open exposures (advisories app)."""
    try:
        from advisories.choices import ExposureState
        from advisories.models import Exposure
    except ImportError:  # the advisories app is optional for planning with explicit targets
        return {}
    rows = Exposure.objects.filter(node__in=nodes, state=ExposureState.OPEN)
    advisory_ids = _advisory_ids(campaign)
    if advisory_ids is not None and advisory_ids:
        rows = rows.filter(advisory_id__in=advisory_ids)
    found: dict[int, list[tuple[str, str, Any]]] = {}
    for node_id, component, fixed, deadline in rows.values_list(
        "node_id", "component", "affected_range__fixed_version", "deadline"
    ):
        found.setdefault(node_id, []).append((component, fixed, deadline))
    return found


def node_target(campaign: Campaign, node: Node, versions: dict[str, str],
                exposures: list[tuple[str, str, Any]]) -> tuple[dict[str, str], str]:
    """The versions this node must reach, and why it is skipped when that is empty."""
    target: dict[str, str] = {}
    if campaign.target_versions:
        for component, wanted in campaign.target_versions.items():
            if isinstance(wanted, dict):
                branch = parse_version(DRIVER, versions.get(DRIVER, "")).branch if component == DRIVER else ""
                chosen = wanted.get(branch) or wanted.get("*")
                if not chosen:
                    return {}, f"no target version for {component} branch {branch or '?'}"
            else:
                chosen = str(wanted)
            target[component] = str(chosen)
    else:
        # The fixed version within the node's own branch: the highest any open exposure asks for.
        for component, fixed, _deadline in exposures:
            if fixed and (component not in target or _newer(fixed, target[component], component)):
                target[component] = fixed
        if not target:
            return {}, "no open exposure with a fixed version"
    needed = {}
    for component, version in target.items():
        current = versions.get(component, "")
        # A move to another driver branch is wanted even when the new branch number is lower.
        other_branch = component == DRIVER and bool(current) and (
            parse_version(DRIVER, version).branch != parse_version(DRIVER, current).branch)
        if current != version and (other_branch or _newer(version, current, component)):
            needed[component] = version
    if not needed:
        return {}, "already at or above the target versions"
    return needed, ""


def workload_policy(campaign: Campaign, ref: str, name: str, own_policy: str) -> str:
    overrides = campaign.workload_overrides or {}
    if ref in overrides:
        return str(overrides[ref])
    if name and name in overrides:
        return str(overrides[name])
    # A workload's own non-default policy (set by its owner) beats the campaign default.
    if own_policy and own_policy != WorkloadPolicyChoice.CHECKPOINT:
        return own_policy
    return campaign.workload_policy


def scope_nodes(campaign: Campaign) -> tuple[list[Node], list[Node]]:
    """(nodes in scope, other nodes of the same clusters that may receive work)."""
    nodes = Node.objects.exclude(service_state=ServiceState.GONE).select_related("cluster").prefetch_related(
        "components", "workloads"
    )
    if campaign.clusters:
        nodes = nodes.filter(cluster__name__in=campaign.clusters)
    everyone = list(nodes)
    selector = dict(campaign.node_selector or {})
    names = set(selector.pop("names", []) or [])
    in_scope: list[Node] = []
    others: list[Node] = []
    for node in everyone:
        chosen = (not campaign.pools or node.pool in campaign.pools) and (not names or node.name in names) and all(
            str(node.labels.get(k)) == str(v) for k, v in selector.items()
        )
        (in_scope if chosen else others).append(node)
    return in_scope, others


def _plan_node(campaign: Campaign, node: Node, target: dict[str, str], deadline: Any) -> PlanNode:
    versions = {c.component: c.version for c in node.components.all()}
    workloads = tuple(
        PlanWorkload(
            ref=w.scheduler_id, name=w.name, gpus=w.gpus,
            checkpointable=w.checkpoint_engine != CheckpointEngine.NONE,
            policy=workload_policy(campaign, w.scheduler_id, w.name, w.policy),
            engine=w.engine, engine_version=w.engine_version,
        )
        for w in node.workloads.all() if w.gone_at is None
    )
    return PlanNode(
        id=node.pk, name=node.name, cluster=node.cluster.name, pool=node.pool, gpu_model=node.gpu_model,
        gpu_count=node.gpu_count, versions=versions, workloads=workloads, target=target, deadline=deadline,
    )


def policy_of(campaign: Campaign) -> Policy:
    try:
        return Policy(
            start=max(timezone.now(), campaign.created_at or timezone.now()),
            per_cluster=campaign.parallelism_per_cluster, per_pool=campaign.parallelism_per_pool,
            windows=parse_windows(campaign.windows or []), blackouts=parse_blackouts(campaign.blackouts or []),
            node_seconds=campaign.node_estimate_s, cold_restart_allowed=campaign.cold_restart_allowed,
            deadline=campaign.deadline,
        )
    except PlanError as exc:
        raise CampaignError(f"campaign {campaign.pk}: {exc}", status=400) from exc


def compute_plan(campaign: Campaign) -> dict[str, Any]:
    """Run the planner on the current inventory (read only: the dry run)."""
    in_scope, others = scope_nodes(campaign)
    if not in_scope:
        # A typo in a selector would otherwise plan, run and "complete" a campaign that patched nothing.
        raise CampaignError(
            f"campaign {campaign.pk} selects no node: clusters {campaign.clusters or 'any'}, pools "
            f"{campaign.pools or 'any'}, node_selector {campaign.node_selector or {}}", status=400)
    exposures = _exposures(in_scope, campaign)
    scope: list[PlanNode] = []
    skipped = []
    for node in in_scope:
        versions = {c.component: c.version for c in node.components.all()}
        mine = exposures.get(node.pk, [])
        target, reason = node_target(campaign, node, versions, mine)
        if not target:
            skipped.append({"node": node.pk, "name": node.name, "reason": reason})
            others.append(node)  # not swept, so it may receive work
            continue
        deadlines = [d for _c, _f, d in mine if d is not None]
        scope.append(_plan_node(campaign, node, target, min(deadlines) if deadlines else None))
    receivers = [_plan_node(campaign, node, {}, None) for node in others
                 if node.service_state == ServiceState.IN_SERVICE]
    try:
        content = run_planner(scope, receivers, policy_of(campaign))
    except PlanError as exc:
        raise CampaignError(f"campaign {campaign.pk}: {exc}", status=400) from exc
    content["skipped"] = skipped
    return content


# -- life cycle --------------------------------------------------------------------------
def _set_status(campaign: Campaign, expected: set[str], status: str, **fields: Any) -> None:
    rows = Campaign.objects.filter(pk=campaign.pk, status__in=expected).update(status=status, **fields)
    if rows != 1:
        raise CampaignError(f"campaign {campaign.pk} is {campaign.status}; cannot become {status}")
    campaign.status = status
    for name, value in fields.items():
        setattr(campaign, name, value)


def make_plan(campaign_id: int, user: User | None) -> Plan:
    """Store a new plan version; earlier approvals no longer count (they approved another plan)."""
    with transaction.atomic():
        campaign = evidence.lock_campaign(campaign_id)
        if campaign.status not in CampaignStatus.EDITABLE:
            raise CampaignError(f"campaign {campaign.pk} is {campaign.status}; plans are made before it starts")
        content = compute_plan(campaign)
        version = (campaign.plans.aggregate(v=Max("version"))["v"] or 0) + 1
        plan = Plan.objects.create(campaign=campaign, version=version, created_by=user, content=content,
                                   summary=content["summary"])
        _set_status(campaign, set(CampaignStatus.EDITABLE), CampaignStatus.PLANNED, approved_plan=None)
        evidence.append(campaign, "planned", actor_of(user), {"plan": plan.pk, "version": version,
                                                               "summary": content["summary"]})
        return plan


def compare_plans(campaign: Campaign, old_version: int | None = None, new_version: int | None = None
                  ) -> dict[str, Any]:
    """Compare two stored versions, or the newest stored one with a fresh re-plan."""
    plans = {p.version: p for p in campaign.plans.all()}
    if not plans:
        raise CampaignError(f"campaign {campaign.pk} has no stored plan to compare", status=400)
    old = plans.get(old_version or max(plans))
    if old is None:
        raise CampaignError(f"campaign {campaign.pk} has no plan version {old_version}", status=404)
    if new_version is None:
        new_content = compute_plan(campaign)
    elif new_version in plans:
        new_content = plans[new_version].content
    else:
        raise CampaignError(f"campaign {campaign.pk} has no plan version {new_version}", status=404)
    return {"old": old.version, "new": new_version or "re-plan", **compare(old.content, new_content)}


def approve(campaign_id: int, user: User, comment: str = "") -> Campaign:
    with transaction.atomic():
        campaign = evidence.lock_campaign(campaign_id)
        if campaign.requested_by_id is not None and campaign.requested_by_id == user.pk:
            raise CampaignError(f"campaign {campaign.pk}: the requester cannot approve their own campaign", 403)
        if campaign.status not in (CampaignStatus.PLANNED, CampaignStatus.APPROVED):
            raise CampaignError(f"campaign {campaign.pk} is {campaign.status}; only a planned campaign is approved")
        plan = campaign.plans.order_by("-version").first()
        assert plan is not None  # PLANNED implies a plan
        _approval, created = Approval.objects.get_or_create(campaign=campaign, plan=plan, user=user,
                                                            defaults={"comment": comment})
        if created:
            evidence.append(campaign, "approved", actor_of(user), {"plan": plan.pk, "version": plan.version,
                                                                    "comment": comment})
        count = Approval.objects.filter(plan=plan).count()
        if count >= campaign.approvals_required and campaign.status == CampaignStatus.PLANNED:
            _set_status(campaign, {CampaignStatus.PLANNED}, CampaignStatus.APPROVED, approved_plan=plan)
            evidence.append(campaign, "fully_approved", actor_of(user), {"plan": plan.pk, "approvals": count})
        return campaign


def start(campaign_id: int, user: User | None) -> Campaign:
    """Create one sweep per planned node and begin; a node already in an active campaign is refused."""
    with transaction.atomic():
        campaign = evidence.lock_campaign(campaign_id)
        if campaign.status != CampaignStatus.APPROVED or campaign.approved_plan_id is None:
            raise CampaignError(f"campaign {campaign.pk} is {campaign.status}: it must be approved before it starts")
        plan = campaign.approved_plan
        assert plan is not None
        nodes = plan.content.get("nodes", {})
        sweeps = [
            NodeSweep(campaign=campaign, node_id=int(node_id), wave=item["wave"], position=item["position"],
                      target=item["target"], planned=item)
            for node_id, item in nodes.items()
        ]
        try:
            with transaction.atomic():
                NodeSweep.objects.bulk_create(sweeps)
        except IntegrityError:
            busy = NodeSweep.objects.filter(node_id__in=[s.node_id for s in sweeps],
                                            state__in=SweepState.ACTIVE).select_related("node").first()
            where = f"node {busy.node.name} is in active campaign {busy.campaign_id}" if busy else "a node is busy"
            raise CampaignError(f"campaign {campaign.pk} cannot start: {where}") from None
        _set_status(campaign, {CampaignStatus.APPROVED}, CampaignStatus.RUNNING, started_at=timezone.now(),
                    limits=plan.content.get("limits") or {})
        # Versions before are recorded per node as the node reports them, when it is drained.
        evidence.append(campaign, "started", actor_of(user), {"plan": plan.pk, "nodes": len(sweeps)})
        enqueue("dispatch", campaign.pk)
        return campaign


def pause(campaign_id: int, user: User | None) -> Campaign:
    with transaction.atomic():
        campaign = evidence.lock_campaign(campaign_id)
        _set_status(campaign, {CampaignStatus.RUNNING, CampaignStatus.WAITING}, CampaignStatus.PAUSED)
        evidence.append(campaign, "paused", actor_of(user), {})
        return campaign


def resume(campaign_id: int, user: User | None) -> Campaign:
    with transaction.atomic():
        campaign = evidence.lock_campaign(campaign_id)
        was = campaign.status
        _set_status(campaign, {CampaignStatus.PAUSED, CampaignStatus.HALTED}, CampaignStatus.RUNNING,
                    status_reason="")
        evidence.append(campaign, "resumed", actor_of(user), {"from": was})
        enqueue("dispatch", campaign.pk)
        return campaign


def abort(campaign_id: int, user: User | None, reason: str = "") -> Campaign:
    """Stop: pending nodes are skipped; nodes not yet patched are rolled back by their next step."""
    with transaction.atomic():
        campaign = evidence.lock_campaign(campaign_id)
        if campaign.status in CampaignStatus.TERMINAL:
            raise CampaignError(f"campaign {campaign.pk} is already {campaign.status}")
        _set_status(campaign, set(CampaignStatus.values()) - set(CampaignStatus.TERMINAL), CampaignStatus.ABORTED,
                    status_reason=reason or "aborted", finished_at=timezone.now())
        evidence.append(campaign, "aborted", actor_of(user), {"reason": reason})
        for sweep in NodeSweep.objects.filter(campaign=campaign, state=SweepState.PENDING):
            if NodeSweep.objects.filter(pk=sweep.pk, state=SweepState.PENDING).update(state=SweepState.SKIPPED):
                evidence.append(campaign, "skipped", actor_of(user), {"reason": "campaign aborted"}, sweep=sweep)
        for sweep_id in NodeSweep.objects.filter(
            campaign=campaign, state__in=SweepState.BEFORE_PATCH - {SweepState.PENDING}
        ).values_list("pk", flat=True):
            enqueue("advance", sweep_id)
        return campaign


def error_budget(campaign: Campaign, total: int) -> int:
    """Failed nodes tolerated; one more halts the campaign. '0' halts at the first failure."""
    if campaign.error_budget.strip() in ("0", "0%"):
        return 0
    return parse_limit(campaign.error_budget, total, "error_budget")


def step_deadline(campaign: Campaign) -> Any:
    return timezone.now() + timedelta(seconds=campaign.step_timeout_s)
