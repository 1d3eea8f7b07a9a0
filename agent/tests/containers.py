"""Real containers for the CRIU tests, built from the kernel's parts as a runtime builds them.

A container here is a process in its own mount, network, UTS, IPC and PID namespaces, whose root is an
overlay mount (lower: the host's /, upper: the container's own folder, so a file written there is only in
that container's root) mounted on the host as containerd mounts a container's ``rootfs``, entered with
pivot_root (the old root detached, so the container's mount table holds its root alone), with its own
hostname and its own cgroup (``gpusweep-test/<name>`` in every cgroup hierarchy the host mounts, v1 and v2).
Its first process is pid 1 of its PID namespace:

- ``workload``: pid 1 is the container's entrypoint, ``gpusweep-run``'s own child machinery
  (``NamespacedChild``): the command runs as pid 1 of a PID namespace nested in the container's, as
  ``gpusweep-run --pid-namespace`` runs it in a pod;
- ``placeholder``: pid 1 waits for the restored process tree to be handed to it and for it to end
  (``gpusweep_agent.run.hold_restored``, what ``gpusweep-run`` does in a replacement pod).

What differs from a real runtime: no user namespace, no seccomp or capability drop, no image (the host's
files through the overlay), no /proc or /dev mounted inside (the workload needs neither). Needs root.
Run as ``python containers.py <mode> <merged> <hostname> -- CMD...`` inside the new namespaces (``start``
does it).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_PARENT = "gpusweep-test"
AGENT_SRC = Path(__file__).resolve().parents[1] / "src"


def cgroup_mounts() -> dict[str, Path]:
    """Each cgroup hierarchy's key as /proc/<pid>/cgroup names it ("" for v2, "memory", "name=systemd") ->
    where it is mounted here."""
    found: dict[str, Path] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        fstype, _, options = after.split(" ", 2)
        point = Path(before.split()[4])
        if fstype == "cgroup2":
            found.setdefault("", point)
        elif fstype == "cgroup":
            keys = [o for o in options.split(",") if o not in ("rw", "ro") and not o.startswith("release_agent")]
            found.setdefault(",".join(k for k in keys if not k.startswith("name=")) or
                             next((k for k in keys if k.startswith("name=")), ""), point)
    return found


@dataclass
class Container:
    name: str
    folder: Path
    merged: Path
    proc: subprocess.Popen[bytes]
    cgroups: list[Path]

    @property
    def pid(self) -> int:
        """The container's pid 1, as the host sees it (what a runtime reports as the container's pid)."""
        return self.proc.pid

    def children(self) -> list[int]:
        return [int(p) for p in Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()]

    def stop(self) -> None:
        for cgroup in self.cgroups:
            # Everything in the container's cgroups, restored processes included, goes with it.
            try:
                members = [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
            except OSError:
                members = []
            for member in members:
                try:
                    os.kill(member, 9)
                except ProcessLookupError:
                    pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        remove_cgroups(self.cgroups)
        subprocess.run(["umount", "-l", str(self.merged)], check=False, capture_output=True)


def make_cgroups(name: str) -> list[Path]:
    """The cgroup `name` under ``gpusweep-test`` in every hierarchy mounted here, made if missing."""
    cgroups = []
    for mount in {str(p): p for p in cgroup_mounts().values()}.values():
        cgroup = mount / CGROUP_PARENT / name
        for level in (cgroup.parent, cgroup):
            level.mkdir(exist_ok=True)
            for knob in ("cpuset.cpus", "cpuset.mems"):  # a v1 cpuset admits no task until they are set
                if (level / knob).is_file() and not (level / knob).read_text().strip():
                    (level / knob).write_text((level.parent / knob).read_text())
        cgroups.append(cgroup)
    return cgroups


def remove_cgroups(cgroups: list[Path], wait: float = 10) -> None:
    deadline = time.monotonic() + wait
    for cgroup in cgroups:
        while cgroup.is_dir():
            try:
                cgroup.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)


def agent_container(folder: Path, name: str) -> tuple[list[str], list[Path]]:
    """A command prefix that runs the agent as a Kubernetes DaemonSet's privileged container runs it with
    ``hostPID`` (on containerd under cgroup v2): in a cgroup of its own and in its own mount namespace (no
    mount made on the host after it started shows in it) and cgroup namespace (rooted at its cgroup, so
    /proc/<pid>/cgroup names every other cgroup relative to it, ``/../...``), its /sys/fs/cgroup hierarchies
    mounted again inside that namespace so they show its own subtree only, as a container's do. Its PID,
    network, UTS and IPC namespaces stay the host's (hostPID; the test needs its port). Returns the prefix
    and the agent's cgroups (for remove_cgroups once it has stopped)."""
    cgroups = make_cgroups(f"agent-{name}")
    remount = []
    for key, point in cgroup_mounts().items():
        kind = "cgroup2" if key == "" else "cgroup"
        options = "" if key == "" else f"-o {'none,' + key if key.startswith('name=') else key} "
        remount.append(f"umount -l {point} && mount -t {kind} {options}{kind} {point}")
    script = folder / f"agent-container-{name}.sh"
    script.write_text(
        "set -e\n"
        + "".join(f"echo $$ > {cgroup}/cgroup.procs\n" for cgroup in cgroups)
        + "exec unshare --mount --cgroup --propagation private sh -c '"
        + " && ".join(remount)
        + " && exec \"$@\"' agent \"$@\"\n"
    )
    return ["sh", str(script)], cgroups


def start(folder: Path, name: str, mode: str, command: list[str], hostname: str = "",
          cgroup_name: str = "", cgroup_namespace: bool = False) -> Container:
    """A container `name` under `folder` running `command` (see the module docstring for `mode`), in the cgroup
    `cgroup_name` (default `name`) under ``gpusweep-test`` (a runtime names it after the container id); with
    `cgroup_namespace`, in a cgroup namespace of its own rooted there (containerd's under cgroup v2)."""
    upper, work, merged = folder / "upper", folder / "work", folder / "rootfs"
    for part in (upper, work, merged):
        part.mkdir(parents=True, exist_ok=True)
    (upper / f"only-in-{name}").write_text(name)
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir=/,upperdir={upper},workdir={work}",
                    str(merged)], check=True)
    cgroups = make_cgroups(cgroup_name or name)

    def enter() -> None:
        for cgroup in cgroups:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    proc = subprocess.Popen(
        ["unshare", "--mount", "--net", "--uts", "--ipc", "--pid", "--fork", "--propagation", "private",
         *(["--cgroup"] if cgroup_namespace else []),
         sys.executable, __file__, mode, str(merged), hostname or name, "--", *command],
        preexec_fn=enter, stdin=subprocess.DEVNULL, stdout=(folder / "out.log").open("ab"),
        stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(AGENT_SRC)})
    # The runtime reports the container's pid 1: unshare forks it, so it is unshare's child.
    deadline = time.monotonic() + 10
    while True:
        kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        # Entered once its root holds the file only this container's root has.
        if kids and Path(f"/proc/{kids[0]}/root/only-in-{name}").exists():
            break
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"container {name} did not start: {(folder / 'out.log').read_text()}")
        time.sleep(0.05)
    return Container(name, folder, merged, _Pid1(proc, int(kids[0])), cgroups)  # type: ignore[arg-type]


class _Pid1:
    """The container's pid 1 as a process handle (unshare waits for it; killing unshare alone would not)."""

    def __init__(self, unshare: subprocess.Popen[bytes], pid: int) -> None:
        self.unshare, self.pid = unshare, pid

    def poll(self) -> int | None:
        return self.unshare.poll()

    def kill(self) -> None:
        try:
            os.kill(self.pid, 9)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> int:
        return self.unshare.wait(timeout=timeout)


def _inside(mode: str, merged: str, hostname: str, command: list[str]) -> None:
    """pid 1 of the new namespaces: pivot into the root, then run as `mode` says."""
    libc = ctypes.CDLL(None, use_errno=True)
    os.chdir(merged)
    os.makedirs(".old-root", exist_ok=True)
    if libc.syscall(155, b".", b".old-root") != 0:  # pivot_root
        raise OSError(ctypes.get_errno(), "pivot_root")
    os.chdir("/")
    if libc.umount2(b"/.old-root", 2) != 0:  # MNT_DETACH
        raise OSError(ctypes.get_errno(), "umount /.old-root")
    os.rmdir("/.old-root")
    # Standard streams inside the root (a runtime hands the container its own; the host's /dev/null is
    # outside the container's mounts, which CRIU could not name).
    stdin = os.open("/stdin", os.O_RDONLY | os.O_CREAT, 0o644)
    console = os.open("/console.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(stdin, 0)
    os.dup2(console, 1)
    os.dup2(console, 2)
    os.close(stdin)
    os.close(console)
    libc.sethostname(hostname.encode(), len(hostname))
    if mode in ("workload", "nested"):
        from gpusweep_agent.run import NamespacedChild

        # As gpusweep-run runs it in a pod: the command a child of the container's pid 1, in the container's
        # PID namespace, or with --pid-namespace pid 1 of a namespace nested in it ("nested").
        child = NamespacedChild(new_namespace=mode == "nested")
        sys.exit(child.run(command, dict(os.environ)))
    if mode == "placeholder":
        from gpusweep_agent.run import hold_restored

        sys.exit(hold_restored(float(command[0]) if command else 3600.0))
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    _inside(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[5:])
