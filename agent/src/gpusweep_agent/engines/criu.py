"""The `criu` engine: the whole process tree (memory, threads, open files) through CRIU 4."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from ..util import pid_alive, proc_stat
from .base import CheckpointEngine, EngineError, EngineUnavailable, Progress

DUMP_OK = "Dumping finished successfully"


_versions: dict[tuple[str, int, int], tuple[int, ...] | None] = {}


def criu_version(binary: str) -> tuple[int, ...] | None:
    path = shutil.which(binary)
    if not path:
        return None
    # Asked once per binary (by path, inode and mtime): every checkpoint checks, and a run costs ~10 ms.
    st = os.stat(path)
    key = (path, st.st_ino, st.st_mtime_ns)
    if key not in _versions:
        _versions[key] = _run_version(path)
    return _versions[key]


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
        data.update(self.before_dump(pid, progress))
        image_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path(image_dir, "dump")
        args = [self.config.criu, "dump", "-t", str(pid), "-D", str(image_dir), "-o", str(log), "-v3",
                *self.common_options]
        if data["shell_job"]:
            args.append("--shell-job")
        if data["tcp_established"]:
            args.append("--tcp-established")
        if leave_running:
            args.append("--leave-running")
        else:
            # Stopped rather than killed by CRIU, which would wait while the kernel frees the
            # process's memory (about 50 ms a GiB); we kill it as soon as the images are complete.
            args.append("--leave-stopped")
        # Its own session and no pipes back to us: if the agent dies, CRIU still finishes (or
        # fails and thaws the process), and the log says which.
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        progress(helper_pid=proc.pid, log=str(log), leave_running=leave_running)
        rc = proc.wait()
        ok = rc == 0 and DUMP_OK in log.read_text(errors="replace")
        if ok and not leave_running:
            kill_tree(pid)
        self.after_dump(pid, leave_running, ok)
        if not ok:
            raise EngineError(f"criu dump of pid {pid} failed (exit {rc}): {tail(log)}")
        return data

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
        pid = int(workload.get("pid") or 0)
        if complete and not state.get("leave_running") and pid and stopped(pid):
            # The agent died between CRIU's end and its kill: finish what it was about to do.
            kill_tree(pid)
        return complete

    def restore_args(self, manifest: dict[str, Any], image_dir: Path, work_dir: Path) -> tuple[list[str], Path]:
        """The `criu restore` command line (detached, with a pidfile) and its pidfile."""
        engine_data = manifest.get("engine_data", {})
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

    def restore(self, manifest: dict[str, Any], image_dir: Path, work_dir: Path) -> int:
        self.check()
        engine_data = manifest.get("engine_data", {})
        args, pidfile = self.restore_args(manifest, image_dir, work_dir)
        log = self.log_path(image_dir, "restore")
        rc = subprocess.run(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            timeout=600, check=False).returncode
        if rc != 0 or not pidfile.is_file():
            hint = ""
            old = engine_data.get("pid")
            if old and pid_alive(int(old)):
                hint = f" (pid {old} is in use on this node; CRIU restores a process under its own pid)"
            raise EngineError(f"criu restore failed (exit {rc}){hint}: {tail(log)}")
        pid = int(pidfile.read_text().strip())
        self.after_restore(pid, engine_data)
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


def tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    errors = [line for line in text if "Error" in line or "error" in line]
    return " | ".join((errors or text)[-lines:])
