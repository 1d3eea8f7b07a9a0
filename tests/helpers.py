"""Helpers shared by tests that start real processes."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get_json(url: str, timeout: float = 5) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def manage(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "manage.py"), *args],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False,
    )


def clean_env(**overrides: str) -> dict[str, str]:
    """The process environment without gpusweep's own variables, plus `overrides`."""
    ours = {"DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE"}
    env = {k: v for k, v in os.environ.items() if k not in ours}
    env.update(overrides)
    return env


def wait_for(predicate: Any, timeout: float, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    return last


def stop_process_group(proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    """SIGTERM the group `proc` leads (started with start_new_session), then SIGKILL what is left."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@contextlib.contextmanager
def throwaway_database_url(url: str, tmp_path: Path, label: str) -> Iterator[str]:
    """A database of the test's own, dropped after it: a fresh SQLite file, or a new PostgreSQL
    database beside DATABASE_URL's (whose tables may hold what earlier runs, or other branches'
    migrations, left)."""
    if not url.startswith("postgres"):
        yield f"sqlite:///{tmp_path / (label + '.sqlite3')}"
        return
    import psycopg

    parts = urlsplit(url)
    name = f"gpusweep_{label}_{secrets.token_hex(4)}"
    maintenance = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(maintenance, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(maintenance, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


HOLDER = REPO / "tests" / "gpu_holder.py"  # `python gpu_holder.py DEVICE COMMAND...`: COMMAND holding a stand-in GPU


def cgroup_base() -> Path:
    """Where a test may make cgroups: the unified hierarchy on a cgroup v2 host, else v1's pids hierarchy."""
    root = Path("/sys/fs/cgroup")
    return root if (root / "cgroup.controllers").exists() else root / "pids"


def cgroups_writable() -> tuple[bool, str]:
    base = cgroup_base()
    if os.geteuid() != 0 or not (base / "cgroup.procs").exists() or not os.access(base, os.W_OK):
        return False, f"making cgroups needs root and a writable {base}"
    return True, ""


@contextlib.contextmanager
def in_cgroup(pid: int, path: str) -> Iterator[str]:
    """Move `pid` into the cgroup `path` (e.g. kubelet's /kubepods/besteffort/pod<uid>/<container> or
    slurmstepd's /slurm/uid_0/job_<id>/step_batch) as a kubelet or slurmstepd would; its /proc/<pid>/cgroup
    then names it, which is how the node agent maps a GPU user to its pod or job. Removed afterwards."""
    base = cgroup_base()
    folder = base / path.strip("/")
    folder.mkdir(parents=True, exist_ok=True)
    try:
        (folder / "cgroup.procs").write_text(str(pid))
        yield path
    finally:
        with contextlib.suppress(OSError):
            (base / "cgroup.procs").write_text(str(pid))  # back to the root, if it still runs
        for parent in [folder, *folder.parents]:
            if parent == base:
                break
            with contextlib.suppress(OSError):
                parent.rmdir()
