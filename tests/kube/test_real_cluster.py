"""The Kubernetes executor against a real cluster, when KUBECONFIG points at one: the one suite CI
may skip (no CI machine has a cluster; conftest.REAL_CLUSTER_SKIP). Read-only, except the drain
test, which cordons and taints the node named by GPUSWEEP_E2E_NODE for a moment and checks that
undo leaves it exactly as it was."""

from __future__ import annotations

import os

import pytest

from conftest import REAL_CLUSTER_SKIP
from executors.base import NodeRef, get_executor
from executors.kubernetes import KubernetesExecutor
from inventory.models import Cluster

pytestmark = pytest.mark.django_db


@pytest.fixture
def real() -> KubernetesExecutor:
    if not os.environ.get("KUBECONFIG"):
        pytest.skip(f"{REAL_CLUSTER_SKIP} (and GPUSWEEP_E2E_NODE=<node> to drain one node for a moment)")
    cluster = Cluster.objects.create(name="real", kind="kubernetes", secret_env={"kubeconfig": "KUBECONFIG"},
                                     connection={"executor": "kubernetes", "agents": False})
    ex = get_executor(cluster)
    assert isinstance(ex, KubernetesExecutor)
    return ex


def test_it_reaches_every_node_and_lists_its_gpu_pods(real: KubernetesExecutor) -> None:
    nodes = real.kube.nodes()
    assert nodes, "the cluster has no nodes"
    for node in nodes[:20]:
        ref = NodeRef(cluster="real", name=node["metadata"]["name"])
        assert real.reachable(ref) == ""
        assert isinstance(real.maintenance_hold(ref), str)
        for workload in real.list_workloads(ref):
            assert workload.gpus > 0 and "/" in workload.id


def test_a_drain_and_its_undo_leave_the_node_as_it_was(real: KubernetesExecutor) -> None:
    name = os.environ.get("GPUSWEEP_E2E_NODE")
    if not name:
        pytest.skip(f"{REAL_CLUSTER_SKIP} and GPUSWEEP_E2E_NODE=<a node gpusweep may cordon for a moment>")
    before = real.kube.node(name)
    assert before is not None
    ref = NodeRef(cluster="real", name=name)
    real.drain(ref, "gs-e2e-drain")
    try:
        drained = real.kube.node(name)
        assert drained and drained["spec"].get("unschedulable") is True
    finally:
        real.undo(ref, "gs-e2e-undo")
    after = real.kube.node(name)
    assert after is not None
    assert after["spec"].get("unschedulable") == before["spec"].get("unschedulable")
    assert after["spec"].get("taints") == before["spec"].get("taints")
    assert {k: v for k, v in (after["metadata"].get("annotations") or {}).items() if k.startswith("gpusweep.io/")} \
        == {k: v for k, v in (before["metadata"].get("annotations") or {}).items() if k.startswith("gpusweep.io/")}
