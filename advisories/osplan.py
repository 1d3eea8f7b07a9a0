"""What fixes a node's open OS package exposures: a livepatch, a reboot, a package update.

For the planner (campaigns): per node, the CVEs a Livepatch notice covers on its running kernel
need no drain and no checkpoint (apply the livepatch, verify its state, done); the rest of a
kernel's needs the fixed kernel installed and booted (a reboot: "reboot pending" when it is
installed already); other packages need their update, to the versions the advisories fix.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from advisories import distro_versions as dv
from advisories.choices import ExposureState
from advisories.models import AffectedRange, Exposure
from advisories.osmatch import covers, livepatch_notices
from advisories.osv import OS_PACKAGE
from inventory.models import Node
from inventory.versions import DRIVER, LIVEPATCH, parse_version

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


def remedies(node_ids: Iterable[int], advisory_ids: Iterable[int] | None = None) -> dict[int, NodeRemedy]:
    """Per node, what its open OS package exposures (of these advisories; None: any) need."""
    ids = list(node_ids)
    nodes = {n.id: n for n in Node.objects.filter(id__in=ids).select_related("package_set")}
    out = {i: NodeRemedy(i) for i in ids}
    open_rows = Exposure.objects.filter(node_id__in=ids, component=OS_PACKAGE, state=ExposureState.OPEN)
    if advisory_ids is not None:
        open_rows = open_rows.filter(advisory_id__in=list(advisory_ids))
    if not open_rows.exists():
        return out
    notices = livepatch_notices()
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


# Source packages that build NVIDIA's driver: their fix is the driver component's upstream version,
# so a packaged driver follows the driver-group rules (branches, checkpoint portability) like a runfile.
_DRIVER_SOURCE = re.compile(r"^nvidia-graphics-drivers-\d+(?:-server)?$")


@dataclass(frozen=True)
class OsTarget:
    """A node's campaign target from its remedy, in the executors' components: ``livepatch`` (the
    livepatch version to apply), ``kernel`` (the fixed kernel's release as uname -r prints it, which
    names its package) and ``driver`` (a packaged driver's upstream version)."""

    target: dict[str, str]
    kind: str
    # What the distribution fixes, per source package (for the plan), and what no component patches.
    packages: dict[str, str] = field(default_factory=dict)
    unpatched: tuple[str, ...] = ()


def upstream(version: str) -> str:
    """A distribution version's upstream part: "570.172.08-0ubuntu0.22.04.1" -> "570.172.08"."""
    bare = version.split(":", 1)[1] if ":" in version.split("-", 1)[0] else version
    return bare.rsplit("-", 1)[0] if "-" in bare else bare


def node_target(remedy: NodeRemedy, running_kernel: str) -> OsTarget:
    """The target that fixes a node's remedy: a livepatch alone where it fixes every kernel CVE,
    else the fixed kernel (the reboot fixes the livepatchable ones too), and packaged drivers."""
    target: dict[str, str] = {}
    unpatched: list[str] = []
    if remedy.kernel:
        release = dv.kernel_release(running_kernel)
        fixes = [found for fixed in remedy.kernel.values() if (found := dv.kernel_abi(fixed))]
        if release is None or not fixes:
            unpatched += sorted(remedy.kernel)
        else:
            upstream_version, abi = max(fixes, key=lambda f: dv.kernel_order(*f))
            target["kernel"] = f"{upstream_version}-{abi}-{release[2]}"
    elif remedy.livepatch:
        target[LIVEPATCH] = str(max(remedy.livepatch.values()))
    drivers = sorted((upstream(v) for p, v in remedy.packages.items() if _DRIVER_SOURCE.match(p) and v),
                     key=lambda v: parse_version(DRIVER, v).key or ())
    if drivers:
        target[DRIVER] = drivers[-1]
    unpatched += sorted(p for p in remedy.packages if not _DRIVER_SOURCE.match(p))
    return OsTarget(target, remedy.kind, {**remedy.kernel, **remedy.packages}, tuple(unpatched))
