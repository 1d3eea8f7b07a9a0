"""The security team's pages, through the real URL stack with a logged-in user."""

from __future__ import annotations

import csv
import io

import pytest
from django.core.management import call_command
from django.test import Client

from advisories.exposure import recompute
from advisories.models import Advisory
from campaigns.models import Campaign
from inventory.models import Cluster
from tests.advisories.conftest import FIXTURES, add_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(db: None) -> Cluster:
    call_command("ingest_advisories", str(FIXTURES), verbosity=0)
    cluster = Cluster.objects.create(name="prod", kind="static")
    add_node(cluster, "gpu-old", driver="570.86.15", cuda="12.8")
    add_node(cluster, "gpu-fixed", driver="570.195.03", cuda="12.8")
    add_node(cluster, "gpu-r535", driver="535.100.01", cuda="12.2")
    recompute()
    return cluster


@pytest.fixture
def viewer(client: Client, make_user) -> Client:  # type: ignore[no-untyped-def]
    make_user("vera", "viewer")
    client.login(username="vera", password="pw-vera-12345")
    return client


def test_it_lists_advisories_with_integrity_and_exposed_nodes(viewer: Client, fleet: Cluster):
    page = viewer.get("/advisories/").content.decode()
    assert "NVIDIA 5703" in page
    assert "SHA-256 mismatch" in page  # 5703's published hash does not match


def test_the_advisory_page_names_exposed_nodes_and_fixed_versions(viewer: Client, fleet: Cluster):
    advisory = Advisory.objects.get(publisher_id="5703")
    page = viewer.get(f"/advisories/{advisory.public_id}/").content.decode()
    assert "570.195.03" in page and "580.95.05" in page and "535.274.02" in page
    assert "prod/gpu-old" in page and "prod/gpu-r535" in page
    assert "prod/gpu-fixed" not in page


def test_it_exports_open_exposures_as_csv(viewer: Client, fleet: Cluster):
    response = viewer.get("/advisories/exposures/?state=open&format=csv")
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    nodes = {row["node"] for row in rows}
    assert nodes == {"gpu-old", "gpu-r535"}
    assert all(row["deadline"] for row in rows)


def test_the_node_page_shows_versions_and_exposures(viewer: Client, fleet: Cluster):
    node = fleet.nodes.get(name="gpu-old")
    page = viewer.get(f"/nodes/{node.pk}/").content.decode()
    assert "570.86.15" in page and "R570" in page
    assert "NVIDIA 5703" in page
    assert "gpu-old" in viewer.get("/nodes/?q=old").content.decode()


def test_a_viewer_cannot_create_or_drive_campaigns(viewer: Client, fleet: Cluster):
    assert viewer.get("/campaigns/new/").status_code == 403
    campaign = Campaign.objects.create(name="c1")
    assert viewer.post(f"/campaigns/{campaign.pk}/plan/").status_code == 403
    assert campaign.plans.count() == 0


def test_an_operator_plans_and_an_approver_approves_from_the_page(client: Client, make_user, fleet: Cluster):  # type: ignore[no-untyped-def]
    make_user("otto", "operator")
    make_user("anna", "approver")
    client.login(username="otto", password="pw-otto-12345")
    response = client.post("/campaigns/new/", {
        "name": "R570 fix", "advisories": [Advisory.objects.get(publisher_id="5703").public_id], "clusters": ["prod"],
        "parallelism_per_cluster": "1", "error_budget": "1", "workload_policy": "checkpoint",
        "approvals_required": "1",
    })
    campaign = Campaign.objects.get(name="R570 fix")
    assert response.status_code == 302
    assert campaign.clusters == ["prod"] and campaign.pools == []
    client.post(f"/campaigns/{campaign.pk}/plan/")
    page = client.get(f"/campaigns/{campaign.pk}/").content.decode()
    assert "Plan v1" in page and "gpu-old" in page
    # The requester may not approve; an approver may.
    assert client.post(f"/campaigns/{campaign.pk}/approve/").status_code == 403
    client.logout()
    client.login(username="anna", password="pw-anna-12345")
    client.post(f"/campaigns/{campaign.pk}/approve/", {"comment": "go"})
    campaign.refresh_from_db()
    assert campaign.status == "approved"
    evidence = client.get(f"/campaigns/{campaign.pk}/evidence.json").json()
    assert evidence["verified"] is True
    assert [e["kind"] for e in evidence["events"]][-2:] == ["approved", "fully_approved"]  # a GET writes no seal
