"""Lazy moves for the criu engine: the workload resumes on the receiver before its memory has arrived.

The source freezes the workload and runs ``criu dump --lazy-pages --address A --port P``: CRIU writes
every image except the memory contents, then serves the pages from the frozen process (its own page
server). The agent copies those images (``*.img`` as they stand when CRIU says "Starting page
server") into the checkpoint's folder and seals them like any other image: manifest, SHA-256,
fetched and checked by the receiver. The receiver starts ``criu lazy-pages --page-server`` against
the source's page server and ``criu restore --lazy-pages``: the process runs at once, each page it
touches first is fetched on its fault (userfaultfd), and the rest are pushed in the background.

What this trades: until all pages have arrived the restored workload depends on the source. The
release is two-phase (agent.py): the dump runs with ``--leave-stopped``, so when the page server ends
CRIU leaves the source's copy stopped, not killed; the source's agent kills it only when the
receiver's agent reports every page in the restored process, and resumes it (SIGCONT) when the
receiver reports a failure or falls silent. If the stream breaks, CRIU's dump thaws the source's copy
itself, which runs on (the fallback), and the receiver's agent kills the restored copy: its missing
pages are gone. So that the restored copy never reads a page that did not arrive as zeros, the
receiving agent holds a duplicate of each userfaultfd (``pidfd_getfd``) while the daemon works: if the
daemon dies, the faults wait for the agent's kill instead of completing with empty pages.

The pages themselves travel over CRIU's page-server protocol, outside the manifest: not hashed, and
without TLS unless the network is trusted (the page server listens on ``lazy_pages_address``).
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from ..util import pid_alive, proc_stat
from .base import EngineError, log_tail

SERVING = "Starting page server"
SERVED = "Lazy pages transfer finished successfully"
# CRIU's page server widens its pipes to PIPE_MAX_SIZE (819 pages, rounded by the kernel to 4 MiB);
# above fs.pipe-max-size that needs CAP_SYS_RESOURCE, and CRIU 4.1.1 ignores the refusal and then
# fails at the first request ("page-pipe: tee: 65536: Operation not permitted").
PIPE_BYTES_NEEDED = 4 * 1024 * 1024
CAP_SYS_RESOURCE = 24
SYS_PIDFD_OPEN, SYS_PIDFD_GETFD = 434, 438
TRANSFERRED_RE = re.compile(r"UFFD transferred pages: \((\d+)/(\d+)\)")

_uffd: dict[str, str] = {}


def has_capability(bit: int) -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> bit & 1)
    return False


def lazy_pages_missing(binary: str) -> str:
    """"" when CRIU can move a process lazily here; else why not, in the kernel's or CRIU's words."""
    if binary not in _uffd:
        done = subprocess.run([binary, "check", "--feature", "uffd-noncoop"], capture_output=True, text=True,
                              timeout=30, check=False)
        said = " ".join((done.stdout + done.stderr).split())
        _uffd[binary] = "" if done.returncode == 0 else \
            f"criu check --feature uffd-noncoop: exit {done.returncode}: {said or 'no output'}"
    if _uffd[binary]:
        return _uffd[binary]
    try:
        pipe_max = int(Path("/proc/sys/fs/pipe-max-size").read_text())
    except (OSError, ValueError):
        pipe_max = 0
    if pipe_max < PIPE_BYTES_NEEDED and not has_capability(CAP_SYS_RESOURCE):
        return (f"fs.pipe-max-size is {pipe_max} and the agent lacks CAP_SYS_RESOURCE: CRIU's page server "
                f"cannot widen its pipes to {PIPE_BYTES_NEEDED} bytes and fails at the first page ('page-pipe: "
                f"tee: 65536: Operation not permitted'); set sysctl fs.pipe-max-size={PIPE_BYTES_NEEDED}")
    return ""


def wait_for_line(proc: subprocess.Popen[bytes], log: Path, line: str, timeout: float = 600) -> bool:
    """Until `line` is in `log` (True) or `proc` ended without it (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.is_file() and line in log.read_text(errors="replace"):
            return True
        if proc.poll() is not None:
            return log.is_file() and line in log.read_text(errors="replace")
        time.sleep(0.005)
    return False


def frozen_ms(log: Path) -> float | None:
    """How long the workload had been frozen when CRIU began to serve its pages: from the first task
    CRIU seized to "Starting page server", by the time stamps of CRIU's own log (None if unreadable)."""
    seized = serving = None
    for line in log.read_text(errors="replace").splitlines() if log.is_file() else []:
        if (seized is None and "Seized task" in line) or SERVING in line:
            try:
                stamp = float(line[1:line.index(")")])
            except ValueError:
                continue
            if SERVING in line:
                serving = stamp
            else:
                seized = stamp
    return round((serving - seized) * 1000, 1) if seized is not None and serving is not None else None


def copy_images(work: Path, image_dir: Path) -> None:
    """The images CRIU has written when it starts serving pages: everything but its closing stats."""
    image_dir.mkdir(parents=True, exist_ok=True)
    for path in work.glob("*.img"):
        shutil.copyfile(path, image_dir / path.name)


def transferred(log: Path) -> tuple[int, int]:
    """(pages arrived, pages expected) over every restored process, from the lazy-pages daemon's log."""
    done = total = 0
    seen: dict[int, tuple[int, int]] = {}
    for number, match in enumerate(TRANSFERRED_RE.finditer(log.read_text(errors="replace") if log.is_file() else "")):
        seen[number] = (int(match.group(1)), int(match.group(2)))
    for arrived, expected in seen.values():
        done += arrived
        total += expected
    return done, total


def hold_userfaultfds(daemon_pid: int) -> list[int]:
    """Duplicates of the daemon's userfaultfds in this process (pidfd_getfd), so that the restored
    process's missing pages stay missing (its faults wait) if the daemon dies; [] where it cannot."""
    libc = ctypes.CDLL(None, use_errno=True)
    held: list[int] = []
    pidfd = libc.syscall(SYS_PIDFD_OPEN, daemon_pid, 0)
    if pidfd < 0:
        return held
    try:
        for entry in Path(f"/proc/{daemon_pid}/fd").iterdir():
            try:
                if os.readlink(entry) != "anon_inode:[userfaultfd]":
                    continue
            except OSError:
                continue
            fd = libc.syscall(SYS_PIDFD_GETFD, pidfd, int(entry.name), 0)
            if fd >= 0:
                held.append(fd)
    except OSError:
        pass
    finally:
        os.close(pidfd)
    return held


def release(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            continue


def wait_for_socket(daemon: subprocess.Popen[bytes], socket_path: Path, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not socket_path.exists():
        if daemon.poll() is not None or time.monotonic() > deadline:
            raise EngineError(f"criu lazy-pages did not start (exit {daemon.poll()}): {log_tail(log)}")
        time.sleep(0.002)


def outcome(proc: subprocess.Popen[bytes], log: Path, started: float) -> dict[str, Any]:
    """Wait for a lazy dump's page server to end: what became of the source's frozen copy."""
    rc = proc.wait()
    text = log.read_text(errors="replace") if log.is_file() else ""
    ok = rc == 0 and SERVED in text
    return {"state": "complete" if ok else "failed", "exit": rc, "serving_s": round(time.monotonic() - started, 3),
            **({} if ok else {"error": log_tail(log)})}


def ended_by_log(log: Path, started: float) -> dict[str, Any]:
    """A lazy dump's outcome read from its log alone: for an agent restarted while CRIU served (not its child)."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    ok = SERVED in text
    return {"state": "complete" if ok else "failed", "exit": None, "serving_s": round(time.monotonic() - started, 3),
            **({} if ok else {"error": log_tail(log)})}


def start_time(pid: int) -> str:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat): with the pid, one process
    for good, so that an agent restarted later never signals a process that took over the number."""
    fields = proc_stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else ""


def same_process(pid: int, started: str) -> bool:
    return bool(pid) and bool(started) and start_time(pid) == started


def kill_if_alive(pid: int) -> None:
    if pid and pid_alive(pid):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def fence(lease: Path, pid: int, started: str, seconds: float) -> None:
    """The receiver's copy's backstop, in a process of its own (started by the receiving agent at the
    restore): while the copy runs unreleased, the agent touches `lease` at each word from the source's
    agent; a lease older than `seconds` (the agent dead or stuck, the source soon free to resume its own
    copy) kills the copy. It ends when the lease says "released" or the copy is gone."""
    from .criu import kill_tree  # criu imports this module

    began = time.time()
    while same_process(pid, started):
        try:
            said = lease.read_text().strip()
            age = time.time() - lease.stat().st_mtime
        except OSError:  # no lease (yet, or its folder went): it counts from the fence's start
            said, age = "", time.time() - began
        if said == "released":
            return
        if age > seconds:
            kill_tree(pid)
            return
        time.sleep(0.2)


def touch(lease: Path, text: str = "") -> None:
    """Renew the fence's lease (or end it: "released")."""
    try:
        lease.parent.mkdir(parents=True, exist_ok=True)
        lease.write_text(text)
    except OSError:
        pass


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 6 and sys.argv[1] == "fence":
        fence(Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5]))
    else:
        raise SystemExit("usage: python -m gpusweep_agent.engines.lazy fence <lease> <pid> <start time> <seconds>")
