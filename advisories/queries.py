"""The exposure recompute's statements (advisories/exposure.py runs them).

Plain SQL because the recompute is set-based over the whole fleet (bench/exposure.py: a full
recompute of 100,000 nodes in a few statements; the node-by-node ORM loop is 150x to 350x
slower) and a node's recompute runs on every changed heartbeat (bench/heartbeat.py), where
compiling ORM queries cost more than running them. Every table and column name comes from the
models (gpusweep.db.names); the derived relations (m: the matches, v: the fleet's distinct
versions, x: the node matches, d: the deadlines) name their columns after the fields they carry.
A statement is built once per shape (lru_cache: its scope's and VALUES lists' lengths).
The OS package matching (advisories/osmatch.py) groups nodes and inserts its verdicts here too.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterator, Sequence
from typing import Any

from django.db import connection

from advisories.models import CVE, Advisory, AffectedRange, ClusterDeadlineOverride, DeadlinePolicy, Exposure, KevEntry
from gpusweep.db.bulk import default_values, marks
from gpusweep.db.names import Columns, Derived, Table, pairs
from inventory.models import Node, NodeComponent

# Statements only one engine runs (the others have their own path), for the statement test.
ONLY = {"postgresql": frozenset({"refresh_all_deadlines", "ANALYZE", "ASYNC_COMMIT", "FLEET_WIDE",
                                  "FLEET_WIDE_RESET"})}

E, EC = Table(Exposure), Columns(Exposure)  # the table UPDATEs and DELETEs name, unaliased
XE = Table(Exposure, "e")
R = Table(AffectedRange, "r")
N = Table(Node, "n")
NODES = Columns(Node)
NC, NC2, NC3, NC4 = (Table(NodeComponent, alias) for alias in ("nc", "nc2", "nc3", "nc4"))
A = Table(Advisory, "a")
RC = Table(AffectedRange.cves.through, "rc")
CV = Table(CVE, "c")
KEV = Table(KevEntry, "k")
P = Table(DeadlinePolicy, "p")
OV = Table(ClusterDeadlineOverride, "o")

# A distinct version of the fleet: the node component's and node's fields ranges match on.
_VERSION = {"component": (NodeComponent, "component"), "branch": (NodeComponent, "branch"),
            "version_key": (NodeComponent, "version_key"), "os_family": (Node, "os_family"),
            "product_line": (Node, "product_line"), "gpu_model": (Node, "gpu_model"), "facts": (Node, "facts")}
TUPLE = tuple(_VERSION)
V = Derived("v", **_VERSION)
# The matches: a version inside a range, with the exposure's range, advisory, severity and state.
M = Derived("m", **_VERSION, affected_range=(Exposure, "affected_range"), advisory=(Exposure, "advisory"),
            severity=(Exposure, "severity"), state=(Exposure, "state"))
# Every node component inside a range (NODE_MATCHES' rows).
X = Derived("x", node=(Exposure, "node"), affected_range=(Exposure, "affected_range"),
            advisory=(Exposure, "advisory"), component=(Exposure, "component"), version=(NodeComponent, "version"),
            severity=(Exposure, "severity"), state=(Exposure, "state"), gone_at=(Node, "gone_at"),
            cluster=(Node, "cluster"))
# Deadlines per range and cluster (new exposures), per group of first_seen (assign_deadlines),
# and fixed or in days (the fleet-wide refresh).
D_NEW = Derived("d", affected_range=(Exposure, "affected_range"), cluster=(Node, "cluster"),
                deadline=(Exposure, "deadline"), deadline_source=(Exposure, "deadline_source"))
D_GROUP = Derived("d", affected_range=(Exposure, "affected_range"), cluster=(Node, "cluster"),
                  first_seen=(Exposure, "first_seen"), deadline=(Exposure, "deadline"),
                  deadline_source=(Exposure, "deadline_source"))
D_REFRESH = Derived("d", affected_range=(Exposure, "affected_range"), cluster=(Node, "cluster"),
                    deadline=(Exposure, "deadline"), days=(ClusterDeadlineOverride, "days"),
                    deadline_source=(Exposure, "deadline_source"))

# v is a distinct version seen in the fleet, r a range; true when that version is inside the
# range. Empty range fields mean "any".
IN_RANGE = f"""
    {R.component} = {V.component}
    AND ({R.os_family} = '' OR {R.os_family} = {V.os_family})
    AND ({R.product_line} = '' OR {R.product_line} = {V.product_line})
    AND ({R.lower_key} IS NULL OR {V.version_key} > {R.lower_key}
         OR ({R.lower_inclusive} AND {V.version_key} = {R.lower_key}))
    AND ({R.upper_key} IS NULL OR {V.version_key} < {R.upper_key}
         OR ({R.upper_inclusive} AND {V.version_key} = {R.upper_key}))
"""


def facts(node: Table) -> str:
    """A node's facts as text, compared by equality (PostgreSQL's jsonb text form is canonical;
    SQLite stores the text the ORM wrote)."""
    return f"CAST({node.facts} AS TEXT)"


def in_list(column: str, ids: Sequence[Any] | None) -> tuple[str, list[Any]]:
    """` AND column IN (...)` for `ids`; nothing for None (no scope), never true for none."""
    if ids is None:
        return "", []
    if not ids:
        return " AND 1 = 0", []
    return f" AND {column} IN ({marks(ids)})", list(ids)


@functools.lru_cache(maxsize=256)
def version_matches(n_scope: str, r_scope: str) -> str:
    """Distinct fleet versions (in scope) inside a range, with the range's terms. Params: n_scope's,
    then r_scope's (twice when it is given: the versions read are only those of its ranges'
    components, through the component index, instead of every component of the fleet)."""
    inner = ", ".join(f"{getattr(NC if model is NodeComponent else N, name)} AS {V.bare(name)}"
                      for name, (model, _field) in _VERSION.items() if name != "facts")
    components = f"AND {NC.component} IN (SELECT {R.component} FROM {R} WHERE 1 = 1 {r_scope})" if r_scope else ""
    return f"""
        SELECT DISTINCT {', '.join(getattr(V, name) for name in TUPLE)},
               {R.id}, {R.advisory_id}, {R.severity}, {R.basis}, {R.scope}, {R.condition}
        FROM (
            SELECT DISTINCT {inner}, {facts(N)} AS {V.bare("facts")}
            FROM {NC} JOIN {N} ON {N.id} = {NC.node_id}
            WHERE {NC.version_key} IS NOT NULL {n_scope} {components}
        ) v
        JOIN {R} ON {R.component} = {V.component}
        WHERE {IN_RANGE} {r_scope}
        """


@functools.lru_cache(maxsize=256)
def with_matches(count: int) -> str:
    """`WITH m(...) AS (VALUES ...)`: `count` match rows (at least one)."""
    return f"WITH {M.header()} AS (VALUES {M.values(max(count, 1))})"


def _joined_to_matches(nc: Table, n: Table) -> str:
    """`nc`, `n` joined to m by equality (the node component and node of a match)."""
    return (f"JOIN {nc} ON {nc.component} = {M.component} AND {nc.branch} = {M.branch} "
            f"AND {nc.version_key} = {M.version_key} "
            f"JOIN {n} ON {n.id} = {nc.node_id} AND {n.os_family} = {M.os_family} "
            f"AND {n.product_line} = {M.product_line} AND {n.gpu_model} = {M.gpu_model} AND {facts(n)} = {M.facts}")


# Every node component inside a range: nc / n joined to m by equality.
NODE_MATCHES = f"""
    SELECT {NC.node_id} AS {X.bare("node")}, {M.affected_range} AS {X.bare("affected_range")},
           {M.advisory} AS {X.bare("advisory")}, {NC.component} AS {X.bare("component")},
           {NC.version} AS {X.bare("version")}, {M.severity} AS {X.bare("severity")}, {M.state} AS {X.bare("state")},
           {N.gone_at} AS {X.bare("gone_at")}, {N.cluster_id} AS {X.bare("cluster")}
    FROM m {_joined_to_matches(NC, N)}
"""
# The m row of an exposure's node component and range (its state), for the UPDATEs.
MATCH_OF_EXPOSURE = f"""
    SELECT {M.state} FROM m {_joined_to_matches(NC, N)}
    WHERE {pairs(NC, E, ('node_id', 'component'))} AND {M.affected_range} = {E.affected_range_id}"""
CURRENT_VERSION = f"(SELECT {NC2.version} FROM {NC2} WHERE {pairs(NC2, E, ('node_id', 'component'))})"

FLEET_WIDE = ("SET LOCAL enable_nestloop = off", "SET LOCAL enable_mergejoin = off",
              "SET LOCAL work_mem = '128MB'", "SET LOCAL jit = off")
FLEET_WIDE_RESET = tuple(f"RESET {name}" for name in ("enable_nestloop", "enable_mergejoin", "work_mem", "jit"))
ANALYZE = f"ANALYZE {E}"
ASYNC_COMMIT = "SET LOCAL synchronous_commit = off"  # this transaction's commit does not wait for the WAL
ORPHANS = f"""
    DELETE FROM {E} WHERE NOT EXISTS (SELECT 1 FROM {N} WHERE {N.id} = {E.node_id})
       OR NOT EXISTS (SELECT 1 FROM {R} WHERE {R.id} = {E.affected_range_id})"""


@functools.lru_cache(maxsize=256)
def any_exposure(a_scope: str) -> str:
    return f"SELECT 1 FROM {E} WHERE 1 = 1 {a_scope} LIMIT 1"


@functools.lru_cache(maxsize=256)
def clusters_of_nodes(n_scope: str) -> str:
    return f"SELECT DISTINCT {NODES.cluster_id} FROM {NODES} WHERE 1 = 1 {n_scope}"


# The new rows' fields the statement gives; every other field gets its default (a parameter).
_INSERTED = ("node", "cluster", "advisory", "affected_range", "component", "detected_version", "severity", "state",
             "first_seen", "deadline", "deadline_source", "updated_at")


def insert_new(with_m: str, d_values: str, n_scope: str, existing: bool = True) -> tuple[str, list[Any]]:
    """New exposures (existing (node, range) rows skipped by an anti-join, unless `existing` is false:
    none in scope), each with its deadline; the parameters after m's and d's: first_seen, updated_at,
    the defaults, then n_scope's."""
    extra, defaults = default_values(Exposure, _INSERTED)
    fence = "OFFSET 0" if connection.vendor == "postgresql" else ""
    sql = f"""
        {with_m}, {d_values}
        INSERT INTO {EC} ({EC.list(_INSERTED + extra)})
        SELECT {X.node}, {X.cluster}, {X.advisory}, {X.affected_range}, {X.component}, {X.version}, {X.severity},
               {X.state}, %s, {D_NEW.deadline}, {D_NEW.deadline_source}, %s{', %s' * len(extra)}
        FROM ({NODE_MATCHES} WHERE 1 = 1 {n_scope} {fence}) x
        JOIN d ON {pairs(D_NEW, X, ('affected_range', 'cluster'))}
        WHERE {X.gone_at} IS NULL
        """
    if existing:
        sql += f"""  AND NOT EXISTS (SELECT 1 FROM {XE} WHERE {XE.node_id} = {X.node}
                          AND {XE.affected_range_id} = {X.affected_range})
        """
    return sql, list(defaults)


ON_CONFLICT_SKIP = " ON CONFLICT DO NOTHING"  # insert_new's guarded form (a concurrent recompute)


@functools.lru_cache(maxsize=256)
def deadline_values(count: int) -> str:
    """`d(...) AS (VALUES ...)`: deadlines of `count` (range, cluster) pairs for new exposures."""
    return f"{D_NEW.header()} AS (VALUES {D_NEW.values(max(count, 1))})"


@functools.lru_cache(maxsize=256)
def reopen(with_m: str, scope: str) -> str:
    """Back in range after a remediation: the state of its match; params: m's, stamp, state, scope's."""
    return f"""
        {with_m}
        UPDATE {EC} SET {EC.state} = ({MATCH_OF_EXPOSURE} LIMIT 1), {EC.remediated_at} = NULL,
               {EC.fixed_by_version} = '', {EC.remediated_by} = '', {EC.deadline} = NULL,
               {EC.detected_version} = COALESCE({CURRENT_VERSION}, {EC.detected_version}), {EC.updated_at} = %s
        WHERE {EC.state} = %s {scope} AND EXISTS ({MATCH_OF_EXPOSURE})
        """


@functools.lru_cache(maxsize=256)
def remediate(with_m: str, states: str, scope: str) -> str:
    """Out of range: remediated, or withdrawn (a presumed one at the same version). Params: m's,
    presumed, withdrawn, remediated, stamp, stamp, remediated_by, the states', scope's, and the OS
    package component (advisories.osmatch keeps those exposures)."""
    return f"""
        {with_m}
        UPDATE {EC} SET {EC.state} = CASE WHEN {EC.state} = %s AND {CURRENT_VERSION} = {EC.detected_version}
                                          THEN %s ELSE %s END,
               {EC.remediated_at} = %s, {EC.updated_at} = %s, {EC.remediated_by} = %s,
               {EC.fixed_by_version} = COALESCE({CURRENT_VERSION}, '(component removed)')
        WHERE {EC.state} IN ({states}) {scope} AND NOT EXISTS ({MATCH_OF_EXPOSURE})
          AND {EC.component} <> %s
          AND EXISTS (SELECT 1 FROM {N} WHERE {N.id} = {E.node_id} AND {N.gone_at} IS NULL)
          AND NOT EXISTS (SELECT 1 FROM {NC3} WHERE {pairs(NC3, E, ('node_id', 'component'))}
                          AND {NC3.version_key} IS NULL)
        """


@functools.lru_cache(maxsize=256)
def delete_in_state(scope: str) -> str:
    return f"DELETE FROM {EC} WHERE {EC.state} = %s {scope}"


@functools.lru_cache(maxsize=256)
def follow_versions(states: str, scope: str) -> str:
    """Still exposed, another version within the range. Params: stamp, the states', scope's."""
    return f"""
        UPDATE {EC} SET {EC.detected_version} = {CURRENT_VERSION}, {EC.updated_at} = %s
        WHERE {EC.state} IN ({states}) {scope}
          AND EXISTS (SELECT 1 FROM {NC4} WHERE {pairs(NC4, E, ('node_id', 'component'))}
                      AND {NC4.version} <> {E.detected_version})
        """


@functools.lru_cache(maxsize=256)
def follow_scope(with_m: str, scope: str) -> str:
    """Open and presumed follow the match's state. Params: m's, stamp, open, presumed, scope's."""
    return f"""
        {with_m}
        UPDATE {EC} SET {EC.state} = ({MATCH_OF_EXPOSURE} LIMIT 1), {EC.updated_at} = %s
        WHERE {EC.state} IN (%s, %s) {scope}
          AND EXISTS ({MATCH_OF_EXPOSURE} AND {M.state} <> {E.state})
        """


@functools.lru_cache(maxsize=256)
def expire_acceptances(bases: str) -> str:
    """Accepted risks past expiry, exposed again. Params: the bases', presumed, open, stamp,
    risk_accepted, stamp."""
    return f"""
        UPDATE {EC} SET {EC.state} = CASE WHEN {EC.affected_range_id} IN (
                SELECT {R.id} FROM {R} WHERE {R.basis} IN ({bases})) THEN %s ELSE %s END, {EC.updated_at} = %s
        WHERE {EC.state} = %s AND {EC.risk_expires_at} < %s
        """


POLICY_DAYS = ("critical_days", "high_days", "medium_days", "low_days")
# The policy with every cluster override (a row each, or one with NULLs): one statement.
POLICY_AND_OVERRIDES = (f"SELECT {', '.join(getattr(P, f) for f in POLICY_DAYS)}, {P.basis}, {P.use_kev}, "
                        f"{OV.cluster_id}, {OV.severity}, {OV.days} FROM {P} LEFT JOIN {OV} ON 1 = 1 WHERE {P.id} = 1")
# Ranges with their advisory's terms and each CVE's KEV due date (NULL when not in KEV, or no CVE);
# a scope on R.id follows.
RANGE_TERMS = f"""
    SELECT {R.id}, {R.severity}, {A.severity}, {A.initial_release_date}, {CV.cve_id}, {KEV.due_date}
    FROM {R} JOIN {A} ON {A.id} = {R.advisory_id}
    LEFT JOIN {RC} ON {RC.affectedrange_id} = {R.id} LEFT JOIN {CV} ON {CV.id} = {RC.cve_id}
    LEFT JOIN {KEV} ON {KEV.cve_id} = {CV.cve_id}
    WHERE 1 = 1"""


@functools.lru_cache(maxsize=256)
def deadline_groups(states: str, pending: bool, n_scope: str, a_scope: str) -> str:
    """(range, cluster, first_seen) of active exposures (without a deadline when `pending`)."""
    return f"""
        SELECT DISTINCT {E.affected_range_id}, {N.cluster_id}, {E.first_seen}
        FROM {E} JOIN {N} ON {N.id} = {E.node_id}
        WHERE {E.state} IN ({states}) {_pending(pending)} {n_scope} {a_scope}
        """


def _pending(pending: bool) -> str:
    return f"AND {E.deadline} IS NULL" if pending else ""


@functools.lru_cache(maxsize=256)
def set_deadlines(groups: int, states: str, pending: bool, n_scope: str, a_scope: str) -> str:
    """The deadlines of `groups` (range, cluster, first_seen) groups. Params: the groups', the
    states', the scopes'."""
    return f"""
        WITH {D_GROUP.header()} AS (VALUES {D_GROUP.values(groups)})
        UPDATE {EC} SET {EC.deadline} = {D_GROUP.deadline}, {EC.deadline_source} = {D_GROUP.deadline_source}
        FROM d, {N}
        WHERE {N.id} = {E.node_id} AND {D_GROUP.affected_range} = {E.affected_range_id}
          AND {D_GROUP.cluster} = {N.cluster_id} AND {D_GROUP.first_seen} = {E.first_seen}
          AND {E.state} IN ({states}) {_pending(pending)} {n_scope} {a_scope}
          AND ({E.deadline} IS NULL OR {E.deadline} <> {D_GROUP.deadline}
               OR {E.deadline_source} <> {D_GROUP.deadline_source})
        """


@functools.lru_cache(maxsize=256)
def active_ranges(states: str) -> str:
    return f"SELECT DISTINCT {EC.affected_range_id} FROM {EC} WHERE {EC.state} IN ({states})"


@functools.lru_cache(maxsize=256)
def refresh_all_deadlines(rows: int, states: str) -> str:
    """Every active deadline (PostgreSQL): `rows` (range, cluster, fixed, days, source). Params: the
    rows', the states'."""
    new = f"COALESCE({D_REFRESH.deadline}, {E.first_seen} + {D_REFRESH.days} * INTERVAL '1 day')"
    return f"""
        WITH {D_REFRESH.header()} AS (VALUES {D_REFRESH.values(rows, ('bigint', 'bigint', 'timestamptz',
                                                                       'integer', ''))})
        UPDATE {EC} SET {EC.deadline} = {new}, {EC.deadline_source} = {D_REFRESH.deadline_source}
        FROM d, {N}
        WHERE {N.id} = {E.node_id} AND {D_REFRESH.affected_range} = {E.affected_range_id}
          AND {D_REFRESH.cluster} = {N.cluster_id} AND {E.state} IN ({states})
          AND ({E.deadline} IS DISTINCT FROM {new} OR {E.deadline_source} <> {D_REFRESH.deadline_source})
        """


# -- OS package matching (advisories/osmatch.py) ----------------------------------------------
# The ranges are matched in Python (an ecosystem's version order has no sort key); the database
# groups the nodes and writes each group's verdict to all of its nodes in one INSERT ... SELECT.

@functools.lru_cache(maxsize=256)
def package_set_nodes(n_scope: str) -> str:
    """(id, package set, running kernel, livepatch as text, gone_at) of the nodes with a package set
    (a scope on NODES.id: `n_scope`, its params). The livepatch is the database's text, which
    insert_os compares it with."""
    return (f"SELECT {NODES.id}, {NODES.package_set_id}, {NODES.running_kernel}, CAST({NODES.livepatch} AS TEXT), "
            f"{NODES.gone_at} FROM {NODES} WHERE {NODES.package_set_id} IS NOT NULL {n_scope}")


def package_set_groups(n_scope: str) -> str:
    """The distinct (package set, running kernel, livepatch as text) of the nodes with a package set
    (a scope on NODES.id: `n_scope`, its params): package_set_nodes grouped by the database."""
    return (f"SELECT DISTINCT {NODES.package_set_id}, {NODES.running_kernel}, CAST({NODES.livepatch} AS TEXT) "
            f"FROM {NODES} WHERE {NODES.package_set_id} IS NOT NULL {n_scope}")


# A cluster's deadline for a group's new exposures.
D_CLUSTER = Derived("d", cluster=(Node, "cluster"), deadline=(Exposure, "deadline"),
                    deadline_source=(Exposure, "deadline_source"))
# The fields insert_os gives; every other field gets its default (a parameter).
_OS_INSERTED = ("node", "cluster", "advisory", "affected_range", "component", "detected_version", "severity", "state",
                "first_seen", "deadline", "deadline_source", "fixed_by_version", "remediated_at", "remediated_by",
                "note", "updated_at")


def insert_os(clusters: int, done: bool, livepatch: bool, n_scope: str, fresh: bool = False) -> tuple[str, list[Any]]:
    """New exposures of one (package set, running kernel, livepatch) group to one range: the group's
    live nodes in scope without one (a row each, its cluster's deadline; none when `done`, the verdict
    a remediation). `livepatch`: the group's livepatch is a text, not NULL. Params: d's (cluster,
    deadline, source) for `clusters` clusters, advisory, range, component, detected version,
    severity, state, first_seen, fixed_by_version, remediated_at, remediated_by, note, updated_at,
    the defaults (returned), then package set, kernel, (livepatch), n_scope's, range (not for a
    `fresh` range: one with no exposure yet, whose rows need no check for one)."""
    extra, defaults = default_values(Exposure, _OS_INSERTED)
    return _insert_os(clusters, done, livepatch, n_scope, extra, fresh), list(defaults)


@functools.lru_cache(maxsize=256)
def _insert_os(clusters: int, done: bool, livepatch: bool, n_scope: str, extra: tuple[str, ...],
               fresh: bool) -> str:
    same_livepatch = f"CAST({N.livepatch} AS TEXT) = %s" if livepatch else f"{N.livepatch} IS NULL"
    deadline = "NULL" if done else D_CLUSTER.deadline  # an all-NULL VALUES column would be typed text
    return f"""
        WITH {D_CLUSTER.header()} AS (VALUES {D_CLUSTER.values(clusters)})
        INSERT INTO {EC} ({EC.list(_OS_INSERTED + extra)})
        SELECT {N.id}, {N.cluster_id}, %s, %s, %s, %s, %s, %s, %s, {deadline}, {D_CLUSTER.deadline_source},
               %s, %s, %s, %s, %s{', %s' * len(extra)}
        FROM {N} JOIN d ON {D_CLUSTER.cluster} = {N.cluster_id}
        WHERE {N.package_set_id} = %s AND {N.running_kernel} = %s AND {same_livepatch} AND {N.gone_at} IS NULL
          {n_scope}
          {"" if fresh else f"AND NOT EXISTS (SELECT 1 FROM {XE} WHERE {XE.node_id} = {N.id} AND "
                            f"{XE.affected_range_id} = %s)"}
        """


def examples() -> Iterator[tuple[str, list[Any]]]:
    """Every statement above with parameters of the right shape (tests/foundation/test_sql_statements.py)."""
    one = [1]
    n_scope, n_params = in_list(N.id, one)
    r_scope, r_params = in_list(R.advisory_id, one)
    e_scope, e_params = in_list(E.node_id, one)
    match = ["driver", "570", "0570", "ubuntu", "", "", "{}", 1, 1, "high", "open"]
    with_m = with_matches(1)
    stamp = connection.ops.adapt_datetimefield_value(dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    yield version_matches(n_scope, r_scope), [*n_params, *r_params, *r_params]
    yield version_matches("", r_scope), [*r_params, *r_params]
    yield version_matches("", ""), []
    yield any_exposure(e_scope), e_params
    yield clusters_of_nodes(in_list(NODES.id, one)[0]), one
    sql, defaults = insert_new(with_m, deadline_values(1), n_scope)
    yield sql, [*match, 1, 1, stamp, "policy", stamp, stamp, *defaults, *n_params]
    yield sql + ON_CONFLICT_SKIP, [*match, 1, 1, stamp, "policy", stamp, stamp, *defaults, *n_params]
    sql, defaults = insert_new(with_m, deadline_values(1), "", existing=False)
    yield sql, [*match, 1, 1, stamp, "policy", stamp, stamp, *defaults]
    yield reopen(with_m, e_scope), [*match, stamp, "remediated", *e_params]
    yield remediate(with_m, marks(["open"]), e_scope), [*match, "presumed", "withdrawn", "remediated", stamp, stamp,
                                                       "", "open", *e_params, "os_package"]
    yield delete_in_state(e_scope), ["withdrawn", *e_params]
    yield follow_versions(marks(["open"]), e_scope), [stamp, "open", *e_params]
    yield follow_scope(with_m, e_scope), [*match, stamp, "open", "presumed", *e_params]
    yield expire_acceptances(marks(["presumed"])), ["presumed", "presumed", "open", stamp, "risk_accepted", stamp]
    yield POLICY_AND_OVERRIDES, []
    yield RANGE_TERMS + in_list(R.id, one)[0], one
    yield deadline_groups(marks(["open"]), True, e_scope, ""), ["open", *e_params]
    yield set_deadlines(1, marks(["open"]), False, e_scope, ""), [1, 1, stamp, stamp, "policy", "open", *e_params]
    yield ORPHANS, []
    yield active_ranges(marks(["open"])), ["open"]
    yield package_set_nodes(in_list(NODES.id, one)[0]), one
    yield package_set_nodes(""), []
    yield package_set_groups(in_list(NODES.id, one)[0]), one
    yield package_set_groups(""), []
    for done, livepatch, fresh in ((False, False, False), (True, True, False), (False, False, True)):
        deadline = None if done else stamp
        sql, defaults = insert_os(2, done, livepatch, n_scope, fresh)
        yield sql, [1, deadline, "policy", 2, deadline, "policy", 1, 1, "os_package", "1.0", "high",
                    "remediated" if done else "open", stamp, *(["1.0", stamp, "livepatch"] if done else ["", None, ""]),
                    "livepatch" if done else "running kernel", stamp, *defaults, 1,
                    "5.15.0-1042-nvidia", *(['{"state":"applied"}'] if livepatch else []), *n_params,
                    *([] if fresh else [1])]
    if connection.vendor == "postgresql":
        yield refresh_all_deadlines(1, marks(["open"])), [1, 1, None, 30, "policy", "open"]
        yield ANALYZE, []
        yield ASYNC_COMMIT, []
        for statement in (*FLEET_WIDE, *FLEET_WIDE_RESET):
            yield statement, []
