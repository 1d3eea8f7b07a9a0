"""The kubelet checkpoint path end to end (issue 27, done-when 5): the kubelet's archive, fetched through the
node's real agent, becomes a checkpoint image, is pushed to a real registry (Debian's docker-registry,
tests/kube/registry.py) and the replacement pod on another node pulls and restores it, its workload's counter
continuing. The other tests read the archives under kubelet_checkpoint_root (no agents).

The API server and kubelets are the stand-ins of tests/kube (no Kubernetes or container runtime runs here); the
stand-in kubelet's dump is the workload's own saved state (the counter saves its step on SIGUSR1), where a
runtime's CRIU would dump the container's memory, and its restore starts the command with that state
(tests/kube/kubelet.py says how). The registry, the image and its push are real."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import tarfile
import tracemalloc
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from executors import checkpoint_image
from executors.base import NodeRef, PermanentExecutorError
from executors.checkpoint_image import CHECKPOINT_NAME, CRIU_CONTAINER_NAME, MANIFEST
from executors.kubernetes import CHECKPOINT_ID, KubernetesExecutor
from inventory.sources.kubernetes import NO_PROGRESS_MARKER
from tests.executors.test_kubernetes import executor
from tests.helpers import free_port, wait_for
from tests.kube.apiserver import KubeApiServer
from tests.kube.fleet import agent_helpers
from tests.kube.kubelet import Kubelet
from tests.kube.objects import gpu_node, gpu_pod
from tests.kube.registry import docker_registry

PROGRESS = r"^(\d+) ok$"


@pytest.fixture
def kube(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeApiServer]:
    monkeypatch.setenv("GPUSWEEP_TEST_KUBE_TOKEN", "test-token")
    with KubeApiServer() as api:
        api.nodes = [gpu_node("n1"), gpu_node("n2"), gpu_node("n3")]
        yield api


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    with docker_registry(tmp_path / "registry") as address:
        yield address


def kubelet(api: KubeApiServer, root: Path, node: str, **kwargs: Any) -> Kubelet:
    return Kubelet(api, node, root / "kubelet" / node, checkpoint_dir=root / "checkpoints" / node, **kwargs)


def kubelet_executor(api: KubeApiServer, root: Path, repository: str) -> KubernetesExecutor:
    return executor(api, checkpoint_via="kubelet", checkpoint_image_repository=repository,
                    kubelet_checkpoint_root=str(root / "checkpoints"), executor_options={"restore_wait_s": 20})


def counter_pod(api: KubeApiServer, log: Path, marker: bool = True, **kwargs: Any) -> dict[str, Any]:
    """A pod whose container runs the test counter, printing each step, checkpointed by the kubelet (with
    `marker`, its progress pattern annotated)."""
    command = [sys.executable, str(agent_helpers().COUNTER), str(log), "1", "0.05"]
    pod = gpu_pod("ml", "trainer", "n1", 1, command=command, env={"COUNTER_STDOUT": "1"}, annotations={
        "gpusweep.io/checkpoint-via": "kubelet", "gpusweep.io/checkpoint": "signal",
        **({"gpusweep.io/progress-pattern": PROGRESS} if marker else {})}, **kwargs)
    api.put("pods", pod)
    assert wait_for(lambda: log.exists() and len(log.read_text().splitlines()) >= 10, 20, 0.1), "the counter runs"
    return pod


def steps(log: Path) -> list[int]:
    return [int(m.group(1)) for line in log.read_text().splitlines() if (m := re.match(PROGRESS, line))]


def ref(name: str, cluster: str = "prod") -> NodeRef:
    return NodeRef(cluster=cluster, name=name)


def pull(address: str, reference: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest of `reference` (host/path:tag@digest) and its layer's files, as a runtime pulls them."""
    path, _, digest = reference.partition("/")[2].partition("@")
    repository = path.rpartition(":")[0]
    request = urllib.request.Request(f"http://{address}/v2/{repository}/manifests/{digest}",
                                     headers={"Accept": MANIFEST})
    with urllib.request.urlopen(request, timeout=10) as answer:
        manifest = json.loads(answer.read())
    with urllib.request.urlopen(f"http://{address}/v2/{repository}/blobs/{manifest['layers'][0]['digest']}",
                                timeout=10) as answer:
        layer = answer.read()
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    return manifest, files


@pytest.fixture
def agents(kube: KubeApiServer, tmp_path: Path, settings: Any) -> Iterator[None]:
    """A real node agent on n1 and n2, each serving its node's kubelet checkpoint folder."""
    helpers = agent_helpers()
    settings.GPUSWEEP_AGENT_FLEET_SECRET = helpers.FLEET_SECRET
    started = []
    try:
        for node in ("n1", "n2"):
            agent = helpers.AgentProcess(tmp_path, node, tmp_path / "artifacts",
                                         kubelet_checkpoint_dir=str(tmp_path / "checkpoints" / node)).start()
            started.append(agent)
            kube.mutate("nodes", node, "", lambda obj, port=agent.port: obj["metadata"].setdefault(
                "annotations", {}).update({"gpusweep.io/agent-endpoint": f"http://127.0.0.1:{port}"}))
        yield
    finally:
        for agent in started:
            agent.stop()


def test_the_archive_moves_as_an_image_through_a_real_registry_and_the_counter_continues(
        kube: KubeApiServer, registry: str, agents: None, tmp_path: Path) -> None:
    """As on a real cluster: the node's agent hands over the kubelet's archive, the worker builds and pushes."""
    kubelet(kube, tmp_path, "n1")
    kubelet(kube, tmp_path, "n2", runtime="containerd://2.1.4", registry=registry)
    log = tmp_path / "counter.log"
    counter_pod(kube, log)
    ex = executor(kube, agents=True, checkpoint_via="kubelet", checkpoint_image_repository=f"http://{registry}/"
                  "checkpoints", executor_options={"restore_wait_s": 20})

    cluster = agent_helpers().CLUSTER  # the agents' identity is <cluster>/<node>
    taken = ex.checkpoint(ref("n1", cluster), "ml/trainer", "criu", "gs-7-11-ck")
    record = json.loads(kube.get("pods", "trainer", "ml")["metadata"]["annotations"]["gpusweep.io/checkpointed"])
    image = record["images"]["main"]
    assert image.startswith(f"{registry}/checkpoints:{taken.checkpoint_id}-main@sha256:")
    # In the registry, in checkpointctl's layout: one layer holding the archive's files, the container named.
    manifest, files = pull(registry, image)
    assert manifest["annotations"][CHECKPOINT_NAME] == "main" == manifest["annotations"][CRIU_CONTAINER_NAME]
    assert len(manifest["layers"]) == 1 and {"config.dump", "spec.dump", "checkpoint/state.json"} <= set(files)
    saved = json.loads(files["checkpoint/state.json"])["step"]
    assert json.loads(files["spec.dump"])["annotations"]["io.kubernetes.pod.name"] == "trainer"
    assert 0 < record["progress"]["main"] <= saved

    moved = ex.restore(ref("n2", cluster), taken.checkpoint_id, "gs-7-11-restore")
    name = moved.workload_id.split("/")[1]
    new = kube.get("pods", name, "ml")
    assert new["spec"]["nodeName"] == "n2" and new["spec"]["containers"][0]["image"] == image
    assert kube.happened("container-restored", f"ml/{name} n2")
    assert wait_for(lambda: kube.get("pods", "trainer", "ml") is None, 10, 0.1), "the original is evicted"
    # The counter went on from the saved step: one run of steps, never reset, now past the checkpoint.
    assert wait_for(lambda: steps(log)[-1] > saved + 5, 10, 0.1)
    counted = steps(log)
    assert counted == list(range(1, counted[-1] + 1)), "the step counter never restarted or skipped"
    assert "BAD" not in log.read_text()


def test_a_containerd_1_7_node_is_refused_and_cri_o_restores_for_a_replicaset(
        kube: KubeApiServer, registry: str, tmp_path: Path) -> None:
    kubelet(kube, tmp_path, "n1")
    kubelet(kube, tmp_path, "n2", runtime="containerd://1.7.24", registry=registry)
    kubelet(kube, tmp_path, "n3", runtime="cri-o://1.34.1", registry=registry)
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "trainer-5d8f", "uid": "rs-1"}
    kube.put("replicasets", {"metadata": {"namespace": "ml", "name": "trainer-5d8f"}, "spec": {
        "replicas": 1, "selector": {"matchLabels": {"app": "trainer", "pod-template-hash": "5d8f"}}}})
    log = tmp_path / "counter.log"
    counter_pod(kube, log, owner=owner, labels={"app": "trainer", "pod-template-hash": "5d8f"})
    ex = kubelet_executor(kube, tmp_path, f"http://{registry}/checkpoints")
    taken = ex.checkpoint(ref("n1"), "ml/trainer", "criu", "gs-7-11-ck")
    assert kube.happened("proxied", "POST n1 /checkpoint/ml/trainer/main")
    assert ex.checkpoint(ref("n1"), "ml/trainer", "criu", "gs-7-11-ck") == taken  # a retry takes nothing new
    assert kube.get("pods", "trainer", "ml")["metadata"]["labels"][CHECKPOINT_ID] == taken.checkpoint_id

    with pytest.raises(PermanentExecutorError, match=r"n2 runs containerd://1\.7\.24, which cannot restore a kubelet "
                                                     r"checkpoint: only CRI-O and containerd 2\.0 or later"):
        ex.restore(ref("n2"), taken.checkpoint_id, "gs-7-11-restore")
    assert [p["metadata"]["name"] for p in kube.objects("pods", "ml")] == ["trainer"]  # nothing made for n2
    moved = ex.restore(ref("n3"), taken.checkpoint_id, "gs-7-11-restore")
    name = moved.workload_id.split("/")[1]
    new = kube.get("pods", name, "ml")
    assert new["spec"]["nodeName"] == "n3" and new["metadata"]["ownerReferences"][0]["uid"] == "rs-1"
    assert kube.happened("container-restored", f"ml/{name} n3")
    assert wait_for(lambda: kube.get("pods", "trainer", "ml") is None, 10, 0.1)
    assert ex.restore(ref("n3"), taken.checkpoint_id, "gs-7-11-restore") == moved
    counted = steps(log)
    assert counted == list(range(1, counted[-1] + 1))


def test_an_unreachable_registry_fails_the_node_once_and_the_pod_keeps_running(
        kube: KubeApiServer, tmp_path: Path) -> None:
    kubelet(kube, tmp_path, "n1")
    log = tmp_path / "counter.log"
    counter_pod(kube, log)
    nowhere = f"127.0.0.1:{free_port()}"  # nothing listens there
    ex = kubelet_executor(kube, tmp_path, f"http://{nowhere}/checkpoints")
    with pytest.raises(PermanentExecutorError, match=rf"registry {nowhere} unreachable: .*the pod keeps running on "
                                                     "n1"):
        ex.checkpoint(ref("n1"), "ml/trainer", "criu", "gs-7-11-ck")
    pod = kube.get("pods", "trainer", "ml")
    assert pod["status"]["phase"] == "Running" and CHECKPOINT_ID not in pod["metadata"]["labels"]
    assert "gpusweep.io/checkpointed" not in pod["metadata"]["annotations"] and not kube.happened("evicted")
    assert [w.id for w in ex.list_workloads(ref("n1"))] == ["ml/trainer"]  # still the node's, still to move


def test_a_replacement_that_starts_afresh_is_no_restore(kube: KubeApiServer, registry: str, tmp_path: Path) -> None:
    """Ready is not enough: a target whose runtime runs the image as an ordinary one (the stand-in here takes it
    as present and starts the command anew) counts from 1 again, and the restore fails saying so."""
    kubelet(kube, tmp_path, "n1")
    kubelet(kube, tmp_path, "n2", runtime="cri-o://1.34.1")  # pulls nothing: the workload starts fresh
    log = tmp_path / "counter.log"
    counter_pod(kube, log)
    ex = kubelet_executor(kube, tmp_path, f"http://{registry}/checkpoints")
    taken = ex.checkpoint(ref("n1"), "ml/trainer", "criu", "gs-7-11-ck")
    with pytest.raises(PermanentExecutorError, match=r"did not continue from checkpoint kubelet-[0-9a-f]+: its "
                                                     r"progress runs 1\.\.\d+, and it had reached \d+"):
        ex.restore(ref("n2"), taken.checkpoint_id, "gs-7-11-restore")
    assert kube.get("pods", "trainer", "ml") is not None, "the original is not evicted for a failed restore"


def test_a_missing_image_waits_in_image_pull_back_off(kube: KubeApiServer, registry: str, tmp_path: Path) -> None:
    kubelet(kube, tmp_path, "n3", runtime="cri-o://1.34.1", registry=registry, backoff_s=0.1)
    pod = gpu_pod("ml", "ghost", "n3", 1)
    pod["spec"]["containers"][0]["image"] = f"{registry}/checkpoints:kubelet-0000-main"
    kube.put("pods", pod)

    def waiting() -> str:
        statuses = (kube.get("pods", "ghost", "ml").get("status") or {}).get("containerStatuses") or [{}]
        return str(((statuses[0].get("state") or {}).get("waiting") or {}).get("reason", ""))

    assert wait_for(lambda: waiting() == "ImagePullBackOff", 10, 0.05)
    status = kube.get("pods", "ghost", "ml")["status"]
    assert status["phase"] == "Pending" and not kube.happened("container-started", "ml/ghost")
    assert "404" in status["containerStatuses"][0]["state"]["waiting"]["message"]


def test_a_large_archive_is_hashed_and_pushed_in_chunks_in_bounded_memory(
        registry: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint of many GiB must never sit in the worker's memory: a 4 MiB archive (a stand-in for one, at
    a 256 KiB chunk) is hashed and uploaded one chunk at a time (one PATCH per chunk, with its Content-Range),
    Python's allocations peaking below a quarter of it; the registry serves back the very bytes."""
    archive, chunk = tmp_path / "checkpoint-trainer_ml-main-2026.tar", 256 * 1024
    pages = tmp_path / "pages-1.img"
    with pages.open("wb") as out:
        for _ in range(16):
            out.write(os.urandom(chunk))
    with tarfile.open(archive, "w") as tar:
        for name, data in (("config.dump", b"{}"), ("spec.dump", b'{"annotations": {}}')):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        tar.add(pages, "checkpoint/pages-1.img")
    pages.unlink()
    size = archive.stat().st_size
    assert size > 16 * chunk
    ranges: list[str] = []
    real = checkpoint_image.Registry._request

    def seen(self: checkpoint_image.Registry, method: str, url: str, data: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        if method == "PATCH":
            ranges.append((headers or {})["Content-Range"])
        return real(self, method, url, data, headers)

    monkeypatch.setattr(checkpoint_image.Registry, "_request", seen)
    pushing = checkpoint_image.Registry(checkpoint_image.Repository.parse(f"http://{registry}/checkpoints"),
                                        chunk=chunk)
    tracemalloc.start()
    try:
        image = checkpoint_image.build(archive, "main", chunk=chunk)
        reference = pushing.push(image, "kubelet-big-main")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < size / 4, f"{peak} bytes allocated at the peak for a {size}-byte archive"
    # The layer's chunks, back to back, then the config's one.
    parts = (size + chunk - 1) // chunk
    assert ranges[:parts] == [f"{at}-{min(at + chunk, size) - 1}" for at in range(0, size, chunk)]
    assert ranges[parts:] == [f"0-{image.config.size - 1}"]
    digest = f"sha256:{hashlib.sha256(archive.read_bytes()).hexdigest()}"
    assert image.layer.descriptor() == {"mediaType": checkpoint_image.LAYER, "digest": digest, "size": size}
    # Read back through the registry, as a runtime pulls it: the manifest by digest, the layer's bytes.
    manifest_digest = reference.rpartition("@")[2]
    request = urllib.request.Request(f"http://{registry}/v2/checkpoints/manifests/{manifest_digest}",
                                     headers={"Accept": MANIFEST})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert json.loads(answer.read())["layers"][0]["digest"] == digest
    served = hashlib.sha256()
    with urllib.request.urlopen(f"http://{registry}/v2/checkpoints/blobs/{digest}", timeout=10) as answer:
        while part := answer.read(chunk):
            served.update(part)
    assert f"sha256:{served.hexdigest()}" == digest


def test_without_a_progress_marker_the_restore_says_unverified_and_a_site_may_require_one(
        kube: KubeApiServer, registry: str, tmp_path: Path) -> None:
    """Ready alone proves no state came back: without ``gpusweep.io/progress-pattern`` the restore is reported
    "restore unverified: no progress marker" (the engine's evidence carries it); with the connection setting
    ``require_progress_marker`` such a pod is not checkpointable (listed with engine none), its checkpoint is
    refused before the kubelet dumps anything, and a checkpoint taken before the setting is not restored."""
    kubelet(kube, tmp_path, "n1")
    kubelet(kube, tmp_path, "n3", runtime="cri-o://1.34.1", registry=registry)
    log = tmp_path / "counter.log"
    counter_pod(kube, log, marker=False)
    ex = kubelet_executor(kube, tmp_path, f"http://{registry}/checkpoints")
    strict = executor(kube, checkpoint_via="kubelet", checkpoint_image_repository=f"http://{registry}/checkpoints",
                      kubelet_checkpoint_root=str(tmp_path / "checkpoints"), require_progress_marker=True)
    assert [(w.id, w.checkpoint_engine) for w in strict.list_workloads(ref("n1"))] == [("ml/trainer", "none")]
    with pytest.raises(PermanentExecutorError, match=r"has no progress marker .* requires one .* not checkpointed"):
        strict.checkpoint(ref("n1"), "ml/trainer", "signal", "gs-7-11-ck")
    assert not kube.happened("proxied") and CHECKPOINT_ID not in kube.get("pods", "trainer", "ml")["metadata"]["labels"]

    taken = ex.checkpoint(ref("n1"), "ml/trainer", "signal", "gs-7-11-ck")
    with pytest.raises(PermanentExecutorError, match="no progress marker to verify its restore by"):
        strict.restore(ref("n3"), taken.checkpoint_id, "gs-7-11-restore")
    assert [p["metadata"]["name"] for p in kube.objects("pods", "ml")] == ["trainer"]  # nothing made for n3
    moved = ex.restore(ref("n3"), taken.checkpoint_id, "gs-7-11-restore")
    assert moved.unverified == NO_PROGRESS_MARKER == "restore unverified: no progress marker"
    assert kube.get("pods", moved.workload_id.split("/")[1], "ml")["spec"]["nodeName"] == "n3"
