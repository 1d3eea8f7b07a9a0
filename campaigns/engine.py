"""Execution: the per-node state machine, admission of nodes, and re-driving stuck steps.

A step runs in three parts. (1) Claim: a conditional UPDATE takes the step's lease (state as
expected and no live lease) and sets its deadline. (2) Work: the executor operations, outside
any transaction, each with an operation id derived from the campaign, sweep and step, so doing
it again after a crash does nothing twice. (3) Finish: a conditional UPDATE moves the state on
only if this worker still holds the lease, with the evidence event in the same transaction.

A worker killed anywhere leaves a step whose deadline passes; ``redrive`` (periodic) enqueues it
again and the next worker repeats the idempotent operations. Nothing is half-recorded: either
the transition and its event are committed together, or neither is.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Case, Count, F, Min, OuterRef, Q, Subquery, Sum, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from campaigns import evidence
from campaigns.choices import CampaignStatus, MoveState, SweepState, WorkloadPolicyChoice
from campaigns.models import Campaign, NodeSweep, WorkloadMove
from campaigns.planner import Calendar, parse_blackouts, parse_windows
from campaigns.services import ENQUEUE, enqueue, error_budget
from executors.base import (
    CheckpointResult,
    Executor,
    NodeRef,
    PermanentExecutorError,
    TemporaryExecutorError,
    WorkloadInfo,
    get_executor,
)
from inventory.choices import ChangeAction, ChangeSource, CheckpointEngine, ServiceState
from inventory.models import ChangeLog, Node, NodeComponent, Workload
from inventory.versions import parse_version

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 5
RETRY_BACKOFF_S = 2.0
WAIT_POLL_S = 30.0


class WaitMore(Exception):
    """The step is not done yet and not failing (a workload we wait for is still running)."""

    def __init__(self, seconds: float, reason: str) -> None:
        super().__init__(reason)
        self.seconds = seconds


def node_ref(node: Node) -> NodeRef:
    return NodeRef(
        cluster=node.cluster.name, name=node.name, node_id=node.pk, endpoint=node.agent_endpoint,
        gpu_model=node.gpu_model, gpu_count=node.gpu_count,
    )


def op_id(sweep: NodeSweep, name: str) -> str:
    # The agent accepts [A-Za-z0-9._:-], at most 128 characters.
    safe = "".join(ch if ch.isalnum() or ch in "._:-" else "_" for ch in name)
    return f"gs-{sweep.campaign_id}-{sweep.pk}-{safe}"[:128]


def _actor(worker: str) -> str:
    return f"worker:{worker}"


def _sweep(sweep_id: int) -> NodeSweep:
    return NodeSweep.objects.select_related("campaign", "node__cluster").get(pk=sweep_id)


# -- admission ---------------------------------------------------------------------------
def dispatch(campaign_id: int) -> list[int]:
    """Admit pending nodes within the window, the parallelism limits and the wave order."""
    now = timezone.now()
    with transaction.atomic():
        campaign = evidence.lock_campaign(campaign_id)
        if campaign.status not in (CampaignStatus.RUNNING, CampaignStatus.WAITING):
            return []
        # Aggregates only: a dispatch costs the same for 10 nodes or 10,000.
        sweeps = NodeSweep.objects.filter(campaign=campaign)
        lowest = sweeps.filter(state__in=SweepState.ACTIVE).aggregate(w=Min("wave"))["w"]
        if lowest is None:
            counts = dict(sweeps.values_list("state").annotate(n=Count("id")).values_list("state", "n"))
            Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.COMPLETED, finished_at=now)
            campaign.status = CampaignStatus.COMPLETED
            evidence.append(campaign, "completed", "system", {"states": counts})
            return []
        calendar = Calendar(parse_windows(campaign.windows or []), parse_blackouts(campaign.blackouts or []),
                            now, horizon_days=9)
        if not calendar.is_open(now):
            opens = calendar.earliest(now, timedelta(0))
            if campaign.status == CampaignStatus.RUNNING:
                Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.WAITING)
                campaign.status = CampaignStatus.WAITING
                evidence.append(campaign, "waiting_for_window", "system",
                                {"next_window": opens.isoformat() if opens else None})
            if opens is not None:
                enqueue("dispatch", campaign.pk, min(300.0, max(1.0, (opens - now).total_seconds())))
            return []
        if campaign.status == CampaignStatus.WAITING:
            Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.RUNNING)
            campaign.status = CampaignStatus.RUNNING
            evidence.append(campaign, "window_opened", "system", {})
        limits = campaign.limits or {}
        cluster_limit: dict[str, int] = limits.get("cluster") or {}
        pool_limit: dict[str, int] | None = limits.get("pool")
        in_cluster: Counter[str] = Counter()
        in_pool: Counter[str] = Counter()
        for cluster, pool, count in sweeps.filter(state__in=SweepState.WORKING).values_list(
                "node__cluster__name", "node__pool").annotate(n=Count("id")).values_list(
                "node__cluster__name", "node__pool", "n"):
            in_cluster[cluster] += count
            in_pool[f"{cluster}/{pool}"] += count
        # Waves go in order: wave v starts only when every wave up to v-2 is finished, so the
        # nodes receiving its workloads (wave v+2 or later) have not started either.
        admitted: list[int] = []
        pending = sweeps.filter(state=SweepState.PENDING, wave__lte=lowest + 1).order_by("wave", "position").values(
            "id", "wave", "node__cluster__name", "node__pool")
        for row in pending:
            cluster, pool = row["node__cluster__name"], f"{row['node__cluster__name']}/{row['node__pool']}"
            if in_cluster[cluster] >= cluster_limit.get(cluster, 1):
                continue
            if pool_limit is not None and in_pool[pool] >= pool_limit.get(pool, 1):
                continue
            moved = NodeSweep.objects.filter(pk=row["id"], state=SweepState.PENDING).update(
                state=SweepState.DRAINING, lease_owner="", attempt=0, step_started_at=now,
                step_deadline=now + timedelta(seconds=campaign.step_timeout_s),
            )
            if moved:
                in_cluster[cluster] += 1
                in_pool[pool] += 1
                admitted.append(row["id"])
                evidence.append(campaign, "admitted", "system", {"wave": row["wave"]}, sweep=NodeSweep(pk=row["id"]))
        for sweep_id in admitted:
            enqueue("advance", sweep_id)
        return admitted


# -- one step ----------------------------------------------------------------------------
def _claim(sweep: NodeSweep, worker: str) -> bool:
    """Take the step's lease. One conditional UPDATE; the step's evidence event is written when it
    ends (with this start time and attempt), so a claim needs no campaign lock."""
    now = timezone.now()
    rows = NodeSweep.objects.filter(pk=sweep.pk, state=sweep.state).filter(
        Q(lease_owner="") | Q(step_deadline__lt=now)
    ).update(lease_owner=worker, attempt=F("attempt") + 1, step_started_at=now,
             step_deadline=now + timedelta(seconds=sweep.campaign.step_timeout_s))
    if not rows:
        return False
    sweep.attempt = NodeSweep.objects.values_list("attempt", flat=True).get(pk=sweep.pk)
    sweep.lease_owner, sweep.step_started_at = worker, now
    return True


def _release(sweep: NodeSweep, worker: str, countdown: float, kind: str, data: dict[str, Any]) -> None:
    with transaction.atomic():
        campaign = evidence.lock_campaign(sweep.campaign_id, light=True)
        rows = NodeSweep.objects.filter(pk=sweep.pk, state=sweep.state, lease_owner=worker).update(
            lease_owner="", step_deadline=timezone.now() + timedelta(seconds=countdown + 1))
        if rows:
            evidence.append(campaign, kind, _actor(worker), {"step": sweep.state, **data}, sweep=sweep)
            enqueue("advance", sweep.pk, countdown)


def _node_state(node_id: int, state: str) -> None:
    Node.objects.filter(pk=node_id).update(service_state=state)


def _finish(sweep: NodeSweep, worker: str, data: dict[str, Any], fields: dict[str, Any]) -> str | None:
    now = timezone.now()
    current = sweep.state
    following = SweepState.next(current)
    with transaction.atomic():
        campaign = evidence.lock_campaign(sweep.campaign_id, light=True)
        if campaign.status == CampaignStatus.ABORTED and following == SweepState.PATCHING:
            # Aborted before the patch: hand over to the rollback instead of patching.
            NodeSweep.objects.filter(pk=sweep.pk, lease_owner=worker).update(lease_owner="", step_deadline=now)
            enqueue("advance", sweep.pk)
            return None
        rows = NodeSweep.objects.filter(pk=sweep.pk, state=current, lease_owner=worker).update(
            state=following, lease_owner="", attempt=0, step_started_at=now,
            step_deadline=None if following == SweepState.DONE else now + timedelta(seconds=campaign.step_timeout_s),
            **fields,
        )
        if not rows:
            return None  # the lease expired and another worker finished this step
        evidence.append(campaign, "step_done", _actor(worker), {
            "step": current, "next": following, "started_at": sweep.step_started_at, "attempt": sweep.attempt, **data,
        }, sweep=sweep)
        if current == SweepState.DRAINING:
            _node_state(sweep.node_id, ServiceState.DRAINING)
        elif following == SweepState.PATCHING:
            _node_state(sweep.node_id, ServiceState.PATCHING)
        elif following == SweepState.DONE:
            _node_state(sweep.node_id, ServiceState.IN_SERVICE)
        if following == SweepState.DONE:
            evidence.append(campaign, "done", _actor(worker), {"versions_after": sweep.versions_after
                                                               or fields.get("versions_after", {})}, sweep=sweep)
            enqueue("dispatch", campaign.pk)
        else:
            enqueue("advance", sweep.pk)
        sweep.state = following
        return following


def _check_budget(campaign: Campaign) -> None:
    counts = Counter(NodeSweep.objects.filter(campaign=campaign).values_list("state", flat=True))
    total = sum(counts.values())
    allowed = error_budget(campaign, total)
    if counts[SweepState.FAILED] > allowed and campaign.status in (
        CampaignStatus.RUNNING, CampaignStatus.WAITING, CampaignStatus.PAUSED
    ):
        reason = f"{counts[SweepState.FAILED]} failed nodes exceed the error budget of {allowed}"
        Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.HALTED, status_reason=reason)
        campaign.status = CampaignStatus.HALTED
        evidence.append(campaign, "halted", "system", {"reason": reason, "failed": counts[SweepState.FAILED]})


def _end(sweep: NodeSweep, worker: str, final: str, data: dict[str, Any]) -> bool:
    with transaction.atomic():
        campaign = evidence.lock_campaign(sweep.campaign_id, light=True)
        rows = NodeSweep.objects.filter(pk=sweep.pk, state=sweep.state, lease_owner=worker).update(
            state=final, lease_owner="", step_deadline=None)
        if not rows:
            return False
        evidence.append(campaign, final, _actor(worker), {"from": sweep.state, **data}, sweep=sweep)
        if final == SweepState.FAILED:
            _check_budget(campaign)
        enqueue("dispatch", campaign.pk)
        sweep.state = final
        return True


def _record_error(sweep: NodeSweep, worker: str, error: str) -> None:
    with transaction.atomic():
        campaign = evidence.lock_campaign(sweep.campaign_id, light=True)
        rows = NodeSweep.objects.filter(pk=sweep.pk, state=sweep.state, lease_owner=worker).update(error=error[:4000])
        if rows:
            sweep.error = error
            evidence.append(campaign, "step_failed", _actor(worker), {"step": sweep.state, "error": error[:4000]},
                            sweep=sweep)


def _unwind(sweep: NodeSweep, worker: str, ex: Executor, final: str) -> str | None:
    """Put a node that was not patched back as it was: its checkpointed workloads restored on it."""
    ref = node_ref(sweep.node)
    returned: list[dict[str, Any]] = []
    if sweep.state != SweepState.PENDING:
        # Leave maintenance first: a node in maintenance admits no work, so its own workloads
        # could not come home. Repeating it (same operation id) on a re-drive is harmless.
        ex.undo(ref, op_id(sweep, "undo"))
    for move in WorkloadMove.objects.filter(sweep=sweep, state=MoveState.CHECKPOINTED).select_related(
            "target_node__cluster"):
        if move.target_node is not None:
            # A restore was under way: finish it where it went (same operation id) rather than
            # starting a second copy here; only a restore that failed comes home.
            try:
                away = ex.restore(node_ref(move.target_node), move.checkpoint_id, op_id(sweep, f"restore-{move.pk}"))
            except PermanentExecutorError:
                pass
            else:
                entry = {"workload": move.workload_name or move.workload_ref, "from": sweep.node.name,
                         "to": move.target_node.name, "checkpoint_id": move.checkpoint_id,
                         "new_id": away.workload_id, "resumed": True}
                with transaction.atomic():
                    if _move(sweep, move, MoveState.CHECKPOINTED, "restored", entry, state=MoveState.RESTORED,
                             new_workload_ref=away.workload_id, steps_after=away.steps):
                        _move_inventory(move, move.target_node, away.workload_id)
                returned.append(entry)
                continue
        result = ex.restore(ref, move.checkpoint_id, op_id(sweep, f"return-{move.pk}"))
        entry = {"workload": move.workload_name or move.workload_ref, "checkpoint_id": move.checkpoint_id,
                 "returned_to": sweep.node.name, "new_id": result.workload_id, "steps_before": move.steps_before,
                 "steps_after": result.steps}
        with transaction.atomic():
            if _move(sweep, move, MoveState.CHECKPOINTED, "returned", entry, state=MoveState.RETURNED,
                     new_workload_ref=result.workload_id, steps_after=result.steps, target_node=sweep.node):
                _move_inventory(move, sweep.node, result.workload_id)
        returned.append(entry)
    with transaction.atomic():
        Node.objects.filter(pk=sweep.node_id).update(service_state=ServiceState.IN_SERVICE)
    if _end(sweep, worker, final, {"error": sweep.error, "workloads_returned": returned}):
        return final
    return None


def advance(sweep_id: int, worker: str | None = None) -> str | None:
    """Run the sweep's current step once; returns the new state (None when nothing was done)."""
    worker = worker or uuid.uuid4().hex[:16]
    sweep = _sweep(sweep_id)
    if sweep.state not in SweepState.WORKING:
        return None
    campaign = sweep.campaign
    unwinding = sweep.state in SweepState.BEFORE_PATCH and (
        campaign.status == CampaignStatus.ABORTED or bool(sweep.error))
    if not _claim(sweep, worker):
        return None
    ex = get_executor(sweep.node.cluster)
    try:
        if unwinding:
            final = SweepState.FAILED if sweep.error else SweepState.ROLLED_BACK
            return _unwind(sweep, worker, ex, final)
        data, fields = STEPS[sweep.state](sweep, ex, node_ref(sweep.node))
    except WaitMore as wait:
        _release(sweep, worker, wait.seconds, "waiting", {"reason": str(wait)})
        return sweep.state
    except TemporaryExecutorError as exc:
        if sweep.attempt < MAX_ATTEMPTS:
            _release(sweep, worker, RETRY_BACKOFF_S * sweep.attempt, "retry", {"error": str(exc),
                                                                              "attempt": sweep.attempt})
            return sweep.state
        return _failed(sweep, worker, ex, f"gave up after {sweep.attempt} attempts: {exc}")
    except PermanentExecutorError as exc:
        return _failed(sweep, worker, ex, str(exc))
    return _finish(sweep, worker, data, fields)


def _failed(sweep: NodeSweep, worker: str, ex: Executor, error: str) -> str | None:
    _record_error(sweep, worker, error)
    if sweep.state in SweepState.BEFORE_PATCH:
        try:
            return _unwind(sweep, worker, ex, SweepState.FAILED)
        except (TemporaryExecutorError, PermanentExecutorError) as exc:
            # The error is recorded: the next attempt (redrive) unwinds again.
            _release(sweep, worker, RETRY_BACKOFF_S, "retry", {"error": f"undo: {exc}"})
            return sweep.state
    # Patched (or partly): the node stays out of service for a human to look at.
    return SweepState.FAILED if _end(sweep, worker, SweepState.FAILED, {"error": error}) else None


# -- the steps ---------------------------------------------------------------------------
StepResult = tuple[dict[str, Any], dict[str, Any]]


def _drain(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> StepResult:
    before = ex.facts(ref)
    ex.drain(ref, op_id(sweep, "drain"))
    return {"versions_before": before}, {"versions_before": before}


def _planned_moves(sweep: NodeSweep) -> dict[str, dict[str, Any]]:
    return {m["workload"]: m for m in (sweep.planned or {}).get("moves", [])}


def _move(sweep: NodeSweep, move: WorkloadMove, expected: str, kind: str, data: dict[str, Any],
          **fields: Any) -> bool:
    """A workload move's conditional state change and its evidence event, in one transaction."""
    with transaction.atomic():
        campaign = evidence.lock_campaign(sweep.campaign_id, light=True)
        if not WorkloadMove.objects.filter(pk=move.pk, state=expected).update(**fields):
            return False
        evidence.append(campaign, kind, "system", data, sweep=sweep)
        return True


def _checkpoint(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> StepResult:
    from campaigns.services import workload_policy

    campaign = sweep.campaign
    running = {w.id: w for w in ex.list_workloads(ref)}
    known = {w.scheduler_id: w for w in Workload.objects.filter(cluster=sweep.node.cluster,
                                                                 scheduler_id__in=list(running))}
    for info in running.values():
        row = known.get(info.id)
        WorkloadMove.objects.get_or_create(sweep=sweep, workload_ref=info.id, defaults={
            "workload": row, "workload_name": info.name, "gpus": info.gpus or (row.gpus if row else 0),
            "policy": workload_policy(campaign, info.id, info.name, row.policy if row else ""),
            "detail": {"engine": (row.checkpoint_engine if row else info.checkpoint_engine)},
        })
    done = []
    for move in WorkloadMove.objects.filter(sweep=sweep, state=MoveState.PLANNED):
        engine = str(move.detail.get("engine") or CheckpointEngine.NONE)
        checkpoint = move.policy == WorkloadPolicyChoice.CHECKPOINT and engine != CheckpointEngine.NONE
        if move.workload_ref not in running:
            # Either it ended by itself, or a worker died after the agent checkpointed (or stopped)
            # it and before this was recorded. Asking again with the same operation id tells which:
            # the agent answers with the first result, or fails because nothing was ever started.
            entry = _recover_move(sweep, ex, ref, move, engine, checkpoint)
            if entry is not None:
                done.append(entry)
            continue
        if move.policy == WorkloadPolicyChoice.WAIT:
            waited = timezone.now() - move.created_at
            if campaign.wait_limit is None or waited < campaign.wait_limit:
                raise WaitMore(WAIT_POLL_S, f"waiting for {move.workload_name or move.workload_ref} to finish")
            if not campaign.cold_restart_allowed:
                raise PermanentExecutorError(
                    f"workload {move.workload_name or move.workload_ref} still runs after the wait limit "
                    "and cold restart is not allowed")
        if checkpoint:
            result = ex.checkpoint(ref, move.workload_ref, engine, op_id(sweep, f"ck-{move.workload_ref}"))
            entry = _checkpointed(sweep, move, engine, result)
        else:
            if move.policy != WorkloadPolicyChoice.COLD_RESTART and not campaign.cold_restart_allowed:
                raise PermanentExecutorError(
                    f"workload {move.workload_name or move.workload_ref} cannot be checkpointed ({engine}) "
                    "and cold restart is not allowed")
            ex.stop(ref, move.workload_ref, op_id(sweep, f"stop-{move.workload_ref}"))
            entry = {"workload": move.workload_name or move.workload_ref, "action": "stopped for a cold restart"}
            _move(sweep, move, MoveState.PLANNED, "stopped", entry, state=MoveState.STOPPED)
        done.append(entry)
    return {"workloads": done}, {}


def _checkpointed(sweep: NodeSweep, move: WorkloadMove, engine: str, result: CheckpointResult) -> dict[str, Any]:
    entry = {"workload": move.workload_name or move.workload_ref, "checkpoint_id": result.checkpoint_id,
             "sha256": result.sha256, "bytes": result.total_bytes, "steps": result.steps, "engine": engine}
    _move(sweep, move, MoveState.PLANNED, "checkpointed", entry, state=MoveState.CHECKPOINTED,
          checkpoint_id=result.checkpoint_id, checkpoint_sha256=result.sha256, steps_before=result.steps)
    return entry


def _recover_move(sweep: NodeSweep, ex: Executor, ref: NodeRef, move: WorkloadMove, engine: str,
                  checkpoint: bool) -> dict[str, Any] | None:
    """A planned move whose workload no longer runs: checkpointed before a crash, or finished."""
    name = move.workload_name or move.workload_ref
    if checkpoint:
        try:
            result = ex.checkpoint(ref, move.workload_ref, engine, op_id(sweep, f"ck-{move.workload_ref}"))
        except PermanentExecutorError:
            result = None
        if result is not None:
            return _checkpointed(sweep, move, engine, result)
    elif move.policy != WorkloadPolicyChoice.WAIT:
        try:
            ex.stop(ref, move.workload_ref, op_id(sweep, f"stop-{move.workload_ref}"))
        except PermanentExecutorError:
            pass
        else:
            entry = {"workload": name, "action": "stopped for a cold restart"}
            _move(sweep, move, MoveState.PLANNED, "stopped", entry, state=MoveState.STOPPED)
            return entry
    _move(sweep, move, MoveState.PLANNED, "finished",
          {"workload": name, "action": "ended by itself before it was moved"}, state=MoveState.FINISHED)
    return None


def choose_target(sweep: NodeSweep, move: WorkloadMove, planned: int | None) -> Node | None:
    """A node the checkpoint can be restored on: same fingerprint, room, not being drained soon.

    One query: the fingerprint (GPU model, driver, CUDA) and free GPUs are matched in SQL, the
    planned target first, then the emptiest.
    """
    source = sweep.node
    versions = source.component_versions()
    candidates = Node.objects.filter(
        cluster=source.cluster, gpu_model=source.gpu_model, service_state=ServiceState.IN_SERVICE, gone_at__isnull=True,
    ).exclude(pk=source.pk)
    for component in ("driver", "cuda"):
        if versions.get(component):
            candidates = candidates.filter(pk__in=NodeComponent.objects.filter(
                component=component, version=versions[component]).values("node_id"))
        else:
            candidates = candidates.exclude(pk__in=NodeComponent.objects.filter(component=component)
                                            .values("node_id"))
    # Nodes being swept now, and nodes of this campaign in this or the next wave (drained before
    # the workload settles), do not receive work.
    candidates = candidates.exclude(pk__in=NodeSweep.objects.filter(state__in=SweepState.WORKING).values("node_id"))
    candidates = candidates.exclude(pk__in=NodeSweep.objects.filter(
        campaign=sweep.campaign, state=SweepState.PENDING, wave__lte=sweep.wave + 1).values("node_id"))
    used = Workload.objects.filter(node=OuterRef("pk"), gone_at__isnull=True).values("node").annotate(
        n=Sum("gpus")).values("n")
    candidates = candidates.annotate(free=F("gpu_count") - Coalesce(Subquery(used), 0)).filter(free__gte=move.gpus)
    first = Case(When(pk=planned, then=Value(0)), default=Value(1)) if planned else Value(1)
    return candidates.order_by(first, "-free", "name").first()


def _move_inventory(move: WorkloadMove, target: Node, new_ref: str) -> None:
    if move.workload_id is None:
        return
    with transaction.atomic():
        row = Workload.objects.select_for_update().filter(pk=move.workload_id).first()
        if row is None or (row.node_id == target.pk and row.scheduler_id == new_ref):
            return
        changes = {"node": [row.node_id, target.pk], "scheduler_id": [row.scheduler_id, new_ref]}
        Workload.objects.filter(pk=row.pk).update(node=target, scheduler_id=new_ref)
        ChangeLog.objects.create(source=ChangeSource.CAMPAIGN, action=ChangeAction.UPDATE, object_type="workload",
                                 object_id=row.pk, object_repr=str(row)[:300], changes=changes)


def _resumed(ex: Executor, ref: NodeRef, workload_id: str) -> WorkloadInfo | None:
    return next((w for w in ex.list_workloads(ref) if w.id == workload_id), None)


def _migrate(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> StepResult:
    planned = _planned_moves(sweep)
    done = []
    for move in WorkloadMove.objects.filter(sweep=sweep, state=MoveState.CHECKPOINTED).select_related("target_node"):
        plan_entry = planned.get(move.workload_ref, {})
        if move.target_node_id is None:
            chosen = choose_target(sweep, move, plan_entry.get("to"))
            if chosen is None:
                raise PermanentExecutorError(f"no compatible node with {move.gpus} free GPUs for workload "
                                             f"{move.workload_name or move.workload_ref}")
            # Recorded before the restore: a retry after a crash goes to the same node with the same
            # operation id, so the workload is restored once, never on two nodes.
            WorkloadMove.objects.filter(pk=move.pk, target_node__isnull=True).update(target_node=chosen)
            move.refresh_from_db(fields=["target_node"])
        assert move.target_node_id is not None
        target = Node.objects.select_related("cluster").get(pk=move.target_node_id)
        result = ex.restore(node_ref(target), move.checkpoint_id, op_id(sweep, f"restore-{move.pk}"))
        seen = _resumed(ex, node_ref(target), result.workload_id)
        if seen is None:
            raise TemporaryExecutorError(f"restored workload {result.workload_id} is not running on {target.name} yet")
        entry = {"workload": move.workload_name or move.workload_ref, "from": sweep.node.name, "to": target.name,
                 "checkpoint_id": move.checkpoint_id, "new_id": result.workload_id, "resumed": True,
                 "steps_before": move.steps_before, "steps_after": seen.steps,
                 "as_planned": plan_entry.get("to") == target.pk}
        with transaction.atomic():  # the move, its event and the inventory's new placement together
            if _move(sweep, move, MoveState.CHECKPOINTED, "restored", entry, state=MoveState.RESTORED,
                     target_node=target, new_workload_ref=result.workload_id, steps_after=seen.steps,
                     detail={**move.detail, "planned_target": plan_entry.get("to"),
                             "as_planned": plan_entry.get("to") == target.pk}):
                _move_inventory(move, target, result.workload_id)
        done.append(entry)
    return {"workloads": done}, {}


def _patch(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> StepResult:
    # A failed or unfinished checkpoint never leads to a patch.
    left = WorkloadMove.objects.filter(sweep=sweep, state__in=[MoveState.PLANNED, MoveState.CHECKPOINTED])
    if left.exists():
        raise PermanentExecutorError(f"refusing to patch: {left.count()} workload(s) not moved off the node")
    results = [ex.patch(ref, component, version, op_id(sweep, f"patch-{component}-{version}"))
               for component, version in sorted(sweep.target.items())]
    patches = [{"component": r.component, "before": r.before, "after": r.after, "output": r.output[:1000]}
               for r in results]
    return {"patches": patches}, {"patched_at": timezone.now()}


def _reboot(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> StepResult:
    ex.reboot(ref, op_id(sweep, "reboot"))
    return {}, {}


def _verify(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> StepResult:
    result = ex.verify(ref)
    wrong = {c: {"want": v, "got": result.versions.get(c)} for c, v in sweep.target.items()
             if result.versions.get(c) != v}
    if wrong or not result.healthy:
        raise PermanentExecutorError(f"verification failed: healthy={result.healthy} versions={wrong}")
    with transaction.atomic():
        for component, version in sweep.target.items():
            parsed = parse_version(component, version)
            row = NodeComponent.objects.filter(node_id=sweep.node_id, component=component).first()
            before = row.version if row else ""
            NodeComponent.objects.update_or_create(
                node_id=sweep.node_id, component=component,
                defaults={"version": version, "version_key": parsed.key, "branch": parsed.branch})
            ChangeLog.objects.create(source=ChangeSource.CAMPAIGN, action=ChangeAction.UPDATE, object_type="node",
                                     object_id=sweep.node_id, object_repr=str(sweep.node)[:300],
                                     changes={component: [before, version]})
    data = {"versions_after": result.versions, "healthy": result.healthy, "output": result.output[:2000]}
    return data, {"versions_after": result.versions}


def _return(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> StepResult:
    ex.return_to_service(ref, op_id(sweep, "return"))
    return {}, {}


STEPS = {
    SweepState.DRAINING: _drain,
    SweepState.CHECKPOINTING: _checkpoint,
    SweepState.MIGRATING: _migrate,
    SweepState.PATCHING: _patch,
    SweepState.REBOOTING: _reboot,
    SweepState.VERIFYING: _verify,
    SweepState.RETURNING: _return,
}


# -- periodic ----------------------------------------------------------------------------
def redrive() -> dict[str, int]:
    """Enqueue every step whose deadline passed (its worker died or its message was lost)."""
    now = timezone.now()
    stale = list(NodeSweep.objects.filter(state__in=SweepState.WORKING, step_deadline__lt=now)
                 .values_list("pk", flat=True))
    for sweep_id in stale:
        ENQUEUE[0]("advance", sweep_id, 0)
    running = list(Campaign.objects.filter(status__in=[CampaignStatus.RUNNING, CampaignStatus.WAITING])
                   .values_list("pk", flat=True))
    for campaign_id in running:
        ENQUEUE[0]("dispatch", campaign_id, 0)
    return {"steps": len(stale), "campaigns": len(running)}
