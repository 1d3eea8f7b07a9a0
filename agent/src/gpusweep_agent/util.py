"""Small helpers: atomic JSON files, UTC timestamps, process checks."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import AgentConfig

# Where a node keeps its commands, for host_which under a host_root.
HOST_PATH = ("usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin")


def host_argv(config: AgentConfig, argv: list[str]) -> list[str]:
    """`argv` as run on the node: behind the host_exec prefix (nsenter into PID 1's namespaces) if set."""
    return [*shlex.split(config.host_exec), *argv] if config.host_exec else list(argv)


def host_pid(config: AgentConfig) -> int | None:
    """For an agent in a container (host_exec set): the pid, as the agent sees it (hostPID), of a process in the
    node's namespaces, the one whose root host_root names (``/proc/<pid>/root``; else 1, the node's init).
    None for an agent on the node itself."""
    if not config.host_exec:
        return None
    match = re.fullmatch(r"/proc/(\d+)/root/?", str(config.host_root))
    return int(match.group(1)) if match else 1


def host_which(config: AgentConfig, name: str) -> bool:
    """Whether the node (under host_root when it is not /) has the command `name`."""
    root = Path(config.host_root)
    if root == Path("/"):
        return shutil.which(name) is not None
    return any((root / folder / name).exists() for folder in HOST_PATH)


def utcnow() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write `data` so that a reader (or a crash) sees the old file or the new one, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return default


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None without such a process."""
    if pid <= 0:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name is in parentheses and may hold spaces and parentheses of its own.
    return stat.rsplit(")", 1)[1].split()


def pid_alive(pid: int) -> bool:
    """True when `pid` is a live process (a zombie counts as dead)."""
    fields = proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def reap(pid: int) -> None:
    """Collect `pid` when it is our (or, as subreaper, our adopted) child; ignore anything else."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def import_string(dotted: str) -> Any:
    """The object named by 'package.module.Name' (Django's import_string, without Django)."""
    import importlib

    module_name, _, attr = dotted.rpartition(".")
    if not module_name:
        raise ImportError(f"{dotted!r} is not a dotted path")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f"module {module_name!r} has no attribute {attr!r}") from None
