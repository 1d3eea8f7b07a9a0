"""The executor contract on the Kubernetes back end (tests/kube/fleet.py): the test API server over
TLS through the official client (no Kubernetes API server can run on these machines), a kubelet
stand-in per node running each pod's container as a real process (no container runtime here),
and a real node agent per node sharing one artifact store. The workload is a pod whose container
runs the step counter under gpusweep-run, checkpointed by the signal engine.

The back end's own view is the cluster's: a node takes work when it is neither cordoned nor
tainted NoSchedule/NoExecute and its agent admits workloads; a pod runs its workload when
Kubernetes shows it Ready on the node and the node's agent runs its process (a container that
restarts after a checkpoint is alive for a moment without its workload)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from executors.base import Executor, NodeRef, PermanentExecutorError, get_executor
from executors.kubernetes import DRAINED_BY, TAINT
from inventory.models import Cluster
from tests.executors.contract import ExecutorContract, Harness, op
from tests.kube.fleet import KubeFleet, agent_helpers

NAMESPACE, POD = "ml", "trainer"
RUNNING = ("running", "restored")


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _workload_id(pod: dict[str, Any]) -> str:
    return next((e["value"] for c in pod["spec"]["containers"] for e in c.get("env") or []
                 if e["name"] == "GPUSWEEP_WORKLOAD_ID"), "")


def _cordon_by_hand(api: Any, name: str, reason: str) -> None:
    """`kubectl cordon` by an administrator, with the reason in an annotation of their own."""
    def change(obj: dict[str, Any]) -> None:
        obj["spec"]["unschedulable"] = True
        obj["metadata"].setdefault("annotations", {})["example.com/cordon-reason"] = reason

    assert api.mutate("nodes", name, "", change)


class TestKubernetesExecutor(ExecutorContract):
    @pytest.fixture
    def site_check(self, tmp_path: Path) -> tuple[str, Any]:
        return agent_helpers().site_check(tmp_path)

    @pytest.fixture
    def fleet(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              site_check: tuple[str, Any]) -> Iterator[KubeFleet]:
        monkeypatch.setenv("GPUSWEEP_TEST_KUBE_TOKEN", "test-token")
        with KubeFleet(tmp_path, ["n0", "n1"], agent_settings={"health_options": site_check[0]}) as fleet:
            yield fleet

    @pytest.fixture
    def executor(self, fleet: KubeFleet) -> Executor:
        cluster = Cluster(name=fleet.helpers.CLUSTER, kind="kubernetes", connection=fleet.connection,
                          secret_env={"token": "GPUSWEEP_TEST_KUBE_TOKEN"})
        return get_executor(cluster, secret=fleet.helpers.FLEET_SECRET, operation_timeout=60)

    @pytest.fixture
    def harness(self, fleet: KubeFleet, executor: Executor, tmp_path: Path, site_check: tuple[str, Any]) -> Harness:
        helpers, api = fleet.helpers, fleet.api
        log = tmp_path / "counter.log"
        fleet.counter_pod(NAMESPACE, POD, "n0", "signal", log)
        helpers.wait_steps(log, 3)

        def takes_work(node: NodeRef) -> bool:
            spec = api.get("nodes", node.name)["spec"]
            fenced = spec.get("unschedulable") or any(
                t.get("effect") in ("NoSchedule", "NoExecute") for t in spec.get("taints") or [])
            return not fenced and not fleet.agents[node.name].client.get("/v1/health")["maintenance"]

        def running(node: NodeRef) -> set[str]:
            processes = {w["id"] for w in fleet.workloads(node.name) if w.get("state") in RUNNING}
            return {f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in api.objects("pods")
                    if p["spec"].get("nodeName") == node.name and not p["metadata"].get("deletionTimestamp")
                    and _ready(p) and _workload_id(p) in processes}

        return Harness(
            executor=executor, a=NodeRef(helpers.CLUSTER, "n0"), b=NodeRef(helpers.CLUSTER, "n1"),
            workload=f"{NAMESPACE}/{POD}", engine="signal", component="driver", version="570.195.03",
            unknown=NodeRef(helpers.CLUSTER, "nowhere"), takes_work=takes_work, running=running,
            progress=lambda _workload: helpers.unbroken(helpers.steps(log)) if log.exists() else None,
            hold=lambda node, reason: _cordon_by_hand(api, node.name, reason),
            # The node agents' real site check script fails on this node from now on.
            fail_check=lambda node, output: site_check[1](node.name, output),
        )

    def test_a_drain_is_a_cordon_and_a_taint_on_the_node_and_undo_removes_both(
            self, executor: Executor, fleet: KubeFleet) -> None:
        """The contract's takes_work is false once any fence is up; here every fence shows."""
        node_ref = NodeRef(fleet.helpers.CLUSTER, "n1")
        executor.drain(node_ref, op("drain"))
        node = fleet.api.get("nodes", "n1")
        assert node["spec"]["unschedulable"] is True
        assert {"key": TAINT, "value": "campaign-900", "effect": "NoSchedule"} in node["spec"]["taints"]
        assert node["metadata"]["annotations"][DRAINED_BY] == op("drain")
        assert fleet.agents["n1"].client.get("/v1/health")["maintenance"] is True
        executor.undo(node_ref, op("undo"))
        node = fleet.api.get("nodes", "n1")
        assert not node["spec"].get("unschedulable") and not node["spec"].get("taints")
        assert DRAINED_BY not in node["metadata"]["annotations"]

    def test_a_restore_at_home_is_found_by_its_retry_and_refused_to_any_other(
            self, harness: Harness, fleet: KubeFleet) -> None:
        """The engine unwinding a node restores a checkpoint into its own pod: the same guarantees."""
        ex, a, b = harness.executor, harness.a, harness.b
        ex.drain(a, op("home-drain"))
        taken = ex.checkpoint(a, harness.workload, harness.engine, op("home-ck"))
        at_checkpoint = harness.progress(harness.workload) or 0
        ex.undo(a, op("home-undo"))  # back in service: the pod's restarting container restores its checkpoint
        home = ex.restore(a, taken.checkpoint_id, op("home-restore"))
        assert home.workload_id == harness.workload and harness.running(a) == {harness.workload}
        assert self._wait(lambda: (harness.progress(harness.workload) or 0) > at_checkpoint)
        assert ex.restore(a, taken.checkpoint_id, op("home-restore")) == home
        assert ex.checkpoint(a, harness.workload, harness.engine, op("home-ck")).checkpoint_id == taken.checkpoint_id
        with pytest.raises(PermanentExecutorError, match="restored already"):
            ex.restore(b, taken.checkpoint_id, op("home-elsewhere"))
        assert harness.running(b) == set() and [p["metadata"]["name"] for p in fleet.api.objects("pods")] == [POD]
