"""The REST API as a ticketing system or the security team uses it."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone

from advisories.ingest import ingest_documents
from advisories.models import Exposure
from advisories.sources import FileSource
from inventory.models import Cluster
from tests.advisories.conftest import FIXTURES, PUBLISHED_5703, add_node, eager_tasks

pytestmark = pytest.mark.django_db
API = "/api/v1/advisories"


def login(client: Client, role: str) -> User:
    user = User.objects.create_user(f"{role}-user", password="pw-long-enough-1")
    user.groups.add(Group.objects.get(name=role))
    client.force_login(user)
    return user


@pytest.fixture
def data() -> None:
    for bulletin in ("5703", "5582"):
        path = FIXTURES / f"{bulletin}.json"
        ingest_documents(FileSource(str(path)).items())
    prod = Cluster.objects.create(name="prod", kind="slurm")
    lab = Cluster.objects.create(name="lab", kind="kubernetes")
    add_node(prod, "p1", driver="580.82.07", container_toolkit="1.16.1")
    add_node(prod, "p2", driver="580.95.05", container_toolkit="1.17.8")
    add_node(lab, "l1", driver="535.261.03")
    from advisories.exposure import recompute

    recompute()


def test_a_viewer_lists_advisories_with_integrity_and_ranges(client, data):
    login(client, "viewer")
    rows = client.get(f"{API}/advisories/", {"severity": "high"}).json()["results"]
    assert [(r["publisher_id"], r["integrity"], r["open_exposures"]) for r in rows] == [("5703", "mismatch", 2)]
    detail = client.get(f"{API}/advisories/{rows[0]['id']}/").json()
    tesla = {(r["branch"], r["fixed_version"]) for r in detail["ranges"]
             if r["os_family"] == "linux" and r["product_line"] == "tesla" and r["basis"] == "decoded"}
    assert tesla == {("R580", "580.95.05"), ("R570", "570.195.03"), ("R535", "535.274.02")}
    cve = client.get(f"{API}/cves/CVE-2025-23309/").json()
    assert (cve["base_score"], cve["severity"]) == ("8.2", "high")


def test_exposures_filter_by_severity_state_cluster_and_overdue(client, data):
    login(client, "viewer")

    def nodes(**params: str) -> set[tuple[str, str]]:
        return {(r["node_name"], r["advisory_id"]) for r in client.get(f"{API}/exposures/", params).json()["results"]}

    assert nodes() == {("p1", "5703"), ("p1", "5582"), ("l1", "5703")}
    assert nodes(severity="critical") == {("p1", "5582")}
    assert nodes(cluster="lab") == {("l1", "5703")}
    # The bulletins are from 2024/2025 and their deadlines counted from publication have passed.
    assert nodes(overdue="true") == nodes()
    Exposure.objects.filter(node__name="l1").update(deadline=timezone.now() + dt.timedelta(days=3))
    assert nodes(overdue="false") == {("l1", "5703")}
    row = client.get(f"{API}/exposures/", {"cluster": "lab"}).json()["results"][0]
    assert row["overdue"] is False and row["fixed_version"] == "535.274.02" and len(row["cves"]) == 6
    assert nodes(state="remediated") == set()


def test_only_approvers_accept_risk_with_reason_and_expiry(client, data):
    exposure = Exposure.objects.get(node__name="l1")
    url = f"{API}/exposures/{exposure.id}/accept_risk/"
    expires = (timezone.now() + dt.timedelta(days=30)).isoformat()
    body = {"reason": "lab cluster, isolated network", "expires_at": expires}
    login(client, "viewer")
    assert client.post(url, body, content_type="application/json").status_code == 403
    approver = login(Client(), "approver")
    approver_client = Client()
    approver_client.force_login(approver)
    bad = approver_client.post(url, {"reason": "x", "expires_at": "2000-01-01T00:00:00Z"},
                               content_type="application/json")
    assert bad.status_code == 400 and set(bad.json()["errors"]) == {"reason", "expires_at"}
    ok = approver_client.post(url, body, content_type="application/json")
    assert ok.status_code == 200
    assert (ok.json()["state"], ok.json()["risk_approver"]) == ("risk_accepted", "approver-user")
    exposure.refresh_from_db()
    assert exposure.risk_reason == "lab cluster, isolated network"
    assert approver_client.post(f"{API}/exposures/{exposure.id}/revoke_risk/").json()["state"] == "open"


def test_admins_edit_the_deadline_policy_and_deadlines_follow(client, data, django_capture_on_commit_callbacks):
    login(client, "viewer")
    assert client.get(f"{API}/deadline-policy/current/").json()["critical_days"] == 15
    assert client.patch(f"{API}/deadline-policy/current/", {"high_days": 10},
                        content_type="application/json").status_code == 403
    admin = Client()
    login(admin, "admin")
    # The recompute is a task, run here where the change commits (tests/advisories/test_deadline_recompute.py
    # runs it on a real worker).
    with eager_tasks(), django_capture_on_commit_callbacks(execute=True):
        response = admin.patch(f"{API}/deadline-policy/current/", {"high_days": 10}, content_type="application/json")
    assert response.status_code == 200 and response.json()["high_days"] == 10
    assert Exposure.objects.get(node__name="l1").deadline == PUBLISHED_5703 + dt.timedelta(days=10)
    lab = Cluster.objects.get(name="lab")
    with eager_tasks(), django_capture_on_commit_callbacks(execute=True):
        created = admin.post(f"{API}/deadline-overrides/", {"cluster": lab.id, "severity": "high", "days": 3},
                             content_type="application/json")
    assert created.status_code == 201
    assert Exposure.objects.get(node__name="l1").deadline == PUBLISHED_5703 + dt.timedelta(days=3)
    assert Exposure.objects.get(node__name="p1", advisory__publisher_id="5703").deadline == (
        PUBLISHED_5703 + dt.timedelta(days=10))
