"""The inventory's plain statements: heartbeats, syncs and the writes a campaign step makes.

Plain SQL where the benches measured the ORM's query compiling as the cost: an agent's heartbeat
(bench/heartbeat.py: a short one is one read, a changed one a dozen statements), the writes of
every campaign step (bench/sweep.py, bench/sweep_cpu.py: set_service_state, record_versions,
move_workload, through the prepared cursor) and a fleet's sync (bench/inventory.py: 600,000
component rows read). Names come from the models (gpusweep.db.names); values are parameters.
A statement whose shape depends on a count is built once per count (lru_cache).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterator
from typing import Any

from django.db import connection

from gpusweep.db.bulk import marks
from gpusweep.db.names import Columns, Derived, Table
from inventory.choices import WorkloadKind
from inventory.models import Cluster, Node, NodeComponent, PackageSet, Workload

# Statements only one engine runs (the other has its own), and those run through the prepared
# cursor (server-side binding on PostgreSQL), for the statement test.
ONLY = {"postgresql": frozenset({"flush_nodes", "flush_processes"}),
        "sqlite": frozenset({"FLUSH_NODE", "FLUSH_PROCESSES"})}
PREPARED = frozenset({"service_states", "set_service_state", "node_components", "UPDATE_COMPONENT",
                      "WORKLOAD_AND_TWIN", "WORKLOAD_GONE", "WORKLOAD_BACK", "WORKLOAD_MOVED", "UNLINK_WORKLOAD"})

NODES, COMPONENTS, WORKLOADS = Columns(Node), Columns(NodeComponent), Columns(Workload)
WORKLOAD_NODES = Columns(Workload.nodes.through)
N, C, NC, W = Table(Node, "n"), Table(Cluster, "c"), Table(NodeComponent, "nc"), Table(Workload, "w")


# -- syncs (services.apply_snapshot) ------------------------------------------------------

@functools.lru_cache(maxsize=512)
def node_scope(names: int | None) -> str:
    """select_rows' condition for a cluster's nodes (all, or `names` named): params cluster, names."""
    if names is None:
        return f"{NODES.cluster_id} = %s"
    return f"{NODES.cluster_id} = %s AND {NODES.name} IN ({marks(range(names))})"


_COMPONENTS = f"SELECT {NC.id}, {NC.node_id}, {NC.component}, {NC.version}, {NC.source} FROM {NC}"
COMPONENTS_OF_CLUSTER = f"{_COMPONENTS} JOIN {N} ON {N.id} = {NC.node_id} WHERE {N.cluster_id} = %s"


@functools.lru_cache(maxsize=512)
def components_of_nodes(count: int) -> str:
    """(id, node, component, version, source) of the components of `count` nodes."""
    return f"{_COMPONENTS} WHERE {NC.node_id} IN ({marks(range(count))})"


@functools.lru_cache(maxsize=512)
def touch_nodes(count: int, heard: bool) -> str:
    """last_seen (and heartbeat_at when `heard`: the agent's own word) of `count` nodes: params
    stamp, (stamp), ids."""
    also = f", {NODES.heartbeat_at} = %s" if heard else ""
    return f"UPDATE {NODES} SET {NODES.last_seen} = %s{also} WHERE {NODES.id} IN ({marks(range(count))})"


@functools.lru_cache(maxsize=512)
def forget_digests(count: int) -> str:
    """Empty the heartbeat digest of `count` nodes (their next heartbeat is a full one): param ids."""
    return (f"UPDATE {NODES} SET {NODES.heartbeat_digest} = '' WHERE {NODES.id} IN ({marks(range(count))}) "
            f"AND {NODES.heartbeat_digest} <> ''")


@functools.lru_cache(maxsize=512)
def workload_scope(kinds: int, active: bool = False, nodes: int = 0, scheduler_ids: int = 0) -> str:
    """select_rows' condition for a cluster's workloads of `kinds` kinds, `active` (not gone), on
    `nodes` nodes, with `scheduler_ids` ids: params cluster, kinds, nodes, scheduler ids."""
    where = f"{WORKLOADS.cluster_id} = %s AND {WORKLOADS.kind} IN ({marks(range(kinds))})"
    if active:
        where += f" AND {WORKLOADS.gone_at} IS NULL"
    if nodes:
        where += f" AND {WORKLOADS.node_id} IN ({marks(range(nodes))})"
    if scheduler_ids:
        where += f" AND {WORKLOADS.scheduler_id} IN ({marks(range(scheduler_ids))})"
    return where


# A component's new version: params version, key, branch, source, updated_at, id.
UPDATE_COMPONENT = (f"UPDATE {COMPONENTS} SET {COMPONENTS.version} = %s, {COMPONENTS.version_key} = %s, "
                    f"{COMPONENTS.branch} = %s, {COMPONENTS.source} = %s, {COMPONENTS.updated_at} = %s "
                    f"WHERE {COMPONENTS.id} = %s")


# -- a campaign's writes (services.set_service_state, record_versions, move_workload) ------

@functools.lru_cache(maxsize=512)
def service_states(count: int) -> str:
    """(id, name, cluster name, service_state) of `count` nodes not in a state: params ids, state."""
    return (f"SELECT {N.id}, {N.name}, {C.name}, {N.service_state} FROM {N} JOIN {C} ON {C.id} = {N.cluster_id} "
            f"WHERE {N.id} IN ({marks(range(count))}) AND {N.service_state} <> %s")


@functools.lru_cache(maxsize=512)
def set_service_state(count: int) -> str:
    """params state, updated_at, ids."""
    return (f"UPDATE {NODES} SET {NODES.service_state} = %s, {NODES.updated_at} = %s "
            f"WHERE {NODES.id} IN ({marks(range(count))})")


@functools.lru_cache(maxsize=512)
def node_components(count: int) -> str:
    """(node name, cluster name, component id, component, version) of one node and its rows of
    `count` components (one row with NULLs when it has none of them): params names, node id."""
    which = f"IN ({marks(range(count))})" if count else "IS NULL"  # never null: no component
    return (f"SELECT {N.name}, {C.name}, {NC.id}, {NC.component}, {NC.version} FROM {N} "
            f"JOIN {C} ON {C.id} = {N.cluster_id} LEFT JOIN {NC} "
            f"ON {NC.node_id} = {N.id} AND {NC.component} {which} WHERE {N.id} = %s")


# select_rows' condition for one node: param its id.
NODE_BY_ID = f"{NODES.id} = %s"


def _lock(of: str) -> str:
    # Only the rows of `of` are locked (never the cluster's row: every move of the cluster would wait).
    if connection.features.has_select_for_update_of:
        return f" FOR UPDATE OF {of}"
    return " FOR UPDATE" if connection.features.has_select_for_update else ""


# The workload and any row of its cluster with the scheduler id it moves to, locked: params
# workload id, scheduler id, workload id.
W2 = Table(Workload, "w2")
WORKLOAD_AND_TWIN = (f"SELECT {W.id}, {W.node_id}, {W.kind}, {W.scheduler_id}, {C.name} FROM {W} "
                     f"JOIN {C} ON {C.id} = {W.cluster_id} WHERE {W.id} = %s OR ({W.scheduler_id} = %s "
                     f"AND {W.cluster_id} = (SELECT {W2.cluster_id} FROM {W2} WHERE {W2.id} = %s))"
                     + _lock("w"))
WORKLOAD_GONE = f"UPDATE {WORKLOADS} SET {WORKLOADS.gone_at} = %s WHERE {WORKLOADS.id} = %s"  # stamp, id
# node, last_seen, id
WORKLOAD_BACK = (f"UPDATE {WORKLOADS} SET {WORKLOADS.node_id} = %s, {WORKLOADS.gone_at} = NULL, "
                 f"{WORKLOADS.last_seen} = %s WHERE {WORKLOADS.id} = %s")
# node, scheduler id, last_seen, id
WORKLOAD_MOVED = (f"UPDATE {WORKLOADS} SET {WORKLOADS.node_id} = %s, {WORKLOADS.scheduler_id} = %s, "
                  f"{WORKLOADS.gone_at} = NULL, {WORKLOADS.last_seen} = %s WHERE {WORKLOADS.id} = %s")
UNLINK_WORKLOAD = f"DELETE FROM {WORKLOAD_NODES} WHERE {WORKLOAD_NODES.workload_id} = %s"  # workload id


# -- heartbeats (inventory/agent.py) -----------------------------------------------------

CLUSTER_BY_NAME = f"SELECT {C.id}, {C.name} FROM {C} WHERE {C.name} = %s"  # the cluster's id and name
# The node's row, locked: two heartbeats of one node arriving together are applied in turn. With it
# what it holds of its OS (packages.OsState: its package set's digest, kernel, livepatch), so an
# unchanged os report costs no statement.
PS = Table(PackageSet, "ps")
LOCK_NODE = (f"SELECT {N.id}, {N.heartbeat_counter}, {PS.digest}, {N.running_kernel}, "
             f"{N.livepatch} FROM {N} LEFT JOIN {PS} ON {PS.id} = {N.package_set_id} WHERE {N.cluster_id} = %s "
             f"AND {N.name} = %s" + (" FOR UPDATE OF n" if connection.features.has_select_for_update_of else
                                     " FOR UPDATE" if connection.features.has_select_for_update else ""))
# params counter, digest, cluster, name, counter
TAKE_COUNTER = (f"UPDATE {NODES} SET {NODES.heartbeat_counter} = %s, {NODES.heartbeat_digest} = %s "
                f"WHERE {NODES.cluster_id} = %s AND {NODES.name} = %s AND {NODES.heartbeat_counter} < %s")
# (id, digest, counter, gone_at) of a node by cluster and node name: a short heartbeat's one read.
SHORT_READ = (f"SELECT {N.id}, {N.heartbeat_digest}, {N.heartbeat_counter}, {N.gone_at} FROM {N} "
              f"JOIN {C} ON {C.id} = {N.cluster_id} WHERE {C.name} = %s AND {N.name} = %s")

# -- heartbeat counters flushed from Redis (inventory/heartbeats.py) -----------------------
# v: a node's newest counter and when it was seen.
V = Derived("v", id=(Node, "id"), counter=(Node, "heartbeat_counter"), seen=(Node, "last_seen"))
_PROCESS = f"{W.kind} = '{WorkloadKind.PROCESS}'"  # a choice, not a name


@functools.lru_cache(maxsize=512)
def flush_nodes(count: int) -> str:
    """PostgreSQL: `count` nodes' counter, last_seen and heartbeat_at, never backwards: params
    (id, counter, seen) per node."""
    return (f"UPDATE {N} SET {NODES.heartbeat_counter} = GREATEST({N.heartbeat_counter}, {V.counter}), "
            f"{NODES.last_seen} = GREATEST({N.last_seen}, {V.seen}), "
            f"{NODES.heartbeat_at} = GREATEST({N.heartbeat_at}, {V.seen}) "
            f"FROM (VALUES {V.values(count, ('bigint', 'bigint', 'timestamptz'))}) AS {V.header()} "
            f"WHERE {N.id} = {V.id}")


@functools.lru_cache(maxsize=512)
def flush_processes(count: int) -> str:
    """PostgreSQL: the nodes' own processes seen with them (a full heartbeat stamps them too)."""
    return (f"UPDATE {W} SET {WORKLOADS.last_seen} = {V.seen} "
            f"FROM (VALUES {V.values(count, ('bigint', 'bigint', 'timestamptz'))}) AS {V.header()} "
            f"WHERE {W.node_id} = {V.id} AND {_PROCESS} AND {W.gone_at} IS NULL "
            f"AND ({W.last_seen} IS NULL OR {W.last_seen} < {V.seen})")


# Other engines, one node a row: params counter, seen, seen, id.
FLUSH_NODE = (f"UPDATE {NODES} SET {NODES.heartbeat_counter} = MAX({NODES.heartbeat_counter}, %s), "
              f"{NODES.last_seen} = MAX(COALESCE({NODES.last_seen}, ''), %s), "
              f"{NODES.heartbeat_at} = MAX(COALESCE({NODES.heartbeat_at}, ''), %s) WHERE {NODES.id} = %s")
# params seen, node id, seen
FLUSH_PROCESSES = (f"UPDATE {WORKLOADS} SET {WORKLOADS.last_seen} = %s WHERE {WORKLOADS.node_id} = %s "
                   f"AND {WORKLOADS.kind} = '{WorkloadKind.PROCESS}' AND {WORKLOADS.gone_at} IS NULL "
                   f"AND ({WORKLOADS.last_seen} IS NULL OR {WORKLOADS.last_seen} < %s)")


def examples() -> Iterator[tuple[str, list[Any]]]:
    """Every statement above with parameters of the right shape (tests/foundation/test_sql_statements.py)."""
    from gpusweep.db.bulk import db_datetime

    stamp = db_datetime(dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    yield f"SELECT {NODES.id} FROM {NODES} WHERE {node_scope(None)}", [1]
    yield f"SELECT {NODES.id} FROM {NODES} WHERE {node_scope(2)}", [1, "a", "b"]
    yield COMPONENTS_OF_CLUSTER, [1]
    yield components_of_nodes(2), [1, 2]
    yield touch_nodes(1, False), [stamp, 1]
    yield touch_nodes(2, True), [stamp, stamp, 1, 2]
    yield forget_digests(2), [1, 2]
    yield f"SELECT {WORKLOADS.id} FROM {WORKLOADS} WHERE {workload_scope(1, True, 2, 1)}", [1, "process", 1, 2, "x"]
    yield UPDATE_COMPONENT, ["1.0", "0001", "", "agent", stamp, 1]
    yield service_states(2), [1, 2, "patching"]
    yield set_service_state(2), ["patching", stamp, 1, 2]
    yield node_components(2), ["driver", "cuda", 1]
    yield node_components(0), [1]
    yield f"SELECT {NODES.facts} FROM {NODES} WHERE {NODE_BY_ID}", [1]
    yield WORKLOAD_AND_TWIN, [1, "x", 1]
    yield WORKLOAD_GONE, [stamp, 1]
    yield WORKLOAD_BACK, [1, stamp, 1]
    yield WORKLOAD_MOVED, [1, "x", stamp, 1]
    yield UNLINK_WORKLOAD, [1]
    yield CLUSTER_BY_NAME, ["lab"]
    yield LOCK_NODE, [1, "gpu01"]
    yield TAKE_COUNTER, [5, "digest", 1, "gpu01", 5]
    yield SHORT_READ, ["lab", "gpu01"]
    if connection.vendor == "postgresql":
        yield flush_nodes(2), [1, 5, stamp, 2, 6, stamp]
        yield flush_processes(1), [1, 5, stamp]
    else:
        yield FLUSH_NODE, [5, stamp, stamp, 1]
        yield FLUSH_PROCESSES, [stamp, 1, stamp]
