"""The service's own agent client (executors/agent_client.py, used by the local executor) against a
real agent process: the wire format as both sides implement it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_helpers import CLUSTER, FLEET_SECRET, AgentProcess, kill_pid, start_workload, steps, wait_steps

from executors.agent_client import AgentClient
from executors.base import PermanentExecutorError, TemporaryExecutorError


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    a = AgentProcess(tmp_path, "gpu-contract", tmp_path / "artifacts", reboot_command="simulate",
                     patch_methods=json.dumps({"package": {"simulate": True}})).start()
    yield a
    a.stop()


def service_client(agent: AgentProcess, secret: str = FLEET_SECRET) -> AgentClient:
    return AgentClient(f"http://127.0.0.1:{agent.port}", CLUSTER, agent.node, secret=secret,
                       operation_timeout=60, poll_interval=0.1)


def test_it_serves_the_service_client_through_a_whole_node_cycle(agent: AgentProcess, tmp_path: Path) -> None:
    client = service_client(agent)
    assert client.get("/v1/health")["node"] == f"{CLUSTER}/gpu-contract"
    log = tmp_path / "counter.log"
    proc = start_workload(agent, "contract-1", log, megabytes=1, engine="signal")
    wait_steps(log, 5)
    client.operation("/v1/maintenance", "drain-1", enabled=True)
    assert client.get("/v1/health")["maintenance"] is True
    late = start_workload(agent, "contract-late", tmp_path / "late.log", megabytes=1)
    assert late.wait(15) == 75, "a draining node admits no new workload"
    assert "maintenance" in (tmp_path / "late.out").read_text()
    result = client.operation("/v1/checkpoint", "ck-1", workload_id="contract-1", engine="signal",
                              leave_running=False)
    assert result["checkpoint_id"].startswith("ck-") and result["manifest"]["files"][0]["path"] == "state.json"
    proc.wait(15)
    assert client.operation("/v1/checkpoint", "ck-1", workload_id="contract-1", engine="signal",
                            leave_running=False) == result

    patched = client.operation("/v1/patch", "patch-1", component="driver", version="580.65.06", method="package",
                               dry_run=False)
    assert (patched["before"], patched["after"]) == ("570.86.15", "580.65.06")
    # The campaign retries a step whose poll fails while the agent restarts; the id keeps it single.
    deadline = time.monotonic() + 60
    while True:
        try:
            client.operation("/v1/reboot", "reboot-1")
            break
        except TemporaryExecutorError:
            assert time.monotonic() < deadline
            time.sleep(0.3)
    assert client.get("/v1/facts")["components"]["driver"] == "580.65.06"

    with pytest.raises(PermanentExecutorError, match="maintenance"):
        client.operation("/v1/restore", "restore-1", checkpoint_id=result["checkpoint_id"])
    client.operation("/v1/maintenance", "undrain-1", enabled=False)
    with pytest.raises(PermanentExecutorError, match="incompatible"):
        client.operation("/v1/restore", "restore-2", checkpoint_id=result["checkpoint_id"])


def test_it_refuses_the_service_client_with_another_fleet_secret(agent: AgentProcess) -> None:
    with pytest.raises(PermanentExecutorError, match="401"):
        service_client(agent, secret="another-fleet").get("/v1/health")


def test_it_restores_for_the_service_client_on_a_compatible_node(tmp_path: Path) -> None:
    store = tmp_path / "artifacts"
    a = AgentProcess(tmp_path, "gpu-c1", store).start()
    b = AgentProcess(tmp_path, "gpu-c2", store).start()
    log = tmp_path / "counter.log"
    try:
        proc = start_workload(a, "contract-2", log, megabytes=1, engine="signal")
        wait_steps(log, 5)
        ck = service_client(a).operation("/v1/checkpoint", "ck-2", workload_id="contract-2", engine="signal",
                                         leave_running=False)
        proc.wait(15)
        before = len(steps(log))
        restored = service_client(b).operation("/v1/restore", "restore-3", checkpoint_id=ck["checkpoint_id"])
        try:
            assert restored["workload_id"] == "contract-2"
            after = wait_steps(log, before + 5)
            assert after == list(range(1, len(after) + 1))
        finally:
            kill_pid(restored["pid"])
    finally:
        a.stop()
        b.stop()
