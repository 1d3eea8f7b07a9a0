"""The `signal` engine: the application saves its own state when asked.

A workload started through ``gpusweep-run`` gets ``GPUSWEEP_CHECKPOINT_DIR``. On checkpoint the
agent sends the configured signal (SIGUSR1 unless the workload names another); the application
writes its state files into that folder and then creates ``.gpusweep-ack`` there. The agent waits
for the acknowledgement (``signal_timeout``), moves the files into the image folder and, unless
asked to leave it running, stops the process. Restore starts the recorded command again with
``GPUSWEEP_RESTORE_DIR`` naming a copy of the files.
"""

from __future__ import annotations

import os
import shutil
import signal as signals
import time
from pathlib import Path
from typing import Any

from ..util import pid_alive, read_json
from .base import CheckpointEngine, EngineError, Progress, start_command, stop_process

ACK = ".gpusweep-ack"


class SignalEngine(CheckpointEngine):
    name = "signal"

    def checkpoint(
        self, workload: dict[str, Any], image_dir: Path, leave_running: bool, progress: Progress
    ) -> dict[str, Any]:
        pid = int(workload["pid"])
        exchange = Path(workload.get("checkpoint_dir") or "")
        if not workload.get("checkpoint_dir"):
            raise EngineError(f"workload {workload['id']} has no checkpoint folder (start it with gpusweep-run)")
        if not pid_alive(pid):
            raise EngineError(f"workload {workload['id']}: process {pid} is not running")
        exchange.mkdir(parents=True, exist_ok=True)
        for stale in exchange.iterdir():
            if stale.is_dir():
                shutil.rmtree(stale)
            else:
                stale.unlink()
        signame = str(workload.get("checkpoint_signal") or "SIGUSR1")
        try:
            signum = signals.Signals[signame]
        except KeyError:
            raise EngineError(f"workload {workload['id']}: unknown signal {signame}") from None
        signals_sent_at = time.time()
        os.kill(pid, signum)
        progress(signal_sent=signame)
        deadline = time.monotonic() + self.config.signal_timeout
        while not (exchange / ACK).exists():
            if time.monotonic() > deadline:
                raise EngineError(
                    f"workload {workload['id']} did not acknowledge {signame} within {self.config.signal_timeout:.0f} s"
                    f" (expected {exchange / ACK})"
                )
            if not pid_alive(pid):
                raise EngineError(f"workload {workload['id']} exited before acknowledging {signame}")
            time.sleep(0.05)
        image_dir.mkdir(parents=True, exist_ok=True)
        ack = read_json(exchange / ACK, None) if (exchange / ACK).stat().st_size else None
        (exchange / ACK).unlink()
        for item in exchange.iterdir():
            shutil.move(str(item), image_dir / item.name)
        if not leave_running:
            stop_process(pid)
        return {"signal": signame, "ack": ack, "ack_after_s": round(time.time() - signals_sent_at, 3)}

    def recover(self, workload: dict[str, Any], image_dir: Path, state: dict[str, Any]) -> bool:
        # Files are moved only after the acknowledgement; an interrupted move is not trusted.
        return False

    def restore(self, manifest: dict[str, Any], image_dir: Path, work_dir: Path) -> int:
        workload = manifest["workload"]
        restore_dir = work_dir / "state"
        if restore_dir.exists():
            shutil.rmtree(restore_dir)
        shutil.copytree(image_dir, restore_dir, ignore=shutil.ignore_patterns("manifest.json", "claim.json"))
        env = {"GPUSWEEP_RESTORE_DIR": str(restore_dir), "GPUSWEEP_WORKLOAD_ID": workload["id"]}
        if workload.get("checkpoint_dir"):
            env["GPUSWEEP_CHECKPOINT_DIR"] = workload["checkpoint_dir"]
        proc = start_command(workload, env, work_dir / "output.log")
        return proc.pid
