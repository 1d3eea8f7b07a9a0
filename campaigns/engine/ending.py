"""How a step ends: ``end_step``, the one place a step's end is written.

A step ends in one of three ways, each an outcome handed to ``end_step``:

- ``NextStep``: it succeeded; the sweep moves on to its next step, this worker keeping the lease to
  go straight on with it (or, after the last step, to done: its head signed);
- ``RunAgain``: it is not done and not failing (a retry after a temporary error, or a wait for a
  workload); the lease is given back and the step enqueued to run again (a wait for a receiver
  alone sets the sweep's ``waiting_since``, which every other end clears: ``waiting_fields``);
- ``Final``: the sweep is over, failed or rolled back (recovery decides which, after putting the node
  back as far as it can); its head is signed, a failed node charged to the campaign's error budget.

Each is one conditional UPDATE under the lease with its evidence (lease.write), so an end written
by a worker that lost its lease writes nothing; ``end_step`` then returns None.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from campaigns import evidence, policy
from campaigns.choices import CampaignStatus, EvidenceKind, SweepState
from campaigns.engine import queries
from campaigns.engine.lease import write
from campaigns.engine.naming import reference
from campaigns.models import Campaign, NodeSweep
from campaigns.queue import enqueue
from inventory import services as inventory
from inventory.choices import ChangeSource, ServiceState

MAX_ATTEMPTS = 5
RETRY_BACKOFF_S = 2.0


@dataclass
class StepResult:
    data: dict[str, Any] = field(default_factory=dict)
    fields: dict[str, Any] = field(default_factory=dict)
    # Inventory changes that must commit with the transition (run inside its transaction).
    after: Callable[[], None] | None = None
    # The node's service state after this step, where it is not the usual one.
    service_state: str | None = None


@dataclass(frozen=True)
class NextStep:
    """The step succeeded with `result`: on to the next step, or done."""

    result: StepResult


@dataclass(frozen=True)
class RunAgain:
    """Run the step again in `countdown` seconds, recording `kind` (a retry or a wait) with `data`."""

    countdown: float
    kind: str
    data: dict[str, Any]
    for_receiver: bool = False  # a wait for a receiver alone: the node holds no wave order meanwhile


@dataclass(frozen=True)
class Final:
    """The sweep ends in `state` (failed or rolled back), recorded with `data`; with `in_service` the
    node is back in service."""

    state: str
    data: dict[str, Any]
    in_service: bool


Outcome = NextStep | RunAgain | Final


def waiting_fields(sweep: NodeSweep, for_receiver: bool = False) -> dict[str, Any]:
    """The sweep's `waiting_since` as a step's end sets it, where it changes ({} otherwise, so the usual
    transition writes no more columns): kept from the wait's first look while the node waits for a
    receiver alone (`for_receiver`), cleared by any other end (it goes on, fails, or waits for a
    workload its policy waits for). Written under the lease, so a retry after a crash, or a second
    worker, finds it as the last end left it."""
    if for_receiver:
        return {} if sweep.waiting_since is not None else {"waiting_since": timezone.now()}
    return {"waiting_since": None} if sweep.waiting_since is not None else {}


def may_retry(sweep: NodeSweep) -> bool:
    """Whether a temporary error may run the step again (else it fails the node)."""
    return sweep.attempt < MAX_ATTEMPTS


def retry(sweep: NodeSweep, error: str) -> RunAgain:
    """The step again after a temporary error, later with each attempt."""
    return RunAgain(RETRY_BACKOFF_S * sweep.attempt, EvidenceKind.RETRY, {"error": error, "attempt": sweep.attempt})


def end_step(sweep: NodeSweep, worker: str, outcome: Outcome) -> str | None:
    """End the step under this worker's lease as `outcome` says; the state the sweep is in now (None
    when the lease was lost and nothing was written; for RunAgain, the step's own state)."""
    if isinstance(outcome, NextStep):
        return _next_step(sweep, worker, outcome.result)
    if isinstance(outcome, RunAgain):
        # A wait is no failed attempt: the retries a temporary error gets are counted afresh after it.
        again: dict[str, Any] = {"attempt": 0} if outcome.kind == EvidenceKind.WAITING else {}
        waiting = waiting_fields(sweep, outcome.for_receiver)
        with transaction.atomic():
            if write(sweep, worker, outcome.kind, {"step": sweep.state, **outcome.data}, lease_owner="",
                     step_deadline=timezone.now() + timedelta(seconds=outcome.countdown + 1), **again, **waiting):
                enqueue("advance", sweep.pk, outcome.countdown)
                if waiting.get("waiting_since") is not None:
                    # It no longer holds the wave order: later waves may start now, not at the next dispatch.
                    enqueue("dispatch", sweep.campaign_id)
                sweep.waiting_since = waiting.get("waiting_since", sweep.waiting_since)
        return sweep.state
    return _final(sweep, worker, outcome)


SERVICE_STATE_AFTER = {
    SweepState.DRAINING: ServiceState.DRAINING,
    SweepState.MIGRATING: ServiceState.PATCHING,  # the step after migrating is the patch
    SweepState.RETURNING: ServiceState.IN_SERVICE,
}


def _next_step(sweep: NodeSweep, worker: str, result: StepResult) -> str | None:
    """Move to the next step (keeping the lease, so this worker goes on with it) or to done."""
    now = timezone.now()
    current, following = sweep.state, SweepState.next(sweep.state, sweep.target)
    chain = following != SweepState.DONE
    guard = queries.lease_guard(sweep.state, worker)
    if following == SweepState.PATCHING:
        # Aborted meanwhile: no patch; the next step unwinds instead.
        guard = queries.not_aborted(guard, sweep.campaign_id)
    with transaction.atomic():
        fields: dict[str, Any] = {
            "state": following, "attempt": 1 if chain else 0, "lease_owner": worker if chain else "",
            "step_started_at": now,
            "step_deadline": policy.step_deadline(sweep.campaign.step_timeout_s, now) if chain else None,
            **waiting_fields(sweep), **result.fields,
        }
        data = {"step": current, "next": following, "started_at": sweep.step_started_at, "attempt": sweep.attempt,
                **result.data}
        done = None if chain else (EvidenceKind.DONE, {"versions_after": result.fields.get("versions_after")
                                                       or sweep.versions_after})
        # Going on before the patch, the step needs the campaign's status (an abort unwinds instead).
        if not write(sweep, worker, EvidenceKind.STEP_DONE, data, guard=guard, then=done, sign=not chain,
                     read_status=following in SweepState.BEFORE_PATCH, **fields):
            if following == SweepState.PATCHING:
                # Lost to an abort (or the lease expired): hand the step over to the unwind.
                NodeSweep.objects.filter(pk=sweep.pk, lease_owner=worker).update(lease_owner="", step_deadline=now)
                enqueue("advance", sweep.pk)
            return None
        if result.after is not None:
            result.after()
        if current in SERVICE_STATE_AFTER:
            inventory.set_service_state([sweep.node_id], result.service_state or SERVICE_STATE_AFTER[current],
                                        ChangeSource.CAMPAIGN, reference(sweep))
        sweep.state, sweep.attempt, sweep.step_started_at, sweep.waiting_since = following, 1, now, None
        for name, value in result.fields.items():
            setattr(sweep, name, value)
        return following


def _final(sweep: NodeSweep, worker: str, outcome: Final) -> str | None:
    """The sweep's last transition (failed or rolled back), its signed head, and the error budget."""
    final, data = outcome.state, outcome.data
    with transaction.atomic():
        if not write(sweep, worker, final, {"from": sweep.state, **data}, state=final, lease_owner="",
                     step_deadline=None, error=str(data.get("error", ""))[:4000], sign=True,
                     **waiting_fields(sweep)):
            return None
        sweep.waiting_since = None
        # The node's service state says how the sweep left it: back in service; drained (as its
        # drain step set it) when it was not patched; offline when patched or reverted and kept out.
        if outcome.in_service or sweep.state not in SweepState.BEFORE_PATCH:
            inventory.set_service_state([sweep.node_id],
                                        ServiceState.IN_SERVICE if outcome.in_service else ServiceState.OFFLINE,
                                        ChangeSource.CAMPAIGN, reference(sweep))
        if final == SweepState.FAILED:
            _charge_budget(sweep.campaign_id)
        sweep.state = final
        return final


def _charge_budget(campaign_id: int) -> None:
    """Halt the campaign once its failed nodes exceed its error budget."""
    counts = Counter(NodeSweep.objects.filter(campaign_id=campaign_id).values_list("state", flat=True))
    failed, total = counts[SweepState.FAILED], sum(counts.values())
    # Never every node: a campaign all of whose nodes failed halts (a one-node campaign at its first).
    allowed = min(total - 1, policy.allowed_failures(
        Campaign.objects.values_list("error_budget", flat=True).get(pk=campaign_id), total))
    if failed <= allowed:
        return
    campaign = evidence.lock_campaign(campaign_id)
    if campaign.status in (CampaignStatus.RUNNING, CampaignStatus.WAITING, CampaignStatus.PAUSED):
        reason = f"{failed} failed nodes exceed the error budget of {allowed}"
        Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.HALTED, status_reason=reason)
        campaign.status = CampaignStatus.HALTED
        evidence.campaign_event(campaign, EvidenceKind.HALTED, "system", {"reason": reason, "failed": failed})
