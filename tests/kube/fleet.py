"""A Kubernetes GPU cluster for campaign tests: the test API server, a kubelet stand-in per node, a
real node agent per node (``agent/``, one process each, sharing one artifact store as a
PersistentVolume would), and gpusweep's inventory synced from the API by the real sync."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from inventory.models import Cluster
from inventory.sync import sync_cluster
from tests.helpers import HOLDER, REPO
from tests.kube.apiserver import KubeApiServer
from tests.kube.kubelet import Kubelet
from tests.kube.objects import gpu_node, gpu_pod


def agent_helpers() -> Any:
    """The agent package's own test helpers: real `gpusweep-agent` processes and counter workloads."""
    sys.path.insert(0, str(REPO / "agent" / "tests"))
    import agent_helpers

    return agent_helpers


class KubeFleet:
    def __init__(self, root: Path, names: list[str], *, agents: bool = True, driver: str = "570.86.15",
                 connection: dict[str, Any] | None = None, options: dict[str, Any] | None = None,
                 agent_settings: dict[str, str] | None = None) -> None:
        self.root, self.names, self.with_agents = root, names, agents
        self.agent_settings = agent_settings or {}
        self.helpers = agent_helpers()
        self.api = KubeApiServer()
        self.agents: dict[str, Any] = {}
        self.kubelets: dict[str, Kubelet] = {}
        self.driver = driver
        self.connection = {"executor": "kubernetes", "host": self.api.url, "ca_cert": str(self.api.ca_path),
                           "agents": agents, **(connection or {}),
                           "executor_options": {"poll_s": 0.1, "restore_wait_s": 20, **(options or {})}}
        self.cluster: Cluster | None = None

    def __enter__(self) -> KubeFleet:
        self.api.__enter__()
        try:
            store = self.root / "artifacts"
            for name in self.names:
                notes = {}
                if self.with_agents:
                    # "{node}" in a setting is the node's name (each node's own stand-in GPU device).
                    agent = self.helpers.AgentProcess(
                        self.root, name, store, reboot_command="simulate",
                        patch_methods='{"package": {"simulate": true}}',
                        **{k: v.replace("{node}", name) for k, v in self.agent_settings.items()}).start()
                    self.agents[name] = agent
                    notes["gpusweep.io/agent-endpoint"] = f"http://127.0.0.1:{agent.port}"
                self.api.put("nodes", gpu_node(name, driver=self.driver, annotations=notes))
                env = self.agents[name].run_env() if name in self.agents else {}
                self.kubelets[name] = Kubelet(self.api, name, self.root / "kubelet" / name, agent_env=env)
        except BaseException:
            self.__exit__()
            raise
        return self

    def make_cluster(self) -> Cluster:
        """The cluster in gpusweep's inventory (named as the agents' identity), synced from the API."""
        self.cluster = Cluster.objects.create(name=self.helpers.CLUSTER, kind="kubernetes",
                                              connection=self.connection,
                                              secret_env={"token": "GPUSWEEP_TEST_KUBE_TOKEN"})
        sync_cluster(self.cluster)
        return self.cluster

    def counter_pod(self, namespace: str, name: str, node: str, engine: str, log: Path, gpus: int = 1,
                    holds: Path | None = None, **kwargs: Any) -> dict[str, Any]:
        """A pod whose container runs the step counter under gpusweep-run, with a stable workload id; asking
        for `gpus` GPUs, and with `holds` the counter keeps that stand-in GPU device open (tests/gpu_holder.py)."""
        wrapper = shutil.which("gpusweep-run", path=str(Path(sys.executable).parent)) or "gpusweep-run"
        extra = ["--pid-namespace"] if engine == "criu" else []
        holder = [sys.executable, str(HOLDER), str(holds)] if holds is not None else []
        command = [wrapper, "--engine", engine, *extra, "--", *holder, sys.executable, str(self.helpers.COUNTER),
                   str(log), "1"]
        pod = gpu_pod(namespace, name, node, gpus, command=command, annotations={"gpusweep.io/checkpoint": engine},
                      env={"GPUSWEEP_WORKLOAD_ID": f"{namespace}.{name}"}, **kwargs)
        return self.api.put("pods", pod)

    def workloads(self, node: str) -> list[dict[str, Any]]:
        agent = self.agents[node]
        return list(agent.client.request("GET", "/v1/workloads")[1].get("workloads", []))

    def __exit__(self, *exc: object) -> None:
        for kubelet in self.kubelets.values():
            kubelet.stop()
        for agent in self.agents.values():
            if agent.proc and agent.proc.poll() is None:
                # Not the pods its agent finds by cgroup: another test's on this host (a DaemonSet pod
                # SIGKILLed mid-campaign); this fleet's containers end with kubelet.stop().
                running = [w for w in self.workloads(agent.node) if w.get("state") in ("running", "restored")]
                for pid in self.helpers.own_pids(running):
                    self.helpers.kill_pid(pid)
            agent.stop()
        self.api.__exit__()
