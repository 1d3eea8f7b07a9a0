"""One finding per node and CVE, whatever the sources that name it.

Exposure rows stay one per (node, affected range): the matching, deadlines, decisions and VEX
work on them. NVIDIA's bulletin and a distribution's advisory (Ubuntu's USN for the same driver
CVE) are two ranges, so two rows; a finding joins them for the node and CVE, with each source.

Which source decides: the one that describes how the node got the software. A node whose driver
comes from the distribution's package (an OS package exposure of a source that builds NVIDIA's
driver, in any state) is judged by the distribution's package version: its fix closes the finding.
A node with NVIDIA's runfile has no such exposure, and NVIDIA's upstream version decides.

Where the lists show them (the API's and console's exposures, VEX): an NVIDIA row all of whose CVEs
a distribution row of the same node names is shown within that row (``merged``), as one of its
finding's sources (``joined``); a source filter (``source_q``: NVIDIA's bulletins or the
distribution's advisories) shows each source's own rows, merged or not.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Exists, OuterRef, Q

from advisories.choices import ExposureState
from advisories.models import AffectedRange, Exposure, public_id
from advisories.osv import OS_PACKAGE
from gpusweep.narrow import among
from gpusweep.responses import cached

NVIDIA, DISTRIBUTION = "nvidia", "distribution"
SOURCES = [(NVIDIA, "NVIDIA bulletins"), (DISTRIBUTION, "Distribution advisories (OSV)")]


@dataclass(frozen=True)
class Source:
    exposure_id: int
    publisher: str
    publisher_id: str
    component: str
    state: str
    detected_version: str
    note: str

    @property
    def advisory(self) -> str:
        return public_id(self.publisher, self.publisher_id)

    def as_dict(self) -> dict[str, str]:
        return {"advisory": self.advisory, "component": self.component, "state": self.state,
                "detected_version": self.detected_version, "note": self.note}


@dataclass
class Finding:
    node_id: int
    cve_id: str
    sources: list[Source] = field(default_factory=list)

    @property
    def deciding(self) -> list[Source]:
        """The distribution's sources where it packages the software, else all of them."""
        packaged = [s for s in self.sources if s.component == OS_PACKAGE]
        return packaged or self.sources

    @property
    def state(self) -> str:
        """Open while a deciding source is; else the deciding sources' state (remediated ...)."""
        states = [s.state for s in self.deciding]
        for state in (ExposureState.OPEN, ExposureState.PRESUMED, ExposureState.RISK_ACCEPTED,
                      ExposureState.NOT_AFFECTED):
            if state in states:
                return state
        return states[0] if states else ""


def source_q(source: str) -> Q:
    """The exposures of one kind of source: NVIDIA's bulletins or the distribution's advisories."""
    return Q(component=OS_PACKAGE) if source == DISTRIBUTION else ~Q(component=OS_PACKAGE)


def any_distribution_range() -> bool:
    """Whether any distribution advisory has a range: without one there is no distribution
    exposure (each is matched from such a range), so no two sources meet. Kept per generation of
    the ranges' table (gpusweep.responses.cached): the lists ask on every request."""
    return cached("findings:os-ranges", (AffectedRange._meta.db_table,),
                  lambda: (AffectedRange.objects.filter(component=OS_PACKAGE).exists(), None))


def merged() -> Q:
    """NVIDIA rows shown within a distribution row: the node has a distribution exposure naming each
    of the row's CVEs (its driver is the distribution's package, whose version decides)."""
    through = AffectedRange.cves.through
    named = Exposure.objects.filter(node_id=OuterRef(OuterRef("node_id")), component=OS_PACKAGE,
                                    affected_range__cves=OuterRef("cve_id"))
    if not any_distribution_range():
        return Q(pk__in=[])  # no distribution advisory: nothing is merged (and the list pays nothing)
    uncovered = through.objects.filter(affectedrange_id=OuterRef("affected_range_id")).exclude(Exists(named))
    # The nodes with distribution exposures as one set (a hashed semi-join), then the CVEs row by row.
    packaged = Exposure.objects.filter(component=OS_PACKAGE).values("node_id")
    return ~Q(component=OS_PACKAGE) & Q(node_id__in=packaged) & ~Q(Exists(uncovered))


def joined(node_ids: Iterable[int]) -> dict[tuple[int, str], Finding]:
    """(node, CVE) -> its finding, for those of the nodes that have distribution exposures (only there
    do two sources meet; a fleet with none costs one query, one with no distribution advisory none)."""
    ids = list(node_ids)
    if not ids or not any_distribution_range():
        return {}
    packaged = set(Exposure.objects.filter(among("node_id", ids), component=OS_PACKAGE).order_by().values_list(
        "node_id", flat=True))
    return {(f.node_id, f.cve_id): f for f in findings(packaged)} if packaged else {}


def findings(node_ids: Iterable[int] | None = None) -> list[Finding]:
    """Findings of the nodes' exposures (None: the fleet's), sorted by node and CVE."""
    rows = Exposure.objects.select_related("advisory")
    if node_ids is not None:
        rows = rows.filter(node_id__in=list(node_ids))
    by_id = {e.id: e for e in rows}
    cves: dict[int, list[str]] = defaultdict(list)
    ranges = {e.affected_range_id for e in by_id.values()}
    for range_id, cve_id in AffectedRange.cves.through.objects.filter(affectedrange_id__in=ranges).values_list(
            "affectedrange_id", "cve__cve_id"):
        cves[range_id].append(cve_id)
    out: dict[tuple[int, str], Finding] = {}
    for e in by_id.values():
        source = Source(e.id, e.advisory.publisher, e.advisory.publisher_id, e.component, e.state,
                        e.detected_version, e.note)
        for cve_id in cves.get(e.affected_range_id, []):
            out.setdefault((e.node_id, cve_id), Finding(e.node_id, cve_id)).sources.append(source)
    return [out[k] for k in sorted(out)]


def of_row(exposure: Exposure, found: dict[tuple[int, str], Finding], cves: Iterable[str]) -> dict[str, Any] | None:
    """The finding a listed exposure stands for, where another source names its node and CVEs too:
    its state (the deciding sources') and every source; None where the row is the only source."""
    mine = [found[(exposure.node_id, c)] for c in cves if (exposure.node_id, c) in found]
    sources = {s.exposure_id: s for f in mine for s in f.sources}
    if len(sources) < 2:
        return None
    states = [f.state for f in mine]
    order = [ExposureState.OPEN, ExposureState.PRESUMED, ExposureState.RISK_ACCEPTED, ExposureState.NOT_AFFECTED]
    state = next((s for s in order if s in states), states[0])
    deciding = {s.exposure_id for f in mine for s in f.deciding}
    return {"state": state, "sources": [{**s.as_dict(), "decides": s.exposure_id in deciding}
                                        for _i, s in sorted(sources.items())]}
