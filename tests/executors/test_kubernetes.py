"""The Kubernetes executor against the test API server (tests/kube/apiserver.py, over TLS, through
the official client; no Kubernetes API server can run on these machines) with kubelet stand-ins
(no container runtime here). These tests need no node agent: the marks, PodDisruptionBudgets, the
kubelet checkpoint path and owner handling. Pods moved by real agents are in
tests/campaigns/test_kubernetes_campaign.py."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from executors.base import NodeRef, PermanentExecutorError, TemporaryExecutorError, get_executor
from executors.kubernetes import CHECKPOINTED, DRAINED_BY, TAINT, KubernetesExecutor
from inventory.models import Cluster
from tests.helpers import wait_for
from tests.kube.apiserver import KubeApiServer
from tests.kube.gpu_operator import GpuOperator
from tests.kube.kubelet import Kubelet
from tests.kube.objects import cluster_policy, gpu_like_pods, gpu_node, gpu_pod, nvidia_driver, pdb
from tests.kube.registry import docker_registry

OP = "gs-7-11-drain"


@pytest.fixture
def kube(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeApiServer]:
    monkeypatch.setenv("GPUSWEEP_TEST_KUBE_TOKEN", "test-token")
    with KubeApiServer() as api:
        api.nodes = [gpu_node("n1"), gpu_node("n2"), gpu_node("n3")]
        yield api


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    """A real registry's address (tests/kube/registry.py) for the kubelet checkpoint path's images."""
    with docker_registry(tmp_path / "registry") as address:
        yield address


def executor(api: KubeApiServer, executor_options: dict[str, object] | None = None,
             **connection: object) -> KubernetesExecutor:
    options = {"eviction_wait_s": 0.2, "eviction_deadline_s": 1, "restore_wait_s": 10, "poll_s": 0.1,
               **(executor_options or {})}
    cluster = Cluster(name="prod", kind="kubernetes", secret_env={"token": "GPUSWEEP_TEST_KUBE_TOKEN"}, connection={
        "executor": "kubernetes", "host": api.url, "ca_cert": str(api.ca_path), "agents": False, **connection,
        "executor_options": options})
    ex = get_executor(cluster, **cluster.connection["executor_options"])
    assert isinstance(ex, KubernetesExecutor)
    return ex


def ref(name: str) -> NodeRef:
    return NodeRef(cluster="prod", name=name)


def test_it_drains_with_marks_that_name_the_campaign_and_removes_only_its_own(kube: KubeApiServer) -> None:
    kube.mutate("nodes", "n1", "", lambda n: n["spec"].update(
        taints=[{"key": "example.com/fpga", "value": "x", "effect": "NoSchedule"}]))
    kube.mutate("nodes", "n2", "", lambda n: n["spec"].update(unschedulable=True))
    ex = executor(kube)
    assert ex.maintenance_hold(ref("n2")) == "cordoned by someone other than gpusweep"
    for name in ("n1", "n2"):
        ex.drain(ref(name), OP)
    n1 = kube.get("nodes", "n1")
    assert n1["spec"]["unschedulable"] is True
    assert {"key": TAINT, "value": "campaign-7", "effect": "NoSchedule"} in n1["spec"]["taints"]
    assert n1["metadata"]["annotations"][DRAINED_BY] == OP and n1["metadata"]["labels"]["gpusweep.io/campaign"] == \
        "campaign-7"
    version = n1["metadata"]["resourceVersion"]
    ex.drain(ref("n1"), OP)  # a retry finds its own marks and writes nothing
    assert kube.get("nodes", "n1")["metadata"]["resourceVersion"] == version
    assert ex.maintenance_hold(ref("n1")) == "tainted example.com/fpga=x:NoSchedule"

    for name in ("n1", "n2"):
        ex.undo(ref(name), "gs-7-11-undo")
    n1, n2 = kube.get("nodes", "n1"), kube.get("nodes", "n2")
    assert "unschedulable" not in n1["spec"] and n1["spec"]["taints"] == [
        {"key": "example.com/fpga", "value": "x", "effect": "NoSchedule"}]
    assert not any(k.startswith("gpusweep.io/") for k in {**n1["metadata"]["annotations"], **n1["metadata"]["labels"]})
    # Someone else's cordon outlives gpusweep's maintenance.
    assert n2["spec"]["unschedulable"] is True and "taints" not in n2["spec"]


def test_it_lists_gpu_pods_but_never_daemonset_static_or_cpu_pods(kube: KubeApiServer) -> None:
    kube.pods = [
        gpu_pod("ml", "trainer", "n1", 2, annotations={"gpusweep.io/checkpoint": "criu"}),
        gpu_pod("ml", "web", "n1", 0),
        gpu_pod("gpu-operator", "dcgm-exporter", "n1", 1, owner={"apiVersion": "apps/v1", "kind": "DaemonSet",
                                                                  "name": "dcgm", "uid": "d1"}),
        gpu_pod("kube-system", "static-n1", "n1", 1, annotations={"kubernetes.io/config.mirror": "abc"}),
        gpu_pod("ml", "db-0", "n1", 1, annotations={"gpusweep.io/checkpoint": "criu"},
                owner={"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "s1"}),
        gpu_pod("ml", "train-0", "n1", 1, annotations={"gpusweep.io/checkpoint": "criu"},
                owner={"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "train", "uid": "p1"}),
        gpu_pod("ml", "elsewhere", "n2", 1),
    ]
    found = {w.id: w for w in executor(kube).list_workloads(ref("n1"))}
    assert sorted(found) == ["ml/db-0", "ml/train-0", "ml/trainer"]
    assert (found["ml/trainer"].gpus, found["ml/trainer"].checkpoint_engine) == (2, "criu")
    # A StatefulSet's pod is checkpointed (its controller starts it again, where the checkpoint is restored);
    # a PyTorchJob's is never copied, so it is not checkpointed.
    assert found["ml/db-0"].checkpoint_engine == "criu" and found["ml/train-0"].checkpoint_engine == "none"
    with pytest.raises(PermanentExecutorError, match="never copied: it belongs to a PyTorchJob"):
        executor(kube).checkpoint(ref("n1"), "ml/train-0", "criu", "gs-7-11-ck-train")


def test_a_disruption_budget_holds_the_checkpoint_until_its_deadline_and_nothing_is_taken(
        kube: KubeApiServer, tmp_path: Path) -> None:
    Kubelet(kube, "n1", tmp_path / "n1")
    kube.put("pods", gpu_pod("ml", "trainer", "n1", 1, labels={"app": "trainer"},
                             annotations={"gpusweep.io/checkpoint-via": "kubelet"}))
    kube.put("poddisruptionbudgets", pdb("ml", "trainer", {"app": "trainer"}, min_available=1))
    wait_for(lambda: (kube.get("pods", "trainer", "ml").get("status") or {}).get("phase") == "Running", 10, 0.05)
    ex = executor(kube)
    with pytest.raises(TemporaryExecutorError, match="PodDisruptionBudget"):
        ex.checkpoint(ref("n1"), "ml/trainer", "criu", "gs-7-11-ck")
    assert wait_for(lambda: _permanent(ex), 5, 0.3) is True
    pod = kube.get("pods", "trainer", "ml")
    assert CHECKPOINTED not in pod["metadata"]["annotations"] and not kube.happened("proxied")
    assert pod["status"]["phase"] == "Running" and kube.happened("eviction-refused")


def _permanent(ex: KubernetesExecutor) -> bool:
    try:
        ex.checkpoint(ref("n1"), "ml/trainer", "criu", "gs-7-11-ck")
    except TemporaryExecutorError:
        return False
    except PermanentExecutorError as exc:
        return "refused eviction" in str(exc)
    return False


def test_a_pod_with_a_readwriteonce_claim_stops_before_its_replacement_starts(kube: KubeApiServer, tmp_path: Path,
                                                                             registry: str) -> None:
    """The replacement is made and pinned first, but its containers start only once the original is gone and
    the volume can attach to the target (the kubelet stand-in holds it in ContainerCreating meanwhile). Moved by
    the kubelet path, its checkpoint image in a real registry (tests/kube/registry.py)."""
    Kubelet(kube, "n1", tmp_path / "n1", checkpoint_dir=tmp_path / "checkpoints" / "n1")
    Kubelet(kube, "n3", tmp_path / "n3", runtime="cri-o://1.34.1", registry=registry)
    kube.put("persistentvolumeclaims", {"metadata": {"namespace": "ml", "name": "cache"}, "spec": {
        "accessModes": ["ReadWriteOnce"]}})
    pod = gpu_pod("ml", "server", "n1", 1, annotations={"gpusweep.io/checkpoint-via": "kubelet"})
    pod["spec"]["volumes"] = [{"name": "cache", "persistentVolumeClaim": {"claimName": "cache"}}]
    kube.put("pods", pod)
    wait_for(lambda: kube.get("pods", "server", "ml")["status"].get("phase") == "Running", 10, 0.05)
    ex = executor(kube, checkpoint_image_repository=f"http://{registry}/checkpoints",
                  kubelet_checkpoint_root=str(tmp_path / "checkpoints"))
    taken = ex.checkpoint(ref("n1"), "ml/server", "criu", "gs-7-11-ck")
    moved = ex.restore(ref("n3"), taken.checkpoint_id, "gs-7-11-restore")
    name = moved.workload_id.split("/")[1]
    assert kube.get("pods", "server", "ml") is None and kube.get("pods", name, "ml")["spec"]["nodeName"] == "n3"
    # Made (and pinned) first, its containers started only once the original was gone (on the old code the
    # replacement waited for the volume the original held, and the restore never ended).
    created, evicted = kube.happened("created", f"ml/{name}")[0][0], kube.happened("evicted", "ml/server")[0][0]
    gone = kube.happened("deleted", "ml/server")[0][0]
    assert created < evicted < gone < kube.happened("container-started", f"ml/{name} n3 0")[0][0]


def test_gpus_in_mig_slices_init_containers_and_resource_claims_are_found_and_moved(
        kube: KubeApiServer, tmp_path: Path, registry: str) -> None:
    """Done-when 4 of issue 27: neither pod asks for nvidia.com/gpu, yet each is listed with its GPUs and moved;
    a pod with an NVIDIA resource claim is listed with the claim's devices. Moved by the kubelet path, their
    checkpoint images in a real registry (tests/kube/registry.py)."""
    pods, claims = gpu_like_pods()
    kube.pods = pods
    for claim in claims:
        kube.put("resourceclaims", claim)
    ex = executor(kube, checkpoint_via="kubelet", checkpoint_image_repository=f"http://{registry}/checkpoints",
                  kubelet_checkpoint_root=str(tmp_path / "checkpoints"), gpu_resources=["example.com/shared-gpu"])
    found = {w.id: w.gpus for w in ex.list_workloads(ref("n1"))}
    assert found == {"ml/mig-only": 1, "ml/warmup": 2, "ml/with-sidecar": 2, "ml/shared": 1, "ml/dra": 2,
                     "ml/dra-templated": 1}
    Kubelet(kube, "n1", tmp_path / "n1", checkpoint_dir=tmp_path / "checkpoints" / "n1")
    Kubelet(kube, "n3", tmp_path / "n3", runtime="cri-o://1.34.1", registry=registry)
    for name in ("mig-only", "warmup"):
        kube.put("pods", {**kube.get("pods", name, "ml"), "status": {}})  # now run by the kubelet
    assert wait_for(lambda: all(kube.get("pods", n, "ml")["status"].get("phase") == "Running"
                                for n in ("mig-only", "warmup")), 10, 0.05)
    for name in ("mig-only", "warmup"):
        taken = ex.checkpoint(ref("n1"), f"ml/{name}", "criu", f"gs-7-11-ck-{name}")
        moved = ex.restore(ref("n3"), taken.checkpoint_id, f"gs-7-11-restore-{name}")
        assert kube.get("pods", moved.workload_id.split("/")[1], "ml")["spec"]["nodeName"] == "n3"
        assert wait_for(lambda n=name: kube.get("pods", n, "ml") is None, 10, 0.1)


def test_a_node_pools_nvidiadriver_gets_the_version_and_the_others_are_held(kube: KubeApiServer,
                                                                             tmp_path: Path) -> None:
    kube.nodes = [gpu_node("a1", pool="a", labels={"pool": "a"}), gpu_node("b1", pool="b", labels={"pool": "b"}),
                  gpu_node("a2", pool="a", labels={"pool": "a"})]
    for name in ("a1", "b1", "a2"):  # the operator's driver pods run there
        Kubelet(kube, name, tmp_path / name)
    kube.put("clusterpolicies", cluster_policy("570.86.15", nvidia_driver_crd=True))
    kube.put("nvidiadrivers", nvidia_driver("pool-a", "570.86.15", {"pool": "a"}))
    kube.put("nvidiadrivers", nvidia_driver("pool-b", "570.86.15", {"pool": "b"}))
    operator = GpuOperator(kube)
    ex = executor(kube, driver_management="gpu-operator", executor_options={"upgrade_wait_s": 15, "poll_s": 0.1})
    done = ex.patch(ref("a1"), "driver", "570.195.03", "gs-7-11-patch-driver")
    assert (done.before, done.after) == ("570.86.15", "570.195.03")
    assert kube.get("nvidiadrivers", "pool-a")["spec"]["version"] == "570.195.03"
    assert kube.get("nvidiadrivers", "pool-b")["spec"]["version"] == "570.86.15"
    assert kube.get("clusterpolicies", "cluster-policy")["spec"]["driver"]["version"] == "570.86.15"
    a2 = kube.get("nodes", "a2")["metadata"]
    assert a2["labels"]["nvidia.com/gpu-driver-upgrade.skip"] == "true"
    assert a2["annotations"]["gpusweep.io/upgrade-skip-set-by"] == "gs-7-11-patch-driver"
    # Pool b's driver does not change: its nodes are not held.
    assert "nvidia.com/gpu-driver-upgrade.skip" not in kube.get("nodes", "b1")["metadata"]["labels"]
    assert operator.started("") == ["a1"]
    # The operator deleted a1's driver pod, and its DaemonSet brought it back at the new version.
    assert operator.driver_restarts == ["a1"]
    driver = operator.operand_pod("a1", "nvidia-gpu-driver-pool-a")
    assert driver is not None and driver["spec"]["containers"][0]["image"].endswith(":570.195.03")
    # A retry of the same operation reads what the first did and waits for nothing more.
    assert ex.patch(ref("a1"), "driver", "570.195.03", "gs-7-11-patch-driver") == done
    assert ex.verify(ref("a1")).versions["driver"] == "570.195.03"
    # Reverted (its health gate failed): nothing reinstalled, the node keeps gpusweep's skip label and the new driver.
    reverted = ex.rollback(ref("a1"), "gs-7-11-revert")
    assert reverted.components == {} and not reverted.reboot_required
    assert "the operator never downgrades a node" in reverted.output
    a1 = kube.get("nodes", "a1")["metadata"]
    assert a1["labels"]["nvidia.com/gpu-driver-upgrade.skip"] == "true"
    assert a1["annotations"]["gpusweep.io/upgrade-skip-set-by"] == "gs-7-11-revert"
    assert kube.get("nvidiadrivers", "pool-a")["spec"]["version"] == "570.195.03"
    # A skip label an administrator set is theirs: the node is held, not upgraded.
    kube.mutate("nodes", "b1", "", lambda n: n["metadata"]["labels"].update({
        "nvidia.com/gpu-driver-upgrade.skip": "true"}))
    assert "excluded from driver upgrades" in ex.maintenance_hold(ref("b1"))
    with pytest.raises(PermanentExecutorError, match="set by someone other than gpusweep"):
        ex.patch(ref("b1"), "driver", "570.195.03", "gs-7-12-patch-driver")


def test_the_operator_is_driven_through_the_resource_it_reads_and_never_when_its_upgrades_are_off(
        kube: KubeApiServer) -> None:
    """Without useNvidiaDriverCRD the operator ignores NVIDIADrivers: the ClusterPolicy gets the version. With
    autoUpgrade off nothing would upgrade the node: refused before anything changes, not waited out."""
    kube.put("clusterpolicies", cluster_policy("570.86.15"))
    kube.put("nvidiadrivers", nvidia_driver("all", "570.86.15", {}))
    ex = executor(kube, driver_management="gpu-operator", executor_options={"upgrade_wait_s": 0.2})
    with pytest.raises(TemporaryExecutorError, match="is upgrading n1"):
        ex.patch(ref("n1"), "driver", "570.195.03", "gs-7-11-patch-driver")
    assert kube.get("clusterpolicies", "cluster-policy")["spec"]["driver"]["version"] == "570.195.03"
    assert kube.get("nvidiadrivers", "all")["spec"]["version"] == "570.86.15"

    kube.put("clusterpolicies", cluster_policy("570.86.15", auto_upgrade=False))
    before = {n["metadata"]["name"]: n["metadata"]["resourceVersion"] for n in kube.nodes}
    with pytest.raises(PermanentExecutorError, match=r"upgrade controller is off.*autoUpgrade: false"):
        ex.patch(ref("n2"), "driver", "570.195.03", "gs-7-12-patch-driver")
    assert kube.get("clusterpolicies", "cluster-policy")["spec"]["driver"]["version"] == "570.86.15"
    assert {n["metadata"]["name"]: n["metadata"]["resourceVersion"] for n in kube.nodes} == before


def test_a_cold_restart_evicts_a_controlled_pod_and_copies_a_bare_one(kube: KubeApiServer, tmp_path: Path) -> None:
    for name in ("n1", "n2"):
        Kubelet(kube, name, tmp_path / name)
    kube.mutate("nodes", "n1", "", lambda n: n["spec"].update(unschedulable=True))
    bare = gpu_pod("ml", "bare", "n1", 1)
    # A debugging container added since (kubectl debug): the API refuses it on create, so the copy drops it.
    bare["spec"]["ephemeralContainers"] = [{"name": "debugger", "image": "busybox", "targetContainerName": "main"}]
    kube.put("pods", bare)
    kube.put("pods", gpu_pod("ml", "web-7c9d-x", "n1", 1, owner={
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7c9d", "uid": "rs"}))
    ex = executor(kube)
    ex.stop(ref("n1"), "ml/bare", "gs-7-11-stop-ml_bare")
    ex.stop(ref("n1"), "ml/web-7c9d-x", "gs-7-11-stop-ml_web")
    assert wait_for(lambda: {p["metadata"]["name"] for p in kube.objects("pods", "ml")} == {"bare-gs" + _h(
        "gs-7-11-stop-ml_bare")}, 10, 0.1)
    fresh = kube.objects("pods", "ml")[0]
    assert fresh["spec"]["nodeName"] == "n2" and fresh["metadata"]["annotations"]["gpusweep.io/replaces"] == "ml/bare"
    assert "affinity" not in fresh["spec"], "a cold start goes wherever the scheduler puts it"
    assert "ephemeralContainers" not in fresh["spec"]
    assert kube.happened("evicted", "ml/web-7c9d-x") and kube.happened("evicted", "ml/bare")
    ex.stop(ref("n1"), "ml/bare", "gs-7-11-stop-ml_bare")  # already done: nothing more
    assert len(kube.objects("pods", "ml")) == 1


def _h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]
