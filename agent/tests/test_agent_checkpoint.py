"""Checkpoint and restore through real agents and real CRIU on real processes (done-when 1 and 2)."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_helpers import (
    COUNTER,
    CRIU_HINT,
    FACTS,
    AgentProcess,
    criu_usable,
    kill_pid,
    start_workload,
    steps,
    wait_for,
    wait_steps,
)
from gpusweep_agent.agent import PR_SET_CHILD_SUBREAPER
from gpusweep_agent.engines.criu import dirty_tracking_missing, kill_tree, processes_mentioning
from gpusweep_agent.util import pid_alive

from conftest import need

pytestmark = pytest.mark.criu


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[tuple[AgentProcess, AgentProcess, Path]]:
    need(criu_usable(), CRIU_HINT)
    store = tmp_path / "artifacts"
    a = AgentProcess(tmp_path, "gpu-a", store).start()
    b = AgentProcess(tmp_path, "gpu-b", store).start()
    yield a, b, store
    a.stop()
    b.stop()


def assert_continuous(numbers: list[int]) -> None:
    assert numbers[0] == 1
    assert numbers == list(range(1, len(numbers) + 1)), "the counter reset, skipped or repeated a step"


def test_it_moves_a_200mb_process_from_agent_a_to_agent_b(agents, tmp_path: Path) -> None:
    a, b, store = agents
    log = tmp_path / "counter.log"
    proc = start_workload(a, "counter-200", log, megabytes=200)
    wait_steps(log, 20, timeout=60)

    op = a.client.call("/v1/checkpoint", "ck-op-1", workload_id="counter-200")
    assert op["state"] == "succeeded", op
    proc.wait(30)  # CRIU stopped the original (and its pid is free again once reaped here)
    at_checkpoint = steps(log)
    manifest = op["result"]["manifest"]
    assert manifest["total_bytes"] > 200 * 1024 * 1024
    assert manifest["fingerprint"]["driver"] == "570.86.15"
    assert all(len(f["sha256"]) == 64 for f in manifest["files"])
    assert (store / op["result"]["checkpoint_id"] / "manifest.json").is_file()
    dump = manifest["engine_data"]["dump"]
    if dirty_tracking_missing("criu"):
        # This kernel tracks no dirty memory (no CONFIG_MEM_SOFT_DIRTY): a plain dump, saying why in CRIU's words.
        assert dump["mode"] == "plain" and "mem_dirty_track" in dump["plain_because"], dump
        assert [r["kind"] for r in dump["rounds"]] == ["dump"]
    else:
        assert dump["mode"] == "pre-dump" and dump["rounds"][0]["kind"] == "pre-dump", dump
        assert dump["rounds"][0]["pages_written"] > 200 * 256 > dump["rounds"][-1]["pages_written"]
    assert dump["rounds"][-1]["pages_written"] > 0 and dump["frozen_ms"] > 0
    time.sleep(0.5)
    assert steps(log) == at_checkpoint, "the workload kept running after its checkpoint"

    restored = b.client.call("/v1/restore", "restore-op-1", checkpoint_id=op["result"]["checkpoint_id"])
    assert restored["state"] == "succeeded", restored
    pid = restored["result"]["pid"]
    try:
        after = wait_steps(log, len(at_checkpoint) + 20)
        assert_continuous(after)
        workloads = b.client.get("/v1/workloads")["workloads"]
        assert {"id": "counter-200", "pid": pid, "state": "running"}.items() <= next(
            w for w in workloads if w["id"] == "counter-200").items()
    finally:
        kill_pid(pid)


def test_it_refuses_a_restore_onto_another_driver_and_reports_the_difference(agents, tmp_path: Path) -> None:
    a, _b, store = agents
    newer = {**FACTS, "components": {**FACTS["components"], "driver": "580.65.06"}}
    c = AgentProcess(tmp_path, "gpu-c", store, facts=newer).start()
    try:
        log = tmp_path / "counter.log"
        proc = start_workload(a, "counter-drv", log, megabytes=10)
        wait_steps(log, 5)
        op = a.client.call("/v1/checkpoint", "ck-drv", workload_id="counter-drv")
        assert op["state"] == "succeeded", op
        proc.wait(30)

        refused = c.client.call("/v1/restore", "restore-drv", checkpoint_id=op["result"]["checkpoint_id"])
        assert refused["state"] == "failed"
        assert refused["error"] == "incompatible"
        assert refused["result"]["differences"] == {"driver": {"checkpoint": "570.86.15", "target": "580.65.06"}}
        assert "580.65.06" in refused["result"]["message"]
        # Nothing was restored and the checkpoint is still there for a compatible node.
        assert not (store / op["result"]["checkpoint_id"] / "claim.json").exists()
        assert steps(log)[-1] == len(steps(log))
        again = a.client.call("/v1/restore", "restore-drv-a", checkpoint_id=op["result"]["checkpoint_id"])
        assert again["state"] == "succeeded", again
        kill_pid(again["result"]["pid"])
    finally:
        c.stop()


def test_it_refuses_a_corrupted_image(agents, tmp_path: Path) -> None:
    a, b, store = agents
    log = tmp_path / "counter.log"
    proc = start_workload(a, "counter-bad", log, megabytes=10)
    wait_steps(log, 5)
    op = a.client.call("/v1/checkpoint", "ck-bad", workload_id="counter-bad")
    assert op["state"] == "succeeded", op
    proc.wait(30)
    folder = store / op["result"]["checkpoint_id"]
    pages = sorted(folder.glob("pages-*.img"), key=lambda p: p.stat().st_size)[-1]
    with pages.open("r+b") as fh:
        fh.seek(pages.stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))

    refused = b.client.call("/v1/restore", "restore-bad", checkpoint_id=op["result"]["checkpoint_id"])
    assert refused["state"] == "failed"
    assert f"{pages.name}: sha256 differs from the manifest" in refused["error"]
    assert refused["result"]["error"] == "corrupted"
    time.sleep(0.3)
    assert steps(log)[-1] == len(steps(log)), "a corrupted image must not be restored"


def test_it_does_not_checkpoint_twice_for_a_repeated_operation_id(agents, tmp_path: Path) -> None:
    a, _b, store = agents
    log = tmp_path / "counter.log"
    proc = start_workload(a, "counter-once", log, megabytes=10)
    wait_steps(log, 5)
    first = a.client.submit("/v1/checkpoint", "ck-once", workload_id="counter-once")
    second = a.client.submit("/v1/checkpoint", "ck-once", workload_id="counter-once")
    assert second["id"] == first["id"] == "ck-once"
    done = a.client.wait(first)
    assert done["state"] == "succeeded", done
    proc.wait(30)
    # After the agent restarts the id still answers with the first result.
    a.stop()
    a.start()
    third = a.client.call("/v1/checkpoint", "ck-once", workload_id="counter-once")
    assert third["result"]["checkpoint_id"] == done["result"]["checkpoint_id"]
    assert [p.name for p in store.iterdir()] == [done["result"]["checkpoint_id"]]
    conflict = a.client.request("POST", "/v1/checkpoint", {"operation_id": "ck-once", "workload_id": "other"})
    assert conflict[0] == 409


def test_it_leaves_the_workload_running_or_restorable_when_the_agent_dies_mid_checkpoint(
    agents, tmp_path: Path
) -> None:
    a, b, store = agents
    log = tmp_path / "counter.log"
    proc = start_workload(a, "counter-kill", log, megabytes=200)
    wait_steps(log, 10, timeout=60)
    a.client.submit("/v1/checkpoint", "ck-kill", workload_id="counter-kill")
    # Kill the agent while CRIU is dumping: the image folder exists but has no manifest yet.
    wait_for(lambda: any(store.iterdir()), 20, interval=0.01, what="the dump to begin")
    a.kill()
    a.start()
    op = a.client.wait(a.client.get("/v1/operations/ck-kill"), timeout=120)

    if op["state"] == "succeeded":
        assert op["result"]["recovered"] is True
        proc.wait(30)
        at_checkpoint = steps(log)
        restored = b.client.call("/v1/restore", "restore-kill", checkpoint_id=op["result"]["checkpoint_id"])
        assert restored["state"] == "succeeded", restored
        try:
            assert_continuous(wait_steps(log, len(at_checkpoint) + 10))
        finally:
            kill_pid(restored["result"]["pid"])
    else:
        assert op["result"]["workload_state"] == "running", op
        before = len(steps(log))
        assert_continuous(wait_steps(log, before + 10))
        assert pid_alive(proc.pid)
        assert list(store.iterdir()) == []
        proc.kill()


def test_it_restores_a_pending_checkpoint_when_gpusweep_run_starts_the_workload_again(
    agents, tmp_path: Path
) -> None:
    """A requeued Slurm job keeps its SLURM_JOB_ID: the wrapper restores instead of starting over."""
    a, b, _store = agents
    log = tmp_path / "counter.log"
    # Under Slurm the wrapper keeps its job through a checkpoint until gpusweep requeues it; nothing requeues here.
    proc = start_workload(a, "ignored", log, megabytes=10, extra_env={"SLURM_JOB_ID": "4242",
                                                                       "GPUSWEEP_REQUEUE_WAIT_S": "0"})
    wait_steps(log, 10)
    workload_ids = [w["id"] for w in a.client.get("/v1/workloads")["workloads"]]
    assert "ignored" in workload_ids  # --workload-id wins over SLURM_JOB_ID
    op = a.client.call("/v1/checkpoint", "ck-requeue", workload_id="ignored")
    assert op["state"] == "succeeded", op
    proc.wait(30)
    at_checkpoint = steps(log)

    again = start_workload(b, "ignored", log, megabytes=10)
    try:
        assert_continuous(wait_steps(log, len(at_checkpoint) + 10))
        assert again.poll() is None, "the wrapper waits for the restored process"
    finally:
        restored = next(w for w in b.client.get("/v1/workloads")["workloads"] if w["id"] == "ignored")
        kill_pid(restored["pid"])
        again.wait(10)


def test_it_restores_beside_the_running_original_when_the_workload_has_its_own_pid_namespace(
    agents, tmp_path: Path
) -> None:
    """CRIU restores a process under the pid it had; a pid namespace moves that pid off the host's."""
    a, b, _store = agents
    log = tmp_path / "counter.log"
    wrapper = start_workload(a, "ns-1", log, megabytes=10, extra_args=("--pid-namespace",))
    wait_steps(log, 5)
    original = next(w for w in a.client.get("/v1/workloads")["workloads"] if w["id"] == "ns-1")["pid"]
    restored: dict = {"result": {}}
    try:
        assert Path(f"/proc/{original}/status").read_text().split("NSpid:")[1].splitlines()[0].split()[-1] == "1"
        op = a.client.call("/v1/checkpoint", "ns-ck", workload_id="ns-1", leave_running=True)
        assert op["state"] == "succeeded", op
        restored = b.client.call("/v1/restore", "ns-restore", checkpoint_id=op["result"]["checkpoint_id"])
        assert restored["state"] == "succeeded", restored
        assert restored["result"]["pid"] != original
        assert pid_alive(original) and pid_alive(restored["result"]["pid"])
        assert wrapper.poll() is None
    finally:
        kill_pid(restored["result"].get("pid") or 0)
        kill_pid(original)
        assert wrapper.wait(10) == 128 + 9, "the wrapper exits with its command's status"


@pytest.fixture
def subreaper() -> Iterator[None]:
    """Makes this test process the reaper of its orphaned descendants for one test.

    When CRIU's dump ends, the agent kills the stopped tree; the shell's child is then orphaned and
    must be reaped by init before CRIU can restore it under its pid. This VM's init does not reap,
    so the test does it, as a real init (systemd) does on a node.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    yield
    libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def test_it_moves_a_process_tree_and_leaves_none_of_it_behind(agents, subreaper, tmp_path: Path) -> None:
    """A shell whose child holds the state: CRIU leaves the whole tree stopped and the agent kills all of it."""
    a, b, _store = agents
    log = tmp_path / "tree.log"
    wrapper = shutil.which("gpusweep-run", path=str(Path(sys.executable).parent)) or "gpusweep-run"
    script = f'"{sys.executable}" "{COUNTER}" "{log}" 20 & wait'
    with log.with_suffix(".out").open("ab") as out:
        proc = subprocess.Popen([wrapper, "--workload-id", "tree", "--engine", "criu", "--", "sh", "-c", script],
                                env=a.run_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    wait_steps(log, 5)
    counters = processes_mentioning(str(log))
    assert len(counters) == 1  # the counter, a child of the workload's shell

    op = a.client.call("/v1/checkpoint", "ck-tree", workload_id="tree")
    assert op["state"] == "succeeded", op
    proc.wait(30)
    # Killed, not left stopped: the orphaned counter comes to this process's reaper as a corpse.
    reaped = wait_for(lambda: (r := os.waitpid(counters[0], os.WNOHANG))[0] and r, 10, what="the counter to be killed")
    assert os.WIFSIGNALED(reaped[1]) and os.WTERMSIG(reaped[1]) == signal.SIGKILL
    at_checkpoint = steps(log)

    restored = b.client.call("/v1/restore", "restore-tree", checkpoint_id=op["result"]["checkpoint_id"])
    assert restored["state"] == "succeeded", restored
    try:
        assert_continuous(wait_steps(log, len(at_checkpoint) + 10))
        assert processes_mentioning(str(log)) == counters  # the tree came back with its pids
    finally:
        kill_tree(restored["result"]["pid"])
