"""What fixes a node's open OS package exposures: a livepatch, a reboot, a package update.

For the planner (campaigns): per node, the CVEs a Livepatch notice covers on its running kernel
need no drain and no checkpoint (apply the livepatch, verify its state, done); the rest of a
kernel's needs the fixed kernel installed and booted (a reboot: "reboot pending" when it is
installed already); other packages need their update, to the versions the advisories fix.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from advisories.choices import ExposureState
from advisories.models import AffectedRange, Exposure
from advisories.osmatch import covers, livepatch_notices
from advisories.osv import OS_PACKAGE
from inventory.models import Node

LIVEPATCH = "livepatch"
REBOOT = "reboot"
BOTH = "livepatch+reboot"
PACKAGES = "packages"


@dataclass
class NodeRemedy:
    node_id: int
    livepatch: dict[str, int] = field(default_factory=dict)  # notice id -> the livepatch version that fixes it
    kernel: dict[str, str] = field(default_factory=dict)  # kernel source package -> fixed version (a reboot)
    packages: dict[str, str] = field(default_factory=dict)  # source package -> fixed version
    reboot_pending: bool = False

    @property
    def kind(self) -> str:
        if self.kernel:
            return BOTH if self.livepatch else REBOOT
        if self.livepatch:
            return LIVEPATCH
        return PACKAGES if self.packages else ""


def targets(advisory_id: int) -> dict[str, dict[str, str]]:
    """The package versions an advisory fixes, per release: {ecosystem: {source package: version}}."""
    out: dict[str, dict[str, str]] = defaultdict(dict)
    for scope in AffectedRange.objects.filter(advisory_id=advisory_id, component=OS_PACKAGE).values_list(
            "scope", flat=True):
        if scope.get("fixed"):
            out[scope["ecosystem"]][scope["package"]] = scope["fixed"]
    return dict(out)


def remedies(node_ids: Iterable[int]) -> dict[int, NodeRemedy]:
    """Per node, what its open OS package exposures need."""
    ids = list(node_ids)
    nodes = {n.id: n for n in Node.objects.filter(id__in=ids).select_related("package_set")}
    notices = livepatch_notices()
    out = {i: NodeRemedy(i) for i in ids}
    open_rows = Exposure.objects.filter(node_id__in=ids, component=OS_PACKAGE, state=ExposureState.OPEN)
    for e in open_rows.select_related("affected_range").prefetch_related("affected_range__cves"):
        remedy, node, scope = out[e.node_id], nodes[e.node_id], e.affected_range.scope
        if not scope.get("kernel"):
            remedy.packages[scope["package"]] = scope.get("fixed", "")
            continue
        codename = str((node.package_set.os_release if node.package_set else {}).get("VERSION_CODENAME", ""))
        cves = {c.cve_id for c in e.affected_range.cves.all()}
        patches = [n for n in notices if covers(n, codename, node.running_kernel)]
        patched = {c for n in patches for c in n.cve_ids}
        for n in patches:
            if n.cve_ids & cves:
                remedy.livepatch[n.publisher_id] = n.version
        if not cves <= patched:
            remedy.kernel[scope["package"]] = scope.get("fixed", "")
            remedy.reboot_pending = remedy.reboot_pending or e.note.startswith("reboot pending")
    return out
