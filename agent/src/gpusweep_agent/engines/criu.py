"""The `criu` engine: the whole process tree (memory, threads, open files) through CRIU 4.

Pre-dumps shorten the pause: while the workload runs, rounds of ``criu pre-dump --track-mem``
copy its memory, each round only what changed since the one before (the kernel's soft-dirty
bits), until little changes; then ``criu dump --track-mem --prev-images-dir`` freezes it and
writes only the last changes. Each round is a folder of the image (``pre-1``, ``pre-2``...), and
CRIU links each dump to the round before it (``parent``); the manifest lists files only, so the
links are recorded in the engine data and put back before a restore (a fetched copy has none).
Where the kernel tracks no dirty memory (``criu check --feature mem_dirty_track`` fails, e.g. a
kernel built without CONFIG_MEM_SOFT_DIRTY) the dump is a plain one, and the engine data says so
with CRIU's words. Every round's figures (CRIU's own stats) and the frozen time go to the evidence.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..artifacts import fsync_tree
from ..util import host_pid, pid_alive, proc_stat
from . import lazy
from .base import CheckpointEngine, EngineError, EngineUnavailable, Progress, log_tail

DUMP_OK = "Dumping finished successfully"
# A pre-dump round that wrote fewer pages than this (16 MiB) leaves the final dump little to do.
PRE_DUMP_ENOUGH_PAGES = 4096
# CRIU's DumpStatsEntry (images/stats.proto): field number -> our name; times in microseconds.
STATS_FIELDS = {1: "freezing_us", 2: "frozen_us", 3: "memdump_us", 4: "memwrite_us", 5: "pages_scanned",
                6: "pages_skipped_parent", 7: "pages_written"}


_versions: dict[tuple[str, int, int], tuple[int, ...] | None] = {}
_dirty_tracking: dict[tuple[str, int, int], str] = {}


def _binary_key(binary: str) -> tuple[str, int, int] | None:
    # Asked once per binary (by path, inode and mtime): every checkpoint checks, and a run costs ~10 ms.
    path = shutil.which(binary)
    if not path:
        return None
    st = os.stat(path)
    return (path, st.st_ino, st.st_mtime_ns)


def criu_version(binary: str) -> tuple[int, ...] | None:
    key = _binary_key(binary)
    if key is None:
        return None
    if key not in _versions:
        _versions[key] = _run_version(key[0])
    return _versions[key]


def dirty_tracking_missing(binary: str) -> str:
    """"" when CRIU can track the memory a process dirties (what pre-dumps need); else why not, in CRIU's words."""
    key = _binary_key(binary)
    if key is None:
        return f"criu not found ({binary})"
    if key not in _dirty_tracking:
        done = subprocess.run([key[0], "check", "--feature", "mem_dirty_track"], capture_output=True, text=True,
                              timeout=30, check=False)
        said = " ".join((done.stdout + done.stderr).split())
        _dirty_tracking[key] = "" if done.returncode == 0 else \
            f"criu check --feature mem_dirty_track: exit {done.returncode}: {said or 'no output'}"
    return _dirty_tracking[key]


def _protobuf_fields(data: bytes) -> dict[int, int | bytes]:
    """The varint and length-delimited fields of one protobuf message (all CRIU's stats use)."""
    fields: dict[int, int | bytes] = {}
    at = 0

    def varint() -> int:
        nonlocal at
        value = shift = 0
        while True:
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while at < len(data):
        key = varint()
        if key & 7 == 0:
            fields[key >> 3] = varint()
        elif key & 7 == 2:
            size = varint()
            fields[key >> 3] = data[at:at + size]
            at += size
        else:
            break  # a wire type CRIU's stats do not use: stop rather than misread
    return fields


def dump_stats(folder: Path) -> dict[str, int]:
    """CRIU's own figures of the (pre-)dump in `folder`: its ``stats-dump`` image, a StatsEntry after
    two magic words and a size ({} when there is none or it cannot be read)."""
    try:
        data = (folder / "stats-dump").read_bytes()
        dump = _protobuf_fields(data[12:12 + int.from_bytes(data[8:12], "little")]).get(1)
        fields = _protobuf_fields(dump) if isinstance(dump, bytes) else {}
    except (OSError, IndexError):
        return {}
    return {name: value for number, name in STATS_FIELDS.items() if isinstance(value := fields.get(number), int)}


def parent_links(image_dir: Path) -> dict[str, str]:
    """The ``parent`` links CRIU left from each dump to the pre-dump before it: folder ("" for the image's
    own) -> where its link points, relative to it (link_parents puts them back)."""
    found: dict[str, str] = {}
    for folder in [image_dir, *sorted(image_dir.glob("pre-*"))]:
        link = folder / "parent"
        if link.is_symlink():
            found["" if folder == image_dir else folder.name] = os.readlink(link)
    return found


def link_parents(image_dir: Path, engine_data: dict[str, Any]) -> None:
    """Put back the ``parent`` links from each dump to the pre-dump before it, as recorded at the checkpoint."""
    root = image_dir.resolve()
    for rel, target in ((engine_data.get("dump") or {}).get("parents") or {}).items():
        folder = image_dir / rel if rel else image_dir
        if root not in (folder / target).resolve().parents or root not in [folder.resolve(), *folder.resolve().parents]:
            raise EngineError(f"the image's parent link {rel or '.'} -> {target} leaves the image folder")
        link = folder / "parent"
        if link.is_symlink() and os.readlink(link) == target:
            continue
        link.unlink(missing_ok=True)
        link.symlink_to(target)


def _run_version(path: str) -> tuple[int, ...] | None:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10, check=False).stdout
    match = re.search(r"Version:\s*([0-9.]+)", out)
    return tuple(int(p) for p in match.group(1).split(".") if p) if match else None


def has_tty(pid: int) -> bool:
    fields = proc_stat(pid)
    return fields is not None and int(fields[4]) != 0


def stopped(pid: int) -> bool:
    """True when `pid` exists and is stopped (CRIU's --leave-stopped leaves it so)."""
    fields = proc_stat(pid)
    return fields is not None and fields[0] in ("T", "t")


# /proc/net/tcp states that are not a connection: LISTEN and CLOSE.
_UNCONNECTED_TCP_STATES = {"0A", "07"}


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants, through /proc/<pid>/task/<tid>/children."""
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                queue.extend(int(child) for child in (task / "children").read_text().split())
            except (OSError, ValueError):
                continue
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL the tree CRIU left stopped. Stopped processes cannot fork, so the list is complete."""
    for member in process_tree(pid):
        try:
            os.kill(member, signal.SIGKILL)
        except ProcessLookupError:
            continue


def resume_tree(pid: int) -> None:
    """SIGCONT the tree CRIU left stopped (--leave-stopped stops each task with SIGSTOP; no cgroup freezer)."""
    for member in process_tree(pid):
        try:
            os.kill(member, signal.SIGCONT)
        except ProcessLookupError:
            continue


# Keys naming the container's namespaces in the image (``--external`` on dump, ``--inherit-fd`` on restore).
NET_KEY, PID_KEY = "gpusweep-netns", "gpusweep-pidns"
CLONE_NEWPID = 0x20000000


def _ns(pid: int | str, kind: str) -> int:
    return os.stat(f"/proc/{pid}/ns/{kind}").st_ino


def container_of(pid: int) -> dict[str, Any]:
    """How `pid` sits in a container, as the dump must record it ({} for a process in the agent's own
    network, PID and mount namespaces: a host process, as on a node without containers).

    A container's network namespace is the pod's, and its PID namespace the container's: both stay
    behind, so the image names them as external (``--external net[...]``, ``pid[...]``) and a restore
    puts the process back into the replacement container's. A process that is pid 1 of its own PID
    namespace (``gpusweep-run --pid-namespace``) carries that namespace in the image instead. The mount,
    UTS and IPC namespaces are dumped (CRIU can name no other as external) and joined or rebuilt on the
    container's root at the restore."""
    found: dict[str, Any] = {}
    for kind in ("net", "pid", "mnt"):
        if _ns(pid, kind) != _ns("self", kind):
            found[kind] = _ns(pid, kind)
    if not found:
        return {}
    nspid = [line.split()[1:] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
             if line.startswith("NSpid:")]
    # pid 1 of its own namespace: CRIU dumps that namespace with it (it cannot be external).
    if "pid" in found and nspid and nspid[0][-1] == "1":
        found["pid_init"] = True
    return found


def container_root(pid: int) -> str:
    """The host path of the root `pid` sees, for ``criu restore --root`` (CRIU bind-mounts it, which the
    kernel refuses from another mount namespace, so /proc/<pid>/root will not do): the mount on this host
    of the same filesystem and folder, as containerd and CRI-O mount a container's rootfs; /proc/<pid>/root
    when none is found."""
    def mounts(path: str) -> list[tuple[str, str, str]]:
        # (major:minor, root within the filesystem, mount point)
        return [(f[2], f[3], f[4]) for f in (line.split() for line in Path(path).read_text().splitlines())]

    mine = [m for m in mounts(f"/proc/{pid}/mountinfo") if m[2] == "/"]
    if mine:
        device, root, _ = mine[-1]
        best = ""
        for other_device, other_root, point in mounts("/proc/self/mountinfo"):
            if other_device != device or not (root == other_root or root.startswith(other_root.rstrip("/") + "/")):
                continue
            candidate = os.path.normpath(point + "/" + root[len(other_root):])
            if other_root == root:
                return candidate
            best = best or candidate
        if best:
            return best
    return f"/proc/{pid}/root"


def cgroup_files(pid: int, mountinfo: str = "/proc/self/mountinfo", under: str = "") -> list[str]:
    """The ``cgroup.procs`` file of each cgroup `pid` is in (each hierarchy mounted in the table `mountinfo`,
    v1 and v2), its mount points taken under `under` ("" for the caller's own mounts). Paths are as the
    caller's cgroup namespace shows them (/proc/<pid>/cgroup), each relative to its mount's root."""
    mounts: dict[str, tuple[str, str]] = {}  # hierarchy key -> (mount point, root within the hierarchy)
    for line in Path(mountinfo).read_text().splitlines():
        before, _, after = line.partition(" - ")
        fstype, _, options = after.split(" ", 2)
        root, point = before.split()[3:5]
        if fstype == "cgroup2":
            mounts.setdefault("", (point, root))
        elif fstype == "cgroup":
            for option in options.split(","):
                mounts.setdefault(option, (point, root))
    found = []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        mounted = mounts.get(controllers.split(",")[0])
        if mounted is None:
            continue
        point, root = mounted
        if root != "/" and (path == root or path.startswith(root + "/")):
            path = path[len(root):]
        found.append(under + os.path.join(point, path.lstrip("/"), "cgroup.procs"))
    return found


def enter_cgroups(pid: int) -> None:
    """Move the calling process into every cgroup `pid` is in (each hierarchy the host mounts, v1 and v2),
    so the processes it forks start there (CRIU's restored tree, with ``--manage-cgroups=ignore``)."""
    for procs in cgroup_files(pid):
        with open(procs, "w") as fh:
            fh.write(str(os.getpid()))


# Namespace and mount calls Python 3.11 lacks (os.setns and os.unshare came in 3.12), through libc.
CLONE_NEWNS, CLONE_NEWCGROUP = 0x20000, 0x2000000
MS_REC, MS_PRIVATE = 0x4000, 0x40000
# open_tree and move_mount (Linux 5.2) have these numbers on every architecture.
SYS_OPEN_TREE, SYS_MOVE_MOUNT = 428, 429
AT_FDCWD, OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC, MOVE_MOUNT_F_EMPTY_PATH = -100, 1, 0o2000000, 4
_libc = ctypes.CDLL(None, use_errno=True)


def _checked(result: int, what: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return result


def _setns(path: str, kind: int) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _checked(_libc.setns(fd, kind), f"setns {path}")
    finally:
        os.close(fd)


def enter_container_from_host(target: int, host: int, root_at: str) -> None:
    """For an agent in a container (its own mount and cgroup namespaces, hostPID): put the calling process
    (CRIU, forked for the restore) where a restore into `target`'s container needs it, as the node sees it.

    - cgroups: in the node's cgroup namespace (`host`'s), where /proc/<target>/cgroup names full paths and
      the kernel lets a process move between any two cgroups, into each of `target`'s, through the node's
      own cgroup mounts (/proc/<host>/mountinfo, under /proc/<host>/root): the agent's /sys/fs/cgroup shows
      its own subtree only. Then into `target`'s cgroup namespace, which the restored tree inherits.
    - root (`root_at`, "" for none): in a mount namespace of its own (a private copy of the agent's), the
      root filesystem `target` sees, cloned from `target`'s mount namespace (open_tree) and mounted at
      `root_at` for ``criu restore --root``: neither the host's mount of a container's rootfs nor
      /proc/<target>/root can be bind-mounted from the agent's mount namespace. Called after the fork, in
      the single-threaded child (setns into a mount namespace needs it)."""
    _setns(f"/proc/{host}/ns/cgroup", CLONE_NEWCGROUP)
    for procs in cgroup_files(target, f"/proc/{host}/mountinfo", f"/proc/{host}/root"):
        with open(procs, "w") as fh:
            fh.write(str(os.getpid()))
    _setns(f"/proc/{target}/ns/cgroup", CLONE_NEWCGROUP)
    if not root_at:
        return
    _checked(_libc.unshare(CLONE_NEWNS), "unshare a mount namespace")
    # Private, so the container's root mounted here shows in no other namespace.
    _checked(_libc.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None), "make the mounts private")
    mine = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(f"/proc/{target}/ns/mnt", CLONE_NEWNS)
        try:
            tree = _checked(_libc.syscall(SYS_OPEN_TREE, AT_FDCWD, b"/", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC),
                            f"open_tree of the root of pid {target}")
        finally:
            _checked(_libc.setns(mine, CLONE_NEWNS), "setns back")
    finally:
        os.close(mine)
    try:
        _checked(_libc.syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, root_at.encode(), MOVE_MOUNT_F_EMPTY_PATH),
                 f"move_mount to {root_at}")
    finally:
        os.close(tree)


def has_tcp_connections(pid: int) -> bool:
    """Whether any process in `pid`'s tree holds a TCP socket that is connected (or closing).

    CRIU refuses such a socket unless told --tcp-established, which also makes it lock the
    network namespace with nftables for the dump (about 25 ms), so it is passed only when needed.
    Anything unreadable counts as a connection: the flag is the safe side.
    """
    try:
        inodes: set[str] = set()
        namespaces: dict[str, int] = {}  # network namespace -> a member in it, whose /proc/<pid>/net shows it
        for member in process_tree(pid):
            namespaces.setdefault(os.readlink(f"/proc/{member}/ns/net"), member)
            for fd in Path(f"/proc/{member}/fd").iterdir():
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        if not inodes:
            return False
        for member in namespaces.values():
            for table in ("tcp", "tcp6"):
                for line in Path(f"/proc/{member}/net/{table}").read_text().splitlines()[1:]:
                    columns = line.split()
                    if columns[3] not in _UNCONNECTED_TCP_STATES and columns[9] in inodes:
                        return True
    except (OSError, IndexError):
        return True
    return False


class CriuEngine(CheckpointEngine):
    name = "criu"
    live = True
    # File locks are common in real jobs and harmless when absent; --tcp-established is added when needed.
    common_options = ("--file-locks",)
    # Pre-dumps copy memory while the process runs (the cuda engine moves GPU memory only at its dump).
    pre_dumps = True

    def check(self) -> None:
        version = criu_version(self.config.criu)
        if version is None:
            raise EngineUnavailable(f"criu not found ({self.config.criu}); run scripts/build-criu.sh as root")
        if version < (4,):
            raise EngineUnavailable(f"criu {'.'.join(map(str, version))} is too old; CRIU 4 is needed")

    def log_path(self, image_dir: Path, action: str) -> Path:
        # Logs live beside the image folder, not in it: the image's files are exactly what was dumped.
        folder = self.config.state_dir / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"{image_dir.name}-{action}.log"

    def before_dump(self, pid: int, progress: Progress) -> dict[str, Any]:
        return {}

    def after_dump(self, pid: int, leave_running: bool, ok: bool) -> None:
        """Hook for engines that prepare the process before CRIU (cuda)."""

    def after_restore(self, pid: int, engine_data: dict[str, Any]) -> None:
        """Hook for engines that finish the process after CRIU (cuda)."""

    def checkpoint(
        self, workload: dict[str, Any], image_dir: Path, leave_running: bool, progress: Progress
    ) -> dict[str, Any]:
        self.check()
        pid = int(workload["pid"])
        if not pid_alive(pid):
            raise EngineError(f"workload {workload['id']}: process {pid} is not running")
        data: dict[str, Any] = {"shell_job": has_tty(pid), "pid": pid, "tcp_established": has_tcp_connections(pid)}
        container = container_of(pid)
        if container:
            data["container"] = container
        data.update(self.before_dump(pid, progress))
        image_dir.mkdir(parents=True, exist_ok=True)
        rounds, why_plain = self._pre_dumps(pid, image_dir, data, progress)
        ok, rc, log, seconds = self._dump(pid, image_dir, data, leave_running, progress,
                                          rounds[-1]["folder"] if rounds else "")
        if not ok and rounds and pid_alive(pid) and not stopped(pid):
            # CRIU thaws a workload whose dump failed: try once more without the pre-dumps, recorded as such.
            why_plain = f"criu dump on the pre-dumps failed (exit {rc}): {log_tail(log)}"
            rounds = []
            for entry in image_dir.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            ok, rc, log, seconds = self._dump(pid, image_dir, data, leave_running, progress, "")
        if ok and not leave_running:
            kill_tree(pid)
        self.after_dump(pid, leave_running, ok)
        if not ok:
            raise EngineError(f"criu dump of pid {pid} failed (exit {rc}): {log_tail(log)}")
        final: dict[str, Any] = {"round": len(rounds) + 1, "kind": "dump", "folder": ".",
                                 "seconds": seconds, **dump_stats(image_dir)}
        data["dump"] = {"mode": "pre-dump" if rounds else "plain", "rounds": [*rounds, final],
                        "parents": parent_links(image_dir),
                        "frozen_ms": round(final["frozen_us"] / 1000, 1) if "frozen_us" in final else None,
                        **({"plain_because": why_plain} if why_plain else {})}
        return data

    def checkpoint_lazy(self, workload: dict[str, Any], image_dir: Path, address: str, port: int,
                        progress: Progress) -> tuple[dict[str, Any], subprocess.Popen[bytes], Path]:
        """A lazy dump (engines/lazy.py): the images but the memory contents in `image_dir`, and CRIU
        left serving the pages from the frozen workload on `address`:`port`. Returns the engine data, the
        running `criu dump` (it ends when every page has gone, leaving the workload stopped, or when the
        stream broke, thawing it) and its log."""
        self.check()
        pid = int(workload["pid"])
        if not pid_alive(pid):
            raise EngineError(f"workload {workload['id']}: process {pid} is not running")
        data: dict[str, Any] = {"shell_job": has_tty(pid), "pid": pid, "tcp_established": has_tcp_connections(pid)}
        # CRIU writes into a folder of its own: it adds its stats after the last page, past the seal.
        work = self.config.state_dir / "lazy" / image_dir.name
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        log = self.log_path(image_dir, "dump")
        args = [self.config.criu, "dump", "-t", str(pid), "-D", str(work), "-o", str(log), "-v3",
                *self._options(data), "--lazy-pages", "--address", address, "--port", str(port),
                # Two-phase release: when the page server ends, CRIU leaves the workload stopped (not
                # killed); the agent kills it once the receiver says every page is in the restored
                # process, and resumes it otherwise (agent.py, _decide_lazy_source). A failed stream
                # still thaws it (CRIU resumes the tasks whenever the dump fails).
                "--leave-stopped"]
        started = time.monotonic()
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=self._in_host_cgroups())
        progress(helper_pid=proc.pid, log=str(log), leave_running=False)
        if not lazy.wait_for_line(proc, log, lazy.SERVING):
            proc.kill()
            proc.wait()
            raise EngineError(f"criu dump --lazy-pages of pid {pid} failed (exit {proc.returncode}): {log_tail(log)}")
        lazy.copy_images(work, image_dir)
        data["dump"] = {"mode": "lazy", "rounds": [{"round": 1, "kind": "dump", "folder": ".", "lazy": True,
                                                    "seconds": round(time.monotonic() - started, 3)}],
                        "parents": {}, "frozen_ms": lazy.frozen_ms(log),
                        "page_server": {"address": address, "port": port}}
        return data, proc, log

    def restore_lazy(self, manifest: dict[str, Any], image_dir: Path, work_dir: Path) -> tuple[int, dict[str, Any]]:
        """Restore a lazy dump: CRIU's lazy-pages daemon connected to the source's page server, then
        `criu restore --lazy-pages`. Returns the pid and what the agent watches until every page arrived:
        the daemon, its log, the userfaultfds held for it and when the restore began."""
        self.check()
        server = (manifest.get("engine_data") or {}).get("dump", {}).get("page_server") or {}
        args, pidfile = self.restore_args(manifest, image_dir, work_dir)
        daemon_log = self.log_path(image_dir, "lazy-pages")
        socket_path = work_dir / "lazy-pages.socket"
        socket_path.unlink(missing_ok=True)
        started = time.monotonic()
        daemon = subprocess.Popen(
            [self.config.criu, "lazy-pages", "--page-server", "--address", str(server.get("address")),
             "--port", str(server.get("port")), "-D", str(image_dir), "-W", str(work_dir), "-o", str(daemon_log),
             "-v4"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        lazy.wait_for_socket(daemon, socket_path, daemon_log)
        log = self.log_path(image_dir, "restore")
        rc = subprocess.run([*args, "--lazy-pages"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, timeout=600, check=False).returncode
        if rc != 0 or not pidfile.is_file():
            daemon.kill()
            daemon.wait()
            raise EngineError(f"criu restore --lazy-pages failed (exit {rc}): {log_tail(log)} | lazy-pages: "
                              f"{log_tail(daemon_log)}")
        pid = int(pidfile.read_text().strip())
        held = lazy.hold_userfaultfds(daemon.pid)
        return pid, {"daemon": daemon, "log": daemon_log, "held": held, "started": started}

    def _dump(self, pid: int, image_dir: Path, data: dict[str, Any], leave_running: bool, progress: Progress,
              parent: str) -> tuple[bool, int, Path, float]:
        """`criu dump`, on top of the pre-dump in `parent` if any: (complete, exit code, log, seconds)."""
        log = self.log_path(image_dir, "dump")
        args = [self.config.criu, "dump", "-t", str(pid), "-D", str(image_dir), "-o", str(log), "-v3",
                *self._options(data)]
        if parent:
            args += ["--track-mem", "--prev-images-dir", parent]
        if leave_running:
            args.append("--leave-running")
        else:
            # Stopped rather than killed by CRIU, which would wait while the kernel frees the
            # process's memory (about 50 ms a GiB); we kill it as soon as the images are complete.
            args.append("--leave-stopped")
        # Its own session and no pipes back to us: if the agent dies, CRIU still finishes (or
        # fails and thaws the process), and the log says which.
        started = time.monotonic()
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=self._in_host_cgroups())
        progress(helper_pid=proc.pid, log=str(log), leave_running=leave_running)
        rc = proc.wait()
        ok = rc == 0 and DUMP_OK in log.read_text(errors="replace")
        return ok, rc, log, round(time.monotonic() - started, 3)

    def _in_host_cgroups(self) -> Callable[[], None] | None:
        """For an agent in a container: CRIU's dump runs in the node's cgroup namespace, where it reads the
        workload's cgroups as full paths (in the agent's own, /../.. paths CRIU refuses). None on the node."""
        host = host_pid(self.config)
        return None if host is None else functools.partial(_setns, f"/proc/{host}/ns/cgroup", CLONE_NEWCGROUP)

    def _options(self, data: dict[str, Any]) -> list[str]:
        container = data.get("container") or {}
        externals = []
        if "net" in container:
            # The pod's network namespace stays with the pod; the image names it, and --network-lock
            # nftables locks it without the iptables tools a node may lack.
            externals += ["--external", f"net[{container['net']}]:{NET_KEY}", "--network-lock", "nftables"]
        if "pid" in container and not container.get("pid_init"):
            externals += ["--external", f"pid[{container['pid']}]:{PID_KEY}"]
        return [*self.common_options, *(["--shell-job"] if data["shell_job"] else []),
                *(["--tcp-established"] if data["tcp_established"] else []), *externals]

    def _pre_dumps(self, pid: int, image_dir: Path, data: dict[str, Any],
                   progress: Progress) -> tuple[list[dict[str, Any]], str]:
        """Copy the workload's memory while it runs, round after round, each round only the pages
        dirtied since the one before, until a round writes little (PRE_DUMP_ENOUGH_PAGES) or no
        less than half the round before (the workload dirties as fast as we copy), or
        ``criu_pre_dumps`` rounds. Returns the rounds, or none and why the dump is a plain one."""
        if self.config.criu_pre_dumps <= 0 or not self.pre_dumps:
            return [], "pre-dumps are off (criu_pre_dumps = 0)" if self.pre_dumps else ""
        missing = dirty_tracking_missing(self.config.criu)
        if missing:
            return [], missing
        rounds: list[dict[str, Any]] = []
        for number in range(1, self.config.criu_pre_dumps + 1):
            folder = f"pre-{number}"
            (image_dir / folder).mkdir()
            log = self.log_path(image_dir, f"pre-dump-{number}")
            args = [self.config.criu, "pre-dump", "-t", str(pid), "-D", str(image_dir / folder), "-o", str(log),
                    "-v3", "--track-mem", *self._options(data)]
            if rounds:
                args += ["--prev-images-dir", f"../{rounds[-1]['folder']}"]
            started = time.monotonic()
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=self._in_host_cgroups())
            progress(helper_pid=proc.pid, log=str(log), leave_running=True)
            if proc.wait() != 0:
                # A pre-dump leaves the workload running whatever happens: drop the rounds, dump plainly.
                for done in (*rounds, {"folder": folder}):
                    shutil.rmtree(image_dir / done["folder"], ignore_errors=True)
                return [], f"criu pre-dump round {number} failed (exit {proc.returncode}): {log_tail(log)}"
            stats = dump_stats(image_dir / folder)
            if self.config.checkpoint_fsync:
                fsync_tree(image_dir / folder)  # while the workload runs, not in its pause
            rounds.append({"round": number, "kind": "pre-dump", "folder": folder,
                           "seconds": round(time.monotonic() - started, 3), **stats})
            written = stats.get("pages_written")
            before = rounds[-2].get("pages_written") if len(rounds) > 1 else None
            if written is None or written < PRE_DUMP_ENOUGH_PAGES or (before is not None and written * 2 > before):
                break
        return rounds, ""

    def recover(self, workload: dict[str, Any], image_dir: Path, state: dict[str, Any]) -> bool:
        # The agent may have died before it recorded CRIU's pid: find CRIU by its image folder.
        helpers = set(processes_mentioning(str(image_dir)))
        if state.get("helper_pid"):
            helpers.add(int(state["helper_pid"]))
        deadline = time.monotonic() + 600
        while any(pid_alive(p) for p in helpers) and time.monotonic() < deadline:
            time.sleep(0.1)
        log = Path(state.get("log") or self.log_path(image_dir, "dump"))
        complete = log.is_file() and DUMP_OK in log.read_text(errors="replace")
        # Rounds of pre-dump the image builds on: recorded as the checkpoint would have (the agent died first).
        self.recovered = {"dump": {"mode": "pre-dump" if parent_links(image_dir) else "plain", "recovered": True,
                                   "rounds": [], "parents": parent_links(image_dir), "frozen_ms": None}}
        pid = int(workload.get("pid") or 0)
        if complete and not state.get("leave_running") and pid and stopped(pid):
            # The agent died between CRIU's end and its kill: finish what it was about to do.
            kill_tree(pid)
        return complete

    def restore_args(self, manifest: dict[str, Any], image_dir: Path, work_dir: Path) -> tuple[list[str], Path]:
        """The `criu restore` command line (detached, with a pidfile) and its pidfile."""
        engine_data = manifest.get("engine_data", {})
        link_parents(image_dir, engine_data)
        work_dir.mkdir(parents=True, exist_ok=True)
        pidfile = work_dir / "restored.pid"
        pidfile.unlink(missing_ok=True)
        log = self.log_path(image_dir, "restore")
        # -W keeps CRIU's own restore files (stats) out of the verified image folder.
        args = [self.config.criu, "restore", "-D", str(image_dir), "-W", str(work_dir), "-o", str(log), "-v3",
                "--restore-detached", "--pidfile", str(pidfile), *self.common_options]
        if engine_data.get("shell_job"):
            args.append("--shell-job")
        # Not recorded (a checkpoint finished after an agent restart): pass it; it costs only time.
        if engine_data.get("tcp_established", True):
            args.append("--tcp-established")
        return args, pidfile

    def restore(self, manifest: dict[str, Any], image_dir: Path, work_dir: Path, into: int | None = None) -> int:
        """`criu restore` of the image; with `into` (the host pid of a container's process: the replacement
        pod's container) into that container: its root, namespaces and cgroups (``into_container``)."""
        self.check()
        engine_data = manifest.get("engine_data", {})
        args, pidfile = self.restore_args(manifest, image_dir, work_dir)
        log = self.log_path(image_dir, "restore")
        fds: list[int] = []
        enter: Callable[[], None] | None = None
        why = work_dir / "enter-container.error"
        why.unlink(missing_ok=True)
        try:
            if into is not None:
                host = host_pid(self.config)
                # An agent in a container takes the node's view of the target's cgroups and root (see
                # enter_container_from_host); one on the node has it already.
                root_at = ""
                if host is not None and "mnt" in (engine_data.get("container") or {}):
                    root_at = str(work_dir / "root")
                    os.makedirs(root_at, exist_ok=True)
                extra, fds = into_container(engine_data, into, root_at)
                args += extra
                enter = functools.partial(enter_cgroups, into) if host is None else \
                    functools.partial(enter_container_from_host, into, host, root_at)
            rc = subprocess.run(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                timeout=600, check=False, pass_fds=fds,
                                preexec_fn=functools.partial(_noting, enter, why) if enter else None).returncode
        except (OSError, subprocess.SubprocessError) as exc:  # the container is gone, or cannot be entered
            said = why.read_text() if why.is_file() else str(exc)
            raise EngineError(f"cannot restore into the container of pid {into}: {said}") from None
        finally:
            for fd in fds:
                os.close(fd)
        if rc != 0 or not pidfile.is_file():
            hint = ""
            old = engine_data.get("pid")
            if old and pid_alive(int(old)):
                hint = f" (pid {old} is in use on this node; CRIU restores a process under its own pid)"
            raise EngineError(f"criu restore failed (exit {rc}){hint}: {log_tail(log)}")
        pid = int(pidfile.read_text().strip())
        self.after_restore(pid, engine_data)
        return pid


def _noting(enter: Callable[[], None], why: Path) -> None:
    """Run `enter` in the forked child before CRIU starts, writing why it failed to `why` (subprocess reports
    only that the child's preparation failed)."""
    try:
        enter()
    except Exception as exc:
        why.write_text(str(exc))
        raise


def into_container(engine_data: dict[str, Any], target: int, root: str = "") -> tuple[list[str], list[int]]:
    """The `criu restore` options that put the image's tree into the container whose process is `target`
    (host pid), and the descriptors they name (open, for the caller to pass and close).

    - root: an image with its own mount namespace (dumped in a container) gets a new one built on the
      container's root filesystem (``--root``: `root`, where the caller mounts it, else its host path,
      ``container_root``); CRIU cannot join a
      mount namespace while it restores one. An image without one joins the container's (``--join-ns mnt``).
    - network: the pod's namespace, external in the image, is the container's (``--inherit-fd``), else joined.
    - UTS and IPC: joined (``--join-ns``); an image that carries its own (dumped in a container) writes its
      hostname and IPC objects into them, so the replacement pod's hostname becomes the original's.
    - PID: external in the image (the workload was not pid 1 of its namespace), the container's
      (``--inherit-fd``; CRIU's ``--join-ns`` has no pid) under the same pid, which must be free there; an
      image holding its own PID namespace (``gpusweep-run --pid-namespace``) gets a new one, not nested in
      the container's (the kernel creates no PID namespace for a process that joined another: CRIU would
      have to fork in between).
    - cgroups: CRIU runs in the container's cgroups and leaves them alone (``--manage-cgroups=ignore``), so
      every restored process starts in them (``enter_cgroups``)."""
    container = engine_data.get("container") or {}
    args = ["--manage-cgroups=ignore"]
    fds: list[int] = []
    if "mnt" in container:
        args += ["--root", root or container_root(target)]
    else:
        args += ["--join-ns", f"mnt:/proc/{target}/ns/mnt"]
    try:
        if "net" in container:
            fds.append(os.open(f"/proc/{target}/ns/net", os.O_RDONLY))
            args += ["--inherit-fd", f"fd[{fds[-1]}]:{NET_KEY}", "--network-lock", "nftables"]
        else:
            args += ["--join-ns", f"net:/proc/{target}/ns/net"]
        if "pid" in container and not container.get("pid_init"):
            fds.append(os.open(f"/proc/{target}/ns/pid", os.O_RDONLY))
            args += ["--inherit-fd", f"fd[{fds[-1]}]:{PID_KEY}"]
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    args += ["--join-ns", f"uts:/proc/{target}/ns/uts", "--join-ns", f"ipc:/proc/{target}/ns/ipc"]
    return args, fds


def container_process(params: dict[str, Any]) -> int | None:
    """The host pid of the container a restore goes into: ``container_pid`` (the container's pid as its
    runtime reports it, e.g. ``crictl inspect``'s ``info.pid``), or ``container_id`` (the pod status's
    ``containerID``, ``containerd://<id>``), found through the cgroups: the process in the container's
    cgroup that is pid 1 of its PID namespace. None when neither is given (a restore beside, as a host
    process). Raises EngineError when the container cannot be found."""
    if params.get("container_pid") not in (None, ""):
        pid = int(params["container_pid"])
        if not pid_alive(pid):
            raise EngineError(f"container process {pid} is not running")
        return pid
    wanted = str(params.get("container_id") or "").split("://")[-1]
    if not wanted:
        return None
    if not re.fullmatch(r"[0-9a-f]{12,64}", wanted):
        raise EngineError(f"container id {wanted!r} is not a runtime's container id")
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if wanted in (entry / "cgroup").read_text():
                    found.append(int(entry.name))
            except OSError:
                continue
    for pid in sorted(found):
        try:
            if ns_pid(pid) == 1:
                return pid
        except OSError:
            continue
    if found:
        return min(found)
    raise EngineError(f"no process of container {wanted} on this node (its cgroup names none)")


def ns_pid(pid: int) -> int:
    """`pid` as its own PID namespace numbers it (the last of /proc/<pid>/status NSpid)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return pid


def processes_mentioning(word: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if word.encode() in argv:
                found.append(int(entry.name))
    return found
