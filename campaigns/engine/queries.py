"""The engine's hand-written SQL, all of it: the statements every step runs (load, claim, transition,
evidence, workload moves) and the choice of a restore target.

Plain SQL because the ORM spent more CPU compiling these statements than the database spends running
them (issue 11). Values go through each field's own get_db_prep_save, so what is stored is exactly
what the ORM would store (JSON, times).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, cast

from django.db import connection
from django.db.models import Model

from campaigns.choices import CampaignStatus, SweepState
from campaigns.models import Campaign, EvidenceEvent, NodeSweep, WorkloadMove
from executors import portability
from inventory.bulk import insert_sql, loader, marks, prepared_cursor, select_instances, select_rows
from inventory.choices import ServiceState
from inventory.models import Cluster, Node, NodeComponent, Workload

_SWEEPS = NodeSweep._meta
_EVENTS = EvidenceEvent._meta
_MOVES = WorkloadMove._meta
_EVENT_FIELDS = ("campaign_id", "sweep_id", "seq", "node_seq", "kind", "actor", "at", "data", "prev_hash", "hash")
_MOVE_FIELDS = tuple(f.attname for f in _MOVES.concrete_fields if not f.primary_key)


# -- the sweep, loaded ---------------------------------------------------------------------
@functools.cache
def _load_sql() -> tuple[str, tuple[Any, ...]]:
    parts = (loader(NodeSweep, "s", ("versions_before", "versions_after")), loader(Campaign, "c", ("name",)),
             loader(Node, "n"), loader(Cluster, "k"))
    q = connection.ops.quote_name
    sql = (f"SELECT {', '.join(part.select for part in parts)} FROM {q(NodeSweep._meta.db_table)} s "
           f"JOIN {q(Campaign._meta.db_table)} c ON c.id = s.campaign_id JOIN {q(Node._meta.db_table)} n "
           f"ON n.id = s.node_id JOIN {q(Cluster._meta.db_table)} k ON k.id = n.cluster_id WHERE s.id = %s")
    return sql, parts


def load_sweep(sweep_id: int) -> NodeSweep | None:
    """The sweep with its campaign, node and cluster, as select_related gives them: one plain statement
    (compiling the join through the ORM cost more CPU than running it)."""
    sql, parts = _load_sql()
    with prepared_cursor() as cursor:
        cursor.execute(sql, [sweep_id])
        row = cursor.fetchone()
    if row is None:
        return None
    at, objects = 0, []
    for part in parts:
        objects.append(part.build(row[at:at + part.width]))
        at += part.width
    sweep, campaign, node, cluster = objects
    node.cluster, sweep.node, sweep.campaign = cluster, node, campaign
    return cast(NodeSweep, sweep)


# -- conditional UPDATEs -------------------------------------------------------------------
@functools.cache
def _column(meta: Any, name: str) -> str:
    """The quoted column of field `name` (or, given the table's name, the quoted table)."""
    return connection.ops.quote_name(meta.get_field(name).column if name != meta.db_table else name)


def _value(meta: Any, name: str, value: Any) -> Any:
    return meta.get_field(name).get_db_prep_save(value, connection)


@dataclass(frozen=True)
class Guard:
    """The condition of a sweep's conditional UPDATE, as SQL after ``WHERE id = %s``."""

    sql: str
    params: tuple[Any, ...] = ()


def pending_guard() -> Guard:
    """The sweep's row while it is still pending (admission)."""
    return Guard(f" AND {_column(_SWEEPS, 'state')} = %s", (SweepState.PENDING,))


def lease_guard(state: str, worker: str) -> Guard:
    """The sweep's row, only while `worker` holds the lease of its step `state`."""
    return Guard(f" AND {_column(_SWEEPS, 'state')} = %s AND {_column(_SWEEPS, 'lease_owner')} = %s",
                 (state, worker))


def lease_holder_guard(worker: str) -> Guard:
    """The sweep's row while `worker` holds its lease, whatever the step."""
    return Guard(f" AND {_column(_SWEEPS, 'lease_owner')} = %s", (worker,))


def not_aborted(guard: Guard, campaign_id: int) -> Guard:
    """`guard`, and the sweep's campaign not aborted (read in the same UPDATE)."""
    campaigns = _column(Campaign._meta, Campaign._meta.db_table)
    return Guard(f"{guard.sql} AND NOT EXISTS (SELECT 1 FROM {campaigns} WHERE {campaigns}."
                 f"{_column(Campaign._meta, 'id')} = %s AND {campaigns}.{_column(Campaign._meta, 'status')} = %s)",
                 (*guard.params, campaign_id, CampaignStatus.ABORTED))


def move_state_guard(state: str) -> Guard:
    """A workload move's row while it is in `state`."""
    return Guard(f" AND {_column(_MOVES, 'state')} = %s", (state,))


def untargeted_guard() -> Guard:
    """A workload move's row while no target is recorded for it."""
    return Guard(f" AND {_column(_MOVES, 'target_node')} IS NULL")


def _update_sql(meta: Any, pk: int, fields: dict[str, Any], guard: Guard, also: str) -> tuple[str, list[Any]]:
    table = _column(meta, meta.db_table)
    sets = ", ".join([*(f"{_column(meta, name)} = %s" for name in fields), *([also] if also else [])])
    # A related row stands for its primary key, as in QuerySet.update().
    values = [_value(meta, name, value.pk if isinstance(value, Model) else value) for name, value in fields.items()]
    return f"UPDATE {table} SET {sets} WHERE {_column(meta, 'id')} = %s{guard.sql}", [*values, pk, *guard.params]


def _update_row(meta: Any, pk: int, fields: dict[str, Any], guard: Guard, also: str = "") -> int:
    """UPDATE the row `pk` of `meta`'s table where `guard` holds (with `also`, more SQL assignments);
    the number of rows changed (0 or 1)."""
    with prepared_cursor() as cursor:
        cursor.execute(*_update_sql(meta, pk, fields, guard, also))
        return int(cursor.rowcount)


def update_sweep(sweep_id: int, fields: dict[str, Any], guard: Guard, also: str = "") -> int:
    return _update_row(_SWEEPS, sweep_id, fields, guard, also)


def update_move(move_id: int, fields: dict[str, Any], guard: Guard) -> int:
    return _update_row(_MOVES, move_id, fields, guard)


def update_sweep_reading_status(sweep_id: int, fields: dict[str, Any], guard: Guard) -> str | None:
    """update_sweep that also reads its campaign's status in the same statement (RETURNING):
    None when no row changed."""
    campaigns, sweeps = _column(Campaign._meta, Campaign._meta.db_table), _column(_SWEEPS, _SWEEPS.db_table)
    status = (f"(SELECT {campaigns}.{_column(Campaign._meta, 'status')} FROM {campaigns} WHERE {campaigns}."
              f"{_column(Campaign._meta, 'id')} = {sweeps}.{_column(_SWEEPS, 'campaign_id')})")
    sql, params = _update_sql(_SWEEPS, sweep_id, fields, guard, "")
    with prepared_cursor() as cursor:
        cursor.execute(f"{sql} RETURNING {status}", params)
        row = cursor.fetchone()
    return None if row is None else str(row[0])


def claim_step(sweep_id: int, state: str, now: Any, fields: dict[str, Any]) -> int:
    """Take the lease of the sweep's step `state` (no live lease: none, or its deadline passed),
    counting the attempt; the number of rows changed (0 or 1)."""
    attempt = _column(_SWEEPS, "attempt")
    guard = Guard(f" AND {_column(_SWEEPS, 'state')} = %s AND ({_column(_SWEEPS, 'lease_owner')} = %s"
                  f" OR {_column(_SWEEPS, 'step_deadline')} < %s)",
                  (state, "", _value(_SWEEPS, "step_deadline", now)))
    return update_sweep(sweep_id, fields, guard, also=f"{attempt} = {attempt} + 1")


# -- INSERTs -------------------------------------------------------------------------------
def _insert(meta: Any, names: tuple[str, ...], rows: list[Any], suffix: str = "") -> None:
    """INSERT `rows` (model instances) in one statement, each field's value as the ORM saves it
    (auto_now and auto_now_add filled in)."""
    fields = [meta.get_field(name) for name in names]
    values = [f.get_db_prep_save(f.pre_save(row, True), connection) for row in rows for f in fields]
    with prepared_cursor() as cursor:
        cursor.execute(insert_sql(meta.model, names, len(rows), suffix), values)


def insert_events(events: list[EvidenceEvent]) -> None:
    """INSERT node events in one statement (append-only: nothing else writes these rows)."""
    _insert(_EVENTS, _EVENT_FIELDS, events)


def insert_moves(moves: list[WorkloadMove]) -> None:
    """INSERT workload moves in one statement; ON CONFLICT DO NOTHING (PostgreSQL, SQLite 3.24+):
    a repeat of the step leaves the moves it made."""
    _insert(_MOVES, _MOVE_FIELDS, moves, " ON CONFLICT DO NOTHING")


# -- reads of every step -------------------------------------------------------------------
def moves(sweep: NodeSweep, *states: str) -> list[WorkloadMove]:
    """The sweep's workload moves in `states`, in their order (read by every step: plain SQL)."""
    return select_instances(WorkloadMove, f"sweep_id = %s AND state IN ({marks(states)}) "
                            "ORDER BY id", [sweep.pk, *states], prepared=True)


def moved_refs(sweep_id: int) -> set[str]:
    """The workloads the sweep has a move for already."""
    return {ref for ref, in select_rows(WorkloadMove, ("workload_ref",), "sweep_id = %s", [sweep_id], prepared=True)}


def running_workloads(cluster_id: int, refs: list[str]) -> dict[str, Workload]:
    """scheduler id -> the inventory's live workload of the cluster, for `refs`."""
    return {w.scheduler_id: w for w in select_instances(
        Workload, f"cluster_id = %s AND scheduler_id IN ({marks(refs)}) AND gone_at IS NULL "
        "ORDER BY kind", [cluster_id, *refs], prepared=True)}  # the ORM's order: the last kind wins


def node_versions(node_id: int) -> dict[str, str]:
    """component -> version of the node, as the inventory has them."""
    return dict(select_rows(NodeComponent, ("component", "version"), "node_id = %s ORDER BY component",
                            [node_id], prepared=True))


# -- the choice of a restore target ---------------------------------------------------------
def _candidates(sweep: NodeSweep, needed: portability.Requirements, gpus: int) -> tuple[str, list[Any]]:
    """Nodes of the sweep's cluster where a checkpoint needing `needed` is valid, with `gpus` free,
    not being drained soon: the statement (each with its free GPUs) and its parameters."""
    source = sweep.node
    q = connection.ops.quote_name
    nodes, components = q(Node._meta.db_table), q(NodeComponent._meta.db_table)
    sweeps, workloads = q(NodeSweep._meta.db_table), q(Workload._meta.db_table)
    where = ["n.cluster_id = %s", "n.service_state = %s", "n.gone_at IS NULL", "n.id <> %s"]
    params: list[Any] = [source.cluster_id, ServiceState.IN_SERVICE, source.pk]
    for fact, value in needed.must.items():
        if fact == portability.GPU_MODEL:
            where.append("n.gpu_model = %s")
            params.append(value)
        elif value:
            where.append(f"n.id IN (SELECT node_id FROM {components} WHERE component = %s AND version = %s)")
            params += [fact, value]
        else:
            where.append(f"n.id NOT IN (SELECT node_id FROM {components} WHERE component = %s)")
            params.append(fact)
    for fact, value in needed.if_reported.items():
        where.append(f"n.id NOT IN (SELECT node_id FROM {components} WHERE component = %s AND version <> %s)")
        params += [fact, value]
    # Nodes being swept now, and nodes of this campaign in this or the next wave (drained before
    # the workload settles), do not receive work.
    working = sorted(SweepState.WORKING)
    where.append(f"n.id NOT IN (SELECT node_id FROM {sweeps} WHERE state IN ({marks(working)}))")
    params += working
    where.append(f"n.id NOT IN (SELECT node_id FROM {sweeps} WHERE campaign_id = %s AND state = %s AND wave <= %s)")
    params += [sweep.campaign_id, SweepState.PENDING, sweep.wave + 1]
    free = (f"n.gpu_count - COALESCE((SELECT SUM(w.gpus) FROM {workloads} w WHERE w.node_id = n.id"
            " AND w.gone_at IS NULL), 0)")
    where.append(f"{free} >= %s")
    params.append(gpus)
    return f"SELECT n.*, {free} AS free FROM {nodes} n WHERE {' AND '.join(where)}", params


def target_node(sweep: NodeSweep, needed: portability.Requirements, gpus: int, planned: int | None) -> Node | None:
    """The planned target if it still qualifies (_candidates), else the emptiest that does."""
    sql, params = _candidates(sweep, needed, gpus)
    # The planned target alone first (it usually still fits): the emptiest node is a search of the
    # whole cluster, each candidate's free GPUs summed, which at 10,000 nodes is the costly part.
    target = next(iter(Node.objects.raw(f"{sql} AND n.id = %s", [*params, planned])), None) if planned else None
    if target is None:
        target = next(iter(Node.objects.raw(f"{sql} ORDER BY free DESC, n.name LIMIT 1", params)), None)
    return target
