"""Kubernetes sync through the official client, over TLS, against the test API server of
tests/kube/apiserver.py (no Kubernetes API server can run on these machines). The end-to-end test against a real
cluster exists only when KUBECONFIG is set at collection time, so CI without a cluster
neither runs nor skips it."""

from __future__ import annotations

import datetime as dt
import os
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from inventory.choices import CheckpointEngine, ClusterKind, ServiceState, WorkloadKind
from inventory.models import Cluster, Node, Workload
from inventory.sources.kubernetes import PAGE, client_for, snapshot_from_kubernetes
from inventory.sync import sync_cluster
from tests.kube.apiserver import KubeApiServer
from tests.kube.objects import gpu_like_pods, gpu_node, gpu_pod

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def kube(monkeypatch):
    monkeypatch.setenv("GPUSWEEP_TEST_KUBE_TOKEN", "test-token")
    with KubeApiServer(token="test-token") as api:
        api.nodes = [gpu_node("n1"), gpu_node("n2", driver="580.95.05", cuda="13.0"),
                     gpu_node("n3", unschedulable=True)]
        api.pods = [
            gpu_pod("ml", "trainer-0", "n1", 4, annotations={
                "gpusweep.io/checkpoint": "cuda", "gpusweep.io/engine": "triton",
                "gpusweep.io/engine-version": "25.01", "gpusweep.io/model": "llama-3-8b"}),
            gpu_pod("web", "nginx", "n1", 0),
            gpu_pod("ml", "done", "n2", 1, phase="Succeeded"),
        ]
        yield api


def k8s_cluster(api: KubeApiServer, name: str = "prod") -> Cluster:
    return Cluster.objects.create(
        name=name, kind=ClusterKind.KUBERNETES, connection={"host": api.url, "ca_cert": str(api.ca_path)},
        secret_env={"token": "GPUSWEEP_TEST_KUBE_TOKEN"},
    )


def test_it_reads_gfd_labels_and_gpu_pods_and_a_second_sync_changes_nothing(kube):
    cluster = k8s_cluster(kube)
    result = sync_cluster(cluster)
    assert (result.added, result.workloads_added) == (3, 1)

    n1 = Node.objects.get(name="n1")
    assert (n1.gpu_model, n1.gpu_count, n1.pool, n1.service_state) == (
        "NVIDIA-H100-80GB-HBM3", 8, "h100", ServiceState.IN_SERVICE,
    )
    versions = n1.component_versions()
    assert versions["driver"] == "570.86.15" and versions["cuda"] == "12.8"
    assert versions["kernel"] == "5.15.0-1053-nvidia" and versions["os"] == "Ubuntu 22.04.4 LTS"
    assert n1.cpu_milli == 96000 and n1.memory_mib == 1031733
    assert Node.objects.get(name="n2").component_versions()["driver"] == "580.95.05"
    assert Node.objects.get(name="n3").service_state == ServiceState.DRAINING

    pod = Workload.objects.get(kind=WorkloadKind.K8S_POD)
    assert (pod.scheduler_id, pod.node, pod.gpus) == ("ml/trainer-0", n1, 4)
    assert (pod.checkpoint_engine, pod.engine, pod.engine_version, pod.model_name) == (
        CheckpointEngine.CUDA, "triton", "25.01", "llama-3-8b",
    )
    assert pod.started_at == dt.datetime(2026, 11, 30, 7, 0, tzinfo=dt.UTC)
    assert pod.time_limit == dt.timedelta(days=1)

    assert sync_cluster(cluster).no_changes


def test_it_detects_vanished_nodes_and_pods_and_driver_upgrades(kube):
    cluster = k8s_cluster(kube)
    sync_cluster(cluster)
    kube.nodes = [gpu_node("n1", driver="570.195.03"), gpu_node("n2", driver="580.95.05", cuda="13.0")]
    kube.pods = []
    result = sync_cluster(cluster)
    assert (result.removed, result.workloads_removed) == (1, 1)
    assert result.versions_changed == {Node.objects.get(name="n1").pk}
    assert Node.objects.get(name="n3").service_state == ServiceState.GONE


def test_it_pages_through_large_clusters(kube):
    kube.nodes = [gpu_node(f"node-{i:04d}") for i in range(PAGE * 2 + 7)]
    kube.pods = []
    snapshot = snapshot_from_kubernetes(client_for(k8s_cluster(kube)))
    assert len(snapshot.nodes) == PAGE * 2 + 7
    assert sum(1 for r in kube.requests if r.startswith("/api/v1/nodes")) == 3


def test_it_reports_a_refused_token_and_changes_nothing(kube, monkeypatch):
    k8s_cluster(kube)
    monkeypatch.setenv("GPUSWEEP_TEST_KUBE_TOKEN", "wrong")
    out = StringIO()
    with pytest.raises(CommandError, match=r"prod: GET /api/v1/nodes: HTTP 401"):
        call_command("sync_inventory", "--cluster", "prod", "--no-progress", stdout=out)
    assert "1 errors" in out.getvalue()
    assert "HTTP 401" in Cluster.objects.get(name="prod").last_sync_error
    assert Node.objects.count() == 0


def test_it_names_a_missing_secret_variable(kube, monkeypatch):
    cluster = k8s_cluster(kube)
    monkeypatch.delenv("GPUSWEEP_TEST_KUBE_TOKEN")
    with pytest.raises(Exception, match="GPUSWEEP_TEST_KUBE_TOKEN"):
        sync_cluster(cluster)


if os.environ.get("KUBECONFIG"):

    def test_it_syncs_a_real_cluster_from_kubeconfig():
        """Runs only when KUBECONFIG points at a real cluster (defined at collection time)."""
        cluster = Cluster.objects.create(name="real", kind=ClusterKind.KUBERNETES,
                                         secret_env={"kubeconfig": "KUBECONFIG"})
        first = sync_cluster(cluster)
        assert first.added == Node.objects.filter(cluster=cluster).count() > 0
        assert sync_cluster(cluster).added == 0


def test_it_finds_gpus_in_init_containers_mig_slices_site_resources_and_nvidia_resource_claims(kube):
    pods, claims = gpu_like_pods()
    kube.pods = pods
    for claim in claims:
        kube.put("resourceclaims", claim)
    cluster = k8s_cluster(kube)
    cluster.connection = {**cluster.connection, "gpu_resources": ["example.com/shared-gpu"]}
    cluster.save()
    sync_cluster(cluster)
    found = dict(Workload.objects.filter(cluster=cluster).values_list("name", "gpus"))
    # Init containers: the largest plain one (2), native sidecars add to the containers (1 + 1).
    assert found == {"mig-only": 1, "warmup": 2, "with-sidecar": 2, "shared": 1, "dra": 2, "dra-templated": 1}
