"""Helpers for the agent tests: real agent processes on their own ports, and real workloads."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpusweep_agent.auth import derive_node_key
from gpusweep_agent.client import AgentClient
from gpusweep_agent.engines.criu import criu_version

DATA = Path(__file__).resolve().parent / "data"
COUNTER = DATA / "counter.py"
FLEET_SECRET = "agent-tests-fleet-secret-long-enough-0123"
CLUSTER = "test"
FACTS = {
    "gpu_model": "NVIDIA H100 80GB HBM3", "gpu_count": 8, "product_line": "tesla", "os_family": "linux",
    "components": {"driver": "570.86.15", "cuda": "12.8"},
}
CRIU_HINT = "needs CRIU 4 and root: run scripts/build-criu.sh as root"
# For an agent standing in for a node with no scheduler (a static cluster on the local executor): every
# test agent shares this host's /proc, so with the default scheduler_workloads it would list every
# Kubernetes pod and Slurm step of other tests (their kubepods/slurm cgroups) as its own workloads, and
# a campaign on it would stop or checkpoint (CRIU-kill) them: the other test's process is killed and
# this one records a STOPPED event too many.
NO_SCHEDULER = {"scheduler_workloads": "false"}


def criu_usable() -> bool:
    if os.geteuid() != 0:
        return False
    version = criu_version("criu")
    if version is None or version < (4,):
        return False
    return subprocess.run(["criu", "check"], capture_output=True, check=False).returncode == 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.05, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class AgentProcess:
    """A real `gpusweep-agent` process with its own port, state folder and static facts file."""

    def __init__(self, root: Path, node: str, artifacts: Path, facts: dict[str, Any] | None = None,
                 wrap: list[str] | None = None, **settings: str) -> None:
        self.node = node
        # A command prefix the agent runs behind (containers.agent_container: as in a DaemonSet's container).
        self.wrap = list(wrap or [])
        self.port = free_port()
        self.state = root / f"state-{node}"
        self.facts_file = root / f"facts-{node}.json"
        self.facts_file.write_text(json.dumps(facts or FACTS))
        self.key = derive_node_key(FLEET_SECRET, CLUSTER, node)
        self.log = root / f"agent-{node}.log"
        self.env = {
            **os.environ, "GPUSWEEP_AGENT_KEY": self.key, "GPUSWEEP_AGENT_CLUSTER": CLUSTER,
            "GPUSWEEP_AGENT_NODE": node, "GPUSWEEP_AGENT_PORT": str(self.port),
            "GPUSWEEP_AGENT_STATE_DIR": str(self.state), "GPUSWEEP_AGENT_ARTIFACT_DIR": str(artifacts),
            "GPUSWEEP_AGENT_PROBES": "static", "GPUSWEEP_AGENT_STATIC_FACTS": str(self.facts_file),
            "GPUSWEEP_AGENT_SIGNAL_TIMEOUT": "20",
            **{f"GPUSWEEP_AGENT_{k.upper()}": v for k, v in settings.items()},
        }
        self.client = AgentClient(f"http://127.0.0.1:{self.port}", f"{CLUSTER}/{node}", self.key)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> AgentProcess:
        # free_port's port is free only when it is chosen: with the test lanes side by side, another
        # process's outgoing connection can take it first. Then the agent exits at once saying so, and
        # starts again on another port (callers read .port after start()).
        for _attempt in range(5):
            with self.log.open("ab") as log:
                self.proc = subprocess.Popen(
                    [*self.wrap, sys.executable, "-m", "gpusweep_agent.main", "--log-level", "DEBUG"],
                    env=self.env, stdout=log, stderr=subprocess.STDOUT)
            wait_for(self._answers_or_exited, 20, what=f"agent {self.node} to answer /v1/health (log {self.log})")
            if self.proc.poll() is None or f"cannot listen on 127.0.0.1:{self.port}" not in self.log.read_text(
                    errors="replace"):
                break
            self._use_port(free_port())
        wait_for(self._healthy, 20, what=f"agent {self.node} to answer /v1/health (log {self.log})")
        return self

    def _answers_or_exited(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            return True
        try:
            return self.client.request("GET", "/v1/health")[0] == 200
        except Exception:  # noqa: BLE001 - not listening yet
            return False

    def _use_port(self, port: int) -> None:
        self.port = port
        self.env["GPUSWEEP_AGENT_PORT"] = str(port)
        self.client = AgentClient(f"http://127.0.0.1:{port}", f"{CLUSTER}/{self.node}", self.key)

    def _healthy(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            return self.client.request("GET", "/v1/health")[0] == 200
        except Exception:  # noqa: BLE001 - not listening yet
            return False

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def run_env(self) -> dict[str, str]:
        """The environment gpusweep-run needs to reach this agent."""
        return {**self.env, "GPUSWEEP_AGENT_ENDPOINT": f"http://127.0.0.1:{self.port}"}


def site_check(root: Path) -> tuple[str, Callable[..., None]]:
    """A real site health check for the agents under `root` (their `health_options`): it passes
    until `fail(node, output)`, then prints `output` and exits 1 on that node (with `once`, only
    its next run fails)."""
    script = root / "site-check"
    script.write_text(f'#!/bin/sh\nflag="{root}/health-flag-$GPUSWEEP_AGENT_NODE"\n'
                      f'once="{root}/health-once-$GPUSWEEP_AGENT_NODE"\n'
                      'if [ -s "$once" ]; then cat "$once"; rm -f "$once"; exit 1; fi\n'
                      'if [ -s "$flag" ]; then cat "$flag"; exit 1; fi\necho "site check: ok"\n')
    script.chmod(0o755)

    def fail(node: str, output: str, once: bool = False) -> None:
        (root / f"health-{'once' if once else 'flag'}-{node}").write_text(output)

    return json.dumps({"site": {"commands": {"site": str(script)}}, "gpus": {"libnvidia_ml": ""}}), fail


def start_workload(agent: AgentProcess, workload_id: str, log: Path, megabytes: int, engine: str = "criu",
                   extra_env: dict[str, str] | None = None, signal_name: str = "SIGUSR1",
                   extra_args: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    """A counter process started through `gpusweep-run`, detached (own session, no terminal, no pipes)."""
    wrapper = shutil.which("gpusweep-run", path=str(Path(sys.executable).parent)) or "gpusweep-run"
    out = log.with_suffix(".out")
    with out.open("ab") as fh:
        return subprocess.Popen(
            [wrapper, "--workload-id", workload_id, "--engine", engine, "--signal", signal_name, *extra_args, "--",
             sys.executable, str(COUNTER), str(log), str(megabytes)],
            env={**agent.run_env(), **(extra_env or {})}, stdin=subprocess.DEVNULL, stdout=fh,
            stderr=subprocess.STDOUT, start_new_session=True,
        )


def steps(log: Path) -> list[int]:
    lines = [line.split() for line in log.read_text().splitlines() if line.strip()]
    assert all(parts[1] == "ok" for parts in lines), f"memory check failed in {log}"
    return [int(parts[0]) for parts in lines]


def unbroken(steps: list[int]) -> int:
    """The counter's step as long as its count runs from 1 without a gap or a repeat (a cold start breaks it)."""
    count = 0
    for step in steps:
        if step != count + 1:
            break
        count = step
    return count


def wait_steps(log: Path, at_least: int, timeout: float = 30) -> list[int]:
    return wait_for(lambda: log.exists() and len(steps(log)) >= at_least and steps(log), timeout,
                    what=f"{at_least} steps in {log}")


# What an agent lists by cgroup (workloads.discover_cgroup_workloads): on this shared host, any test's pod
# or Slurm step, so never this test's to kill at its teardown.
FOUND_BY_CGROUP = ("k8s_pod", "slurm_step")


def own_pids(listed: list[dict[str, Any]]) -> list[int]:
    """The pids of an agent's GET /v1/workloads entries `listed` that are its own (registered with it, or a
    bare process holding its stand-in GPU), for a teardown to kill: not the pods and steps found by cgroup."""
    return [int(w["pid"]) for w in listed if w.get("pid") and w.get("kind") not in FOUND_BY_CGROUP]


def kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
