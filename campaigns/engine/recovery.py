"""What happens to a node whose sweep fails or is aborted, and the re-drive of stuck steps.

Failure is final: a permanent error (or a temporary one past MAX_ATTEMPTS) fails the node once
(``on_failure``). A node not yet patched is first put back as it was (``unwind``: maintenance off,
its checkpoints restored on it); an error during that unwind is recorded too, the node stays as the
evidence says (drained), and the step is never run again. A node whose patch or health gate failed
is reverted instead (``revert``: the back end reinstalls what it recorded before the patch, reboots,
the old versions are verified), then stays out of service or returns per ``Campaign.after_rollback``.
Each of them records what it did and returns how the sweep ends (a ``Final``, or ``RunAgain`` for an
abort's unwind that may be retried); ``end_step`` writes it.

A worker killed anywhere leaves a step whose deadline passes; ``redrive`` (periodic) enqueues it
again and the next worker repeats the idempotent operations.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from campaigns import evidence
from campaigns.choices import AfterRollback, CampaignStatus, EvidenceKind, MoveState, SweepState, in_place
from campaigns.engine.ending import Final, Outcome, may_retry, retry, waiting_fields
from campaigns.engine.lease import record, record_move
from campaigns.engine.naming import move_op, node_ref, op_id, reference
from campaigns.engine.steps import foreign_hold, gate_check, origin_of
from campaigns.engine.targets import choose_target
from campaigns.models import Campaign, EvidenceEvent, NodeSweep, WorkloadMove
from campaigns.queue import enqueue_now
from executors.base import (
    Executor,
    ExecutorError,
    InterruptedOperation,
    NodeRef,
    PermanentExecutorError,
    SupportsRollback,
    SupportsSchedulerRelease,
    TemporaryExecutorError,
    get_executor,
    is_bare_process,
)
from inventory import services as inventory
from inventory.choices import ChangeSource, ServiceState
from inventory.models import Node
from inventory.versions import LIVEPATCH


def on_failure(sweep: NodeSweep, worker: str, ex: Executor, error: str, revert: bool = True,
               detail: dict[str, Any] | None = None) -> Outcome:
    """Fail the node once: record the error, unwind it if it was not patched, revert a failed patch or
    health gate (`revert`), else leave it out of service; every error in the evidence (with `detail`:
    the workload that caused it and its origin)."""
    # The failure is recorded before anything is undone, on the sweep too (its `error`): a worker
    # that dies during the recovery leaves a sweep whose redrive resumes the recovery (resume_failure)
    # and never runs the failed step again.
    # A node that waited for a receiver holds the wave order again through its recovery.
    record(sweep, worker, EvidenceKind.STEP_FAILED, {"step": sweep.state, "error": error[:4000], "revert": revert,
                                                     **(detail or {})}, error=error[:4000], **waiting_fields(sweep))
    sweep.waiting_since = None
    return _recover(sweep, worker, ex, error, revert)


def failure_recorded(sweep: NodeSweep) -> bool:
    """Whether the sweep's current step failed for good and its recovery has not ended yet."""
    return bool(sweep.error) and sweep.state in SweepState.WORKING


def resume_failure(sweep: NodeSweep, worker: str, ex: Executor) -> Outcome:
    """Go on with the recovery of a failure recorded before its worker died (same operation ids)."""
    last = (EvidenceEvent.objects.filter(sweep=sweep, kind=EvidenceKind.STEP_FAILED).order_by("-node_seq")
            .values_list("data", flat=True).first()) or {}
    return _recover(sweep, worker, ex, sweep.error, bool(last.get("revert", True)))


def _recover(sweep: NodeSweep, worker: str, ex: Executor, error: str, revert: bool) -> Outcome:
    if in_place(sweep.target):
        # Never drained and never rebooted: the node still runs its work on its old kernel, in
        # service; a revert (a reinstall and a reboot) would cost what the livepatch was to spare.
        how = "livepatch" if LIVEPATCH in sweep.target else "packages updated in place"
        return Final(SweepState.FAILED, {"error": error, "left": f"in service, its work untouched ({how})"},
                     in_service=True)
    if sweep.state in SweepState.BEFORE_PATCH:
        return unwind(sweep, worker, ex, SweepState.FAILED, error)
    if revert and sweep.state in (SweepState.PATCHING, SweepState.VERIFYING):
        return _revert(sweep, worker, ex, error)
    # Patched (or partly): the node stays out of service for a human to look at; its parked
    # workloads cannot wait for it and go elsewhere.
    data = {"error": error, "left": "out of service after its patch",
            **settle(sweep, worker, ex, home=False)}
    return Final(SweepState.FAILED, data, in_service=False)


def unwind(sweep: NodeSweep, worker: str, ex: Executor, final: str, error: str) -> Outcome:
    """Put a node that was not patched back as it was: maintenance off, its workloads restored on it;
    then the sweep ends `final` (rolled back for an abort, failed for an error).

    Tried once. An error here is recorded beside the one that caused the unwind and ends the
    sweep too: the node is left as the evidence says, for an operator, and never retried (only an
    abort's unwind retries a temporary error).
    """
    ref = node_ref(sweep.node)
    returned: list[dict[str, Any]] = []
    try:
        if sweep.state != SweepState.PENDING:
            # Leave maintenance first: a node in maintenance admits no work, so its own workloads
            # could not come home. Repeating it (same operation id) after a crash is harmless.
            ex.undo(ref, op_id(sweep, "undo"))
        for move in WorkloadMove.objects.filter(sweep=sweep, state__in=[MoveState.CHECKPOINTED, MoveState.PARKED]
                                                ).select_related("target_node__cluster"):
            returned.append(_bring_back(sweep, worker, ex, ref, move))
        if returned and sweep.state != SweepState.PENDING:
            # Again, now that its workloads run: a back end that kept the node out until they were home
            # (Slurm keeps it drained, admitting each returning job alone) gives it back only now.
            ex.undo(ref, op_id(sweep, "undo"))
        _close_untouched(sweep, worker, ex, ref)
    except ExecutorError as exc:
        if final == SweepState.ROLLED_BACK and isinstance(exc, TemporaryExecutorError) and may_retry(sweep):
            return retry(sweep, f"rollback: {exc}")
        state = "drained" if sweep.state != SweepState.PENDING else "untouched"
        failed: dict[str, Any] = {"error": error or f"rollback failed: {exc}", "unwind_error": str(exc),
                                  "left": state, "workloads_returned": returned,
                                  **settle(sweep, worker, ex, home=False)}
        return Final(SweepState.FAILED, failed, in_service=False)
    data: dict[str, Any] = {"workloads_returned": returned, **({"error": error} if error else {})}
    kept = foreign_hold(sweep, ex, ref)
    if kept:
        data["foreign_hold_kept"] = kept
    return Final(final, data, in_service=not kept)


def _close_untouched(sweep: NodeSweep, worker: str, ex: Executor, ref: NodeRef) -> None:
    """Moves the sweep never began: a workload still running stays as it is; one that ended by
    itself meanwhile (what a wait waits for) is recorded so."""
    planned = list(WorkloadMove.objects.filter(sweep=sweep, state=MoveState.PLANNED))
    if not planned:
        return
    running = {w.id for w in ex.list_workloads(ref)}
    for move in planned:
        if move.workload_ref not in running:
            record_move(sweep, worker, move, EvidenceKind.FINISHED,
                        {"workload": move.workload_name or move.workload_ref,
                         "action": "ended by itself before it was moved", **origin_of(move)},
                        state=MoveState.FINISHED)


def _bring_back(sweep: NodeSweep, worker: str, ex: Executor, ref: NodeRef, move: WorkloadMove) -> dict[str, Any]:
    """One checkpointed workload of an unwinding node: finish a restore under way, else restore it home."""
    name = move.workload_name or move.workload_ref
    if move.target_node is not None and move.target_node_id != sweep.node_id:
        # A restore was under way: finish it where it went (same operation id) rather than
        # starting a second copy here; only a restore that failed comes home.
        try:
            away = ex.restore(node_ref(move.target_node), move.checkpoint_id, move_op(sweep, move, "restore"))
        except (PermanentExecutorError, InterruptedOperation):
            pass
        else:
            entry = {"workload": name, "from": sweep.node.name, "to": move.target_node.name,
                     "checkpoint_id": move.checkpoint_id, "new_id": away.workload_id, "resumed": True}
            record_move(sweep, worker, move, EvidenceKind.RESTORED, entry, state=MoveState.RESTORED,
                        new_workload_ref=away.workload_id, steps_after=away.steps, inventory_to=move.target_node)
            return entry
    result = ex.restore(ref, move.checkpoint_id, op_id(sweep, f"return-{move.pk}"))
    entry = {"workload": name, "checkpoint_id": move.checkpoint_id, "returned_to": sweep.node.name,
             "new_id": result.workload_id, "steps_before": move.steps_before, "steps_after": result.steps}
    record_move(sweep, worker, move, EvidenceKind.RETURNED, entry, state=MoveState.RETURNED,
                new_workload_ref=result.workload_id, steps_after=result.steps, target_node=sweep.node,
                inventory_to=sweep.node)
    return entry


def _revert(sweep: NodeSweep, worker: str, ex: Executor, error: str) -> Final:
    """Put a node whose patch or health gate failed back on the versions it had: the back end
    reinstalls what it recorded before the patch, the node reboots, the old versions are verified.
    Then it stays out of service, or (``after_rollback`` "return") returns once its health gates
    pass on the old versions. Tried once, every step in the evidence; the sweep fails either way
    (charged to the budget)."""
    ref = node_ref(sweep.node)
    campaign = sweep.campaign
    data: dict[str, Any] = {"error": error}
    in_service = False
    try:
        if not isinstance(ex, SupportsRollback):
            raise PermanentExecutorError(f"the {ex.name} back end cannot roll back {ref.identity}")
        result = ex.rollback(ref, op_id(sweep, "revert"))
        record(sweep, worker, EvidenceKind.REVERTED, {"components": result.components,
                                                      "reinstalled": result.reinstalled,
                                                      "output": result.output[:2000]})
        if not result.components:
            # Nothing was reinstalled (e.g. the GPU Operator's node keeps its skip label): it stays out.
            data["left"] = f"out of service: nothing reinstalled ({result.output[:500]})"
            return Final(SweepState.FAILED, {**data, **settle(sweep, worker, ex, home=False)}, in_service=False)
        if result.reboot_required:
            ex.reboot(ref, op_id(sweep, "revert-reboot"))
        facts = ex.facts(ref)
        wrong = {c: {"want": v, "got": facts.get(c)} for c, v in result.components.items() if facts.get(c) != v}
        if wrong:
            raise PermanentExecutorError(f"after the revert the node does not report its previous versions: {wrong}")
        back = {c: facts[c] for c in result.components}
        record(sweep, worker, EvidenceKind.REVERT_VERIFIED, {"versions": back, "rebooted": result.reboot_required})
        data["reverted_to"] = back
        if campaign.after_rollback == AfterRollback.RETURN:
            gate = gate_check(sweep, worker, ex, ref, back, "revert-health")
            if gate.passed:
                ex.return_to_service(ref, op_id(sweep, "revert-return"))
                kept = foreign_hold(sweep, ex, ref)
                in_service = not kept
                if kept:
                    data["foreign_hold_kept"] = kept
        data["left"] = ("in service on its previous versions" if in_service
                        else "out of service on its previous versions")
    except ExecutorError as exc:
        record(sweep, worker, EvidenceKind.REVERT_FAILED, {"error": str(exc)[:4000]})
        data.update(revert_error=str(exc)[:4000], left="out of service: the revert failed")
    # Workloads parked for this node: home now that it is back on the versions they were taken on,
    # or elsewhere when it stays out.
    data.update(settle(sweep, worker, ex, home=in_service))
    return Final(SweepState.FAILED, data, in_service=in_service)


def settle(sweep: NodeSweep, worker: str, ex: Executor, home: bool) -> dict[str, Any]:
    """Account for every workload of a failed sweep still held in a checkpoint (checkpointed or parked):
    restored on its node when `home` (the node is back in service), else on another node where its
    checkpoint is valid, else stranded: the checkpoint kept, the move named so, an operator alerted
    (the stranded-workloads metric, the console). Returns what the sweep's last event records."""
    restored: list[dict[str, Any]] = []
    stranded: list[dict[str, Any]] = []
    held = WorkloadMove.objects.filter(sweep=sweep, state__in=[MoveState.CHECKPOINTED, MoveState.PARKED]
                                       ).select_related("target_node__cluster").order_by("pk")
    released: list[dict[str, Any]] = []
    for move in held:
        entry = _restore_somewhere(sweep, worker, ex, move, home)
        if entry is not None:
            restored.append(entry)
            continue
        entry = _release(sweep, worker, ex, move)
        (released if entry is not None else stranded).append(entry or _strand(sweep, worker, move))
    return {**({"workloads_restored": restored} if restored else {}),
            **({"workloads_released": released} if released else {}),
            **({"stranded_workloads": stranded} if stranded else {})}


def _release(sweep: NodeSweep, worker: str, ex: Executor, move: WorkloadMove) -> dict[str, Any] | None:
    """No node takes the checkpoint: a back end whose scheduler restarts work hands the workload back to it
    (never left held); None where it cannot, and the workload is stranded."""
    if not isinstance(ex, SupportsSchedulerRelease) or is_bare_process(move.workload_ref):
        return None
    try:
        how = ex.release_held(node_ref(sweep.node), move.workload_ref, move.checkpoint_id,
                              move_op(sweep, move, "release"))
    except (PermanentExecutorError, TemporaryExecutorError, InterruptedOperation):
        return None
    entry = {"workload": move.workload_name or move.workload_ref, "checkpoint_id": move.checkpoint_id,
             "node": sweep.node.name, "action": "released to its scheduler: no node took its checkpoint",
             "restarted_by": how, "after_failure": True, **origin_of(move)}
    record_move(sweep, worker, move, EvidenceKind.STOPPED, entry, state=MoveState.STOPPED)
    return entry


def receivers(sweep: NodeSweep, move: WorkloadMove, home: bool) -> list[Node]:
    """Where a held checkpoint may go, in order: its own node when it is back in service (`home`),
    then another node with room where the checkpoint is valid (choose_target)."""
    target = choose_target(sweep, move, None)
    return [*([sweep.node] if home else []), *([target] if target is not None else [])]


def _restore_somewhere(sweep: NodeSweep, worker: str, ex: Executor, move: WorkloadMove,
                       home: bool) -> dict[str, Any] | None:
    name = move.workload_name or move.workload_ref
    for node in receivers(sweep, move, home):
        try:
            result = ex.restore(node_ref(node), move.checkpoint_id, move_op(sweep, move, f"settle-{node.pk}"))
        except (PermanentExecutorError, TemporaryExecutorError, InterruptedOperation):
            continue  # the next choice; stranded when none is left
        entry = {"workload": name, "checkpoint_id": move.checkpoint_id, "from": sweep.node.name, "to": node.name,
                 "new_id": result.workload_id, "steps_before": move.steps_before, "steps_after": result.steps,
                 "after_failure": True, **origin_of(move)}
        record_move(sweep, worker, move, EvidenceKind.RESTORED, entry, state=MoveState.RESTORED,
                    new_workload_ref=result.workload_id, steps_after=result.steps, target_node=node,
                    inventory_to=node)
        return entry
    return None


def _strand(sweep: NodeSweep, worker: str, move: WorkloadMove) -> dict[str, Any]:
    entry = {"workload": move.workload_name or move.workload_ref, "checkpoint_id": move.checkpoint_id,
             "node": sweep.node.name, **origin_of(move),
             "to_do": "restore it when a compatible node is free: manage.py recover_stranded "
                      f"{sweep.campaign_id} (or cancel it and start it again from scratch)"}
    record_move(sweep, worker, move, EvidenceKind.STRANDED, entry, state=MoveState.STRANDED)
    return entry


# -- after the sweep -----------------------------------------------------------------------
def recover_stranded(campaign_id: int, actor: str) -> list[dict[str, Any]]:
    """Restore the campaign's stranded workloads where their checkpoints are valid now (their own node
    again, once it is back in service, or any other with room); each one restored is a campaign event
    and its move says where it went. What is still stranded is returned with why."""
    outcome = []
    for move in (WorkloadMove.objects.filter(sweep__campaign_id=campaign_id, state=MoveState.STRANDED)
                 .select_related("sweep__node__cluster", "sweep__campaign").order_by("pk")):
        sweep = move.sweep
        ex = get_executor(sweep.node.cluster)
        name = move.workload_name or move.workload_ref
        home = sweep.node.service_state == ServiceState.IN_SERVICE
        errors = []
        for node in receivers(sweep, move, home):
            try:
                result = ex.restore(node_ref(node), move.checkpoint_id, move_op(sweep, move, f"recover-{node.pk}"))
            except (PermanentExecutorError, TemporaryExecutorError, InterruptedOperation) as exc:
                errors.append(f"{node.name}: {exc}")
                continue
            entry = {"workload": name, "checkpoint_id": move.checkpoint_id, "from": sweep.node.name, "to": node.name,
                     "new_id": result.workload_id, "steps_before": move.steps_before, "steps_after": result.steps,
                     "sweep": sweep.pk, **origin_of(move)}
            with transaction.atomic():
                if not WorkloadMove.objects.filter(pk=move.pk, state=MoveState.STRANDED).update(
                        state=MoveState.RESTORED, target_node=node, new_workload_ref=result.workload_id,
                        steps_after=result.steps):
                    break  # someone else recovered it meanwhile
                if move.workload_id is not None:
                    inventory.move_workload(move.workload_id, node.pk, result.workload_id, ChangeSource.CAMPAIGN,
                                            reference(sweep))
                evidence.campaign_event(evidence.lock_campaign(campaign_id), EvidenceKind.RECOVERED, actor, entry)
            outcome.append({**entry, "state": "restored"})
            break
        else:
            outcome.append({"workload": name, "checkpoint_id": move.checkpoint_id, "state": "stranded",
                            "why": "; ".join(errors) or "no node in service where its checkpoint is valid has "
                                                        f"{move.gpus} free GPUs"})
    return outcome


# -- periodic ----------------------------------------------------------------------------
def redrive() -> dict[str, int]:
    """Enqueue every step whose deadline passed (its worker died or its message was lost)."""
    now = timezone.now()
    stale = list(NodeSweep.objects.filter(state__in=SweepState.WORKING, step_deadline__lt=now)
                 .values_list("pk", flat=True))
    for sweep_id in stale:
        enqueue_now("advance", sweep_id, 0)
    running = list(Campaign.objects.filter(status__in=[CampaignStatus.RUNNING, CampaignStatus.WAITING])
                   .values_list("pk", flat=True))
    for campaign_id in running:
        enqueue_now("dispatch", campaign_id, 0)
    return {"steps": len(stale), "campaigns": len(running)}
