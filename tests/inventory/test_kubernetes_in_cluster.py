"""In-cluster configuration (issue 27, item 4): gpusweep running in a pod reaches its own cluster with
the pod's service account, the token and CA where the kubelet mounts them and the API server named by
KUBERNETES_SERVICE_HOST/PORT, with no kubeconfig written by hand. The service account folder is a
stand-in (a folder of this test holding a token the test API server of tests/kube/apiserver.py accepts,
and that server's CA): no pod runs here."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from executors.base import NodeRef, get_executor
from executors.kubernetes import DRAINED_BY
from inventory.models import Cluster
from inventory.sources.kubernetes import KubernetesError, client_for
from tests.kube.apiserver import KubeApiServer
from tests.kube.objects import gpu_node

TOKEN = "service-account-token-of-gpusweep-worker"


@pytest.fixture
def kube() -> Iterator[KubeApiServer]:
    with KubeApiServer(token=TOKEN) as api:
        api.nodes = [gpu_node("n1"), gpu_node("n2")]
        yield api


@pytest.fixture
def in_a_pod(kube: KubeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings) -> Path:  # type: ignore[no-untyped-def]
    """The environment and files the kubelet gives a pod: its service account's token and the cluster CA."""
    folder = tmp_path / "serviceaccount"
    folder.mkdir()
    (folder / "token").write_text(TOKEN)
    shutil.copy(kube.ca_path, folder / "ca.crt")
    (folder / "namespace").write_text("gpusweep")
    url = urlsplit(kube.url)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", str(url.hostname))
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(url.port))
    settings.GPUSWEEP_KUBE_SERVICE_ACCOUNT_DIR = folder
    return folder


def test_a_cluster_with_no_connection_settings_is_read_and_driven_with_the_pods_service_account(
    kube: KubeApiServer, in_a_pod: Path
) -> None:
    cluster = Cluster(name="home", kind="kubernetes", connection={})
    assert sorted(n["metadata"]["name"] for n in client_for(cluster).nodes()) == ["n1", "n2"]
    # The executor uses the same client: the worker drains and undoes with its own service account.
    ex = get_executor(Cluster(name="home", kind="kubernetes", connection={"executor": "kubernetes", "agents": False}))
    ex.drain(NodeRef("home", "n1"), "gs-3-1-drain")
    assert kube.get("nodes", "n1")["metadata"]["annotations"][DRAINED_BY] == "gs-3-1-drain"
    ex.undo(NodeRef("home", "n1"), "gs-3-1-undo")
    assert not kube.get("nodes", "n1")["spec"].get("unschedulable")


def test_in_cluster_set_explicitly_needs_a_pod_and_says_what_is_missing(
    kube: KubeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, settings
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    settings.GPUSWEEP_KUBE_SERVICE_ACCOUNT_DIR = tmp_path / "nothing"
    with pytest.raises(KubernetesError, match=r"runs in no pod.*KUBERNETES_SERVICE_HOST"):
        client_for(Cluster(name="home", kind="kubernetes", connection={"in_cluster": True}))


def test_a_kubeconfig_named_for_the_cluster_wins_over_the_pods_own_service_account(
    kube: KubeApiServer, in_a_pod: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another cluster, managed from this pod: its kubeconfig carries its own token."""
    other_token = "token-of-another-cluster"
    with KubeApiServer(token=other_token) as other:
        other.nodes = [gpu_node("far1")]
        monkeypatch.setenv("GPUSWEEP_SECRET_KUBECONFIG_FAR", str(other.kubeconfig(tmp_path / "far.yaml")))
        cluster = Cluster(
            name="far", kind="kubernetes", connection={}, secret_env={"kubeconfig": "GPUSWEEP_SECRET_KUBECONFIG_FAR"}
        )
        assert [n["metadata"]["name"] for n in client_for(cluster).nodes()] == ["far1"]
    # And in_cluster wins over nothing else: the pod's own cluster.
    assert len(client_for(Cluster(name="home", kind="kubernetes", connection={"in_cluster": True})).nodes()) == 2
