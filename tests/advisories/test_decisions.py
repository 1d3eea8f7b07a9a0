"""Approvers' and admins' decisions through the API and the pages, each with its evidence."""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.test import Client

from advisories.exposure import recompute
from advisories.ingest import FetchedDocument, ingest_document
from advisories.models import Advisory, AdvisoryEvent, Exposure, ReviewItem
from inventory.models import Cluster
from tests.advisories.conftest import FIXTURES, add_node

pytestmark = pytest.mark.django_db
API = "/api/v1/advisories"
TEST_CSAF = FIXTURES.parent / "test-csaf"


def client_for(role: str) -> tuple[Client, User]:
    user = User.objects.create_user(f"{role}-user")
    user.groups.add(Group.objects.get(name=role))
    client = Client()
    client.force_login(user)
    return client, user


@pytest.fixture
def presumed() -> Exposure:
    call_command("ingest_advisories", str(FIXTURES / "5703.json"), "--no-progress", stdout=io.StringIO())
    cluster = Cluster.objects.create(name="prod", kind="static")
    add_node(cluster, "old-branch", driver="550.163.01")
    add_node(cluster, "open-node", driver="570.172.08")
    recompute()
    return Exposure.objects.get(state="presumed")


def test_an_approver_sets_a_presumed_exposure_not_affected_with_a_vex_justification(presumed):
    url = f"{API}/exposures/{presumed.id}/not_affected/"
    body = {"justification": "vulnerable_code_not_in_execute_path", "reason": "headless nodes, no display driver use"}
    viewer, _ = client_for("viewer")
    assert viewer.post(url, body, content_type="application/json").status_code == 403
    approver, anna = client_for("approver")
    bad = approver.post(url, {"justification": "trust_me", "reason": "short"}, content_type="application/json")
    assert bad.status_code == 400 and set(bad.json()["errors"]) == {"justification", "reason"}
    ok = approver.post(url, body, content_type="application/json")
    assert ok.status_code == 200
    assert (ok.json()["state"], ok.json()["justification"], ok.json()["risk_approver"]) == (
        "not_affected", "vulnerable_code_not_in_execute_path", "approver-user")
    event = AdvisoryEvent.objects.get(kind="not_affected")
    assert (event.user, event.details["node"], event.details["previous"]) == (anna, "old-branch", "presumed")
    again = approver.post(url, body, content_type="application/json")
    assert again.status_code == 409 and "not_affected" in again.json()["detail"]
    # Not affected is not exposed: no deadline counts, and a recompute leaves the decision alone.
    recompute()
    presumed.refresh_from_db()
    assert presumed.state == "not_affected"


def test_accepting_a_risk_writes_its_evidence(presumed):
    approver, anna = client_for("approver")
    exposure = Exposure.objects.get(state="open")
    response = approver.post(f"{API}/exposures/{exposure.id}/accept_risk/",
                             {"reason": "lab cluster, isolated network",
                              "expires_at": (dt.datetime.now(dt.UTC) + dt.timedelta(days=300)).isoformat()},
                             content_type="application/json")
    assert response.status_code == 200 and response.json()["state"] == "risk_accepted"
    assert AdvisoryEvent.objects.get(kind="risk_accepted").user == anna
    assert approver.post(f"{API}/exposures/{exposure.id}/revoke_risk/").json()["state"] == "open"
    assert AdvisoryEvent.objects.filter(kind="risk_revoked", user=anna).count() == 1


def test_an_admin_dismisses_or_maps_review_items_and_exposures_follow():
    ingest_document(FetchedDocument("9004.json", (TEST_CSAF / "9004.json").read_bytes(), "file"))
    advisory = Advisory.objects.get(publisher_id="9004")
    cluster = Cluster.objects.create(name="vgpu", kind="static")
    guest = add_node(cluster, "guest-r570", driver="570.172.08")
    guest.product_line = "vgpu_guest"
    guest.save()
    recompute()
    assert Exposure.objects.get(node=guest).state == "presumed"
    viewer, _ = client_for("viewer")
    listed = viewer.get(f"{API}/advisories/", {"needs_review": "true"}).json()["results"]
    # 4 rows, and the branches older than the oldest it names, of which its notes say nothing.
    assert [(a["publisher_id"], a["needs_review"], a["open_review_items"]) for a in listed] == [("9004", True, 5)]
    item = advisory.review_items.get(key__endswith="570_172_08all_versions_through_the_next_maintenance_release")
    mapping = {"component": "driver", "os_family": "linux", "product_line": "vgpu_guest", "branch": "R570",
               "lower": "570.0", "upper": "570.172.08", "upper_inclusive": True, "fixed_version": "570.195.03"}
    assert viewer.post(f"{API}/review-items/{item.id}/map/", {"mapping": mapping, "reason": "per vGPU 18.5 notes"},
                       content_type="application/json").status_code == 403
    admin, root = client_for("admin")
    bad = admin.post(f"{API}/review-items/{item.id}/map/", {"mapping": {"component": "warp_drive", "upper": "1.0"},
                                                             "reason": "per vGPU 18.5 release notes"},
                     content_type="application/json")
    assert bad.status_code == 400 and "component must be one of" in bad.json()["detail"]
    ok = admin.post(f"{API}/review-items/{item.id}/map/", {"mapping": mapping, "reason": "per vGPU 18.5 release notes"},
                    content_type="application/json")
    assert ok.status_code == 200 and ok.json()["state"] == "mapped"
    # The presumed exposure is withdrawn and the node, inside the mapped range, is open now.
    exposure = Exposure.objects.get(node=guest)
    assert (exposure.state, exposure.affected_range.basis, exposure.affected_range.fixed_version) == (
        "open", "mapped", "570.195.03")
    assert AdvisoryEvent.objects.filter(kind="presumed_withdrawn").count() == 1
    assert AdvisoryEvent.objects.get(kind="review_mapped").user == root
    for other in advisory.review_items.filter(state="open"):
        response = admin.post(f"{API}/review-items/{other.id}/dismiss/", {"reason": "checked against the table"},
                              content_type="application/json")
        assert response.status_code == 200
    assert viewer.get(f"{API}/advisories/{advisory.public_id}/").json()["needs_review"] is False
    # A later revision keeps the admin's mapping (and the resolved items).
    data = json.loads((TEST_CSAF / "9004.json").read_bytes())
    data["document"]["tracking"]["version"] = "1.1.0"
    data["document"]["tracking"]["revision_history"].append(
        {"date": "2099-02-01T00:00:00Z", "number": "1.1.0", "summary": "Typo fixed"})
    assert ingest_document(FetchedDocument("9004-1.1.json", json.dumps(data).encode(), "file"))[0] == "updated"
    assert Exposure.objects.get(node=guest).state == "open"
    assert not ReviewItem.objects.filter(advisory=advisory, state="open").exists()


def test_the_pages_show_review_items_and_let_an_approver_decide(presumed):
    advisory = presumed.advisory
    admin, _ = client_for("admin")
    page = admin.get(f"/advisories/{advisory.public_id}/").content.decode()
    assert "Needs review" in page and "between R535 and R570" in page and "Dismiss" in page
    assert "Presumed exposed" in page and "move to a supported branch" in page
    approver, _ = client_for("approver")
    response = approver.post(f"/advisories/exposures/{presumed.id}/decide/", {
        "decision": "not_affected", "justification": "component_not_present", "reason": "display driver not loaded"})
    assert response.status_code == 302
    presumed.refresh_from_db()
    assert (presumed.state, presumed.justification) == ("not_affected", "component_not_present")
    item = advisory.review_items.filter(state="open").first()
    assert item is not None
    assert approver.post(f"/advisories/review-items/{item.id}/resolve/", {
        "resolution": "dismiss", "reason": "we run no such branch"}).status_code == 403
    admin.post(f"/advisories/review-items/{item.id}/resolve/", {"resolution": "dismiss",
                                                               "reason": "we run no such branch"})
    item.refresh_from_db()
    assert item.state == "dismissed" and item.resolution == "we run no such branch"


def test_a_revoked_or_expired_acceptance_of_a_presumed_exposure_is_presumed_again(presumed):
    from advisories import services
    from advisories.exposure import expire_acceptances

    anna = User.objects.create_user("anna")
    future = dt.datetime.now(dt.UTC) + dt.timedelta(days=300)
    services.accept_risk(presumed.id, anna, "R550 retires next month", future)
    assert services.revoke_risk(presumed.id, anna).state == "presumed"
    services.accept_risk(presumed.id, anna, "R550 retires next month", future)
    Exposure.objects.filter(pk=presumed.id).update(risk_expires_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    assert expire_acceptances() == 1
    presumed.refresh_from_db()
    assert presumed.state == "presumed"
