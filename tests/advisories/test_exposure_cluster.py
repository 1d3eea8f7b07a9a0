"""Each exposure's copy of its node's cluster (Exposure.cluster, the exposure list's cluster filter
without a node join): written with every new exposure, moved with its node in the same transaction,
never different from the node's."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F
from django.test import Client

from advisories.ingest import ingest_documents
from advisories.models import Exposure
from advisories.sources import resolve
from inventory.models import ChangeLog, Cluster, Node
from inventory.services import InventoryError, move_node
from tests.advisories.conftest import add_node
from tests.advisories.test_exposure import ingest
from tests.advisories.test_osmatch import DRIVER_OLD, OSV, driver_packages, report

pytestmark = pytest.mark.django_db


def mismatched() -> list[int]:
    return list(Exposure.objects.exclude(cluster_id=F("node__cluster_id")).values_list("id", flat=True))


@pytest.fixture
def two_clusters() -> tuple[Cluster, Cluster]:
    prod, lab = Cluster.objects.create(name="prod", kind="slurm"), Cluster.objects.create(name="lab", kind="slurm")
    for cluster in (prod, lab):
        for i in range(3):
            add_node(cluster, f"{cluster.name}-{i}", driver="570.172.08", container_toolkit="1.17.8")
    ingest("5703")
    return prod, lab


def listed(client: Client, cluster: str) -> set[str]:
    answer = client.get("/api/v1/advisories/exposures/", {"cluster": cluster, "state": "open", "limit": "1000"})
    assert answer.status_code == 200
    return {row["node_name"] for row in answer.json()["results"]}


@pytest.fixture
def api() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw-root-123456789"))
    return client


def test_the_recompute_writes_each_exposure_with_its_nodes_cluster(two_clusters, api):
    prod, lab = two_clusters
    assert Exposure.objects.filter(cluster=prod).count() == Exposure.objects.filter(node__cluster=prod).count() > 0
    assert Exposure.objects.filter(cluster=lab).exists() and mismatched() == []
    assert listed(api, "prod") == {"prod-0", "prod-1", "prod-2"} and listed(api, "lab") == {"lab-0", "lab-1", "lab-2"}


def test_the_os_package_inserts_write_the_cluster_too():
    cluster = Cluster.objects.create(name="dgx", kind="static")
    node = Node.objects.create(cluster=cluster, name="gpu01")
    report(node, driver_packages(DRIVER_OLD))
    ingest_documents(resolve(str(OSV / "USN-5547-1.json")).items())
    assert Exposure.objects.get(node=node).cluster_id == cluster.pk and mismatched() == []


def test_an_exposure_saved_without_a_cluster_takes_its_nodes(two_clusters):
    prod, _lab = two_clusters
    exposure = Exposure.objects.filter(cluster=prod).first()
    copy = Exposure.objects.get(pk=exposure.pk)
    copy.pk, copy.cluster_id, copy.affected_range_id = None, None, exposure.affected_range_id
    copy.node = Node.objects.create(cluster=prod, name="prod-new")
    copy.save()
    assert copy.cluster_id == prod.pk and mismatched() == []


def test_a_node_moved_to_another_cluster_takes_its_exposures_in_the_same_transaction(two_clusters, api):
    _prod, lab = two_clusters
    node = Node.objects.get(name="prod-1")
    count = node.exposures.count()
    with transaction.atomic():
        move_node(node.pk, lab.pk)
        # Within the move's transaction already: no reader sees the node and its exposures apart.
        assert Exposure.objects.filter(node=node, cluster=lab).count() == count > 0 and mismatched() == []
    assert listed(api, "prod") == {"prod-0", "prod-2"} and "prod-1" in listed(api, "lab")
    assert ChangeLog.objects.filter(object_type="node", object_id=node.pk).latest("id").changes == {
        "cluster": ["prod", "lab"]
    }


def test_a_move_that_fails_moves_nothing(two_clusters):
    prod, lab = two_clusters
    clash = Node.objects.create(cluster=lab, name="prod-0")
    node = Node.objects.get(cluster=prod, name="prod-0")
    with pytest.raises(InventoryError, match="has a node named prod-0"):
        move_node(node.pk, lab.pk)
    with pytest.raises(InventoryError, match="no cluster"):
        move_node(node.pk, 10**9)
    assert Node.objects.get(pk=node.pk).cluster_id == prod.pk and clash.cluster_id == lab.pk
    assert Exposure.objects.filter(node=node, cluster=prod).exists() and mismatched() == []


def test_the_admin_cannot_move_a_node_around_its_exposures(two_clusters, api):
    _prod, lab = two_clusters
    node = Node.objects.get(name="prod-2")
    page = api.get(f"/admin/inventory/node/{node.pk}/change/")
    assert page.status_code == 200 and 'name="cluster"' not in page.content.decode()
    api.post(f"/admin/inventory/node/{node.pk}/change/", {"name": node.name, "cluster": lab.pk})
    assert Node.objects.get(pk=node.pk).cluster.name == "prod" and mismatched() == []
