"""Which nodes distribution advisories expose: OS package ranges (advisories.osv) matched on
package sets, the kernel by the version that runs.

Matching works on package sets (one per image: tens) and on the distinct (set, running kernel,
livepatch state) groups of nodes, never node by node: each group is evaluated once against the
ranges of its set's ecosystem, in the ecosystem's version order, and the verdict is written to
every node of the group.

- A source package's range hits the set's binaries built from it (dpkg's source field), or named
  in the record's `ecosystem_specific.binaries`, whose source version is inside the range.
- A kernel range hits the node by its running kernel (uname -r: "5.15.0-1042-nvidia" is the
  package linux-image-5.15.0-1042-nvidia): a fixed kernel installed but not booted keeps the
  exposure open, with the note "reboot pending".
- A kernel exposure whose every CVE the node's livepatch fixes (the agent's livepatch report,
  or a Livepatch notice covering its kernel at the livepatch version it runs) is remediated
  without a reboot, with the note "livepatch".

The statements (the nodes' groups, a group's new exposures) are advisories.queries'.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from advisories import distro_versions as dv
from advisories import queries as q
from advisories.choices import ExposureState
from advisories.exposure import DeadlineRules, RecomputeResult, assign_deadlines
from advisories.models import Advisory, AffectedRange, Exposure
from advisories.osv import OS_LIVEPATCH, OS_PACKAGE
from gpusweep.db.reads import rowcount
from inventory.models import Cluster, Node, Package, PackageSet

_KERNEL_BINARY = re.compile(r"^linux-(?:image|image-unsigned|modules)-(\d+\.\d+\.\d+)-(\d+)-([a-z][a-z0-9-]*)$")


@dataclass(frozen=True)
class OsRange:
    id: int
    advisory_id: int
    ecosystem: str
    package: str
    introduced: str
    fixed: str
    last_affected: str
    kernel: bool
    binaries: frozenset[str]
    cve_ids: frozenset[str]
    severity: str = ""

    def hits(self, order: str, version: str) -> bool:
        return dv.in_range(order, version, self.introduced, self.fixed, self.last_affected)

    def kernels(self) -> set[tuple[str, str]]:
        """(upstream version, flavour) of the kernels built from the range's source."""
        return {(m[1], m[3]) for b in self.binaries if (m := _KERNEL_BINARY.match(b))}


@dataclass(frozen=True)
class LivepatchNotice:
    publisher_id: str
    cve_ids: frozenset[str]
    codename: str
    flavour: str  # "generic-4.15": the kernel flavour and series it patches
    kernel: str  # the base kernel ABI covered from ("4.15.0-69")
    version: int  # the livepatch version that fixes its CVEs


@dataclass
class SetIndex:
    ecosystem: str
    codename: str
    by_source: dict[str, list[tuple[str, str]]] = field(default_factory=lambda: defaultdict(list))
    by_name: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    state: str  # open, remediated (livepatch), or "" (not exposed)
    version: str
    note: str = ""


def _ranges(advisory_ids: Sequence[int] | None) -> list[OsRange]:
    rows = AffectedRange.objects.filter(component=OS_PACKAGE)
    if advisory_ids is not None:
        rows = rows.filter(advisory_id__in=advisory_ids)
    cves: dict[int, set[str]] = defaultdict(set)
    through = AffectedRange.cves.through
    for range_id, cve_id in through.objects.filter(affectedrange__in=rows).values_list("affectedrange_id",
                                                                                      "cve__cve_id"):
        cves[range_id].add(cve_id)
    return [OsRange(r.id, r.advisory_id, r.scope.get("ecosystem", ""), r.scope.get("package", ""),
                    r.scope.get("introduced", "0"), r.scope.get("fixed", ""), r.scope.get("last_affected", ""),
                    bool(r.scope.get("kernel")), frozenset(r.condition.get("binaries", [])), frozenset(cves[r.id]),
                    r.severity)
            for r in rows.only("id", "advisory_id", "scope", "condition", "severity")]


def livepatch_notices() -> list[LivepatchNotice]:
    out = []
    for r in AffectedRange.objects.filter(component=OS_LIVEPATCH).select_related("advisory").prefetch_related("cves"):
        out.append(LivepatchNotice(r.advisory.publisher_id, frozenset(c.cve_id for c in r.cves.all()),
                                   r.scope.get("codename", ""), r.scope.get("flavour", ""), r.scope.get("kernel", ""),
                                   int(r.scope.get("livepatch_version") or 0)))
    return out


def _sets(set_ids: set[int], ranges: list[OsRange], kernels: set[str]) -> dict[int, SetIndex]:
    """The sets' packages the ranges can hit: built from their sources, named among their
    binaries, or the running kernels' own (a few hundred rows of a set's thousands)."""
    index = {s.id: SetIndex(s.ecosystem, str(s.os_release.get("VERSION_CODENAME", "")))
             for s in PackageSet.objects.filter(id__in=set_ids)}
    sources = {r.package for r in ranges}
    names = {b for r in ranges for b in r.binaries}
    names |= {f"{prefix}{k}" for k in kernels if k for prefix in ("linux-image-", "linux-image-unsigned-",
                                                                    "linux-modules-")}
    rows = Package.objects.filter(Q(source__in=sources) | Q(name__in=names), package_set_id__in=set_ids).values_list(
        "package_set_id", "name", "version", "source", "source_version")
    for set_id, name, version, source, source_version in rows.iterator(chunk_size=5000):
        entry = index[set_id]
        entry.by_name[name] = source_version or version
        entry.by_source[source or name].append((name, source_version or version))
    return index


def livepatched(livepatch: dict[str, Any] | None, codename: str, uname_r: str,
                notices: list[LivepatchNotice]) -> dict[str, str]:
    """CVE -> what fixes it by livepatch on this node: its own report, or a notice covering it."""
    if not livepatch or livepatch.get("state") != "applied":
        return {}
    fixed = {str(c): f"livepatch ({livepatch.get('tool', 'agent')} reports it)" for c in livepatch.get("fixes", [])}
    version = str(livepatch.get("version", ""))
    if not version.isdigit():
        return fixed
    for notice in notices:
        if covers(notice, codename, uname_r) and int(version) >= notice.version:
            for cve in notice.cve_ids:
                fixed.setdefault(cve, f"livepatch {notice.publisher_id}")
    return fixed


def covers(notice: LivepatchNotice, codename: str, uname_r: str) -> bool:
    """Whether a Livepatch notice's patch applies to this running kernel (release, flavour, from its base)."""
    release = dv.kernel_release(uname_r)
    base = dv.kernel_abi(notice.kernel)
    if release is None or base is None:
        return False
    upstream, abi, flavour = release
    series = ".".join(upstream.split(".")[:2])
    return (notice.codename == codename and notice.flavour in (flavour, f"{flavour}-{series}")
            and base[0] == upstream and abi >= base[1])


def _running_version(index: SetIndex, uname_r: str) -> str:
    for prefix in ("linux-image-", "linux-image-unsigned-", "linux-modules-"):
        if version := index.by_name.get(prefix + uname_r):
            return version
    return ""


def _kernel_verdict(rng: OsRange, order: str, index: SetIndex, uname_r: str, patched: dict[str, str]) -> Verdict:
    release = dv.kernel_release(uname_r)
    if release is None or (release[0], release[2]) not in rng.kernels():
        return Verdict("", "")  # another kernel flavour runs: this source's packages are not in use
    upstream, abi, flavour = release
    running = _running_version(index, uname_r)
    if running:
        exposed = rng.hits(order, running)
    else:  # the running kernel's package was removed: its ABI number is all there is
        fixed_abi = dv.kernel_abi(rng.fixed)
        running = f"{upstream}-{abi}"
        exposed = fixed_abi is None or abi < fixed_abi[1]
    if not exposed:
        return Verdict("", running)
    if rng.cve_ids and all(c in patched for c in rng.cve_ids):
        return Verdict(ExposureState.REMEDIATED, running, sorted({patched[c] for c in rng.cve_ids})[0][:200])
    for name, version in index.by_name.items():
        m = _KERNEL_BINARY.match(name)
        if m and (m[1], m[3]) == (upstream, flavour) and not rng.hits(order, version):
            return Verdict(ExposureState.OPEN, running, f"reboot pending: {version} is installed, {uname_r} runs")
    return Verdict(ExposureState.OPEN, running, f"running kernel {uname_r}")


def _package_verdict(rng: OsRange, order: str, index: SetIndex) -> Verdict:
    hits = list(index.by_source.get(rng.package, []))
    hits += [(b, index.by_name[b]) for b in rng.binaries if b in index.by_name]
    seen = ""
    for name, version in sorted(set(hits)):
        if rng.hits(order, version):
            return Verdict(ExposureState.OPEN, version, name)
        seen = seen or version
    return Verdict("", seen)


def verdict(rng: OsRange, index: SetIndex, uname_r: str, patched: dict[str, str]) -> Verdict:
    order = dv.order_of(rng.ecosystem)
    if order is None or rng.ecosystem != index.ecosystem:
        return Verdict("", "")
    if rng.kernel and uname_r:
        return _kernel_verdict(rng, order, index, uname_r, patched)
    return _package_verdict(rng, order, index)


def vendor_scope(advisory_ids: Sequence[int]) -> list[int]:
    """The advisories the SQL match (advisories.exposure.recompute) has work for: all but those whose
    every range is a distribution's (matched here alone; its revisit would scan the fleet's exposures
    for nothing)."""
    ids = list(advisory_ids)
    ranges = AffectedRange.objects.filter(advisory_id__in=ids)
    distribution = set(ranges.filter(component__in=(OS_PACKAGE, OS_LIVEPATCH)).values_list("advisory_id", flat=True))
    other = set(ranges.exclude(component__in=(OS_PACKAGE, OS_LIVEPATCH)).values_list("advisory_id", flat=True))
    return [i for i in ids if i not in distribution or i in other]


def os_scope(advisory_ids: Sequence[int]) -> list[int] | None:
    """The advisories an OS rematch covers after these changed: all of them when a Livepatch
    notice is among them (it changes kernel exposures of other advisories), else these."""
    if AffectedRange.objects.filter(advisory_id__in=advisory_ids, component=OS_LIVEPATCH).exists():
        return None
    return list(advisory_ids)


Key = tuple[int, int]  # (node id, range id)


Group = tuple[int, str, str | None]  # (package set, running kernel, livepatch as the database's text)


def _groups(node_ids: Sequence[int] | None, members: bool) -> dict[Group, list[tuple[int, bool]]]:
    """Nodes with a package set by (set, running kernel, livepatch state): (node id, gone) each, or
    without `members` the groups alone (the database groups them: no node row reaches Python).
    The livepatch is kept as the database's text, which the inserts compare it with."""
    scope, params = q.in_list(q.NODES.id, node_ids)
    groups: dict[Group, list[tuple[int, bool]]] = defaultdict(list)
    with connection.cursor() as cursor:
        if not members:
            cursor.execute(q.package_set_groups(scope), params)
            return {(set_id, kernel, livepatch): [] for set_id, kernel, livepatch in cursor.fetchall()}
        cursor.execute(q.package_set_nodes(scope), params)
        for node_id, set_id, kernel, livepatch, gone_at in cursor.fetchall():
            groups[(set_id, kernel, livepatch)].append((node_id, gone_at is not None))
    return groups


def recompute_os(node_ids: Sequence[int] | None = None, advisory_ids: Sequence[int] | None = None,
                 now: dt.datetime | None = None, remediated_by: str = "",
                 fresh: Sequence[int] = ()) -> RecomputeResult:
    """Bring the OS package exposures of the nodes and advisories in scope (None: all) in line.
    `fresh`: advisories known to have no exposure yet (created by the ingest calling): their ranges
    are not looked up among the exposures."""
    now = now or timezone.now()
    ranges = _ranges(advisory_ids)
    if node_ids is None:  # matched with the fleet: no later batch takes them for unmatched (ingest)
        matched = Advisory.objects.filter(ranges__component__in=(OS_PACKAGE, OS_LIVEPATCH)) if advisory_ids is None \
            else Advisory.objects.filter(id__in=advisory_ids)
        Advisory.objects.filter(id__in=matched.values("id")).update(exposures_at=now)
    if not ranges:
        return RecomputeResult()  # nothing to match (and a removed range took its exposures with it)
    node_ids = sorted(set(node_ids)) if node_ids is not None else None
    notices = livepatch_notices() if any(r.kernel for r in ranges) else []
    by_ecosystem: dict[str, list[OsRange]] = defaultdict(list)
    for rng in ranges:
        by_ecosystem[rng.ecosystem].append(rng)
    range_ids = sorted({r.id for r in ranges})
    with transaction.atomic():
        if connection.vendor == "postgresql":
            # Derived rows, committed with the advisories' exposures_at: a crash that loses this
            # commit loses both, and the next ingest matches them again. No wait for the WAL flush.
            with connection.cursor() as cursor:
                cursor.execute(q.ASYNC_COMMIT)
        new = set(fresh)
        existing = _existing(sorted({r.id for r in ranges if r.advisory_id not in new}), node_ids)
        # Per (node, range) verdicts matter only where rows exist to restate: a new advisory's
        # match (its ranges have none) reads no node row, keeps no per-node map and inserts
        # without a per-row check.
        track = bool(existing)
        groups = _groups(node_ids, members=track)
        index = _sets({key[0] for key in groups}, ranges, {key[1] for key in groups})
        wanted: dict[Key, Verdict] = {}
        seen: dict[Key, str] = {}
        inserts: list[tuple[Group, OsRange, Verdict]] = []
        for group, members in groups.items():
            entry = index[group[0]]
            patched = livepatched(json.loads(group[2] or "null"), entry.codename, group[1], notices)
            for rng in by_ecosystem.get(entry.ecosystem, []):
                found = verdict(rng, entry, group[1], patched)
                if found.state:
                    inserts.append((group, rng, found))
                if not track:
                    continue
                for node_id, gone in members:
                    if found.state and not gone:
                        wanted[(node_id, rng.id)] = found
                    elif found.version:
                        seen[(node_id, rng.id)] = found.version
        result = _restate_existing(existing, wanted, seen, now, remediated_by)
        unmatched = set(range_ids) - {e.affected_range_id for e in existing}
        result.opened = _insert(inserts, node_ids, now, unmatched)
        assign_deadlines(node_ids=node_ids, advisory_ids=sorted({r.advisory_id for r in ranges}))
    return result


@dataclass(frozen=True)
class NotAffected:
    """A node a distribution advisory's range does not expose, and why (a VEX justification)."""

    node_id: int
    range_id: int
    package: str  # the range's source package
    cve_ids: frozenset[str]
    justification: str  # component_not_present, vulnerable_code_not_present, vulnerable_code_not_in_execute_path
    reason: str
    version: str  # what the node has of the package ("" none)


def not_affected(advisory_ids: Sequence[int]) -> list[NotAffected]:
    """The nodes (in service or not, never gone) whose package set the advisories' ranges for their
    release do not hit, per range: none of the source's binaries installed (component_not_present),
    installed outside the range (vulnerable_code_not_present), or the source's kernel installed while
    another runs (vulnerable_code_not_in_execute_path). Judged per group of nodes (set, kernel,
    livepatch) as the match is; a node on a release the advisory has no range for gets no statement
    (the advisory says nothing of it), nor does a node with no package set."""
    ranges = _ranges(list(advisory_ids))
    if not ranges:
        return []
    notices = livepatch_notices() if any(r.kernel for r in ranges) else []
    by_ecosystem: dict[str, list[OsRange]] = defaultdict(list)
    for rng in ranges:
        by_ecosystem[rng.ecosystem].append(rng)
    groups = _groups(None, members=True)
    index = _sets({key[0] for key in groups}, ranges, {key[1] for key in groups})
    out: list[NotAffected] = []
    for (set_id, kernel, livepatch), members in groups.items():
        entry = index[set_id]
        patched = livepatched(json.loads(livepatch or "null"), entry.codename, kernel, notices)
        for rng in by_ecosystem.get(entry.ecosystem, []):
            found = verdict(rng, entry, kernel, patched)
            if found.state:
                continue  # an exposure speaks for it (open, or remediated by a livepatch)
            if found.version:
                why, reason = "vulnerable_code_not_present", (
                    f"{rng.package} {found.version} is outside the affected range"
                    + (f" (fixed in {rng.fixed})" if rng.fixed else ""))
            elif rng.kernel and any((m := _KERNEL_BINARY.match(n)) and (m[1], m[3]) in rng.kernels()
                                    for n in entry.by_name):
                why, reason = "vulnerable_code_not_in_execute_path", (
                    f"a kernel built from {rng.package} is installed, but {kernel or 'another kernel'} runs")
            else:
                why, reason = "component_not_present", f"no package built from {rng.package} is installed"
            out += [NotAffected(node_id, rng.id, rng.package, rng.cve_ids, why, reason, found.version)
                    for node_id, gone in members if not gone]
    return out


def _existing(range_ids: list[int], node_ids: Sequence[int] | None) -> list[Exposure]:
    """The OS package exposures of these ranges (and nodes) there are already."""
    if not range_ids:
        return []
    current = Exposure.objects.filter(affected_range_id__in=range_ids, component=OS_PACKAGE)
    if node_ids is not None:
        current = current.filter(node_id__in=node_ids)
    return list(current.only("id", "node_id", "affected_range_id", "state", "detected_version", "note"))


def _insert(inserts: list[tuple[Group, OsRange, Verdict]], node_ids: Sequence[int] | None, now: dt.datetime,
            fresh: set[int]) -> int:
    """New exposures, one INSERT ... SELECT per (group, range): the nodes of a group share the verdict,
    and each gets its deadline (per range and cluster, DeadlineRules) as it is inserted. A `fresh`
    range has no exposure yet: its rows need no check for one."""
    if not inserts:
        return 0
    adapt = connection.ops.adapt_datetimefield_value
    stamp = adapt(now)
    scope, params = q.in_list(q.N.id, node_ids)
    rules = DeadlineRules({rng.id for _g, rng, _v in inserts})
    clusters = list(Cluster.objects.values_list("id", flat=True))
    opened = 0
    with connection.cursor() as cursor:
        for (set_id, kernel, livepatch), rng, v in inserts:
            done = v.state == ExposureState.REMEDIATED
            d_params: list[Any] = []
            for cluster_id in clusters:
                deadline, source = rules.deadline(rng.id, cluster_id, now)
                d_params += [cluster_id, None if done else adapt(deadline), "" if done else source]
            new = rng.id in fresh
            sql, defaults = q.insert_os(len(clusters), done, livepatch is not None, scope, new)
            cursor.execute(sql, [
                *d_params, rng.advisory_id, rng.id, OS_PACKAGE, v.version[:128], rng.severity, v.state, stamp,
                v.version[:128] if done else "", stamp if done else None, v.note[:200] if done else "",
                v.note[:200], stamp, *defaults, set_id, kernel, *([] if livepatch is None else [livepatch]),
                *params, *([] if new else [rng.id])])
            if not done:
                opened += rowcount(cursor)
    return opened


def _restate_existing(existing: list[Exposure], wanted: dict[Key, Verdict], seen: dict[Key, str],
                      now: dt.datetime, remediated_by: str) -> RecomputeResult:
    """Reopen, remediate and restate the exposures there are to match `wanted`; gone nodes keep theirs."""
    result = RecomputeResult()
    if not existing:
        return result
    gone = set(Node.objects.filter(gone_at__isnull=False).values_list("id", flat=True))
    changed: list[Exposure] = []
    for exposure in existing:
        key = (exposure.node_id, exposure.affected_range_id)
        if _restate(exposure, wanted.get(key), seen.get(key, ""), key[0] in gone, now, remediated_by, result):
            changed.append(exposure)
    Exposure.objects.bulk_update(changed, ["state", "detected_version", "note", "remediated_at", "remediated_by",
                                           "fixed_by_version", "deadline", "updated_at"], batch_size=2000)
    return result


def _restate(exposure: Exposure, want: Verdict | None, seen: str, gone: bool, now: dt.datetime,
             remediated_by: str, result: RecomputeResult) -> bool:
    """Change one exposure to its verdict; True when it changed."""
    tracked = exposure.state in ExposureState.TRACKED
    before = (exposure.state, exposure.detected_version, exposure.note)
    if want is None or want.state == ExposureState.REMEDIATED:
        if not tracked or (want is None and gone):
            return False  # leaving the inventory is not a patch
        exposure.state, exposure.remediated_at = ExposureState.REMEDIATED, now
        exposure.fixed_by_version = (want.version if want else seen or "(package removed)")[:128]
        # Credited to what caused it: a campaign's reference, the node's agent where its report did (a
        # livepatch applied outside any campaign), and the verdict's note (the notice) where a new
        # advisory's arrival did. The note says by what either way.
        exposure.remediated_by = (want.note if want and not remediated_by else remediated_by or "")[:200]
        exposure.note = want.note if want else ""
        result.remediated += 1
    elif exposure.state == ExposureState.REMEDIATED:
        exposure.state, exposure.remediated_at, exposure.remediated_by = want.state, None, ""
        exposure.fixed_by_version, exposure.deadline = "", None
        exposure.detected_version, exposure.note = want.version[:128], want.note
        result.reopened += 1
    else:
        exposure.detected_version, exposure.note = want.version[:128], want.note
    exposure.updated_at = now
    return (exposure.state, exposure.detected_version, exposure.note) != before
