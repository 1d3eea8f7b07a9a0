"""Node facts advisories match on (GPU architecture, platform, container toolkit mode), as each
source reports them; a change of one re-matches the node's exposures like a version change."""

from __future__ import annotations

import pytest

from inventory.agent import parse_heartbeat
from inventory.choices import ClusterKind
from inventory.importers import import_file
from inventory.models import Cluster, Node
from inventory.services import InventoryError, ObservedNode, Snapshot, apply_snapshot
from inventory.signals import node_versions_changed
from inventory.sources.kubernetes import node_from_kubernetes
from tests.kube.objects import gpu_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster() -> Cluster:
    return Cluster.objects.create(name="lab", kind=ClusterKind.STATIC)


def test_a_file_reports_facts_by_column_and_a_change_re_matches_only_that_node(
        tmp_path, cluster, django_capture_on_commit_callbacks):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("name,driver,platform,container_toolkit_mode,fact:rack\n"
                     "g1,570.86.15,DGX H100,CDI,r12\ng2,570.86.15,,,\n")
    import_file(nodes, "lab")
    assert Node.objects.get(name="g1").facts == {"platform": "dgx_h100", "container_toolkit_mode": "cdi",
                                                 "rack": "r12"}
    assert Node.objects.get(name="g2").facts == {}
    calls: list[list[int]] = []

    def receiver(sender, node_ids, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(list(node_ids))

    node_versions_changed.connect(receiver, weak=False)
    try:
        nodes.write_text("name,driver,platform,container_toolkit_mode\ng1,570.86.15,DGX H100,legacy\n"
                         "g2,570.86.15,,\n")
        with django_capture_on_commit_callbacks(execute=True):
            import_file(nodes, "lab")
    finally:
        node_versions_changed.disconnect(receiver)
    g1 = Node.objects.get(name="g1")
    assert calls == [[g1.pk]]  # no version changed, but a fact exposures match on did
    # Facts merge: the file no longer names the rack, which the node keeps.
    assert g1.facts == {"platform": "dgx_h100", "container_toolkit_mode": "legacy", "rack": "r12"}


def test_a_bad_fact_is_refused_with_its_node(cluster):
    with pytest.raises(InventoryError, match=r"node .g1.*fact platform"):
        apply_snapshot(cluster, Snapshot(nodes=[ObservedNode("g1", facts={"platform": "DGX; rm -rf"})]), "file")
    assert not Node.objects.exists()


def test_kubernetes_labels_and_agent_heartbeats_report_facts():
    node = gpu_node("n1")
    node["metadata"]["labels"].update({"nvidia.com/gpu.family": "hopper", "nvidia.com/gpu.machine": "NVIDIA DGX H100",
                                       "gpusweep.io/container-toolkit-mode": "cdi"})
    assert node_from_kubernetes(node).facts == {"gpu_architecture": "hopper", "platform": "NVIDIA DGX H100",
                                                "container_toolkit_mode": "cdi"}
    assert node_from_kubernetes(gpu_node("n2")).facts is None  # reports none: leaves the node's alone
    observed, _ = parse_heartbeat({"schema": "gpusweep.heartbeat/1", "cluster": "lab", "node": "g1", "facts": {
        "components": {"driver": "570.86.15"}, "platform": "HGX H100", "facts": {"container_toolkit_mode": "csv"}}},
        "lab", "g1")
    assert observed.facts == {"platform": "HGX H100", "container_toolkit_mode": "csv"}
