"""An agent in a container patching its node (settings ``host_exec`` and ``host_root``, as the Kubernetes
DaemonSet sets them to ``nsenter -t 1 -m -u -i -n -p --`` and ``/proc/1/root``). No container can run here,
so the node is a folder (its root: ``etc/os-release``, its own ``dpkg-query`` and install command in
``usr/bin``) and entering it is a wrapper that records each command and runs it with the node's commands
first on its PATH, as nsenter into the node's mount namespace would find them. Each reader and writer of
the node goes through it: the OS report, the facts, the rollback's package manager, a patch and the
reboot (through a real agent process)."""

from __future__ import annotations

import shlex
from pathlib import Path

from agent_helpers import AgentProcess, wait_for
from gpusweep_agent.config import AgentConfig
from gpusweep_agent.facts import KernelProbe, PackagesProbe
from gpusweep_agent.osinfo import OsProbe
from gpusweep_agent.packages import Dpkg, get_package_manager
from gpusweep_agent.patch import get_patch_method

DPKG = """#!/bin/sh
# dpkg-query -W -f FORMAT: the node's packages, in the format asked for
case "$3" in
  *Architecture*) printf 'nvidia-driver-570\\t570.195.03-0ubuntu1\\tamd64\\t\\t\\tinstalled\\n' ;;
  *) printf 'nvidia-driver-570\\t570.195.03-0ubuntu1\\tinstalled\\n' ;;
esac
"""


def node(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The node's root, the wrapper that enters it, and the wrapper's log of what it ran."""
    root, log = tmp_path / "node", tmp_path / "entered.log"
    (root / "etc").mkdir(parents=True)
    (root / "etc/os-release").write_text('ID=rhel\nVERSION_ID="9.4"\n')
    bin_dir = root / "usr/bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("dpkg-query", DPKG),
                       ("install-on-node", f'#!/bin/sh\necho "$@" >> {shlex.quote(str(tmp_path / "installed"))}\n'),
                       ("reboot-node", f'#!/bin/sh\ntouch {shlex.quote(str(tmp_path / "rebooted"))}\n')):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    enter = tmp_path / "enter"
    enter.write_text(f'#!/bin/sh\nprintf "%s\\n" "$1" >> {shlex.quote(str(log))}\n'
                     f'PATH={shlex.quote(str(bin_dir))}:$PATH exec "$@"\n')
    enter.chmod(0o755)
    return root, enter, log


def entered(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_the_os_report_facts_and_package_manager_read_the_node(tmp_path: Path) -> None:
    root, enter, log = node(tmp_path)
    config = AgentConfig(host_exec=str(enter), host_root=root)
    assert KernelProbe(config).probe()["components"]["os"] == "rhel 9.4"
    report = OsProbe.of(config).report()
    assert report is not None and report["release"] == {"ID": "rhel", "VERSION_ID": "9.4"}
    assert report["packages"] == [["nvidia-driver-570", "570.195.03-0ubuntu1", "amd64", "nvidia-driver-570",
                                   "570.195.03-0ubuntu1"]]
    assert PackagesProbe(config).probe()["components"]["driver"] == "570.195.03"
    manager = get_package_manager(config)
    assert isinstance(manager, Dpkg) and manager.installed() == {"nvidia-driver-570": "570.195.03-0ubuntu1"}
    # The report's package list and livepatch state (none on this node), the facts, the rollback's reader.
    assert entered(log) == ["dpkg-query", "canonical-livepatch", "kpatch", "dpkg-query", "dpkg-query"]
    # Without the settings the same readers look at this machine, not the folder.
    assert KernelProbe(AgentConfig()).probe()["components"].get("os") != "rhel 9.4"


def test_a_patch_and_the_reboot_run_on_the_node(tmp_path: Path) -> None:
    root, enter, log = node(tmp_path)
    config = AgentConfig(host_exec=str(enter), host_root=root,
                         patch_methods={"package": {"commands": {"driver": "install-on-node driver={version}"}}})
    get_patch_method("package", config).apply("driver", "570.195.03")
    assert (tmp_path / "installed").read_text() == "driver=570.195.03\n"
    assert entered(log) == ["install-on-node"]

    agent = AgentProcess(tmp_path, "gpu-host", tmp_path / "artifacts", host_exec=str(enter), host_root=str(root),
                         reboot_command="reboot-node").start()
    try:
        agent.client.submit("/v1/reboot", "host-reboot")
        assert wait_for(lambda: (tmp_path / "rebooted").exists(), 20, what="the node's reboot command")
        assert "reboot-node" in entered(log)
    finally:
        agent.stop()
