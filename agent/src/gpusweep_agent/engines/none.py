"""The `none` engine: no state is kept; the workload cold-starts on restore (and says so)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..util import pid_alive
from .base import CheckpointEngine, Progress, start_command, stop_process


class NoneEngine(CheckpointEngine):
    name = "none"

    def checkpoint(
        self, workload: dict[str, Any], image_dir: Path, leave_running: bool, progress: Progress
    ) -> dict[str, Any]:
        image_dir.mkdir(parents=True, exist_ok=True)
        pid = int(workload.get("pid") or 0)
        if not leave_running and pid_alive(pid):
            stop_process(pid)
        return {"cold_restart": True}

    def recover(self, workload: dict[str, Any], image_dir: Path, state: dict[str, Any]) -> bool:
        return True

    def restore(self, manifest: dict[str, Any], image_dir: Path, work_dir: Path) -> int:
        workload = manifest["workload"]
        env = {"GPUSWEEP_WORKLOAD_ID": workload["id"]}
        if workload.get("checkpoint_dir"):
            env["GPUSWEEP_CHECKPOINT_DIR"] = workload["checkpoint_dir"]
        return start_command(workload, env, work_dir / "output.log").pid
