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
from advisories import queries as q
from advisories.choices import DeadlineBasis, ExposureState, RangeBasis
from advisories.models import Advisory, ClusterDeadlineOverride, DeadlinePolicy
from advisories.osv import OS_PACKAGE
from gpusweep.db.bulk import marks
from gpusweep.db.reads import read_date, read_datetime, rowcount
from inventory.models import Cluster


def _version_matches(cursor: Any, n_scope: str, n_params: list[int], r_scope: str,
                     r_params: list[int]) -> tuple[list[Any], set[int]]:
    """Distinct fleet tuples (in scope) inside a range, with the exposure's state: a few hundred rows,
    and the ids of the scoped ranges among them (the ones `_follow_scope` revisits).

    Matching runs here, on the distinct tuples of the fleet against the ranges; the statements
    below join the result back to every component by equality. Handing it over as a VALUES list
    gives the planner its true size, so the plans are hash joins, linear in the fleet, rather
    than every node tested against every range.
    """
    cursor.execute(q.version_matches(n_scope, r_scope), [*n_params, *(r_params * 2 if r_scope else [])])
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
    return q.with_matches(len(rows)), [value for row in rows for value in row]


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
    for statement in q.FLEET_WIDE_RESET if reset else q.FLEET_WIDE:
        cursor.execute(statement)


@dataclass
class RecomputeResult:
    opened: int = 0
    reopened: int = 0
    remediated: int = 0
    withdrawn: int = 0
    restated: int = 0
    expired_acceptances: int = 0
    deadlines_set: int = 0


_in = q.in_list


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
        n_scope, n_params = _in(q.E.node_id, self.node_ids)
        a_scope, a_params = _in(q.E.advisory_id, self.advisory_ids)
        return n_scope + a_scope, [*n_params, *a_params]


def recompute(
    node_ids: Sequence[int] | None = None,
    advisory_ids: Sequence[int] | None = None,
    now: dt.datetime | None = None,
    remediated_by: str = "",
    fresh: Sequence[int] = (),
) -> RecomputeResult:
    """Bring Exposure rows in line with the inventory; None for both = the whole fleet.

    `remediated_by` names what changed the versions (a campaign's sweep, an inventory source); it
    is kept on the exposures this run remediates, as their evidence. `fresh`: advisories known to
    have no exposure yet (created by the ingest calling): when they are the whole scope, the
    exposures table is not searched for rows to revisit. Idempotent: run twice, the second run
    changes nothing.
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
        n_scope, n_params = _in(q.N.id, node_ids)
        r_scope, r_params = _in(q.R.advisory_id, advisory_ids)
        matches, scoped = _version_matches(cursor, n_scope, n_params, r_scope, r_params)
        run = _Run(cursor, stamp, *_with_matches(matches), node_ids, advisory_ids, scoped)
        had_rows = _had_rows(run, fresh)
        new_advisories = not had_rows and advisory_ids is not None
        if new_advisories and connection.vendor == "postgresql":
            # New advisories' rows, committed with their exposures_at: a crash that loses this commit
            # loses both, and the next ingest matches them again (as advisories.osmatch does).
            cursor.execute(q.ASYNC_COMMIT)
        result.opened = _insert_new(run, matches, now, had_rows)
        if result.opened > 10_000 and connection.vendor == "postgresql" and not new_advisories:
            # The table just grew a lot: fresh statistics keep the anti-joins below hash joins. New
            # advisories' rows are a part of it, and no such step follows them (autovacuum catches up).
            cursor.execute(q.ANALYZE)
        if had_rows:
            result.reopened = _reopen(run)
            result.remediated, result.withdrawn = _remediate(run, remediated_by)
            _follow_versions(run)
            result.restated = _follow_scope(run)
            if node_ids is None and advisory_ids is None:
                # References are not database constraints (see Exposure): a full run drops orphans.
                cursor.execute(q.ORPHANS)
        if fleet_wide:
            _fleet_wide_settings(cursor, reset=True)
        advisories = Advisory.objects.all() if advisory_ids is None else Advisory.objects.filter(id__in=advisory_ids)
        if node_ids is None:
            advisories.update(exposures_at=now)
        result.expired_acceptances = expire_acceptances(now)
        if had_rows:  # else every row in scope is one just inserted, with its deadline
            result.deadlines_set = assign_deadlines(node_ids=node_ids, advisory_ids=advisory_ids, rules=run.rules)
    return result


def _had_rows(run: _Run, fresh: Sequence[int] = ()) -> bool:
    """False when nothing is recorded yet in scope (a first run, or only new advisories): the
    UPDATE steps have nothing to revisit and new rows need no check against existing ones."""
    if run.node_ids is not None:
        return True
    if run.advisory_ids is not None and set(run.advisory_ids) <= set(fresh):
        return False  # the exposures table has no advisory index: a search for none reads all of it
    a_scope, a_params = _in(q.E.advisory_id, run.advisory_ids)
    run.cursor.execute(q.any_exposure(a_scope), a_params)
    return run.cursor.fetchone() is not None


def _insert_new(run: _Run, matches: list[Any], now: dt.datetime, had_rows: bool = True) -> int:
    """New exposures, each with its deadline (one per range and cluster) as it is inserted; with
    no row in scope yet (`had_rows` false) without a per-row search for an existing one."""
    range_ids = {row[7] for row in matches}
    if not range_ids:  # no new exposure without a matching version
        return 0
    if run.node_ids is None:
        cluster_ids = list(Cluster.objects.values_list("id", flat=True))
    else:
        n_scope, n_params = _in(q.NODES.id, run.node_ids)
        run.cursor.execute(q.clusters_of_nodes(n_scope), n_params)
        cluster_ids = [row[0] for row in run.cursor.fetchall()]
    if not cluster_ids:
        return 0
    d_values, d_params = _deadline_values(run.rules_for(range_ids), range_ids, cluster_ids, now)
    n_scope, n_params = _in(q.N.id, run.node_ids)
    # The node matches are joined to the deadlines (per range and cluster) once they are complete:
    # PostgreSQL, unable to estimate the VALUES joins, would otherwise join the two small lists first
    # and carry every cluster's copy of each match through the join with the nodes (ten times the
    # rows, sorted on disk). An OFFSET keeps the subquery a unit of its own (queries.insert_new).
    insert, defaults = q.insert_new(run.with_m, d_values, n_scope, had_rows)
    params = [*run.m_params, *d_params, run.stamp, run.stamp, *defaults, *n_params]
    # ON CONFLICT costs a speculative index probe per row (a third of a fleet-wide insert), and
    # only another recompute committing the same rows meanwhile needs it: that race makes the
    # plain insert fail inside its savepoint, and the guarded one runs instead.
    try:
        with transaction.atomic():
            run.cursor.execute(insert, params)
            return rowcount(run.cursor)
    except IntegrityError:
        run.cursor.execute(insert + q.ON_CONFLICT_SKIP, params)
        return rowcount(run.cursor)


def _reopen(run: _Run) -> int:
    """Back in range after a remediation (a downgrade, a reimaged node): open (or presumed) again."""
    scope, params = run.scope()
    run.cursor.execute(q.reopen(run.with_m, scope), [*run.m_params, run.stamp, ExposureState.REMEDIATED, *params])
    return rowcount(run.cursor)


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
        q.remediate(run.with_m, states, scope),
        [*run.m_params, ExposureState.PRESUMED, _WITHDRAWN, ExposureState.REMEDIATED, run.stamp, run.stamp,
         remediated_by[:200], *s_params, *params, OS_PACKAGE],
    )
    changed = rowcount(run.cursor)
    if not changed:
        return 0, 0
    run.cursor.execute(q.delete_in_state(scope), [_WITHDRAWN, *params])
    withdrawn = rowcount(run.cursor)
    return changed - withdrawn, withdrawn


def _follow_versions(run: _Run) -> None:
    """Still exposed but moved within the range: record the version now seen."""
    scope, params = run.scope()
    states, s_params = _states(sorted(ExposureState.TRACKED))
    run.cursor.execute(q.follow_versions(states, scope), [run.stamp, *s_params, *params])


def _follow_scope(run: _Run) -> int:
    """Open and presumed follow what the node's facts now tell (its platform became known, say).

    Only scoped ranges can change between the two, so only their exposures are revisited.
    """
    scoped = sorted(run.scoped_ranges)
    if not scoped:
        return 0
    scope, params = run.scope()
    r_scope, r_params = _in(q.E.affected_range_id, scoped)
    run.cursor.execute(q.follow_scope(run.with_m, scope + r_scope),
                       [*run.m_params, run.stamp, ExposureState.OPEN, ExposureState.PRESUMED, *params, *r_params])
    return rowcount(run.cursor)


def expire_acceptances(now: dt.datetime | None = None) -> int:
    """Accepted risks past their expiry are exposed again: presumed where the bulletin does not tell."""
    now = now or timezone.now()
    stamp = connection.ops.adapt_datetimefield_value(now)
    bases, b_params = _states(sorted(RangeBasis.PRESUMED))
    with connection.cursor() as cursor:  # one plain statement: it runs with every recompute
        cursor.execute(q.expire_acceptances(bases), [*b_params, ExposureState.PRESUMED, ExposureState.OPEN, stamp,
                                                     ExposureState.RISK_ACCEPTED, stamp])
        return rowcount(cursor)


def _end_of_day(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(23, 59, 59), tzinfo=dt.UTC)


class RangeTerms(NamedTuple):
    """What a deadline needs of a range: its severity, its advisory's, and the publication date."""

    severity: str
    advisory_severity: str
    published: dt.datetime | None


class DeadlineRules:
    """The policy, KEV due dates and cluster overrides, loaded once for a set of ranges (plain
    statements: a node's recompute on each changed heartbeat loads them)."""

    def __init__(self, range_ids: Iterable[int] = ()) -> None:
        self.overrides: dict[tuple[int, str], int]
        with connection.cursor() as cursor:
            cursor.execute(q.POLICY_AND_OVERRIDES)
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
        scope, params = _in(q.R.id, missing)
        with connection.cursor() as cursor:
            cursor.execute(q.RANGE_TERMS + scope, params)
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
    """`d(range, cluster, deadline, deadline_source) AS (VALUES ...)` for new exposures."""
    rows: list[Any] = []
    for range_id in sorted(range_ids):
        for cluster_id in cluster_ids:
            deadline, source = rules.deadline(range_id, cluster_id, first_seen)
            rows += [range_id, cluster_id, connection.ops.adapt_datetimefield_value(deadline), source]
    if not rows:
        rows = [0, 0, None, ""]
    return q.deadline_values(len(rows) // 4), rows


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
    n_scope, n_params = _in(q.E.node_id, node_ids)
    a_scope, a_params = _in(q.E.advisory_id, advisory_ids)
    states, s_params = _states(sorted(ExposureState.ACTIVE))
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:  # part of the caller's, if any
        cursor.execute(q.deadline_groups(states, not refresh, n_scope, a_scope), [*s_params, *n_params, *a_params])
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
        if node_ids is None:
            _fleet_wide_settings(cursor)
        cursor.execute(q.set_deadlines(len(groups), states, not refresh, n_scope, a_scope),
                       [*params, *s_params, *n_params, *a_params])
        updated = rowcount(cursor)
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
        cursor.execute(q.active_ranges(states), s_params)
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
        cursor.execute(q.refresh_all_deadlines(len(params) // 5, states), [*params, *s_params])
        updated = rowcount(cursor)
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
