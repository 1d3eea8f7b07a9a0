"""A node's OS as its agent reports it: the release, the installed packages, the running kernel and
the livepatch state (the heartbeat's optional ``os`` object, docs/agent-wire-format.md).

Packages are stored per image, not per node: a PackageSet is keyed by the digest of its content,
so the many nodes of one image share one set, and a heartbeat whose set is the node's already
writes nothing. A set that is new is written once (its packages in one bulk insert), whichever
of its nodes reports it first.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from inventory.models import Node, Package, PackageSet
from inventory.signals import node_packages_changed

MAX_PACKAGES = 20_000
LIVEPATCH_STATES = ("applied", "nothing-to-apply", "applying", "failed", "disabled", "unknown")

# /etc/os-release's ID to the OSV ecosystem's name.
_ECOSYSTEMS = {"ubuntu": "Ubuntu", "debian": "Debian", "almalinux": "AlmaLinux", "rocky": "Rocky Linux",
               "rhel": "Red Hat"}


class OsReportError(ValueError):
    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__(errors)
        self.errors = errors


@dataclass(frozen=True)
class OsReport:
    release: dict[str, str]
    ecosystem: str
    packages: tuple[tuple[str, str, str, str, str], ...] | None  # name, version, arch, source, source version
    running_kernel: str
    livepatch: dict[str, Any] | None

    @property
    def digest(self) -> str:
        content = json.dumps([self.ecosystem, sorted(self.packages or ())], separators=(",", ":"))
        return hashlib.sha256(content.encode()).hexdigest()


def ecosystem_of(release: dict[str, str]) -> str:
    """OSV's ecosystem for an os-release: Ubuntu:22.04:LTS, Debian:12, AlmaLinux:9, Rocky Linux:9."""
    name = _ECOSYSTEMS.get(release.get("ID", "").lower(), "")
    version = release.get("VERSION_ID", "")
    if not name or not version:
        return ""
    if name == "Ubuntu":
        return f"Ubuntu:{version}:LTS" if "LTS" in release.get("VERSION", "") else f"Ubuntu:{version}"
    if name == "Red Hat":
        return f"Red Hat:enterprise_linux:{version.split('.')[0]}"
    return f"{name}:{version.split('.')[0]}"


def _strings(value: Any, errors: dict[str, str], where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        errors[where] = "expected an object of strings"
        return {}
    return value


def _packages(value: Any, errors: dict[str, str]) -> tuple[tuple[str, str, str, str, str], ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_PACKAGES:
        errors["os.packages"] = f"expected a list of at most {MAX_PACKAGES} packages"
        return None
    rows = []
    for i, row in enumerate(value):
        if (not isinstance(row, list) or not 2 <= len(row) <= 5 or not all(isinstance(c, str) for c in row)
                or not row[0] or not row[1] or any(len(c) > 200 for c in row)):
            errors[f"os.packages[{i}]"] = "expected [name, version, arch, source, source version] (strings)"
            return None
        name, version, arch, source, source_version = (*row, "", "", "")[:5]
        rows.append((name, version, arch, source, source_version))
    return tuple(sorted(set(rows)))


def parse_os_report(payload: dict[str, Any]) -> OsReport | None:
    """The heartbeat's ``os`` object; None when the agent sent none (its probes found nothing)."""
    value = payload.get("os")
    if value is None:
        return None
    errors: dict[str, str] = {}
    if not isinstance(value, dict):
        raise OsReportError({"os": "expected an object"})
    release = _strings(value.get("release", {}), errors, "os.release")
    kernel = value.get("running_kernel", "")
    if not isinstance(kernel, str) or len(kernel) > 100:
        errors["os.running_kernel"] = "expected uname -r (at most 100 characters)"
        kernel = ""
    livepatch = value.get("livepatch")
    if livepatch is not None and (not isinstance(livepatch, dict) or livepatch.get("state") not in LIVEPATCH_STATES
                                  or not isinstance(livepatch.get("fixes", []), list)):
        errors["os.livepatch"] = f"expected {{tool, state (one of {', '.join(LIVEPATCH_STATES)}), fixes: [...]}}"
    packages = _packages(value.get("packages"), errors)
    if errors:
        raise OsReportError(errors)
    return OsReport(release={k: release[k] for k in ("ID", "VERSION_ID", "VERSION_CODENAME", "VERSION")
                             if k in release},
                    ecosystem=ecosystem_of(release), packages=packages, running_kernel=kernel.strip(),
                    livepatch=livepatch)


@dataclass(frozen=True)
class OsState:
    """What the node's row holds of its OS: the heartbeat reads it with the node's row (LOCK_NODE), so
    comparing a report with it costs no statement."""

    digest: str  # its package set's ("" for none)
    running_kernel: str
    livepatch: dict[str, Any] | None

    @classmethod
    def of(cls, digest: str | None, running_kernel: str | None, livepatch: Any) -> OsState:
        """From the database's values (a JSON column read by a plain statement may come as text)."""
        return cls(digest or "", running_kernel or "",
                   json.loads(livepatch) if isinstance(livepatch, str) else livepatch)


def package_set(report: OsReport) -> PackageSet:
    """The set of these packages, written once for every node that has it."""
    digest = report.digest
    found = PackageSet.objects.filter(digest=digest).first()
    if found is not None:
        return found
    try:
        with transaction.atomic():
            created = PackageSet.objects.create(digest=digest, ecosystem=report.ecosystem, os_release=report.release,
                                                package_count=len(report.packages or ()))
            Package.objects.bulk_create([
                Package(package_set=created, name=n, version=v, arch=a, source=s, source_version=sv)
                for n, v, a, s, sv in report.packages or ()], batch_size=2000)
            return created
    except IntegrityError:  # another node of the image wrote it meanwhile
        return PackageSet.objects.get(digest=digest)


def apply_os_report(node_id: int, report: OsReport | None, reference: str = "",
                    current: OsState | None = None) -> bool:
    """Point the node at its package set, record its kernel and livepatch; True when any changed
    (advisories then rematch the node's OS package exposures). With `current` (the heartbeat read
    it with the node's row) a report that changes nothing costs no statement at all."""
    if report is None:
        return False
    if current is None:
        row = Node.objects.filter(pk=node_id).values_list("package_set__digest", "running_kernel", "livepatch").first()
        if row is None:
            return False
        current = OsState.of(*row)
    changes: dict[str, Any] = {}
    if report.packages is not None and current.digest != report.digest:
        changes["package_set"] = package_set(report)
    if current.running_kernel != report.running_kernel:
        changes["running_kernel"] = report.running_kernel
    if current.livepatch != report.livepatch:
        changes["livepatch"] = report.livepatch
    if not changes:
        return False
    Node.objects.filter(pk=node_id).update(**changes)
    transaction.on_commit(lambda: node_packages_changed.send(sender=Node, node_ids=[node_id], reference=reference))
    return True


def record_running(node_id: int, kernel: str = "", livepatch_version: str = "", reference: str = "") -> bool:
    """What a campaign verified runs on the node: the kernel it booted, the livepatch it applied; True
    when either changed. The node's OS package exposures follow on commit, remediated with
    `reference` (the campaign and sweep) as their evidence, before the agent's next report says so.
    A new kernel drops the old one's livepatch state (livepatches are per kernel)."""
    if not kernel and not livepatch_version:
        return False  # nothing verified to record (a driver campaign): not even a read
    current = Node.objects.filter(pk=node_id).values("running_kernel", "livepatch").first()
    if current is None:
        return False
    changes: dict[str, Any] = {}
    if kernel and current["running_kernel"] != kernel:
        changes.update(running_kernel=kernel, livepatch=None)
    if livepatch_version:
        before = (current["livepatch"] or {}) if "running_kernel" not in changes else {}
        state = {"tool": "campaign", "fixes": [], **before, "state": "applied", "version": livepatch_version}
        if state != current["livepatch"]:
            changes["livepatch"] = state
    if not changes:
        return False
    Node.objects.filter(pk=node_id).update(**changes)
    transaction.on_commit(lambda: node_packages_changed.send(sender=Node, node_ids=[node_id], reference=reference))
    return True


def record_installed(node_id: int, installed: dict[str, str], reference: str = "") -> bool:
    """What a campaign installed on the node (exact package versions its agent read back): the node's
    package set becomes its current one with those versions, before the agent's next report (whose
    set, the same packages, has the same digest and changes nothing). True when it changed; its OS
    package exposures follow on commit, remediated with `reference` as their evidence. Only packages
    the set holds change: a binary built from a source keeps its source at the installed version."""
    node = Node.objects.filter(pk=node_id).select_related("package_set").first()
    current = node.package_set if node is not None else None
    if current is None or not installed:
        return False
    rows = []
    for name, version, arch, source, source_version in current.packages.values_list(
            "name", "version", "arch", "source", "source_version").iterator(chunk_size=5000):
        if name in installed:
            new = installed[name]
            version, source_version = new, new if source_version else source_version
        rows.append((name, version, arch, source, source_version))
    report = OsReport(release=dict(current.os_release), ecosystem=current.ecosystem,
                      packages=tuple(sorted(set(rows))), running_kernel="", livepatch=None)
    if report.digest == current.digest:
        return False
    Node.objects.filter(pk=node_id).update(package_set=package_set(report))
    transaction.on_commit(lambda: node_packages_changed.send(sender=Node, node_ids=[node_id], reference=reference))
    return True
