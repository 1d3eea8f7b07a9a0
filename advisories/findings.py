"""One finding per node and CVE, whatever the sources that name it.

Exposure rows stay one per (node, affected range): the matching, deadlines, decisions and VEX
work on them. NVIDIA's bulletin and a distribution's advisory (Ubuntu's USN for the same driver
CVE) are two ranges, so two rows; a finding joins them for the node and CVE, with each source.

Which source decides: the one that describes how the node got the software. A node whose driver
comes from the distribution's package (an OS package exposure of a source that builds NVIDIA's
driver, in any state) is judged by the distribution's package version: its fix closes the finding.
A node with NVIDIA's runfile has no such exposure, and NVIDIA's upstream version decides.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from advisories.choices import ExposureState
from advisories.models import AffectedRange, Exposure
from advisories.osv import OS_PACKAGE


@dataclass(frozen=True)
class Source:
    exposure_id: int
    publisher: str
    publisher_id: str
    component: str
    state: str
    detected_version: str
    note: str


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
