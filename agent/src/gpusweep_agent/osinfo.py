"""The node's OS for distribution advisories: the heartbeat's optional ``os`` object.

- ``release``: /etc/os-release (ID, VERSION_ID, VERSION_CODENAME, VERSION);
- ``packages``: every installed binary package with its source package and version
  (``dpkg-query``, or ``rpm -qa``), as [name, version, arch, source, source version];
- ``running_kernel``: ``uname -r``, the kernel that runs (not the newest installed);
- ``livepatch``: ``canonical-livepatch status --format json`` or ``kpatch list``.

Each probe is optional: a tool that is absent or fails gives nothing, and a node with none of
them sends no ``os`` object. The package list is read again only when the package database
changed (its modification time), so a heartbeat costs a stat, not a dpkg-query.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .config import AgentConfig
from .facts import Facts, Probe, parse_os_release
from .util import host_argv

Runner = Callable[[list[str]], str | None]
# dpkg-query expands the \t and \n escapes itself.
DPKG_FORMAT = ("${Package}\\t${Version}\\t${Architecture}\\t${source:Package}\\t${source:Version}"
               "\\t${db:Status-Status}\\n")
RPM_FORMAT = "%{NAME}\\t%{EPOCHNUM}:%{VERSION}-%{RELEASE}\\t%{ARCH}\\t%{SOURCERPM}\\n"
PACKAGE_DBS = ("var/lib/dpkg/status", "var/lib/rpm/rpmdb.sqlite", "var/lib/rpm/Packages")


def run_tool(argv: list[str], timeout: float = 60) -> str | None:
    """The tool's standard output; None when it is not installed or fails."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def parse_dpkg(output: str) -> list[list[str]]:
    """dpkg-query rows of installed packages; the source is the package itself when dpkg names none."""
    rows = []
    for line in output.splitlines():
        parts = line.split("\t")
        if len(parts) < 6 or parts[5] != "installed" or not parts[0]:
            continue
        name, version, arch, source, source_version = parts[:5]
        rows.append([name, version, arch, source or name, source_version or version])
    return rows


_SRPM = re.compile(r"^(?P<name>.+)-(?P<version>[^-]+-[^-]+)\.(?:no)?src\.rpm$")


def parse_rpm(output: str) -> list[list[str]]:
    """rpm -qa rows; epoch 0 is left out; the source name and version from the source RPM's file name."""
    rows = []
    for line in output.splitlines():
        parts = line.split("\t")
        if len(parts) != 4 or not parts[0] or parts[0] == "gpg-pubkey":
            continue
        name, evr, arch, srpm = parts
        evr = evr[2:] if evr.startswith("0:") else evr
        m = _SRPM.match(srpm)
        rows.append([name, evr, arch, m["name"] if m else name, m["version"] if m else evr])
    return rows


def parse_canonical_livepatch(output: str) -> dict[str, Any] | None:
    """`canonical-livepatch status --format json`: the running kernel's livepatch state and fixes."""
    try:
        data = json.loads(output)
    except json.JSONDecodeError:
        return None
    statuses = _get(data, "status") if isinstance(data, dict) else None
    if not isinstance(statuses, list) or not statuses:
        return None
    running = [s for s in statuses if isinstance(s, dict) and _get(s, "running")] or statuses
    patch = _get(running[0], "livepatch") if isinstance(running[0], dict) else None
    if not isinstance(patch, dict):
        return None
    state = str(_get(patch, "state") or "unknown").lower()
    fixes = _get(patch, "fixes") or []
    if isinstance(fixes, str):  # older clients: one fix per line ("* cve-2020-8647 ...")
        fixes = [{"name": m, "patched": True} for m in re.findall(r"cve-\d{4}-\d+", fixes, flags=re.I)]
    cves = sorted({str(_get(f, "name")).upper() for f in fixes
                   if isinstance(f, dict) and _get(f, "patched") is not False and _get(f, "name")})
    version = str(_get(patch, "version") or "").split(".")[0]
    return {"tool": "canonical-livepatch", "state": state if state in _STATES else "unknown", "version": version,
            "fixes": [c for c in cves if c.startswith("CVE-")]}


_STATES = ("applied", "nothing-to-apply", "applying", "failed", "disabled", "unknown")


def _get(obj: dict[str, Any], key: str) -> Any:
    """A key whatever its case or separator (the client's JSON changed between versions)."""
    want = key.replace("-", "").replace("_", "").lower()
    for k, v in obj.items():
        if k.replace("-", "").replace("_", "").lower() == want:
            return v
    return None


def parse_kpatch_list(output: str) -> dict[str, Any] | None:
    """`kpatch list`: loaded patch modules mean applied (their CVEs come as kpatch-patch packages)."""
    loaded, section = [], ""
    for line in output.splitlines():
        if line.strip().lower().startswith("loaded patch modules"):
            section = "loaded"
        elif line.strip().lower().startswith("installed patch modules"):
            section = "installed"
        elif section == "loaded" and line.strip():
            loaded.append(line.split()[0])
    return {"tool": "kpatch", "state": "applied" if loaded else "nothing-to-apply", "modules": loaded, "fixes": []}


class OsProbe:
    """The ``os`` object, with the package list kept until the package database changes."""

    @classmethod
    def of(cls, config: AgentConfig) -> OsProbe:
        """The node's, as the agent's settings reach it (host_root, host_exec: an agent in a container)."""
        return cls(root=Path(config.host_root),
                   run=lambda argv: run_tool(host_argv(config, argv)) if config.host_exec else run_tool(argv))

    def __init__(self, root: Path = Path("/"), run: Runner = run_tool,
                 uname: Callable[[], str] = lambda: os.uname().release) -> None:
        self.root, self.run, self.uname = root, run, uname
        self._packages: tuple[float, list[list[str]] | None] | None = None

    def packages(self) -> list[list[str]] | None:
        stamp = max((p.stat().st_mtime for p in (self.root / db for db in PACKAGE_DBS) if p.exists()), default=-1.0)
        if self._packages is not None and self._packages[0] == stamp and stamp >= 0:
            return self._packages[1]
        found: list[list[str]] | None = None
        if (output := self.run(["dpkg-query", "-W", "-f", DPKG_FORMAT])) is not None:
            found = parse_dpkg(output)
        elif (output := self.run(["rpm", "-qa", "--qf", RPM_FORMAT])) is not None:
            found = parse_rpm(output)
        self._packages = (stamp, sorted(found) if found is not None else None)
        return self._packages[1]

    def livepatch(self) -> dict[str, Any] | None:
        if (output := self.run(["canonical-livepatch", "status", "--format", "json"])) is not None:
            return parse_canonical_livepatch(output)
        if (output := self.run(["kpatch", "list"])) is not None:
            return parse_kpatch_list(output)
        return None

    def report(self) -> dict[str, Any] | None:
        release = parse_os_release(self.root / "etc/os-release")
        packages = self.packages()
        livepatch = self.livepatch()
        if not release and packages is None and livepatch is None:
            return None
        report: dict[str, Any] = {
            "release": {k: release[k] for k in ("ID", "VERSION_ID", "VERSION_CODENAME", "VERSION") if k in release},
            "running_kernel": self.uname(), "livepatch": livepatch}
        if packages is not None:
            report["packages"] = packages
        return report


class LivepatchProbe(Probe):
    """The running kernel's livepatch as the ``livepatch`` component: the applied livepatch's version
    (canonical-livepatch), or "applied" (kpatch, which has no version); nothing when none is applied.
    A campaign verifies a livepatch step by it."""

    name = "livepatch"

    def probe(self) -> Facts:
        state = OsProbe.of(self.config).livepatch()
        if not state or state.get("state") != "applied":
            return {}
        return {"components": {"livepatch": str(state.get("version") or "applied")}}
