"""The node's package manager, behind one small interface, for rollback.

Before a patch the agent records the exact installed packages it is about to change (names and
versions, as the package manager reports them); a rollback installs exactly those again.

- ``dpkg``: ``dpkg-query -W`` to read, ``apt-get install -y --allow-downgrades name=version``.
- ``rpm``: ``rpm -qa`` to read, ``dnf install -y name-version`` (dnf downgrades to a named older
  version).
- ``recording``: a stand-in for tests and demo nodes, NOT a package manager: "installed" packages
  are a JSON file (``package_db``) and every install is appended to its ``installs`` list, so a
  test can see what a rollback reinstalled. Its command line (``python -m gpusweep_agent.packages
  --db FILE install name=version ...``) lets a test's patch script change it as a real install would.

Which packages belong to a component: the ``packages`` setting (component -> name patterns, shell
style), over ``DEFAULT_PACKAGES``.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import subprocess
from pathlib import Path

from .config import AgentConfig
from .util import host_argv, host_which, read_json, utcnow, write_json_atomic

DEFAULT_PACKAGES: dict[str, list[str]] = {
    "driver": ["nvidia-driver-*", "nvidia-kernel-*", "libnvidia-compute-*", "nvidia-utils-*", "kmod-nvidia-*",
               "nvidia-driver", "nvidia-driver-cuda", "nvidia-kmod-*"],
    "container_toolkit": ["nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container*"],
    "dcgm": ["datacenter-gpu-manager*"],
    "fabric_manager": ["nvidia-fabricmanager*", "nvidia-fabric-manager*"],
}


class PackageError(Exception):
    """The package manager could not be read or refused an install."""


class PackageManager:
    name = ""

    def __init__(self, config: AgentConfig | None = None) -> None:
        self.config = config or AgentConfig()

    def run(self, argv: list[str], timeout: float = 1800) -> str:
        return _run(host_argv(self.config, argv), timeout)

    def installed(self) -> dict[str, str]:
        """Every installed package: name -> exact version."""
        raise NotImplementedError

    def install(self, packages: dict[str, str]) -> str:
        """Install exactly these versions (downgrading where needed); the command's output."""
        raise NotImplementedError

    def matching(self, patterns: list[str]) -> dict[str, str]:
        return {name: version for name, version in sorted(self.installed().items())
                if any(fnmatch.fnmatchcase(name, p) for p in patterns)}


def _run(argv: list[str], timeout: float = 1800) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PackageError(f"{' '.join(argv)}: {exc}") from None
    if proc.returncode != 0:
        raise PackageError(f"{' '.join(argv)} exited {proc.returncode}: {(proc.stdout + proc.stderr)[-2000:]}")
    return (proc.stdout + proc.stderr)[-20_000:]


def parse_dpkg_installed(output: str) -> dict[str, str]:
    """`dpkg-query -W -f '${Package}\\t${Version}\\t${db:Status-Status}\\n'`: installed ones only."""
    found = {}
    for line in output.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[2] == "installed":
            found[parts[0]] = parts[1]
    return found


def parse_rpm_installed(output: str) -> dict[str, str]:
    """`rpm -qa --qf '%{NAME}\\t%{EPOCHNUM}:%{VERSION}-%{RELEASE}\\n'`; epoch 0 is left out."""
    found = {}
    for line in output.splitlines():
        parts = line.split("\t")
        if len(parts) == 2 and parts[0]:
            found[parts[0]] = parts[1][2:] if parts[1].startswith("0:") else parts[1]
    return found


class Dpkg(PackageManager):
    name = "dpkg"

    def installed(self) -> dict[str, str]:
        return parse_dpkg_installed(self.run(["dpkg-query", "-W", "-f",
                                              "${Package}\\t${Version}\\t${db:Status-Status}\\n"], 60))

    def install(self, packages: dict[str, str]) -> str:
        return self.run(["apt-get", "install", "-y", "--allow-downgrades", "--no-install-recommends",
                     *(f"{n}={v}" for n, v in sorted(packages.items()))])


class Rpm(PackageManager):
    name = "rpm"

    def installed(self) -> dict[str, str]:
        return parse_rpm_installed(self.run(["rpm", "-qa", "--qf", "%{NAME}\\t%{EPOCHNUM}:%{VERSION}-%{RELEASE}\\n"],
                                            60))

    def install(self, packages: dict[str, str]) -> str:
        return self.run(["dnf", "install", "-y", *(f"{n}-{v}" for n, v in sorted(packages.items()))])


class RecordingPackageManager(PackageManager):
    """Test stand-in (not a package manager): installed packages in a JSON file, installs recorded."""

    name = "recording"

    def __init__(self, db: Path) -> None:
        self.db = db

    def _data(self) -> dict[str, dict[str, str] | list[dict[str, object]]]:
        data = read_json(self.db, None)
        if data is None:
            raise PackageError(f"recording package manager: no database at {self.db}")
        return dict(data)

    def installed(self) -> dict[str, str]:
        return dict(self._data().get("installed") or {})  # type: ignore[arg-type]

    def install(self, packages: dict[str, str]) -> str:
        data = self._data()
        installed = dict(data.get("installed") or {})  # type: ignore[arg-type]
        installed.update(packages)
        installs = [*list(data.get("installs") or []), {"at": utcnow(), "packages": dict(packages)}]
        write_json_atomic(self.db, {**data, "installed": installed, "installs": installs})
        return "recorded install of " + ", ".join(f"{n}={v}" for n, v in sorted(packages.items()))


def get_package_manager(config: AgentConfig) -> PackageManager | None:
    """The configured package manager; None when "auto" finds neither dpkg nor rpm."""
    chosen = config.package_manager or "auto"
    if chosen == "recording":
        if not config.package_db:
            raise PackageError("package_manager recording needs package_db")
        return RecordingPackageManager(Path(config.package_db))
    if chosen == "dpkg" or (chosen == "auto" and host_which(config, "dpkg-query")):
        return Dpkg(config)
    if chosen == "rpm" or (chosen == "auto" and host_which(config, "rpm")):
        return Rpm(config)
    if chosen != "auto":
        raise PackageError(f"unknown package_manager {chosen!r} (auto, dpkg, rpm, recording)")
    return None


def patterns_for(config: AgentConfig, component: str) -> list[str]:
    configured = config.packages.get(component)
    if isinstance(configured, str):
        return [configured]
    return list(configured or DEFAULT_PACKAGES.get(component, []))


def main(argv: list[str] | None = None) -> int:
    """The stand-in's command line, for test patch scripts: install name=version ... into a database."""
    parser = argparse.ArgumentParser(prog="python -m gpusweep_agent.packages")
    parser.add_argument("--db", required=True)
    parser.add_argument("action", choices=["install", "show"])
    parser.add_argument("packages", nargs="*")
    args = parser.parse_args(argv)
    manager = RecordingPackageManager(Path(args.db))
    if args.action == "show":
        print(json.dumps(manager.installed(), indent=1, sort_keys=True))
        return 0
    wanted = dict(item.split("=", 1) for item in args.packages)
    print(manager.install(wanted))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
