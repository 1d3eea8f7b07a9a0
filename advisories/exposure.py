"""Which nodes sit inside which affected ranges: computed set-based in the database.

A node is exposed to a range when one of its components has the range's component, the node's
OS family and product line (empty on the range = any), a version key inside the bounds (a driver
row's branch is its lower bound), the product the range is scoped to (a VBIOS row's GPU model, a
firmware row's platform) and the condition it carries (a GPU architecture, the container
toolkit's mode; a fact the inventory lacks counts as met). Keys are zero-padded strings
(inventory.versions), so bounds are plain string comparisons.

The fleet is matched by its distinct (component, branch, version key, OS, product line, GPU model,
facts) tuples: SQL finds the ranges each tuple's version falls in, Python checks scopes and
conditions on those few hundred rows and decides the state (`presumed` where the range is one the
bulletin did not let us decode, or its scope is unknown on the node; else `open`), and a few
INSERT ... SELECT / UPDATE statements join the result back to every component by equality, never
node by node. The same statements run for all nodes, a set of nodes (their versions or facts
changed) or a set of advisories (just ingested).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from advisories import components
from advisories.choices import DeadlineBasis, ExposureState, RangeBasis
from advisories.models import CVE, Advisory, AffectedRange, ClusterDeadlineOverride, DeadlinePolicy, Exposure, KevEntry
from advisories.osv import OS_PACKAGE
from inventory.bulk import marks, read_date, read_datetime
from inventory.models import Cluster, Node, NodeComponent

# Tables for the raw statements: a node's recompute runs on every changed heartbeat, where
# compiling ORM queries would cost more than running them.
E = Exposure._meta.db_table
R = AffectedRange._meta.db_table
N = Node._meta.db_table
NC = NodeComponent._meta.db_table
A = Advisory._meta.db_table
RC = AffectedRange.cves.through._meta.db_table
CV = CVE._meta.db_table
KEV = KevEntry._meta.db_table
P = DeadlinePolicy._meta.db_table
OV = ClusterDeadlineOverride._meta.db_table

# v is a distinct (component, branch, version_key, os_family, product_line, ...) seen in the fleet,
# r a range; true when that version is inside the range. Empty range fields mean "any".
IN_RANGE = """
    r.component = v.component
    AND (r.os_family = '' OR r.os_family = v.os_family)
    AND (r.product_line = '' OR r.product_line = v.product_line)
    AND (r.lower_key IS NULL OR v.version_key > r.lower_key OR (r.lower_inclusive AND v.version_key = r.lower_key))
    AND (r.upper_key IS NULL OR v.version_key < r.upper_key OR (r.upper_inclusive AND v.version_key = r.upper_key))
"""
# A node's facts as text, compared by equality (PostgreSQL's jsonb text form is canonical; SQLite
# stores the text the ORM wrote).
FACTS = "CAST(n.facts AS TEXT)"
TUPLE = ("component", "branch", "version_key", "os_family", "product_line", "gpu_model", "facts")
MATCH_COLUMNS = ", ".join([*TUPLE, "range_id", "advisory_id", "severity", "state"])


def _version_matches(cursor: Any, n_scope: str, n_params: list[int], r_scope: str,
                     r_params: list[int]) -> tuple[list[Any], set[int]]:
    """Distinct fleet tuples (in scope) inside a range, with the exposure's state: a few hundred rows,
    and the ids of the scoped ranges among them (the ones `_follow_scope` revisits).

    Matching runs here, on the distinct tuples of the fleet against the ranges; the statements
    below join the result back to every component by equality. Handing it over as a VALUES list
    gives the planner its true size, so the plans are hash joins, linear in the fleet, rather
    than every node tested against every range.
    """
    cursor.execute(
        f"""
        SELECT DISTINCT v.component, v.branch, v.version_key, v.os_family, v.product_line, v.gpu_model, v.facts,
               r.id, r.advisory_id, r.severity, r.basis, r.scope, r.condition
        FROM (
            SELECT DISTINCT nc.component AS component, nc.branch AS branch, nc.version_key AS version_key,
                   n.os_family AS os_family, n.product_line AS product_line, n.gpu_model AS gpu_model,
                   {FACTS} AS facts
            FROM {NC} nc JOIN {N} n ON n.id = nc.node_id
            WHERE nc.version_key IS NOT NULL {n_scope}
        ) v
        JOIN {R} r ON r.component = v.component
        WHERE {IN_RANGE} {r_scope}
        """,
        [*n_params, *r_params],
    )
    rows = []
    scoped: set[int] = set()
    for *tuple_, range_id, advisory_id, severity, basis, scope, condition in cursor.fetchall():
        scope = _json(scope)
        state = match_state(tuple_[5], tuple_[6], basis, scope, _json(condition))
        if state:
            rows.append((*tuple_, range_id, advisory_id, severity, state))
            if scope:
                scoped.add(range_id)
    return rows, scoped


def _json(value: Any) -> dict[str, Any]:
    # Raw cursors return JSON columns as text on SQLite and decoded on PostgreSQL.
    if isinstance(value, str):
        value = json.loads(value or "{}")
    return value if isinstance(value, dict) else {}


def node_fact(gpu_model: str, facts: dict[str, Any], name: str) -> str:
    """A node's fact as advisories compare it; '' when unknown. The architecture falls back to
    the one the GPU model implies; platforms compare in their short form (dgx_a100)."""
    value = str(facts.get(name) or "")
    if name == "gpu_architecture" and not value:
        return components.architecture_of(gpu_model)
    if name == components.SCOPE_PLATFORM and value:
        return components.platform_of(value.replace("_", " ")) or components.slug(value)
    return components.slug(value) if value else ""


def match_state(gpu_model: str, facts_text: str | dict[str, Any], basis: str, scope: dict[str, str],
                condition: dict[str, list[str]]) -> str:
    """The state of a node inside a range's bounds: `open`, `presumed`, or '' (not exposed)."""
    facts = _json(facts_text)
    presumed = basis in RangeBasis.PRESUMED
    for name, wanted in scope.items():
        if name == components.SCOPE_GPU_MODEL:
            known = components.gpu_models(gpu_model)
            if not known:
                presumed = True
            elif wanted not in known:
                return ""
        else:
            value = node_fact(gpu_model, facts, name)
            if not value:
                presumed = True  # which product's firmware this node runs is unknown
            elif value != wanted:
                return ""
    for name, values in condition.items():
        value = node_fact(gpu_model, facts, name)
        if value and value not in values:
            return ""
    return ExposureState.PRESUMED if presumed else ExposureState.OPEN


def _with_matches(rows: list[Any]) -> tuple[str, list[Any]]:
    """A `WITH m(...) AS (VALUES ...)` prefix holding `rows` (one impossible row when empty)."""
    if not rows:
        rows = [("", "", "", "", "", "", "", 0, 0, "", "")]
    values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(rows))
    return f"WITH m({MATCH_COLUMNS}) AS (VALUES {values})", [value for row in rows for value in row]


# Every node component inside a range: nc / n joined to m by equality.
NODE_MATCHES = f"""
    SELECT nc.node_id AS node_id, m.range_id AS range_id, m.advisory_id AS advisory_id,
           nc.component AS component, nc.version AS version, m.severity AS severity, m.state AS state,
           n.gone_at AS gone_at, n.cluster_id AS cluster_id
    FROM m
    JOIN {NC} nc ON nc.component = m.component AND nc.branch = m.branch AND nc.version_key = m.version_key
    JOIN {N} n ON n.id = nc.node_id AND n.os_family = m.os_family AND n.product_line = m.product_line
                  AND n.gpu_model = m.gpu_model AND {FACTS} = m.facts
"""


def _fleet_wide_settings(cursor: Any, reset: bool = False) -> None:
    """PostgreSQL settings for statements over the whole fleet, for this transaction only.

    Fleet-wide, every join is large: hash joins are right (not nested loops, not merge joins that
    sort hundreds of thousands of rows), and PostgreSQL cannot estimate a VALUES list's join
    selectivity well enough to know. Big hashes should stay in memory, and JIT
    compiling these statements costs more than it saves. Node-scoped runs keep the defaults
    (nested loops over index lookups are right for a handful of nodes).
    """
    if connection.vendor != "postgresql":
        return
    if reset:
        for name in ("enable_nestloop", "enable_mergejoin", "work_mem", "jit"):
            cursor.execute(f"RESET {name}")
        return
    cursor.execute("SET LOCAL enable_nestloop = off")
    cursor.execute("SET LOCAL enable_mergejoin = off")
    cursor.execute("SET LOCAL work_mem = '128MB'")
    cursor.execute("SET LOCAL jit = off")


def _rowcount(cursor: Any) -> int:
    # Python's sqlite3 reports -1 for statements that start with WITH; SQLite itself knows.
    if cursor.rowcount >= 0:
        return int(cursor.rowcount)
    cursor.execute("SELECT changes()")
    return int(cursor.fetchone()[0])


@dataclass
class RecomputeResult:
    opened: int = 0
    reopened: int = 0
    remediated: int = 0
    withdrawn: int = 0
    restated: int = 0
    expired_acceptances: int = 0
    deadlines_set: int = 0


def _in(column: str, ids: Sequence[int] | None) -> tuple[str, list[int]]:
    if ids is None:
        return "", []
    if not ids:
        return " AND 1 = 0", []
    return f" AND {column} IN ({marks(ids)})", list(ids)


def _states(states: Sequence[str]) -> tuple[str, list[str]]:
    return marks(states), list(states)


@dataclass
class _Run:
    """One recompute's scope and its matches, shared by the steps below."""

    cursor: Any
    stamp: Any
    with_m: str
    m_params: list[Any]
    node_ids: list[int] | None
    advisory_ids: list[int] | None
    scoped_ranges: set[int]
    # The deadline rules, loaded once for the new rows and the reopened ones.
    rules: DeadlineRules | None = None

    def rules_for(self, range_ids: Iterable[int]) -> DeadlineRules:
        if self.rules is None:
            self.rules = DeadlineRules(range_ids)
        else:
            self.rules.load(range_ids)
        return self.rules

    def scope(self) -> tuple[str, list[int]]:
        n_scope, n_params = _in(f"{E}.node_id", self.node_ids)
        a_scope, a_params = _in(f"{E}.advisory_id", self.advisory_ids)
        return n_scope + a_scope, [*n_params, *a_params]


# The m row of an exposure's node component and range (its state), for the UPDATEs.
MATCH_OF_EXPOSURE = f"""
    SELECT m.state FROM m
    JOIN {NC} nc ON nc.component = m.component AND nc.branch = m.branch AND nc.version_key = m.version_key
    JOIN {N} n ON n.id = nc.node_id AND n.os_family = m.os_family AND n.product_line = m.product_line
                  AND n.gpu_model = m.gpu_model AND {FACTS} = m.facts
    WHERE nc.node_id = {E}.node_id AND nc.component = {E}.component AND m.range_id = {E}.affected_range_id"""
CURRENT_VERSION = (f"(SELECT nc2.version FROM {NC} nc2 WHERE nc2.node_id = {E}.node_id "
                   f"AND nc2.component = {E}.component)")


def recompute(
    node_ids: Sequence[int] | None = None,
    advisory_ids: Sequence[int] | None = None,
    now: dt.datetime | None = None,
    remediated_by: str = "",
) -> RecomputeResult:
    """Bring Exposure rows in line with the inventory; None for both = the whole fleet.

    `remediated_by` names what changed the versions (a campaign's sweep, an inventory source); it
    is kept on the exposures this run remediates, as their evidence. Idempotent: run twice, the
    second run changes nothing.
    """
    now = now or timezone.now()
    result = RecomputeResult()
    node_ids = sorted(set(node_ids)) if node_ids is not None else None
    advisory_ids = sorted(set(advisory_ids)) if advisory_ids is not None else None
    # Raw SQL: store the timestamp exactly as the ORM would (SQLite keeps text), so ORM filters match.
    stamp = connection.ops.adapt_datetimefield_value(now)
    with transaction.atomic(), connection.cursor() as cursor:
        fleet_wide = node_ids is None
        if fleet_wide:
            _fleet_wide_settings(cursor)
        n_scope, n_params = _in("n.id", node_ids)
        r_scope, r_params = _in("r.advisory_id", advisory_ids)
        matches, scoped = _version_matches(cursor, n_scope, n_params, r_scope, r_params)
        run = _Run(cursor, stamp, *_with_matches(matches), node_ids, advisory_ids, scoped)
        had_rows = _had_rows(run)
        result.opened = _insert_new(run, matches, now)
        if result.opened > 10_000 and connection.vendor == "postgresql":
            # The table just grew a lot: fresh statistics keep the anti-joins below hash joins.
            cursor.execute(f"ANALYZE {E}")
        if had_rows:
            result.reopened = _reopen(run)
            result.remediated, result.withdrawn = _remediate(run, remediated_by)
            _follow_versions(run)
            result.restated = _follow_scope(run)
            if node_ids is None and advisory_ids is None:
                # References are not database constraints (see Exposure): a full run drops orphans.
                cursor.execute(f"""
                    DELETE FROM {E} WHERE NOT EXISTS (SELECT 1 FROM {N} n WHERE n.id = {E}.node_id)
                       OR NOT EXISTS (SELECT 1 FROM {R} r WHERE r.id = {E}.affected_range_id)""")
        if fleet_wide:
            _fleet_wide_settings(cursor, reset=True)
        advisories = Advisory.objects.all() if advisory_ids is None else Advisory.objects.filter(id__in=advisory_ids)
        if node_ids is None:
            advisories.update(exposures_at=now)
        result.expired_acceptances = expire_acceptances(now)
        result.deadlines_set = assign_deadlines(node_ids=node_ids, advisory_ids=advisory_ids, rules=run.rules)
    return result


def _had_rows(run: _Run) -> bool:
    """False when nothing is recorded yet in scope (a first run): the UPDATE steps have nothing to revisit."""
    if run.node_ids is not None:
        return True
    a_scope, a_params = _in(f"{E}.advisory_id", run.advisory_ids)
    run.cursor.execute(f"SELECT 1 FROM {E} WHERE 1 = 1 {a_scope} LIMIT 1", a_params)
    return run.cursor.fetchone() is not None


# The node matches are joined to the deadlines (per range and cluster) once they are complete:
# PostgreSQL, unable to estimate the VALUES joins, would otherwise join the two small lists first
# and carry every cluster's copy of each match through the join with the nodes (ten times the
# rows, sorted on disk). An OFFSET keeps the subquery a unit of its own.
_FENCE = {False: "", True: "OFFSET 0"}


def _insert_new(run: _Run, matches: list[Any], now: dt.datetime) -> int:
    """New exposures, each with its deadline (one per range and cluster) as it is inserted."""
    range_ids = {row[7] for row in matches}
    if not range_ids:  # no new exposure without a matching version
        return 0
    if run.node_ids is None:
        cluster_ids = list(Cluster.objects.values_list("id", flat=True))
    else:
        n_scope, n_params = _in("id", run.node_ids)
        run.cursor.execute(f"SELECT DISTINCT cluster_id FROM {N} WHERE 1 = 1 {n_scope}", n_params)
        cluster_ids = [row[0] for row in run.cursor.fetchall()]
    if not cluster_ids:
        return 0
    d_values, d_params = _deadline_values(run.rules_for(range_ids), range_ids, cluster_ids, now)
    n_scope, n_params = _in("n.id", run.node_ids)
    insert = f"""
        {run.with_m}, {d_values}
        -- Existing (node, range) rows are skipped by an anti-join.
        INSERT INTO {E} (node_id, advisory_id, affected_range_id, component, detected_version, severity,
                         state, first_seen, deadline, deadline_source, fixed_by_version, remediated_by,
                         risk_reason, justification, updated_at)
        SELECT x.node_id, x.advisory_id, x.range_id, x.component, x.version, x.severity,
               x.state, %s, d.deadline, d.deadline_source, '', '', '', '', %s
        FROM ({NODE_MATCHES} WHERE 1 = 1 {n_scope} {_FENCE[connection.vendor == "postgresql"]}) x
        JOIN d ON d.range_id = x.range_id AND d.cluster_id = x.cluster_id
        WHERE x.gone_at IS NULL
          AND NOT EXISTS (SELECT 1 FROM {E} e WHERE e.node_id = x.node_id AND e.affected_range_id = x.range_id)
        """
    params = [*run.m_params, *d_params, run.stamp, run.stamp, *n_params]
    # ON CONFLICT costs a speculative index probe per row (a third of a fleet-wide insert), and
    # only another recompute committing the same rows meanwhile needs it: that race makes the
    # plain insert fail inside its savepoint, and the guarded one runs instead.
    try:
        with transaction.atomic():
            run.cursor.execute(insert, params)
            return _rowcount(run.cursor)
    except IntegrityError:
        run.cursor.execute(insert + " ON CONFLICT DO NOTHING", params)
        return _rowcount(run.cursor)


def _reopen(run: _Run) -> int:
    """Back in range after a remediation (a downgrade, a reimaged node): open (or presumed) again."""
    scope, params = run.scope()
    run.cursor.execute(
        f"""
        {run.with_m}
        UPDATE {E} SET state = ({MATCH_OF_EXPOSURE} LIMIT 1), remediated_at = NULL, fixed_by_version = '',
               remediated_by = '', deadline = NULL, detected_version = COALESCE({CURRENT_VERSION}, detected_version),
               updated_at = %s
        WHERE state = %s {scope} AND EXISTS ({MATCH_OF_EXPOSURE})
        """,
        [*run.m_params, run.stamp, ExposureState.REMEDIATED, *params],
    )
    return _rowcount(run.cursor)


# Within one statement, rows to drop rather than remediate carry this state for a moment.
_WITHDRAWN = "withdrawn"


def _remediate(run: _Run, remediated_by: str) -> tuple[int, int]:
    """Out of range: remediated, with the version that fixed it as evidence. Returns (remediated, withdrawn).

    A node that is gone keeps its exposure: leaving the inventory is not a patch, and neither is
    a version that does not parse. A presumed exposure out of the match at the same version is
    withdrawn instead: the node's facts now tell it is another product (its platform became
    known, say), and nothing was patched. One pass finds both (the match is the costly part).
    """
    scope, params = run.scope()
    states, s_params = _states(sorted(ExposureState.TRACKED))
    run.cursor.execute(
        f"""
        {run.with_m}
        UPDATE {E} SET state = CASE WHEN state = %s AND {CURRENT_VERSION} = detected_version THEN %s ELSE %s END,
               remediated_at = %s, updated_at = %s, remediated_by = %s,
               fixed_by_version = COALESCE({CURRENT_VERSION}, '(component removed)')
        WHERE state IN ({states}) {scope} AND NOT EXISTS ({MATCH_OF_EXPOSURE})
          AND {E}.component <> %s  -- OS package exposures: advisories.osmatch keeps them
          AND EXISTS (SELECT 1 FROM {N} n WHERE n.id = {E}.node_id AND n.gone_at IS NULL)
          AND NOT EXISTS (SELECT 1 FROM {NC} nc3 WHERE nc3.node_id = {E}.node_id
                          AND nc3.component = {E}.component AND nc3.version_key IS NULL)
        """,
        [*run.m_params, ExposureState.PRESUMED, _WITHDRAWN, ExposureState.REMEDIATED, run.stamp, run.stamp,
         remediated_by[:200], *s_params, *params, OS_PACKAGE],
    )
    changed = _rowcount(run.cursor)
    if not changed:
        return 0, 0
    run.cursor.execute(f"DELETE FROM {E} WHERE state = %s {scope}", [_WITHDRAWN, *params])
    withdrawn = _rowcount(run.cursor)
    return changed - withdrawn, withdrawn


def _follow_versions(run: _Run) -> None:
    """Still exposed but moved within the range: record the version now seen."""
    scope, params = run.scope()
    states, s_params = _states(sorted(ExposureState.TRACKED))
    run.cursor.execute(
        f"""
        UPDATE {E} SET detected_version = {CURRENT_VERSION}, updated_at = %s
        WHERE state IN ({states}) {scope}
          AND EXISTS (SELECT 1 FROM {NC} nc4 WHERE nc4.node_id = {E}.node_id AND nc4.component = {E}.component
                      AND nc4.version <> {E}.detected_version)
        """,
        [run.stamp, *s_params, *params],
    )


def _follow_scope(run: _Run) -> int:
    """Open and presumed follow what the node's facts now tell (its platform became known, say).

    Only scoped ranges can change between the two, so only their exposures are revisited.
    """
    scoped = sorted(run.scoped_ranges)
    if not scoped:
        return 0
    scope, params = run.scope()
    r_scope, r_params = _in(f"{E}.affected_range_id", scoped)
    run.cursor.execute(
        f"""
        {run.with_m}
        UPDATE {E} SET state = ({MATCH_OF_EXPOSURE} LIMIT 1), updated_at = %s
        WHERE state IN (%s, %s) {scope} {r_scope}
          AND EXISTS ({MATCH_OF_EXPOSURE} AND m.state <> {E}.state)
        """,
        [*run.m_params, run.stamp, ExposureState.OPEN, ExposureState.PRESUMED, *params, *r_params],
    )
    return _rowcount(run.cursor)


def expire_acceptances(now: dt.datetime | None = None) -> int:
    """Accepted risks past their expiry are exposed again: presumed where the bulletin does not tell."""
    now = now or timezone.now()
    stamp = connection.ops.adapt_datetimefield_value(now)
    bases, b_params = _states(sorted(RangeBasis.PRESUMED))
    with connection.cursor() as cursor:  # one plain statement: it runs with every recompute
        cursor.execute(
            f"""
            UPDATE {E} SET state = CASE WHEN affected_range_id IN (SELECT id FROM {R} WHERE basis IN ({bases}))
                                        THEN %s ELSE %s END, updated_at = %s
            WHERE state = %s AND risk_expires_at < %s
            """,
            [*b_params, ExposureState.PRESUMED, ExposureState.OPEN, stamp, ExposureState.RISK_ACCEPTED, stamp],
        )
        return _rowcount(cursor)


def _end_of_day(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(23, 59, 59), tzinfo=dt.UTC)


class RangeTerms(NamedTuple):
    """What a deadline needs of a range: its severity, its advisory's, and the publication date."""

    severity: str
    advisory_severity: str
    published: dt.datetime | None


_POLICY_DAYS = ("critical_days", "high_days", "medium_days", "low_days")
# The policy with every cluster override (a row each, or one with NULLs): one statement.
_POLICY_AND_OVERRIDES = (f"SELECT {', '.join(f'p.{f}' for f in _POLICY_DAYS)}, p.basis, p.use_kev, "
                         f"o.cluster_id, o.severity, o.days FROM {P} p LEFT JOIN {OV} o ON 1 = 1 WHERE p.id = 1")
# Ranges with their advisory's terms and each CVE's KEV due date (NULL when not in KEV, or no CVE).
_RANGE_TERMS = f"""
    SELECT r.id, r.severity, a.severity, a.initial_release_date, c.cve_id, k.due_date
    FROM {R} r JOIN {A} a ON a.id = r.advisory_id
    LEFT JOIN {RC} rc ON rc.affectedrange_id = r.id LEFT JOIN {CV} c ON c.id = rc.cve_id
    LEFT JOIN {KEV} k ON k.cve_id = c.cve_id
    WHERE 1 = 1"""


class DeadlineRules:
    """The policy, KEV due dates and cluster overrides, loaded once for a set of ranges (plain
    statements: a node's recompute on each changed heartbeat loads them)."""

    def __init__(self, range_ids: Iterable[int] = ()) -> None:
        self.overrides: dict[tuple[int, str], int]
        with connection.cursor() as cursor:
            cursor.execute(_POLICY_AND_OVERRIDES)
            rows = cursor.fetchall()
        if not rows:  # no policy row yet: the defaults, stored
            self.policy = DeadlinePolicy.current()
            self.overrides = {(o.cluster_id, o.severity): o.days for o in ClusterDeadlineOverride.objects.all()}
        else:
            critical, high, medium, low, basis, use_kev = rows[0][:6]
            self.policy = DeadlinePolicy(pk=1, critical_days=critical, high_days=high, medium_days=medium,
                                         low_days=low, basis=basis, use_kev=bool(use_kev))
            self.overrides = {(cluster_id, severity): days for *_p, cluster_id, severity, days in rows
                              if cluster_id is not None}
        self.ranges: dict[int, RangeTerms] = {}
        self.range_cves: dict[int, list[str]] = {}
        self.kev: dict[str, dt.date] = {}
        self.load(range_ids)

    def load(self, range_ids: Iterable[int]) -> None:
        """Add the terms of the ranges not loaded yet."""
        missing = sorted(set(range_ids) - self.ranges.keys())
        if not missing:
            return
        scope, params = _in("r.id", missing)
        with connection.cursor() as cursor:
            cursor.execute(_RANGE_TERMS + scope, params)
            rows = cursor.fetchall()
        for range_id, severity, advisory_severity, published, cve_id, due in rows:
            self.ranges[range_id] = RangeTerms(severity, advisory_severity, read_datetime(published))
            if cve_id is not None:
                self.range_cves.setdefault(range_id, []).append(cve_id)
                if due is not None and self.policy.use_kev:
                    self.kev[cve_id] = read_date(due)

    def deadline(self, range_id: int, cluster_id: int, first_seen: dt.datetime) -> tuple[dt.datetime, str]:
        return _deadline(self.policy, self.ranges[range_id], cluster_id, first_seen,
                         self.range_cves.get(range_id, []), self.kev, self.overrides)


def _deadline_values(
    rules: DeadlineRules, range_ids: set[int], cluster_ids: list[int], first_seen: dt.datetime
) -> tuple[str, list[Any]]:
    """`d(range_id, cluster_id, deadline, deadline_source) AS (VALUES ...)` for new exposures."""
    rows: list[Any] = []
    for range_id in sorted(range_ids):
        for cluster_id in cluster_ids:
            deadline, source = rules.deadline(range_id, cluster_id, first_seen)
            rows += [range_id, cluster_id, connection.ops.adapt_datetimefield_value(deadline), source]
    if not rows:
        rows = [0, 0, None, ""]
    values = ", ".join(["(%s, %s, %s, %s)"] * (len(rows) // 4))
    return f"d(range_id, cluster_id, deadline, deadline_source) AS (VALUES {values})", rows


def assign_deadlines(
    node_ids: Sequence[int] | None = None, advisory_ids: Sequence[int] | None = None, refresh: bool = False,
    rules: DeadlineRules | None = None,
) -> int:
    """Set the deadline of active exposures that have none (every active one with `refresh`).

    New exposures get theirs as they are inserted; this serves reopened ones and changes to the
    policy, overrides or KEV. Exposures sharing range, cluster and first_seen share a deadline:
    those groups are computed here and applied by one UPDATE ... FROM (VALUES ...). `rules` are
    ones the caller loaded in the same transaction (recompute's, for its new rows).
    """
    if refresh and node_ids is None and advisory_ids is None and connection.vendor == "postgresql":
        return _refresh_all_deadlines()
    n_scope, n_params = _in(f"{E}.node_id", node_ids)
    a_scope, a_params = _in(f"{E}.advisory_id", advisory_ids)
    pending = "" if refresh else f"AND {E}.deadline IS NULL"
    states, s_params = _states(sorted(ExposureState.ACTIVE))
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:  # part of the caller's, if any
        cursor.execute(
            f"""
            SELECT DISTINCT {E}.affected_range_id, n.cluster_id, {E}.first_seen
            FROM {E} JOIN {N} n ON n.id = {E}.node_id
            WHERE {E}.state IN ({states}) {pending} {n_scope} {a_scope}
            """,
            [*s_params, *n_params, *a_params],
        )
        groups = [(range_id, cluster_id, read_datetime(first_seen)) for range_id, cluster_id, first_seen
                  in cursor.fetchall()]
        if not groups:
            return 0
        if rules is None:
            rules = DeadlineRules()
        rules.load({g[0] for g in groups})
        adapt = connection.ops.adapt_datetimefield_value
        params: list[Any] = []
        for range_id, cluster_id, first_seen in groups:
            deadline, source = rules.deadline(range_id, cluster_id, first_seen)
            params += [range_id, cluster_id, adapt(first_seen), adapt(deadline), source]
        values = ", ".join(["(%s, %s, %s, %s, %s)"] * len(groups))
        if node_ids is None:
            _fleet_wide_settings(cursor)
        cursor.execute(
            f"""
            WITH d(range_id, cluster_id, first_seen, deadline, deadline_source) AS (VALUES {values})
            UPDATE {E} SET deadline = d.deadline, deadline_source = d.deadline_source
            FROM d, {N} n
            WHERE n.id = {E}.node_id AND d.range_id = {E}.affected_range_id AND d.cluster_id = n.cluster_id
              AND d.first_seen = {E}.first_seen AND {E}.state IN ({states}) {pending} {n_scope} {a_scope}
              AND ({E}.deadline IS NULL OR {E}.deadline <> d.deadline OR {E}.deadline_source <> d.deadline_source)
            """,
            [*params, *s_params, *n_params, *a_params],
        )
        updated = _rowcount(cursor)
        if node_ids is None:
            _fleet_wide_settings(cursor, reset=True)
        return updated


_EPOCHS = (dt.datetime(2000, 1, 1, tzinfo=dt.UTC), dt.datetime(2001, 1, 1, tzinfo=dt.UTC))


def _refresh_all_deadlines() -> int:
    """Every active deadline of the fleet in one UPDATE (PostgreSQL), for a policy or override change.

    A deadline depends on the exposure only through its range, its node's cluster and, when counted
    from the first exposure, its first_seen. So the rule (`_deadline`, the one definition) is
    evaluated here once per range and cluster, at two first_seen values: equal answers are a fixed
    date (KEV, publication), different ones a number of days after first_seen, which SQL adds.
    Only rows whose deadline or its source changes are written; the table's fillfactor leaves room
    for those writes to stay on their page (advisories migration 0005).
    """
    with transaction.atomic(), connection.cursor() as cursor:
        _fleet_wide_settings(cursor)
        states, s_params = _states(sorted(ExposureState.ACTIVE))
        cursor.execute(f"SELECT DISTINCT affected_range_id FROM {E} WHERE state IN ({states})", s_params)
        range_ids = {row[0] for row in cursor.fetchall()}
        cluster_ids = list(Cluster.objects.values_list("id", flat=True))
        if not range_ids or not cluster_ids:
            return 0
        rules = DeadlineRules(range_ids)
        params: list[Any] = []
        for range_id in sorted(range_ids):
            for cluster_id in cluster_ids:
                (one, source), (two, _same) = (rules.deadline(range_id, cluster_id, base) for base in _EPOCHS)
                fixed = one if one == two else None
                days = None if fixed is not None else (one - _EPOCHS[0]).days
                params += [range_id, cluster_id, fixed, days, source]
        values = ", ".join(["(%s::bigint, %s::bigint, %s::timestamptz, %s::integer, %s)"] * (len(params) // 5))
        new = f"COALESCE(d.fixed, {E}.first_seen + d.days * INTERVAL '1 day')"
        cursor.execute(
            f"""
            WITH d(range_id, cluster_id, fixed, days, source) AS (VALUES {values})
            UPDATE {E} SET deadline = {new}, deadline_source = d.source
            FROM d, {N} n
            WHERE n.id = {E}.node_id AND d.range_id = {E}.affected_range_id AND d.cluster_id = n.cluster_id
              AND {E}.state IN ({states})
              AND ({E}.deadline IS DISTINCT FROM {new} OR {E}.deadline_source <> d.source)
            """,
            [*params, *s_params],
        )
        updated = _rowcount(cursor)
        _fleet_wide_settings(cursor, reset=True)
        return updated


def refresh_deadlines(generation: int) -> int | None:
    """Recompute every active deadline for the policy's `generation` (the task a change queues).

    Returns the rows changed, or None when a later change superseded this one: its own task
    recomputes, and this one rolls back rather than finish after it (two changes in a row end
    with the later one, whichever task runs first).
    """
    with transaction.atomic():
        current, done = DeadlinePolicy.objects.values_list("generation", "recomputed_generation").get(pk=1)
        if generation < current:
            return None
        if done >= current:
            return 0
        updated = assign_deadlines(refresh=True)
        if DeadlinePolicy.objects.values_list("generation", flat=True).get(pk=1) != current:
            transaction.set_rollback(True)
            return None
        DeadlinePolicy.objects.filter(pk=1, recomputed_generation__lt=current).update(
            recomputed_generation=current, recomputed_at=timezone.now())
    return updated


def _deadline(
    policy: DeadlinePolicy,
    rng: RangeTerms,
    cluster_id: int,
    first_seen: dt.datetime,
    cve_ids: list[str],
    kev: dict[str, dt.date],
    overrides: dict[tuple[int, str], int],
) -> tuple[dt.datetime, str]:
    in_kev = sorted((kev[c], c) for c in cve_ids if c in kev)
    if in_kev:
        due, cve = in_kev[0]
        return _end_of_day(due), f"CISA KEV due date for {cve}"
    severity = rng.severity or rng.advisory_severity
    if (cluster_id, severity) in overrides:
        days, why = overrides[(cluster_id, severity)], "cluster override"
    else:
        days, why = policy.days_for(severity), "policy"
    published = rng.published
    if policy.basis == DeadlineBasis.PUBLICATION and published is not None:
        base, basis = published, "publication"
    else:
        base, basis = first_seen, "first exposure"
    return base + dt.timedelta(days=days), f"{why}: {severity or 'unrated'} {days} days from {basis}"
