"""The cuda engine's call sequence around real CRIU.

No GPU here: libcuda is a stand-in compiled with gcc in the test (data/libcuda_standin.c) that
records each call. The sequence (Lock, Checkpoint before the CRIU dump; Restore, Unlock after the
CRIU restore) is what is checked; the real driver is exercised when a GPU machine is lent.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from agent_helpers import CRIU_HINT, DATA, AgentProcess, criu_usable, kill_pid, start_workload, steps, wait_steps

from conftest import need

pytestmark = pytest.mark.criu


@pytest.fixture
def standin(tmp_path: Path) -> Path:
    need(shutil.which("gcc") is not None, "needs gcc (apt-get install build-essential)")
    library = tmp_path / "libcuda-standin.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(DATA / "libcuda_standin.c")], check=True)
    return library


def calls(log: Path) -> list[tuple[str, int]]:
    return [(line.split()[0], int(line.split()[1])) for line in log.read_text().splitlines()]


def test_it_locks_and_checkpoints_cuda_before_criu_and_restores_after(standin: Path, tmp_path: Path) -> None:
    need(criu_usable(), CRIU_HINT)
    store = tmp_path / "artifacts"
    log_a, log_b = tmp_path / "cuda-a.log", tmp_path / "cuda-b.log"
    a = AgentProcess(tmp_path, "gpu-ca", store, libcuda=str(standin))
    a.env["CUDA_STANDIN_LOG"] = str(log_a)
    b = AgentProcess(tmp_path, "gpu-cb", store, libcuda=str(standin))
    b.env["CUDA_STANDIN_LOG"] = str(log_b)
    a.start()
    b.start()
    counter = tmp_path / "counter.log"
    try:
        proc = start_workload(a, "cuda-1", counter, megabytes=10, engine="cuda")
        wait_steps(counter, 5)
        op = a.client.call("/v1/checkpoint", "cuda-ck", workload_id="cuda-1")
        assert op["state"] == "succeeded", op
        proc.wait(30)
        assert calls(log_a) == [("cuInit", 0), ("cuCheckpointProcessLock", proc.pid),
                                ("cuCheckpointProcessCheckpoint", proc.pid)]
        assert log_a.read_text().splitlines()[1].endswith(" 30000")  # the lock timeout in ms
        assert op["result"]["manifest"]["engine"] == "cuda"

        at_checkpoint = steps(counter)
        restored = b.client.call("/v1/restore", "cuda-restore", checkpoint_id=op["result"]["checkpoint_id"])
        assert restored["state"] == "succeeded", restored
        try:
            pid = restored["result"]["pid"]
            assert calls(log_b) == [("cuInit", 0), ("cuCheckpointProcessRestore", pid),
                                    ("cuCheckpointProcessUnlock", pid)]
            after = wait_steps(counter, len(at_checkpoint) + 5)
            assert after == list(range(1, len(after) + 1))
        finally:
            kill_pid(restored["result"]["pid"])
    finally:
        a.stop()
        b.stop()


def test_it_unlocks_and_keeps_the_process_running_when_the_cuda_checkpoint_fails(standin: Path, tmp_path: Path) -> None:
    need(criu_usable(), CRIU_HINT)
    log = tmp_path / "cuda.log"
    a = AgentProcess(tmp_path, "gpu-cf", tmp_path / "artifacts", libcuda=str(standin))
    a.env.update(CUDA_STANDIN_LOG=str(log), CUDA_STANDIN_FAIL="cuCheckpointProcessCheckpoint")
    a.start()
    counter = tmp_path / "counter.log"
    try:
        proc = start_workload(a, "cuda-f", counter, megabytes=1, engine="cuda")
        wait_steps(counter, 3)
        op = a.client.call("/v1/checkpoint", "cuda-fail", workload_id="cuda-f")
        assert op["state"] == "failed"
        assert "cuCheckpointProcessCheckpoint failed with CUresult 600" in op["error"]
        assert [c for c, _ in calls(log)] == ["cuInit", "cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint",
                                             "cuCheckpointProcessUnlock"]
        before = len(steps(counter))
        wait_steps(counter, before + 3)
        assert proc.poll() is None
        assert list((tmp_path / "artifacts").iterdir()) == []
        proc.kill()
    finally:
        a.stop()


def test_it_refuses_a_cuda_checkpoint_without_libcuda_and_leaves_the_process_alone(tmp_path: Path) -> None:
    need(criu_usable(), CRIU_HINT)
    a = AgentProcess(tmp_path, "gpu-nolib", tmp_path / "artifacts", libcuda=str(tmp_path / "absent.so")).start()
    counter = tmp_path / "counter.log"
    try:
        proc = start_workload(a, "cuda-n", counter, megabytes=1, engine="cuda")
        wait_steps(counter, 2)
        op = a.client.call("/v1/checkpoint", "cuda-n", workload_id="cuda-n")
        assert op["state"] == "failed"
        assert "cannot load" in op["error"] and "driver 570+" in op["error"]
        assert proc.poll() is None
        proc.kill()
    finally:
        a.stop()
