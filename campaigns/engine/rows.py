"""The engine's reads and writes of its own rows, through the statements of ``queries``: the sweep
loaded with its campaign, node and cluster, conditional UPDATEs, INSERTs of events and moves, the
reads of every step and the choice of a restore target. Values go through each field's own
get_db_prep_save, so what is stored is exactly what the ORM would store (JSON, times).
"""

from __future__ import annotations

from typing import Any, cast

from django.db import connection
from django.db.models import Model

from campaigns.engine import queries
from campaigns.engine.queries import Guard
from campaigns.models import EvidenceEvent, NodeSweep, WorkloadMove
from executors import portability
from gpusweep.db.reads import prepared_cursor, select_instances, select_rows
from inventory.models import Node, NodeComponent, Workload

_SWEEPS = NodeSweep._meta
_MOVES = WorkloadMove._meta


def load_sweep(sweep_id: int) -> NodeSweep | None:
    """The sweep with its campaign, node and cluster, as select_related gives them: one plain statement
    (compiling the join through the ORM cost more CPU than running it)."""
    with prepared_cursor() as cursor:
        cursor.execute(queries.LOAD_SWEEP, [sweep_id])
        row = cursor.fetchone()
    if row is None:
        return None
    at, objects = 0, []
    for part in queries.load_parts():
        objects.append(part.build(row[at:at + part.width]))
        at += part.width
    sweep, campaign, node, cluster = objects
    node.cluster, sweep.node, sweep.campaign = cluster, node, campaign
    return cast(NodeSweep, sweep)


def waves(campaign_id: int) -> tuple[int | None, int | None]:
    """The campaign's lowest wave with an active sweep and the lowest held by an active sweep not
    waiting for a receiver (None: no such sweep), in one statement."""
    with prepared_cursor() as cursor:
        cursor.execute(queries.WAVES, [campaign_id, *queries.ACTIVE_STATES])
        active, holding = cursor.fetchone()
    return active, holding


def _values(meta: Any, fields: dict[str, Any]) -> list[Any]:
    # A related row stands for its primary key, as in QuerySet.update().
    return [meta.get_field(name).get_db_prep_save(value.pk if isinstance(value, Model) else value, connection)
            for name, value in fields.items()]


def _update_row(meta: Any, pk: int, fields: dict[str, Any], guard: Guard, also: str = "") -> int:
    """UPDATE the row `pk` of `meta`'s table where `guard` holds (with `also`, more SQL assignments);
    the number of rows changed (0 or 1)."""
    sql = queries.update(meta.model, tuple(fields), guard.sql, also)
    with prepared_cursor() as cursor:
        cursor.execute(sql, [*_values(meta, fields), pk, *guard.params])
        return int(cursor.rowcount)


def update_sweep(sweep_id: int, fields: dict[str, Any], guard: Guard, also: str = "") -> int:
    return _update_row(_SWEEPS, sweep_id, fields, guard, also)


def update_move(move_id: int, fields: dict[str, Any], guard: Guard) -> int:
    return _update_row(_MOVES, move_id, fields, guard)


def update_sweep_reading_status(sweep_id: int, fields: dict[str, Any], guard: Guard) -> str | None:
    """update_sweep that also reads its campaign's status in the same statement (RETURNING):
    None when no row changed."""
    sql = queries.update_reading_status(tuple(fields), guard.sql)
    with prepared_cursor() as cursor:
        cursor.execute(sql, [*_values(_SWEEPS, fields), sweep_id, *guard.params])
        row = cursor.fetchone()
    return None if row is None else str(row[0])


def claim_step(sweep_id: int, state: str, now: Any, fields: dict[str, Any]) -> int:
    """Take the lease of the sweep's step `state` (no live lease: none, or its deadline passed),
    counting the attempt; the number of rows changed (0 or 1)."""
    guard = queries.claim_guard(state, _SWEEPS.get_field("step_deadline").get_db_prep_save(now, connection))
    return update_sweep(sweep_id, fields, guard, also=queries.COUNT_ATTEMPT)


def insert_events(events: list[EvidenceEvent]) -> None:
    """INSERT node events in one statement (append-only: nothing else writes these rows)."""
    with prepared_cursor() as cursor:
        cursor.execute(queries.insert_events_sql(len(events)),
                       queries.insert_values(EvidenceEvent, queries.EVENT_FIELDS, events))


def insert_moves(moves: list[WorkloadMove]) -> None:
    """INSERT workload moves in one statement; a repeat of the step leaves the moves it made."""
    with prepared_cursor() as cursor:
        cursor.execute(queries.insert_moves_sql(len(moves)),
                       queries.insert_values(WorkloadMove, queries.MOVE_FIELDS, moves))


def moves(sweep: NodeSweep, *states: str) -> list[WorkloadMove]:
    """The sweep's workload moves in `states`, in their order (read by every step: plain SQL)."""
    return select_instances(WorkloadMove, queries.moves_in_states(len(states)), [sweep.pk, *states], prepared=True)


def moved_refs(sweep_id: int) -> set[str]:
    """The workloads the sweep has a move for already."""
    return {ref for ref, in select_rows(WorkloadMove, ("workload_ref",), queries.MOVES_OF_SWEEP, [sweep_id],
                                        prepared=True)}


def running_workloads(cluster_id: int, refs: list[str]) -> dict[str, Workload]:
    """scheduler id -> the inventory's live workload of the cluster, for `refs`."""
    return {w.scheduler_id: w for w in select_instances(
        Workload, queries.running_workloads(len(refs)), [cluster_id, *refs], prepared=True)}


def node_versions(node_id: int) -> dict[str, str]:
    """component -> version of the node, as the inventory has them."""
    return dict(select_rows(NodeComponent, ("component", "version"), queries.NODE_VERSIONS, [node_id], prepared=True))


def target_node(sweep: NodeSweep, needed: portability.Requirements, gpus: int, planned: int | None) -> Node | None:
    """The planned target if it still qualifies (queries.candidates), else the emptiest that does."""
    # The planned target alone first (it usually still fits): the emptiest node is a search of the
    # whole cluster, each candidate's free GPUs summed, which at 10,000 nodes is the costly part.
    target = next(iter(Node.objects.raw(*queries.candidates(sweep, needed, gpus, planned))), None) if planned else None
    if target is None:
        target = next(iter(Node.objects.raw(*queries.candidates(sweep, needed, gpus, None))), None)
    return target
