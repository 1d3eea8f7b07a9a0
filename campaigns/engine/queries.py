"""The engine's hand-written SQL, all of it: the statements every step runs (load, claim, transition,
evidence, workload moves) and the choice of a restore target. ``rows`` runs them.

Plain SQL because the ORM spent more CPU compiling these statements than the database spends running
them (issue 11). Names come from the models (gpusweep.db.names); an INSERT lists every concrete
field of its model, so a new defaulted field needs no change here. A statement whose shape depends on
its fields or a count is built once per shape (lru_cache): the engine is on the bench's hot path.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection, models

from campaigns.choices import CampaignStatus, SweepState
from campaigns.models import Campaign, EvidenceEvent, NodeSweep, WorkloadMove
from executors import portability
from gpusweep.db.bulk import insert_sql, marks
from gpusweep.db.names import Columns, Table
from gpusweep.db.reads import loader
from inventory.choices import ServiceState
from inventory.models import Cluster, Node, NodeComponent, Workload

# Run through the prepared cursor (server-side binding on PostgreSQL), for the statement test.
PREPARED = frozenset({"LOAD_SWEEP", "WAVES", "update", "update_reading_status", "insert_events_sql",
                      "insert_moves_sql"})

S, C, N, K = Table(NodeSweep, "s"), Table(Campaign, "c"), Table(Node, "n"), Table(Cluster, "k")
CAMPAIGN, SWEEP, W = Table(Campaign), Table(NodeSweep), Table(Workload, "w")  # CAMPAIGN, SWEEP: by table
SWEEPS, MOVES, COMPONENTS, WORKLOADS = Columns(NodeSweep), Columns(WorkloadMove), Columns(NodeComponent), \
    Columns(Workload)
EVENT_FIELDS = tuple(f.attname for f in EvidenceEvent._meta.concrete_fields if not f.primary_key)
MOVE_FIELDS = tuple(f.attname for f in WorkloadMove._meta.concrete_fields if not f.primary_key)


# -- the sweep, loaded ---------------------------------------------------------------------
_LOADED = (loader(NodeSweep, "s", ("versions_before", "versions_after")), loader(Campaign, "c", ("name",)),
           loader(Node, "n"), loader(Cluster, "k"))
LOAD_SWEEP = (f"SELECT {', '.join(part.select for part in _LOADED)} FROM {S} JOIN {C} ON {C.id} = {S.campaign_id} "
              f"JOIN {N} ON {N.id} = {S.node_id} JOIN {K} ON {K.id} = {N.cluster_id} WHERE {S.id} = %s")


def load_parts() -> tuple[Any, ...]:
    """The Loaders of LOAD_SWEEP's row, in order: the sweep, its campaign, node and cluster."""
    return _LOADED


# -- admission -----------------------------------------------------------------------------
ACTIVE_STATES = tuple(sorted(SweepState.ACTIVE))
# The campaign's lowest wave with an active sweep, and the lowest held by an active sweep not waiting
# for a receiver (aggregates only: a dispatch costs the same for 10 nodes or 10,000): params campaign,
# ACTIVE_STATES.
WAVES = (f"SELECT MIN({SWEEPS.wave}), MIN(CASE WHEN {SWEEPS.waiting_since} IS NULL THEN {SWEEPS.wave} END) "
         f"FROM {SWEEPS} WHERE {SWEEPS.campaign_id} = %s AND {SWEEPS.state} IN ({marks(ACTIVE_STATES)})")


# -- conditional UPDATEs -------------------------------------------------------------------
@dataclass(frozen=True)
class Guard:
    """The condition of a sweep's conditional UPDATE, as SQL after ``WHERE id = %s``."""

    sql: str
    params: tuple[Any, ...] = ()


def pending_guard() -> Guard:
    """The sweep's row while it is still pending (admission)."""
    return Guard(f" AND {SWEEPS.state} = %s", (SweepState.PENDING,))


def lease_guard(state: str, worker: str) -> Guard:
    """The sweep's row, only while `worker` holds the lease of its step `state`."""
    return Guard(f" AND {SWEEPS.state} = %s AND {SWEEPS.lease_owner} = %s", (state, worker))


def lease_holder_guard(worker: str) -> Guard:
    """The sweep's row while `worker` holds its lease, whatever the step."""
    return Guard(f" AND {SWEEPS.lease_owner} = %s", (worker,))


def claim_guard(state: str, now: Any) -> Guard:
    """The sweep's step `state` with no live lease (none, or its deadline passed before `now`, in
    database form)."""
    return Guard(f" AND {SWEEPS.state} = %s AND ({SWEEPS.lease_owner} = %s OR {SWEEPS.step_deadline} < %s)",
                 (state, "", now))


COUNT_ATTEMPT = f"{SWEEPS.attempt} = {SWEEPS.attempt} + 1"  # a claim's extra assignment


def not_aborted(guard: Guard, campaign_id: int) -> Guard:
    """`guard`, and the sweep's campaign not aborted (read in the same UPDATE)."""
    return Guard(f"{guard.sql} AND NOT EXISTS (SELECT 1 FROM {CAMPAIGN} WHERE {CAMPAIGN.id} = %s "
                 f"AND {CAMPAIGN.status} = %s)", (*guard.params, campaign_id, CampaignStatus.ABORTED))


def move_state_guard(state: str) -> Guard:
    """A workload move's row while it is in `state`."""
    return Guard(f" AND {MOVES.state} = %s", (state,))


def untargeted_guard() -> Guard:
    """A workload move's row while no target is recorded for it."""
    return Guard(f" AND {MOVES.target_node} IS NULL")


@functools.lru_cache(maxsize=512)
def update(model: type[models.Model], fields: tuple[str, ...], guard: str, also: str = "") -> str:
    """UPDATE `model`'s row (param: its id) setting `fields` (params, in order; then `also`, more
    assignments) where `guard` (a Guard's sql, its params last) holds."""
    table = Columns(model)
    sets = ", ".join([*(f"{getattr(table, name)} = %s" for name in fields), *([also] if also else [])])
    return f"UPDATE {table} SET {sets} WHERE {table.id} = %s{guard}"


@functools.lru_cache(maxsize=512)
def update_reading_status(fields: tuple[str, ...], guard: str) -> str:
    """update() of a sweep that also returns its campaign's status, read in the same statement."""
    return (f"{update(NodeSweep, fields, guard)} RETURNING (SELECT {CAMPAIGN.status} FROM {CAMPAIGN} "
            f"WHERE {CAMPAIGN.id} = {SWEEP.campaign_id})")


# -- INSERTs -------------------------------------------------------------------------------
def insert_events_sql(count: int) -> str:
    """INSERT `count` node events, every concrete field (EVENT_FIELDS)."""
    return insert_sql(EvidenceEvent, EVENT_FIELDS, count)


def insert_moves_sql(count: int) -> str:
    """INSERT `count` workload moves (MOVE_FIELDS); ON CONFLICT DO NOTHING (PostgreSQL, SQLite
    3.24+): a repeat of the step leaves the moves it made."""
    return insert_sql(WorkloadMove, MOVE_FIELDS, count, " ON CONFLICT DO NOTHING")


def insert_values(model: type[models.Model], names: Sequence[str], rows: Sequence[models.Model]) -> list[Any]:
    """The parameters of an INSERT of `rows` (instances), each field's value as the ORM saves it
    (its default where the instance kept it; auto_now and auto_now_add filled in)."""
    fields = [model._meta.get_field(name) for name in names]
    return [f.get_db_prep_save(f.pre_save(row, True), connection) for row in rows for f in fields]  # type: ignore[union-attr]


# -- reads of every step (select_rows' and select_instances' conditions) --------------------
@functools.lru_cache(maxsize=64)
def moves_in_states(count: int) -> str:
    """A sweep's workload moves in `count` states, in their order: params sweep, states."""
    return f"{MOVES.sweep_id} = %s AND {MOVES.state} IN ({marks(range(count))}) ORDER BY {MOVES.id}"


MOVES_OF_SWEEP = f"{MOVES.sweep_id} = %s"


@functools.lru_cache(maxsize=512)
def running_workloads(count: int) -> str:
    """A cluster's live workloads with `count` scheduler ids: params cluster, ids. In the ORM's
    order (by kind): where two share an id, the last kind wins."""
    return (f"{WORKLOADS.cluster_id} = %s AND {WORKLOADS.scheduler_id} IN ({marks(range(count))}) "
            f"AND {WORKLOADS.gone_at} IS NULL ORDER BY {WORKLOADS.kind}")


NODE_VERSIONS = f"{COMPONENTS.node_id} = %s ORDER BY {COMPONENTS.component}"


# -- the choice of a restore target ---------------------------------------------------------
_HAS = f"{N.id} IN (SELECT {COMPONENTS.node_id} FROM {COMPONENTS} WHERE {COMPONENTS.component} = %s"
_LACKS = f"{N.id} NOT IN (SELECT {COMPONENTS.node_id} FROM {COMPONENTS} WHERE {COMPONENTS.component} = %s"
_FREE = (f"{N.gpu_count} - COALESCE((SELECT SUM({W.gpus}) FROM {W} WHERE {W.node_id} = {N.id}"
         f" AND {W.gone_at} IS NULL), 0)")
_BUSY = f"{N.id} NOT IN (SELECT {SWEEPS.node_id} FROM {SWEEPS} WHERE {SWEEPS.state} IN "
_NEXT = (f"{N.id} NOT IN (SELECT {SWEEPS.node_id} FROM {SWEEPS} WHERE {SWEEPS.campaign_id} = %s "
         f"AND {SWEEPS.state} = %s AND {SWEEPS.wave} <= %s)")


def _facts(needed: portability.Requirements) -> tuple[list[str], list[Any]]:
    where, params = [], []
    for fact, value in needed.must.items():
        if fact == portability.GPU_MODEL:
            where.append(f"{N.gpu_model} = %s")
            params.append(value)
        elif value:
            where.append(f"{_HAS} AND {COMPONENTS.version} = %s)")
            params += [fact, value]
        else:
            where.append(f"{_LACKS})")
            params.append(fact)
    for fact, value in needed.if_reported.items():
        where.append(f"{_LACKS} AND {COMPONENTS.version} <> %s)")
        params += [fact, value]
    return where, params


def candidates(sweep: NodeSweep, needed: portability.Requirements, gpus: int,
               planned: int | None) -> tuple[str, list[Any]]:
    """Nodes of the sweep's cluster where a checkpoint needing `needed` is valid, with `gpus` free,
    not being drained soon, each with its free GPUs: the node `planned` alone, or (None) the
    emptiest. The statement and its parameters, for Node.objects.raw."""
    source = sweep.node
    where = [f"{N.cluster_id} = %s", f"{N.service_state} = %s", f"{N.gone_at} IS NULL", f"{N.id} <> %s"]
    params: list[Any] = [source.cluster_id, ServiceState.IN_SERVICE, source.pk]
    facts, values = _facts(needed)
    # Nodes being swept now, and nodes of this campaign in this or the next wave (drained before
    # the workload settles), do not receive work.
    working = sorted(SweepState.WORKING)
    where += [*facts, f"{_BUSY}({marks(working)}))", _NEXT, f"{_FREE} >= %s"]
    params += [*values, *working, sweep.campaign_id, SweepState.PENDING, sweep.wave + 1, gpus]
    sql = f"SELECT n.*, {_FREE} AS free FROM {N} WHERE {' AND '.join(where)}"
    if planned is not None:
        return f"{sql} AND {N.id} = %s", [*params, planned]
    return f"{sql} ORDER BY free DESC, {N.name} LIMIT 1", params


def examples() -> Iterator[tuple[str, list[Any]]]:
    """Every statement above with parameters of the right shape (tests/foundation/test_sql_statements.py)."""
    stamp = connection.ops.adapt_datetimefield_value(dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    load_parts()
    yield LOAD_SWEEP, [1]
    yield WAVES, [1, *ACTIVE_STATES]
    fields = ("state", "lease_owner", "step_deadline")
    claim = claim_guard("draining", stamp)
    yield update(NodeSweep, fields, claim.sql, COUNT_ATTEMPT), ["draining", "w", stamp, 1, *claim.params]
    for guard in (pending_guard(), lease_guard("draining", "w"), lease_holder_guard("w"),
                  not_aborted(lease_guard("draining", "w"), 1)):
        yield update(NodeSweep, fields, guard.sql), ["draining", "w", stamp, 1, *guard.params]
        yield update_reading_status(fields, guard.sql), ["draining", "w", stamp, 1, *guard.params]
    for guard in (move_state_guard("planned"), untargeted_guard()):
        yield update(WorkloadMove, ("target_node",), guard.sql), [1, 1, *guard.params]
    yield from _insert_examples()
    yield f"SELECT {MOVES.id} FROM {MOVES} WHERE {moves_in_states(2)}", [1, "planned", "parked"]
    yield f"SELECT {MOVES.workload_ref} FROM {MOVES} WHERE {MOVES_OF_SWEEP}", [1]
    yield f"SELECT {WORKLOADS.id} FROM {WORKLOADS} WHERE {running_workloads(2)}", [1, "a", "b"]
    yield f"SELECT {COMPONENTS.version} FROM {COMPONENTS} WHERE {NODE_VERSIONS}", [1]
    sweep = NodeSweep(id=1, campaign_id=1, wave=0, node=Node(id=1, cluster_id=1))
    needed = portability.Requirements(engine="signal", must={portability.GPU_MODEL: "h100", "driver": "570",
                                                              "mig": ""}, if_reported={"cuda": "12.8"})
    yield candidates(sweep, needed, 1, 2)
    yield candidates(sweep, needed, 1, None)


def _insert_examples() -> Iterator[tuple[str, list[Any]]]:
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    events = [EvidenceEvent(campaign_id=1, sweep_id=1, node_seq=n, kind="claimed", actor="w", at=at, hash="h")
              for n in (1, 2)]
    yield insert_events_sql(2), insert_values(EvidenceEvent, EVENT_FIELDS, events)
    moves = [WorkloadMove(sweep_id=1, workload_ref="job-1", policy="checkpoint")]
    yield insert_moves_sql(1), insert_values(WorkloadMove, MOVE_FIELDS, moves)
