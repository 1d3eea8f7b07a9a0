"""Execution: the per-node state machine, admission of nodes, and re-driving stuck steps.

A step runs in three parts. (1) Claim: a conditional UPDATE takes the step's lease (state as
expected and no live lease) and sets its deadline (``lease``). (2) Work: the executor operations,
outside any transaction, each with an operation id derived from the campaign, sweep and step, so
doing it again after a crash does nothing twice (``steps``). (3) End: ``ending.end_step``, the one
writer of a step's end, moves the state on (or gives the step back to run again, or ends the sweep)
by one conditional UPDATE, only if this worker still holds the lease, writing the node chain's new
head, with the evidence event and the inventory changes (through inventory.services) in the same
transaction. A worker then goes straight on with the node's next step under the same lease, so a
node costs one task, not one per step.

A worker killed anywhere leaves a step whose deadline passes; ``redrive`` (periodic) enqueues it
again and the next worker repeats the idempotent operations. Nothing is half-recorded: either
the transition and its event are committed together, or neither is.

Failure is final: a permanent error (or a temporary one past MAX_ATTEMPTS) fails the node once
(``recovery``): a node not yet patched is unwound (put back as it was), one whose patch or health
gate failed is reverted to its old versions, and each failed node is charged to the campaign's
error budget. No step takes the campaign row lock; only campaign-level work does (admission,
halting, sealing).

The modules, in the order ``advance`` reaches them:

- ``runner``: ``advance`` (claim, run the steps, end each) and the executor a step uses;
- ``lease``: the claim, and every write made under the lease (events, workload moves);
- ``steps``: the per-node steps, drain to return (``STEPS``);
- ``targets``: what a checkpoint needs and which node receives it;
- ``ending``: ``end_step`` and its outcomes (``NextStep``, ``RunAgain``, ``Final``);
- ``recovery``: unwind, revert, the failure of a node, and ``redrive``;
- ``admission``: ``dispatch`` (window, canary, limits, wave order; completing a campaign);
- ``reservations``: each wave's maintenance reservation;
- ``naming``: node references, operation ids, the inventory's reference to a step;
- ``queries``: the engine's hand-written SQL, all of it; ``rows`` runs it.
"""

from __future__ import annotations

from campaigns.engine.admission import ADMIT_PAGE, dispatch
from campaigns.engine.ending import MAX_ATTEMPTS, RETRY_BACKOFF_S, StepResult, end_step
from campaigns.engine.naming import move_op, node_ref, op_id, reference
from campaigns.engine.recovery import redrive
from campaigns.engine.reservations import planned_wave_times, sync_reservations
from campaigns.engine.runner import advance, executor_for
from campaigns.engine.steps import STEPS, HealthGateFailed, NotPatched, WaitMore, gates_of
from campaigns.engine.targets import choose_target

__all__ = [
    "ADMIT_PAGE",
    "MAX_ATTEMPTS",
    "RETRY_BACKOFF_S",
    "STEPS",
    "HealthGateFailed",
    "NotPatched",
    "StepResult",
    "WaitMore",
    "advance",
    "choose_target",
    "dispatch",
    "end_step",
    "executor_for",
    "gates_of",
    "move_op",
    "node_ref",
    "op_id",
    "planned_wave_times",
    "redrive",
    "reference",
    "sync_reservations",
]
