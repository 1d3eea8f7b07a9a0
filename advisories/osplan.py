"""What fixes a node's open OS package exposures: a livepatch, a reboot, a package update.

For the planner (campaigns): per node, the CVEs a Livepatch notice covers on its running kernel
need no drain and no checkpoint (apply the livepatch, verify its state, done); the rest of a
kernel's needs the fixed kernel installed and booted (a reboot: "reboot pending" when it is
installed already); other packages need their update, to the versions the advisories fix.

A package update installs the distribution's exact fix: every binary of the source package that the
node's package set holds, at the fixed version for the node's release (``OsTarget.install``: apt
``name=version``, dnf ``name-version``, through the agent's ``package`` patch method). A packaged
NVIDIA driver is the ``driver`` component (its upstream version, so it follows the driver groups,
with the drain and reboot a driver needs); any other package (a library, a tool) is the ``packages``
component: a plain update in place, no drain, no checkpoint and no reboot, as unattended-upgrades or
any patch manager would install it (processes already running keep the old code until they restart,
which the plan says). The binaries are installed at the source's fixed version: the distributions
build them at the source's version (the USN's ``binary_version``s for NVIDIA's drivers are).
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db.models import Q

from advisories import distro_versions as dv
from advisories.choices import ExposureState
from advisories.models import AffectedRange, Exposure
from advisories.osmatch import covers, livepatch_notices
from advisories.osv import OS_PACKAGE
from inventory.models import Node, Package
from inventory.versions import DRIVER, LIVEPATCH, OS_PACKAGES, parse_version

REBOOT = "reboot"
BOTH = "livepatch+reboot"
PACKAGES = "packages"


@dataclass
class NodeRemedy:
    node_id: int
    livepatch: dict[str, int] = field(default_factory=dict)  # notice id -> the livepatch version that fixes it
    kernel: dict[str, str] = field(default_factory=dict)  # kernel source package -> fixed version (a reboot)
    packages: dict[str, str] = field(default_factory=dict)  # source package -> fixed version
    # source package -> its binaries installed on the node (its package set's), which an update installs
    binaries: dict[str, list[str]] = field(default_factory=dict)
    reboot_pending: bool = False

    @property
    def kind(self) -> str:
        if self.kernel:
            return BOTH if self.livepatch else REBOOT
        if self.livepatch:
            return LIVEPATCH
        return PACKAGES if self.packages else ""


def _installed_binaries(nodes: dict[int, Node], wanted: dict[int, dict[str, frozenset[str]]]) -> dict[
        int, dict[str, list[str]]]:
    """node id -> source package -> the binaries its package set holds of it (built from the source, or
    named among the range's binaries): one query for every node's sets."""
    by_set: dict[int, dict[str, frozenset[str]]] = defaultdict(dict)
    for node_id, sources in wanted.items():
        set_id = nodes[node_id].package_set_id
        if set_id is not None:
            by_set[set_id].update(sources)
    if not by_set:
        return {}
    wanted_sources = {s for found in by_set.values() for s in found}
    names = {b for found in by_set.values() for binaries in found.values() for b in binaries}
    found_in: dict[int, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    rows = Package.objects.filter(package_set_id__in=list(by_set)).filter(
        Q(source__in=wanted_sources) | Q(name__in=names)).values_list("package_set_id", "name", "source")
    for set_id, name, source in rows:
        for wanted_source, binaries in by_set[set_id].items():
            if source == wanted_source or name in binaries:
                found_in[set_id][wanted_source].add(name)
    return {node_id: {source: sorted(found_in[nodes[node_id].package_set_id or 0].get(source, ()))
                      for source in sources_of}
            for node_id, sources_of in wanted.items()}


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
    updates: dict[int, dict[str, frozenset[str]]] = defaultdict(dict)
    for e in open_rows.select_related("affected_range").prefetch_related("affected_range__cves"):
        remedy, node, scope = out[e.node_id], nodes[e.node_id], e.affected_range.scope
        if not scope.get("kernel"):
            remedy.packages[scope["package"]] = scope.get("fixed", "")
            updates[e.node_id][scope["package"]] = frozenset(e.affected_range.condition.get("binaries", []))
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
    for node_id, binaries in _installed_binaries(nodes, updates).items():
        out[node_id].binaries = binaries
    return out


# Source packages that build NVIDIA's driver: their fix is the driver component's upstream version,
# so a packaged driver follows the driver-group rules (branches, checkpoint portability) like a runfile.
_DRIVER_SOURCE = re.compile(r"^nvidia-graphics-drivers-\d+(?:-server)?$")


@dataclass(frozen=True)
class OsTarget:
    """A node's campaign target from its remedy, in the executors' components: ``livepatch`` (the
    livepatch version to apply), ``kernel`` (the fixed kernel's release as uname -r prints it, which
    names its package), ``driver`` (a packaged driver's upstream version) and ``packages`` (other
    packages' exact versions, in place: its value names the set, ``install_label``)."""

    target: dict[str, str]
    kind: str
    # What the distribution fixes, per source package (for the plan), and what no component patches.
    packages: dict[str, str] = field(default_factory=dict)
    unpatched: tuple[str, ...] = ()
    # component -> the exact binary packages its patch installs (name -> version): the driver's, the others'.
    install: dict[str, dict[str, str]] = field(default_factory=dict)


def upstream(version: str) -> str:
    """A distribution version's upstream part: "570.172.08-0ubuntu0.22.04.1" -> "570.172.08"."""
    bare = version.split(":", 1)[1] if ":" in version.split("-", 1)[0] else version
    return bare.rsplit("-", 1)[0] if "-" in bare else bare


def install_label(packages: dict[str, str]) -> str:
    """The ``packages`` target's version: a name for exactly this set of package versions (the plan
    lists them), so a changed set is another target."""
    text = "\n".join(f"{n}={v}" for n, v in sorted(packages.items()))
    return f"set-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def node_target(remedy: NodeRemedy, running_kernel: str) -> OsTarget:
    """The target that fixes a node's remedy: a livepatch alone where it fixes every kernel CVE,
    else the fixed kernel (the reboot fixes the livepatchable ones too), packaged drivers, and the
    other packages' update in place."""
    target: dict[str, str] = {}
    unpatched: list[str] = []
    install: dict[str, dict[str, str]] = {}
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
    for source, fixed in sorted(remedy.packages.items()):
        binaries = remedy.binaries.get(source, [])
        if not fixed or not binaries:  # no fix yet, or none of its binaries found to install
            if not _DRIVER_SOURCE.match(source):  # (a driver is still the driver component's target)
                unpatched.append(source)
            continue
        component = DRIVER if _DRIVER_SOURCE.match(source) else OS_PACKAGES
        install.setdefault(component, {}).update({b: fixed for b in binaries})
    if OS_PACKAGES in install:
        target[OS_PACKAGES] = install_label(install[OS_PACKAGES])
    kind = remedy.kind
    if kind == LIVEPATCH and OS_PACKAGES in target:
        kind = f"{LIVEPATCH}+{PACKAGES}"  # both in place: still no drain
    return OsTarget(target, kind, {**remedy.kernel, **remedy.packages}, tuple(unpatched), install)
