"""The checkpoint engine interface."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import AgentConfig
from ..util import pid_alive, reap

Progress = Callable[..., None]


class EngineError(Exception):
    """A checkpoint or restore failed; the message says where and why."""


class EngineUnavailable(EngineError):
    """The engine cannot run on this node (CRIU absent, no libcuda, unknown name)."""


class CheckpointEngine:
    """Saves a workload into an image folder and brings it back from one.

    `checkpoint` fills `image_dir` and returns engine data for the manifest; unless
    `leave_running`, the workload is stopped afterwards. It reports progress (e.g. a helper's pid)
    through `progress(**fields)`, which the agent persists, so that `recover` can tell after an
    agent restart whether an interrupted checkpoint completed. `restore` returns the new pid.
    """

    name = ""
    # True when the image holds the process itself (the restored pid continues where it stopped).
    live = False

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.recovered: dict[str, Any] = {}

    def check(self) -> None:
        """Raise EngineUnavailable when the engine cannot run here."""

    def checkpoint(
        self, workload: dict[str, Any], image_dir: Path, leave_running: bool, progress: Progress
    ) -> dict[str, Any]:
        raise NotImplementedError

    def recover(self, workload: dict[str, Any], image_dir: Path, state: dict[str, Any]) -> bool:
        """After an agent restart mid-checkpoint: True when the image is complete and usable. The engine
        data a restore needs, as far as it can be read from the image, is left in ``recovered``."""
        return False

    def restore(self, manifest: dict[str, Any], image_dir: Path, work_dir: Path) -> int:
        raise NotImplementedError


def stop_process(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `timeout`; the process is gone when this returns."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            reap(pid)
            if not pid_alive(pid):
                return
            time.sleep(0.05)
    raise EngineError(f"process {pid} did not stop")


SECRET_WORDS = ("KEY", "SECRET", "TOKEN", "PASSWORD")


def start_command(workload: dict[str, Any], extra_env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start a workload's recorded command again (restart-based engines), detached from the agent."""
    command = workload.get("command") or []
    if not command:
        raise EngineError(f"workload {workload.get('id')} has no recorded command to start")
    env = {k: v for k, v in (workload.get("env") or {}).items() if not any(w in k.upper() for w in SECRET_WORDS)}
    env.setdefault("PATH", os.environ.get("PATH", "/usr/bin:/bin"))
    env.update(extra_env)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            command, cwd=workload.get("cwd") or "/", env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )


def log_tail(path: Path, lines: int = 5) -> str:
    """The lines of a helper's log that say what went wrong (its last lines if none does), joined."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    errors = [line for line in text if "Error" in line or "error" in line]
    return " | ".join((errors or text)[-lines:])
