"""The per-node steps, in the order a sweep runs them: drain, checkpoint, migrate, patch, reboot,
verify, return (``STEPS``).

A step is the work between the claim and the transition: the executor's operations, outside any
transaction, each with an operation id derived from the campaign, sweep and step (naming.op_id), so
doing it again after a crash does nothing twice. It returns a StepResult for ``end_step``, or raises:
WaitMore (not done yet), a TemporaryExecutorError (try again), a PermanentExecutorError (the node
fails; NotPatched when nothing changed on it, HealthGateFailed when its gates failed after the reboot).
Each workload move it makes is recorded as it happens (lease.record_move).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from campaigns import policy
from campaigns.choices import EvidenceKind, MoveState, SweepState, in_place
from campaigns.engine import queries, rows
from campaigns.engine.ending import StepResult
from campaigns.engine.lease import record, record_move, stop_waiting
from campaigns.engine.naming import move_op, node_ref, op_id, reference
from campaigns.engine.targets import choose_target, requirements, source_facts
from campaigns.models import Campaign, EvidenceEvent, NodeSweep, WorkloadMove
from executors import portability
from executors.base import (
    CheckpointResult,
    Executor,
    HealthGates,
    HealthResult,
    InterruptedOperation,
    NodeRef,
    PermanentExecutorError,
    SupportsHealthGates,
    SupportsMaintenanceHolds,
    TemporaryExecutorError,
    WorkloadInfo,
    inventory_ref,
    version_reached,
    versions_gate,
)
from inventory import packages
from inventory import services as inventory
from inventory.choices import ChangeSource, CheckpointEngine, ServiceState, WorkloadPolicy
from inventory.versions import LIVEPATCH, OS_PACKAGES


class NotPatched(PermanentExecutorError):
    """The patch step refused before anything changed on the node: there is nothing to revert."""


class HealthGateFailed(PermanentExecutorError):
    """The node's health gates failed after its reboot (the checks' outputs are in the evidence)."""


class WorkloadFailed(PermanentExecutorError):
    """The node fails because of one of its workloads: its evidence names the workload (and its origin)."""

    def __init__(self, move: WorkloadMove, message: str) -> None:
        super().__init__(message)
        self.detail = {"workload": move.workload_name or move.workload_ref, **origin_of(move)}


class WaitMore(Exception):
    """The step is not done yet and not failing (a workload we wait for is still running). With
    `for_receiver` the node waits only for a receiver for a workload (no node could take its
    checkpoint now): it keeps its slot but holds no wave order meanwhile (policy.admits)."""

    def __init__(self, seconds: float, reason: str, detail: dict[str, Any] | None = None,
                 for_receiver: bool = False) -> None:
        super().__init__(reason)
        self.seconds = seconds
        self.detail = detail or {}
        self.for_receiver = for_receiver


# -- drain ---------------------------------------------------------------------------------
def _drain(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> StepResult:
    before = ex.facts(ref)
    ex.drain(ref, op_id(sweep, "drain"))
    return StepResult({"versions_before": before}, {"versions_before": before})


# -- checkpoint ------------------------------------------------------------------------------
def _checkpoint(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> StepResult:
    campaign = sweep.campaign
    running = {w.id: w for w in ex.list_workloads(ref)}

    @functools.cache
    def facts() -> dict[str, str]:
        # The node's facts (source_facts), read at most once a step: nothing in the step changes them.
        return source_facts(sweep)

    _prepare_moves(sweep, running, facts)
    planned = rows.moves(sweep, MoveState.PLANNED)
    _wait_first(sweep, planned, running, facts)
    stop_waiting(sweep, sweep.lease_owner)
    done = []
    for move in planned:
        engine = str(move.detail.get("engine") or CheckpointEngine.NONE)
        checkpoint = move.policy == WorkloadPolicy.CHECKPOINT and portability.rule(engine).checkpointable
        if move.workload_ref not in running:
            # Either it ended by itself, or a worker died after the agent checkpointed (or stopped)
            # it and before this was recorded. Asking again with the same operation id tells which:
            # the agent answers with the first result, or fails because nothing was ever started.
            entry = _recover_move(sweep, ex, ref, move, engine, checkpoint)
            if entry is not None:
                done.append(entry)
            continue
        if checkpoint:
            done.append(_checkpointed(sweep, move, engine, _take_checkpoint(sweep, ex, ref, move, engine)))
        else:
            if move.policy != WorkloadPolicy.COLD_RESTART and not campaign.cold_restart_allowed:
                raise WorkloadFailed(move, f"workload {move.workload_name or move.workload_ref} cannot be "
                                           f"checkpointed ({engine}) and cold restart is not allowed")
            output = ex.stop(ref, move.workload_ref, op_id(sweep, f"stop-{move.workload_ref}"))
            done.append(_stopped(sweep, ex, move, output))
    return StepResult({"workloads": done})


def _wait_first(sweep: NodeSweep, moves: list[WorkloadMove], running: dict[str, WorkloadInfo],
                facts: Callable[[], dict[str, str]]) -> None:
    """Every wait is decided before anything on the node stops: while a workload the policy waits for
    still runs, none of its neighbours is checkpointed or stopped (each would stay frozen for the
    whole wait, however long). Past the wait limit it is moved like the others, or the node fails
    when a cold restart is not allowed. A wait for a receiver alone (no workload the policy waits for
    still runs) is said so (`for_receiver`): the node then holds no wave order (policy.admits)."""
    campaign = sweep.campaign
    for at, move in enumerate(moves):
        if move.workload_ref not in running:
            continue
        name = move.workload_name or move.workload_ref
        for_receiver = False
        if move.policy == WorkloadPolicy.WAIT:
            why = f"waiting for {name} to finish"
        elif _nowhere_to_go(sweep, move, facts):
            # What the plan calls "finishes first" or "cold start": decided now, on the receivers as
            # they are, before a checkpoint freezes it for nothing.
            if campaign.cold_restart_allowed:
                pinned = (move.detail.get("requires") or {}).get("must", {}).get(portability.PINNED)
                _cold_start_instead(move, f"it cannot move: {pinned}" if pinned else
                                    f"no node where its checkpoint would be valid has {move.gpus} free GPUs")
                continue
            pinned = (move.detail.get("requires") or {}).get("must", {}).get(portability.PINNED)
            why = (f"{name} cannot move ({pinned}): waiting for it to finish" if pinned else
                   f"no node where the checkpoint of {name} would be valid has {move.gpus} free GPUs: "
                   "waiting for it to finish")
            # For a receiver alone unless a workload the policy waits for runs on (one earlier in
            # `moves` would have raised already; a later one is only looked at, nothing else).
            for_receiver = not any(m.policy == WorkloadPolicy.WAIT and m.workload_ref in running
                                   for m in moves[at + 1:])
        else:
            continue
        waited = timezone.now() - move.created_at
        if campaign.wait_limit is None or waited < campaign.wait_limit:
            raise WaitMore(policy.WAIT_POLL_S, why, origin_of(move), for_receiver=for_receiver)
        if not campaign.cold_restart_allowed:
            raise WorkloadFailed(move, f"workload {name} still runs after the wait limit "
                                       "and cold restart is not allowed")


def _nowhere_to_go(sweep: NodeSweep, move: WorkloadMove, facts: Callable[[], dict[str, str]]) -> bool:
    """A workload to checkpoint whose image no node could take now: no other node with room where it
    is valid, and not valid on its own node (its `facts`, source_facts) after the patch (where it
    could be parked)."""
    engine = str(move.detail.get("engine") or CheckpointEngine.NONE)
    if move.policy != WorkloadPolicy.CHECKPOINT or not portability.rule(engine).checkpointable:
        return False
    needed = portability.from_dict(move.detail.get("requires") or {})
    if portability.compatible(needed, portability.node_facts(sweep.node.gpu_model,
                                                             {**facts(), **sweep.target})):
        return False
    return choose_target(sweep, move, plan_entry(sweep, _planned_moves(sweep), move).get("to")) is None


def _cold_start_instead(move: WorkloadMove, why: str) -> None:
    move.policy = WorkloadPolicy.COLD_RESTART
    move.detail = {**move.detail, "cold_start_because": why}
    WorkloadMove.objects.filter(pk=move.pk).update(policy=move.policy, detail=move.detail)


def _prepare_moves(sweep: NodeSweep, running: dict[str, WorkloadInfo], facts: Callable[[], dict[str, str]]) -> None:
    """One WorkloadMove per workload running on the node, with its policy and its image's needs."""
    campaign = sweep.campaign
    # Plain statements: this runs for every node, and compiling the ORM's cost more than running them.
    have = rows.moved_refs(sweep.pk)
    missing = [ref for ref in running if ref not in have]
    if not missing:
        return
    ids = {ref: inventory_ref(sweep.node.name, ref) for ref in missing}  # the plan's and inventory's ids
    known = rows.running_workloads(sweep.node.cluster_id, list(ids.values()))
    planned = _planned_moves(sweep)
    moves = []
    for ref in missing:
        info, row = running[ref], known.get(ids[ref])
        # The inventory's engine (the registration's, inventory.identity), unless it knows none: then the
        # back end's live view (the job's registration before a heartbeat joined it to the job's row).
        known_engine = row.checkpoint_engine if row and row.checkpoint_engine != CheckpointEngine.NONE else ""
        engine = known_engine or info.checkpoint_engine or CheckpointEngine.NONE
        needed = requirements(info, row, engine, facts())
        gpus = info.gpus or (row.gpus if row else 0)
        moves.append(WorkloadMove(
            sweep=sweep, workload=row, workload_ref=ref, workload_name=info.name, gpus=gpus,
            policy=policy.workload_policy(campaign, ref, info.name, row.policy if row else ""),
            detail={"engine": engine, "requires": needed.as_dict(),
                    "planned": (planned.get(ids[ref]) or {}).get("action", ""),
                    **({"origin": info.origin} if info.origin else {})}))
    rows.insert_moves(moves)


def _planned_moves(sweep: NodeSweep) -> dict[str, dict[str, Any]]:
    """The plan's moves of this node by the inventory's workload id (executors.base.inventory_ref)."""
    planned = sweep.planned or {}  # loaded with the sweep: it is copied at start and never changes
    return {m["workload"]: m for m in planned.get("moves", []) if "arrived_from" not in m}


def plan_entry(sweep: NodeSweep, planned: dict[str, dict[str, Any]], move: WorkloadMove) -> dict[str, Any]:
    return planned.get(inventory_ref(sweep.node.name, move.workload_ref), {})


def origin_of(move: WorkloadMove) -> dict[str, str]:
    """For the evidence: {"origin": "undeclared-found-by-agent"} when no scheduler declared the workload's
    GPUs and the node's agent found it holding some (WorkloadInfo.origin); {} for a declared one."""
    origin = move.detail.get("origin")
    return {"origin": str(origin)} if origin else {}


def _take_checkpoint(sweep: NodeSweep, ex: Executor, ref: NodeRef, move: WorkloadMove, engine: str) -> CheckpointResult:
    """The move's checkpoint; after an interruption the step is retried under a new operation id."""
    try:
        return ex.checkpoint(ref, move.workload_ref, engine, move_op(sweep, move, "ck"),
                             requires=move.detail.get("requires"))
    except InterruptedOperation as exc:
        raise _renamed(move, "ck", exc) from exc


def _renamed(move: WorkloadMove, step: str, exc: InterruptedOperation) -> TemporaryExecutorError:
    """Record that the move's `step` runs again under a new operation id; the step is retried."""
    tries = dict(move.detail.get("tries") or {})
    tries[step] = int(tries.get(step, 0)) + 1
    move.detail = {**move.detail, "tries": tries}
    WorkloadMove.objects.filter(pk=move.pk).update(detail=move.detail)
    return TemporaryExecutorError(f"{exc}; it runs again under a new operation id")


def _stopped(sweep: NodeSweep, ex: Executor, move: WorkloadMove, output: str | None = None) -> dict[str, Any]:
    who = ex.restarted_by(move.workload_ref)
    entry = {"workload": move.workload_name or move.workload_ref, "action": "stopped for a cold restart",
             "restarted_by": who or "nobody: its owner must start it again", **origin_of(move),
             # What the restart does to its output files, where the back end knows (Slurm: kept or appended).
             **({"output": output} if output else {})}
    record_move(sweep, sweep.lease_owner, move, EvidenceKind.STOPPED, entry, state=MoveState.STOPPED)
    return entry


def _checkpointed(sweep: NodeSweep, move: WorkloadMove, engine: str, result: CheckpointResult) -> dict[str, Any]:
    entry = {"workload": move.workload_name or move.workload_ref, "checkpoint_id": result.checkpoint_id,
             "sha256": result.sha256, "bytes": result.total_bytes, "steps": result.steps, "engine": engine,
             "requires": move.detail.get("requires"), **origin_of(move),
             # What the move does to the job's output files, where the back end knows (Slurm: kept or appended).
             **({"output": result.manifest["output"]} if result.manifest.get("output") else {})}
    if result.dump:  # a criu image: plain or after pre-dumps, each round and the time CRIU held it frozen
        entry["dump"] = result.dump
    home = move.detail.get("planned") == "return_home"
    fields: dict[str, Any] = {"checkpoint_id": result.checkpoint_id, "checkpoint_sha256": result.sha256,
                              "steps_before": result.steps}
    if home:  # planned to come back here after the reboot (the image stays valid on this node)
        fields.update(state=MoveState.PARKED, target_node_id=sweep.node_id)
        record_move(sweep, sweep.lease_owner, move, EvidenceKind.PARKED,
                    {**entry, "restore": "on this node after its reboot"}, **fields)
    else:
        record_move(sweep, sweep.lease_owner, move, EvidenceKind.CHECKPOINTED, entry, state=MoveState.CHECKPOINTED,
                    **fields)
    return entry


def _recover_move(sweep: NodeSweep, ex: Executor, ref: NodeRef, move: WorkloadMove, engine: str,
                  checkpoint: bool) -> dict[str, Any] | None:
    """A planned move whose workload no longer runs: checkpointed before a crash, or finished."""
    name = move.workload_name or move.workload_ref
    if checkpoint:
        try:
            result: CheckpointResult | None = _take_checkpoint(sweep, ex, ref, move, engine)
        except PermanentExecutorError:
            result = None
        if result is not None:
            return _checkpointed(sweep, move, engine, result)
    elif move.policy != WorkloadPolicy.WAIT:
        try:
            output = ex.stop(ref, move.workload_ref, op_id(sweep, f"stop-{move.workload_ref}"))
        except PermanentExecutorError:
            pass
        else:
            return _stopped(sweep, ex, move, output)
    record_move(sweep, sweep.lease_owner, move, EvidenceKind.FINISHED,
                {"workload": name, "action": "ended by itself before it was moved", **origin_of(move)},
                state=MoveState.FINISHED)
    return None


# -- migrate -------------------------------------------------------------------------------
def _migrate(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> StepResult:
    planned = _planned_moves(sweep)
    done = []
    for move in rows.moves(sweep, MoveState.CHECKPOINTED):  # a target chosen before a retry loads when used
        entry_of_plan = plan_entry(sweep, planned, move)
        if move.target_node_id is None:
            target = choose_target(sweep, move, entry_of_plan.get("to"))
            if target is None:
                done.append(_park_or_fail(sweep, move))
                continue
            # Recorded before the restore: a retry after a crash goes to the same node with the same
            # operation id, so the workload is restored once, never on two nodes.
            rows.update_move(move.pk, {"target_node": target}, queries.untargeted_guard())
            move.target_node, move.target_node_id = target, target.pk
        assert move.target_node is not None
        target = move.target_node
        try:
            result = ex.restore(node_ref(target), move.checkpoint_id, move_op(sweep, move, "restore"))
        except InterruptedOperation as exc:
            raise _renamed(move, "restore", exc) from exc
        seen = _resumed(ex, node_ref(target), result.workload_id)
        if seen is None:
            raise TemporaryExecutorError(f"restored workload {result.workload_id} is not running on {target.name} yet")
        as_planned = entry_of_plan.get("to") == target.pk
        # Its progress as it runs on the target, else the step the restore resumed it from (a back end
        # that lists no progress: the demo counter's agent).
        after = seen.steps if seen.steps is not None else result.steps
        entry = {"workload": move.workload_name or move.workload_ref, "from": sweep.node.name, "to": target.name,
                 "checkpoint_id": move.checkpoint_id, "new_id": result.workload_id, "resumed": True,
                 "steps_before": move.steps_before, "steps_after": after, "as_planned": as_planned,
                 **({"unverified": result.unverified} if result.unverified else {})}
        record_move(sweep, sweep.lease_owner, move, EvidenceKind.RESTORED, entry, state=MoveState.RESTORED,
                    new_workload_ref=result.workload_id, steps_after=after, inventory_to=target,
                    detail={**move.detail, "planned_target": entry_of_plan.get("to"), "as_planned": as_planned})
        done.append(entry)
    return StepResult({"workloads": done})


def _resumed(ex: Executor, ref: NodeRef, workload_id: str) -> WorkloadInfo | None:
    return next((w for w in ex.list_workloads(ref) if w.id == workload_id), None)


def _park_or_fail(sweep: NodeSweep, move: WorkloadMove) -> dict[str, Any]:
    """No receiver is free now: keep the checkpoint for this node's return if it stays valid here."""
    name = move.workload_name or move.workload_ref
    needed = portability.from_dict(move.detail.get("requires") or {})
    after = portability.node_facts(sweep.node.gpu_model, {**source_facts(sweep), **sweep.target})
    if not portability.compatible(needed, after):
        raise WorkloadFailed(move, f"no node where the checkpoint of {name} is valid has {move.gpus} free GPUs, "
                                   f"and it would not be valid on {sweep.node.name} after the patch")
    entry = {"workload": name, "checkpoint_id": move.checkpoint_id, "restore": "on this node after its reboot",
             "why": "no compatible node with room; the checkpoint stays valid here after the patch"}
    record_move(sweep, sweep.lease_owner, move, EvidenceKind.PARKED, entry, state=MoveState.PARKED,
                target_node_id=sweep.node_id)
    return entry


# -- patch, reboot -------------------------------------------------------------------------
def _patch(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> StepResult:
    # A failed or unfinished checkpoint never leads to a patch.
    left = len(rows.moves(sweep, MoveState.PLANNED, MoveState.CHECKPOINTED))
    if left:
        raise NotPatched(f"refusing to patch: {left} workload(s) not moved off the node")
    # A distribution's fix names the exact packages of each component (advisories.osplan, in the plan).
    install = (sweep.planned or {}).get("os_install") or {}
    # (Named only where there are some: an executor written before exact packages takes no such argument.)
    results = [ex.patch(ref, component, version, op_id(sweep, f"patch-{component}-{version}"),
                        **({"packages": install[component]} if install.get(component) else {}))
               for component, version in sorted(sweep.target.items())]
    patches = [{"component": r.component, "before": r.before, "after": r.after, "output": r.output[:1000],
                **({"packages": r.packages} if r.packages else {})} for r in results]
    return StepResult({"patches": patches}, {"patched_at": timezone.now()})


def _reboot(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> StepResult:
    ex.reboot(ref, op_id(sweep, "reboot"))
    return StepResult()


# -- verify --------------------------------------------------------------------------------
def _verify(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> StepResult:
    result = ex.verify(ref)
    wrong = {c: {"want": v, "got": result.versions.get(c)} for c, v in sweep.target.items()
             if not version_reached(c, v, result.versions.get(c))}
    if wrong or not result.healthy:
        raise PermanentExecutorError(f"verification failed: healthy={result.healthy} versions={wrong}")
    verified = {c: result.versions.get(c, v) for c, v in sweep.target.items()}
    installed = patched_packages(sweep)
    live = in_place(sweep.target)
    if live:
        # The node kept its work: no diagnostics under running jobs; the livepatch state it reports is the check.
        gates: dict[str, str] = {"versions": "passed"}
    else:
        # The health gates, before the node may return to service: a failing one keeps it out.
        gate = gate_check(sweep, sweep.lease_owner, ex, ref, dict(sweep.target), "health")
        if not gate.passed:
            summaries = "; ".join(f"{c.name}: {c.summary}" for c in gate.checks if c.status == "failed")
            raise HealthGateFailed(f"health gate failed: {summaries}"[:4000])
        gates = {c.name: c.status for c in gate.checks}

    def record_versions() -> None:
        # The inventory learns the new versions from the campaign, and the node's exposures are
        # remediated with this sweep as their evidence (node_versions_changed, on commit); the
        # kernel it booted and the livepatch it applied rematch its OS package exposures the same way.
        inventory.record_versions(sweep.node_id, {c: v for c, v in verified.items() if c != OS_PACKAGES},
                                  ChangeSource.CAMPAIGN, reference(sweep))
        packages.record_running(sweep.node_id, kernel=verified.get("kernel", ""),
                                livepatch_version=verified.get(LIVEPATCH, ""), reference=reference(sweep))
        # The exact packages its agent reported installed: the node's package set follows, before
        # the agent's next report says so, and the exposures they fix are credited to this sweep.
        if installed:
            packages.record_installed(sweep.node_id, installed, reference=reference(sweep))
        _credit(sweep)

    data = {"versions_after": result.versions, "healthy": result.healthy, "output": result.output[:2000],
            "health_gates": gates,
            **({"livepatch": "applied to the running kernel: no drain, no reboot"}
               if live and LIVEPATCH in sweep.target else {}),
            **({"packages": "updated in place: no drain, no reboot"} if live and OS_PACKAGES in sweep.target else {})}
    return StepResult(data, {"versions_after": result.versions}, after=record_versions)


def _credit(sweep: NodeSweep) -> None:
    """Remediations the node's agent reported after this sweep's patch began are this sweep's work."""
    try:
        from advisories.services import credit_sweep
    except ImportError:  # the advisories app is optional
        return
    done = EvidenceEvent.objects.filter(sweep=sweep, kind=EvidenceKind.STEP_DONE).values_list("data", flat=True)
    began = next((d.get("started_at") for d in done if d.get("step") == SweepState.PATCHING), None)
    since = parse_datetime(began) if isinstance(began, str) else sweep.patched_at
    if since is not None:
        advisory_ids = list(sweep.campaign.advisories.values_list("pk", flat=True))
        credit_sweep(sweep.node_id, since, sweep.target, reference(sweep), advisory_ids)


def patched_packages(sweep: NodeSweep) -> dict[str, str]:
    """The exact packages this sweep's patch step installed, at the versions the node reported."""
    found: dict[str, str] = {}
    for data in EvidenceEvent.objects.filter(sweep=sweep, kind=EvidenceKind.STEP_DONE).order_by(
            "node_seq").values_list("data", flat=True):
        for patch in (data or {}).get("patches") or []:
            found.update(patch.get("packages") or {})
    return found


def gates_of(campaign: Campaign) -> HealthGates:
    return HealthGates(dcgm_level=int(campaign.dcgm_level), site_checks=tuple(campaign.site_checks or ()) or None)


def gate_check(sweep: NodeSweep, worker: str, ex: Executor, ref: NodeRef, expected: dict[str, str],
               step: str) -> HealthResult:
    """Run the node's health gates and keep every check with its output in the evidence (the expected
    versions only where the back end has no health gates of its own)."""
    if isinstance(ex, SupportsHealthGates):
        result = ex.health(ref, expected, gates_of(sweep.campaign), op_id(sweep, step))
    else:
        result = versions_gate(ex, ref, expected)
    record(sweep, worker, EvidenceKind.HEALTH_CHECKED, {"expected": expected, **result.as_dict()})
    return result


# -- return --------------------------------------------------------------------------------
def _return(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> StepResult:
    ex.return_to_service(ref, op_id(sweep, "return"))
    kept = foreign_hold(sweep, ex, ref)
    # Checkpoints parked for this node come back now that it admits work again.
    restored = []
    for move in rows.moves(sweep, MoveState.PARKED):
        result = ex.restore(ref, move.checkpoint_id, op_id(sweep, f"home-{move.pk}"))
        entry = {"workload": move.workload_name or move.workload_ref, "checkpoint_id": move.checkpoint_id,
                 "to": sweep.node.name, "new_id": result.workload_id, "steps_before": move.steps_before,
                 "steps_after": result.steps, "after_reboot": True}
        record_move(sweep, sweep.lease_owner, move, EvidenceKind.RESTORED, entry, state=MoveState.RESTORED,
                    new_workload_ref=result.workload_id, steps_after=result.steps, inventory_to=sweep.node)
        restored.append(entry)
    data: dict[str, Any] = {"workloads": restored} if restored else {}
    if kept:
        data["foreign_hold_kept"] = kept
    return StepResult(data, service_state=ServiceState.OFFLINE if kept else None)


def foreign_hold(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> dict[str, Any]:
    """For a node swept while someone else held it: that hold, still there (it is theirs to lift)."""
    planned = sweep.planned or {}
    if not planned.get("held_by"):
        return {}
    held_now = ex.maintenance_hold(ref) if isinstance(ex, SupportsMaintenanceHolds) else ""
    return {"held_before": planned["held_by"].get("hold"), "held_now": held_now}


STEPS: dict[str, Callable[[NodeSweep, Executor, NodeRef], StepResult]] = {
    SweepState.DRAINING: _drain,
    SweepState.CHECKPOINTING: _checkpoint,
    SweepState.MIGRATING: _migrate,
    SweepState.PATCHING: _patch,
    SweepState.REBOOTING: _reboot,
    SweepState.VERIFYING: _verify,
    SweepState.RETURNING: _return,
}
