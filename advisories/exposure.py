"""Which nodes sit inside which affected ranges: computed set-based in the database.

A node is exposed to a range when one of its components has the range's component, its branch
(drivers), the node's OS family and product line (empty on the range = any), and a version key
inside the bounds. Keys are zero-padded strings (inventory.versions), so the bounds are plain
string comparisons and the whole fleet is matched by a few INSERT ... SELECT / UPDATE statements,
never node by node. The same statements run for all nodes, a set of nodes (their versions
changed) or a set of advisories (just ingested).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import connection, transaction
from django.utils import timezone

from advisories.choices import DeadlineBasis, ExposureState
from advisories.models import AffectedRange, ClusterDeadlineOverride, DeadlinePolicy, Exposure, KevEntry
from inventory.models import Node, NodeComponent

E = Exposure._meta.db_table
R = AffectedRange._meta.db_table
N = Node._meta.db_table
NC = NodeComponent._meta.db_table

# nc / n / r are a node component, its node and a range; true when the component is in the range.
IN_RANGE = """
    nc.version_key IS NOT NULL
    AND r.component = nc.component
    AND (r.branch = '' OR r.branch = nc.branch)
    AND (r.os_family = '' OR r.os_family = n.os_family)
    AND (r.product_line = '' OR r.product_line = n.product_line)
    AND (r.lower_key IS NULL OR nc.version_key > r.lower_key OR (r.lower_inclusive AND nc.version_key = r.lower_key))
    AND (r.upper_key IS NULL OR nc.version_key < r.upper_key OR (r.upper_inclusive AND nc.version_key = r.upper_key))
"""


@dataclass
class RecomputeResult:
    opened: int = 0
    reopened: int = 0
    remediated: int = 0
    expired_acceptances: int = 0
    deadlines_set: int = 0


def _in(column: str, ids: Sequence[int] | None) -> tuple[str, list[int]]:
    if ids is None:
        return "", []
    if not ids:
        return " AND 1 = 0", []
    return f" AND {column} IN ({', '.join(['%s'] * len(ids))})", list(ids)


def recompute(
    node_ids: Sequence[int] | None = None,
    advisory_ids: Sequence[int] | None = None,
    now: dt.datetime | None = None,
) -> RecomputeResult:
    """Bring Exposure rows in line with the inventory; None for both = the whole fleet.

    Idempotent: run twice, the second run changes nothing.
    """
    now = now or timezone.now()
    result = RecomputeResult()
    node_ids = sorted(set(node_ids)) if node_ids is not None else None
    advisory_ids = sorted(set(advisory_ids)) if advisory_ids is not None else None
    # Raw SQL: store the timestamp exactly as the ORM would (SQLite keeps text), so ORM filters match.
    stamp = connection.ops.adapt_datetimefield_value(now)
    with transaction.atomic(), connection.cursor() as cursor:
        n_scope, n_params = _in("n.id", node_ids)
        r_scope, r_params = _in("r.advisory_id", advisory_ids)
        # 1. New exposures.
        cursor.execute(
            f"""
            INSERT INTO {E} (node_id, advisory_id, affected_range_id, component, detected_version, severity,
                             state, first_seen, deadline, deadline_source, fixed_by_version, risk_reason, updated_at)
            SELECT nc.node_id, r.advisory_id, r.id, nc.component, nc.version, r.severity,
                   %s, %s, NULL, '', '', '', %s
            FROM {NC} nc
            JOIN {N} n ON n.id = nc.node_id
            JOIN {R} r ON r.component = nc.component
            WHERE n.gone_at IS NULL AND {IN_RANGE} {n_scope} {r_scope}
              AND NOT EXISTS (SELECT 1 FROM {E} e WHERE e.node_id = nc.node_id AND e.affected_range_id = r.id)
            ON CONFLICT DO NOTHING
            """,
            [ExposureState.OPEN, stamp, stamp, *n_params, *r_params],
        )
        result.opened = cursor.rowcount

        e_node_scope, e_node_params = _in(f"{E}.node_id", node_ids)
        e_adv_scope, e_adv_params = _in(f"{E}.advisory_id", advisory_ids)
        current_version = (
            f"(SELECT nc2.version FROM {NC} nc2 WHERE nc2.node_id = {E}.node_id AND nc2.component = {E}.component)"
        )
        still_in = f"""EXISTS (
            SELECT 1 FROM {NC} nc JOIN {N} n ON n.id = nc.node_id JOIN {R} r ON r.id = {E}.affected_range_id
            WHERE nc.node_id = {E}.node_id AND {IN_RANGE})"""
        # 2. Back in range after a remediation (a downgrade, a reimaged node): open again.
        cursor.execute(
            f"""
            UPDATE {E} SET state = %s, remediated_at = NULL, fixed_by_version = '', deadline = NULL,
                   detected_version = COALESCE({current_version}, detected_version), updated_at = %s
            WHERE state = %s {e_node_scope} {e_adv_scope} AND {still_in}
            """,
            [ExposureState.OPEN, stamp, ExposureState.REMEDIATED, *e_node_params, *e_adv_params],
        )
        result.reopened = cursor.rowcount
        # 3. Out of range: remediated, with the version that fixed it as evidence. A node that is
        # gone keeps its exposure: leaving the inventory is not a patch, and neither is a version
        # that does not parse.
        cursor.execute(
            f"""
            UPDATE {E} SET state = %s, remediated_at = %s, updated_at = %s,
                   fixed_by_version = COALESCE({current_version}, '(component removed)')
            WHERE state IN (%s, %s) {e_node_scope} {e_adv_scope} AND NOT {still_in}
              AND EXISTS (SELECT 1 FROM {N} n WHERE n.id = {E}.node_id AND n.gone_at IS NULL)
              AND NOT EXISTS (SELECT 1 FROM {NC} nc3 WHERE nc3.node_id = {E}.node_id
                              AND nc3.component = {E}.component AND nc3.version_key IS NULL)
            """,
            [ExposureState.REMEDIATED, stamp, stamp, ExposureState.OPEN, ExposureState.RISK_ACCEPTED,
             *e_node_params, *e_adv_params],
        )
        result.remediated = cursor.rowcount
        # 4. Still exposed but moved within the range: record the version now seen.
        cursor.execute(
            f"""
            UPDATE {E} SET detected_version = {current_version}, updated_at = %s
            WHERE state IN (%s, %s) {e_node_scope} {e_adv_scope}
              AND detected_version <> COALESCE({current_version}, detected_version)
            """,
            [stamp, ExposureState.OPEN, ExposureState.RISK_ACCEPTED, *e_node_params, *e_adv_params],
        )
        result.expired_acceptances = expire_acceptances(now)
        result.deadlines_set = assign_deadlines(node_ids=node_ids, advisory_ids=advisory_ids)
    return result


def expire_acceptances(now: dt.datetime | None = None) -> int:
    now = now or timezone.now()
    return Exposure.objects.filter(state=ExposureState.RISK_ACCEPTED, risk_expires_at__lt=now).update(
        state=ExposureState.OPEN, updated_at=now
    )


def _end_of_day(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(23, 59, 59), tzinfo=dt.UTC)


def assign_deadlines(
    node_ids: Sequence[int] | None = None, advisory_ids: Sequence[int] | None = None, refresh: bool = False
) -> int:
    """Set the deadline of active exposures that have none (all of them with `refresh`).

    Exposures sharing range, cluster and first_seen share a deadline, so this is one UPDATE per
    such group, not per row.
    """
    policy = DeadlinePolicy.current()
    with transaction.atomic():
        active = Exposure.objects.filter(state__in=ExposureState.ACTIVE)
        if node_ids is not None:
            active = active.filter(node_id__in=node_ids)
        if advisory_ids is not None:
            active = active.filter(advisory_id__in=advisory_ids)
        if refresh:
            active.update(deadline=None, deadline_source="")
        pending = active.filter(deadline__isnull=True)
        groups = list(pending.values_list("affected_range_id", "node__cluster_id", "first_seen").distinct())
        if not groups:
            return 0
        range_ids = {g[0] for g in groups}
        ranges = {
            r.id: r for r in AffectedRange.objects.filter(id__in=range_ids).select_related("advisory")
        }
        range_cves: dict[int, list[str]] = {}
        for range_id, cve_id in AffectedRange.cves.through.objects.filter(affectedrange_id__in=range_ids).values_list(
            "affectedrange_id", "cve__cve_id"
        ):
            range_cves.setdefault(range_id, []).append(cve_id)
        kev = dict(KevEntry.objects.filter(cve_id__in={c for v in range_cves.values() for c in v}).values_list(
            "cve_id", "due_date"
        )) if policy.use_kev else {}
        overrides = {
            (o.cluster_id, o.severity): o.days for o in ClusterDeadlineOverride.objects.all()
        }
        updated = 0
        for range_id, cluster_id, first_seen in groups:
            rng = ranges[range_id]
            deadline, source = _deadline(policy, rng, cluster_id, first_seen, range_cves.get(range_id, []), kev,
                                         overrides)
            updated += pending.filter(affected_range_id=range_id, node__cluster_id=cluster_id,
                                      first_seen=first_seen).update(deadline=deadline, deadline_source=source)
        return updated


def _deadline(
    policy: DeadlinePolicy,
    rng: AffectedRange,
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
    severity = rng.severity or rng.advisory.severity
    if (cluster_id, severity) in overrides:
        days, why = overrides[(cluster_id, severity)], "cluster override"
    else:
        days, why = policy.days_for(severity), "policy"
    published = rng.advisory.initial_release_date
    if policy.basis == DeadlineBasis.PUBLICATION and published is not None:
        base, basis = published, "publication"
    else:
        base, basis = first_seen, "first exposure"
    return base + dt.timedelta(days=days), f"{why}: {severity or 'unrated'} {days} days from {basis}"
