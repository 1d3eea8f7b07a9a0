"""The agent's API on a Unix socket (setting ``socket``), as a workload pod reaches its node's agent on
Kubernetes: the socket's folder is a hostPath both mount, so no network path (and no NetworkPolicy
opening) is needed. A real agent process, a real ``gpusweep-run`` registering a counter through the
socket, and the signed client."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from agent_helpers import CLUSTER, AgentProcess, kill_pid, own_pids, start_workload, wait_for, wait_steps
from gpusweep_agent.client import AgentClient


def test_gpusweep_run_registers_through_the_socket_and_unsigned_calls_are_refused(tmp_path: Path) -> None:
    # A short path: a Unix socket's path has a limit of 107 bytes, which pytest's tmp_path can pass.
    folder = Path(f"/tmp/gsa-{os.getpid()}-{tmp_path.name[-12:]}")
    sock = folder / "agent.sock"
    agent = AgentProcess(tmp_path, "gpu-sock", tmp_path / "artifacts", socket=str(sock)).start()
    log = tmp_path / "counter.log"
    workload = None
    try:
        assert stat.S_ISSOCK(sock.stat().st_mode) and stat.S_IMODE(sock.stat().st_mode) == 0o666
        client = AgentClient(f"unix://{sock}", f"{CLUSTER}/gpu-sock", agent.key)
        status, health = client.request("GET", "/v1/health")
        assert status == 200 and health["node"] == f"{CLUSTER}/gpu-sock"
        assert client.request("GET", "/v1/workloads", signed=False)[0] == 401
        assert AgentClient(f"unix://{sock}", f"{CLUSTER}/gpu-sock", "0" * 64).request(
            "GET", "/v1/workloads")[0] == 401

        workload = start_workload(agent, "pod-ml.trainer", log, 1, engine="signal",
                                  extra_env={"GPUSWEEP_AGENT_ENDPOINT": f"unix://{sock}"})
        wait_steps(log, 2)
        listed = wait_for(lambda: [w for w in client.get("/v1/workloads")["workloads"]
                                   if w["id"] == "pod-ml.trainer"], 20, what="the registration")
        assert listed[0]["state"] == "running" and listed[0]["checkpoint_engine"] == "signal"
        # The TCP port serves the same agent.
        assert "pod-ml.trainer" in [w["id"] for w in agent.client.get("/v1/workloads")["workloads"]]
    finally:
        if workload is not None:
            for pid in own_pids(agent.client.get("/v1/workloads")["workloads"]):
                kill_pid(pid)
            kill_pid(workload.pid)
        agent.stop()
    assert not sock.exists(), "the agent removes its socket when it stops"
    folder.rmdir()
