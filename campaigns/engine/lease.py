"""A step's lease, and every write made under it.

The lease is taken by one conditional UPDATE (``claim``: the step's state as expected and no live
lease) that sets the step's deadline; the lease holder is the step's only writer. Each write under
it (``write``, ``record``, ``record_move``) is one conditional UPDATE of the sweep, only while this
worker still holds the lease, writing the node chain's new head, with its evidence event in the same
transaction. A write that finds the lease gone writes nothing.
"""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from campaigns import evidence, policy
from campaigns.engine import queries, rows
from campaigns.engine.naming import actor, reference
from campaigns.models import Campaign, NodeSweep, WorkloadMove
from executors.base import TemporaryExecutorError
from inventory import services as inventory
from inventory.choices import ChangeSource
from inventory.models import Node


def claim(sweep: NodeSweep, worker: str) -> bool:
    """Take the step's lease: one conditional UPDATE (the lease holder is the step's only writer)."""
    now = timezone.now()
    fields = {"lease_owner": worker, "step_started_at": now,
              "step_deadline": policy.step_deadline(sweep.campaign.step_timeout_s, now)}
    if not rows.claim_step(sweep.pk, sweep.state, now, fields):
        return False
    sweep.attempt += 1
    sweep.lease_owner, sweep.step_started_at = worker, now
    return True


def let_go(sweep_id: int, worker: str) -> None:
    """Give back the lease of a step this worker has not begun, for whoever advances it next."""
    NodeSweep.objects.filter(pk=sweep_id, lease_owner=worker).update(lease_owner="", attempt=0)


def write(sweep: NodeSweep, worker: str, kind: str, data: dict[str, Any], guard: queries.Guard | None = None,
          then: tuple[str, dict[str, Any]] | None = None, sign: bool = False, read_status: bool = False,
          **fields: Any) -> bool:
    """One conditional UPDATE of the sweep (with its chain's new head) and its event (and a second,
    `then`), in the caller's transaction; with `sign` the new head is signed in the same UPDATE, with
    `read_status` the campaign's status is read into ``sweep.campaign`` by it too."""
    events = [evidence.prepare_node_event(sweep.campaign_id, sweep.pk, sweep.evidence_seq, sweep.evidence_head, kind,
                                          actor(worker), data)]
    if then is not None:
        events.append(evidence.prepare_node_event(sweep.campaign_id, sweep.pk, events[0].node_seq or 0,
                                                  events[0].hash, then[0], actor(worker), then[1]))
    head = events[-1]
    if sign:
        fields.update(signed_seq=head.node_seq, head_signature=evidence.head_signature(
            sweep.campaign_id, sweep.pk, head.node_seq or 0, head.hash))
    fields = {"evidence_seq": head.node_seq, "evidence_head": head.hash, **fields}
    guard = guard if guard is not None else queries.lease_guard(sweep.state, worker)
    if read_status and connection.features.can_return_columns_from_insert:
        status = rows.update_sweep_reading_status(sweep.pk, fields, guard)
        if status is None:
            return False
        sweep.campaign.status = status
    elif not rows.update_sweep(sweep.pk, fields, guard):
        return False
    elif read_status:
        sweep.campaign.status = Campaign.objects.values_list("status", flat=True).get(pk=sweep.campaign_id)
    rows.insert_events(events)
    sweep.evidence_seq, sweep.evidence_head = head.node_seq or 0, head.hash
    return True


def stop_waiting(sweep: NodeSweep, worker: str) -> None:
    """A node that waited for a receiver found one (or its workload ended): it holds the wave order
    again before anything of it is checkpointed, so no dispatch admits, meanwhile, a later wave whose
    nodes its workloads are about to go to (policy.admits). Its next event says what happened."""
    if sweep.waiting_since is None:
        return
    if not rows.update_sweep(sweep.pk, {"waiting_since": None}, queries.lease_holder_guard(worker)):
        raise TemporaryExecutorError(f"node sweep {sweep.pk}: the lease was lost before it went on after its wait")
    sweep.waiting_since = None


def record(sweep: NodeSweep, worker: str, kind: str, data: dict[str, Any], **fields: Any) -> None:
    """``write`` in a transaction of its own: evidence of the step under way (the step goes on)."""
    with transaction.atomic():
        write(sweep, worker, kind, data, **fields)


def record_move(sweep: NodeSweep, worker: str, move: WorkloadMove, kind: str, data: dict[str, Any],
                inventory_to: Node | None = None, **fields: Any) -> bool:
    """A workload move's conditional state change, its evidence and its inventory placement, together."""
    with transaction.atomic():
        if not rows.update_move(move.pk, fields, queries.move_state_guard(move.state)):
            return False
        event = evidence.prepare_node_event(sweep.campaign_id, sweep.pk, sweep.evidence_seq, sweep.evidence_head,
                                            kind, actor(worker), data)
        if not rows.update_sweep(sweep.pk, {"evidence_seq": event.node_seq, "evidence_head": event.hash},
                                    queries.lease_holder_guard(worker)):
            raise TemporaryExecutorError(f"node sweep {sweep.pk}: the lease was lost while recording {kind}")
        rows.insert_events([event])
        sweep.evidence_seq, sweep.evidence_head = event.node_seq or 0, event.hash
        if inventory_to is not None and move.workload_id is not None and fields.get("new_workload_ref"):
            inventory.move_workload(move.workload_id, inventory_to.pk, str(fields["new_workload_ref"]),
                                    ChangeSource.CAMPAIGN, reference(sweep))
        move.state = str(fields.get("state", move.state))
        return True
