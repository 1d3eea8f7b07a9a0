from __future__ import annotations

import pytest
from django.test import Client

from campaigns.choices import CampaignStatus
from campaigns.models import Campaign, NodeSweep, Plan
from tests.campaigns.fleet import FIXED, drive, make_fleet, user

pytestmark = pytest.mark.django_db
BASE = "/api/v1/campaigns/campaigns/"


def login(name: str, *roles: str) -> Client:
    user(name, *roles)
    client = Client()
    assert client.login(username=name, password=f"pw-{name}-123456")
    return client


@pytest.fixture
def clients():
    make_fleet(nodes=3, spares=2)
    return login("olga", "operator"), login("abe", "approver"), login("vic", "viewer")


def create(client: Client, **fields) -> dict:
    body = {"name": "Driver R570", "node_selector": {"sweep": "yes"}, "target_versions": {"driver": {"R570": FIXED}},
            "parallelism_per_cluster": "50%", "canary": "0", **fields}
    response = client.post(BASE, body, content_type="application/json")
    assert response.status_code == 201, response.content
    return response.json()


def start(operator: Client, approver: Client, **fields) -> tuple[dict, str]:
    """A campaign planned by the operator, approved by the approver and started: (campaign, its URL)."""
    campaign = create(operator, **fields)
    url = f"{BASE}{campaign['id']}/"
    operator.post(url + "plan/", {}, content_type="application/json")
    approver.post(url + "approve/")
    operator.post(url + "start/")
    return campaign, url


def test_it_runs_the_whole_life_cycle_with_the_right_roles(clients):
    operator, approver, viewer = clients
    campaign = create(operator)
    assert campaign["requested_by"] == "olga" and campaign["status"] == "draft"
    url = f"{BASE}{campaign['id']}/"
    preview = operator.post(url + "plan/", {"dry_run": True}, content_type="application/json").json()
    assert preview["dry_run"] and len(preview["content"]["nodes"]) == 3
    assert Campaign.objects.get(pk=campaign["id"]).plans.count() == 0
    plan = operator.post(url + "plan/", {}, content_type="application/json")
    assert plan.status_code == 201 and plan.json()["version"] == 1
    node = next(iter(plan.json()["content"]["nodes"].values()))
    assert {"wave", "expected_start", "expected_end", "moves", "risks"} <= set(node)
    assert node["moves"][0]["action"] == "migrate" and node["moves"][0]["to_name"].startswith("spare")

    assert viewer.post(url + "approve/").status_code == 403
    assert operator.post(url + "approve/").status_code == 403  # operators do not approve
    assert operator.post(url + "start/").status_code == 409  # not approved yet
    assert approver.post(url + "approve/", {"comment": "ok"}, content_type="application/json").status_code == 200
    assert approver.post(url + "start/").status_code == 403  # approvers do not run campaigns
    started = operator.post(url + "start/")
    assert started.status_code == 200 and started.json()["status"] == "running"
    drive(campaign["id"])
    assert viewer.get(url).json()["status"] == CampaignStatus.COMPLETED
    sweeps = viewer.get(f"/api/v1/campaigns/sweeps/?campaign={campaign['id']}").json()["results"]
    assert {s["state"] for s in sweeps} == {"done"} and all(s["moves"][0]["steps_after"] for s in sweeps)
    log = viewer.get(url + "evidence/").json()
    own = [e["seq"] for e in log["events"] if e["sweep"] is None]
    assert log["intact"] and own == list(range(1, len(own) + 1)), log["problems"]
    assert {s["reason"] for s in log["seals"]} == {"completed", "export"} and log["public_key"]
    assert {"created", "planned", "approved", "started", "checkpointed", "restored", "done", "completed"} <= {
        e["kind"] for e in log["events"]}


def test_the_requester_cannot_approve_their_own_campaign(clients):
    _operator, _approver, _viewer = clients
    both = login("ben", "operator", "approver")
    campaign = create(both)
    url = f"{BASE}{campaign['id']}/"
    both.post(url + "plan/", {}, content_type="application/json")
    response = both.post(url + "approve/")
    assert response.status_code == 403 and "requester cannot approve" in response.json()["detail"]


def test_bad_policy_is_refused_naming_the_field(clients):
    operator, _approver, _viewer = clients
    response = operator.post(BASE, {"name": "x", "parallelism_per_cluster": "many", "windows": [{"start": "25:00"}],
                                    "workload_overrides": {"job": "teleport"}}, content_type="application/json")
    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"parallelism_per_cluster", "windows", "workload_overrides"}
    assert not Campaign.objects.exists()


def test_a_re_plan_is_compared_and_voids_approvals(clients):
    operator, approver, _viewer = clients
    campaign = create(operator)
    url = f"{BASE}{campaign['id']}/"
    operator.post(url + "plan/", {}, content_type="application/json")
    approver.post(url + "approve/")
    assert operator.patch(url, {"parallelism_per_cluster": "1"}, content_type="application/json").status_code == 200
    diff = operator.get(url + "compare/").json()
    assert diff["new"] == "re-plan" and diff["changed"], diff
    operator.post(url + "plan/", {}, content_type="application/json")
    assert Campaign.objects.get(pk=campaign["id"]).status == CampaignStatus.PLANNED
    assert operator.post(url + "start/").status_code == 409
    assert operator.get(url + "compare/?old=1&new=2").json()["changed"]


def test_pause_stops_admitting_nodes_and_resume_continues(clients):
    operator, approver, _viewer = clients
    campaign, url = start(operator, approver, parallelism_per_cluster="1")
    assert operator.post(url + "pause/").json()["status"] == "paused"
    drive(campaign["id"])
    assert NodeSweep.objects.filter(campaign_id=campaign["id"], state="pending").count() == 3
    assert operator.post(url + "resume/").json()["status"] == "running"
    assert drive(campaign["id"]).status == CampaignStatus.COMPLETED


def test_only_operators_abort_and_an_aborted_campaign_stays_aborted(clients):
    operator, approver, viewer = clients
    campaign, url = start(operator, approver)
    assert viewer.post(url + "abort/").status_code == 403
    response = operator.post(url + "abort/", {"reason": "change freeze"}, content_type="application/json")
    assert response.status_code == 200 and response.json()["status"] == "aborted"
    assert operator.post(url + "resume/").status_code == 409
    assert operator.post(url + "abort/").status_code == 409
    assert set(NodeSweep.objects.filter(campaign_id=campaign["id"]).values_list("state", flat=True)) == {"skipped"}
    log = viewer.get(url + "evidence/").json()
    assert log["intact"], log["problems"]
    assert {e["kind"] for e in log["events"] if e["sweep"] is not None} == {"skipped"}
    assert all(s["signed_head"] for s in log["sweeps"])


def test_a_format_suffix_is_not_a_route_and_format_picks_the_renderer(clients):
    operator, approver, _viewer = clients
    campaign, url = start(operator, approver)
    assert operator.get(url + "evidence.json").status_code == 404  # it used to reach the action and fail with 500
    assert operator.get(url + "evidence/?format=json").json()["campaign"]["id"] == campaign["id"]


def test_a_campaign_that_selects_no_node_is_not_planned(clients):
    operator, _approver, _viewer = clients
    campaign = create(operator, node_selector={"pool": "typo"})
    response = operator.post(f"{BASE}{campaign['id']}/plan/", {}, content_type="application/json")
    assert response.status_code == 400
    assert "selects no node" in response.json()["detail"]
    assert Campaign.objects.get(pk=campaign["id"]).status == CampaignStatus.DRAFT
    assert not Plan.objects.filter(campaign_id=campaign["id"]).exists()


@pytest.mark.parametrize("fields, refused", [
    ({"clusters": [1, "nope", {"a": 1}]}, "clusters"),
    ({"clusters": ["nope"]}, "clusters"),
    ({"pools": [None]}, "pools"),
    ({"pools": ["no-such-pool"]}, "pools"),
    ({"approvals_required": 0}, "approvals_required"),
    ({"node_selector": {"names": "gpu00"}}, "node_selector"),
    ({"canary": "many"}, "canary"),
])
def test_a_bad_scope_or_approval_count_is_refused_at_create_naming_the_field(clients, fields, refused):
    operator, _approver, _viewer = clients
    response = operator.post(BASE, {"name": "bad", **fields}, content_type="application/json")
    assert response.status_code == 400, response.content
    assert refused in response.json()["errors"]
    assert not Campaign.objects.exists()


def test_nobody_approves_a_plan_they_edited_or_planned(clients):
    operator, approver, _viewer = clients
    campaign, url = create(operator), None
    url = f"{BASE}{campaign['id']}/"
    operator.post(url + "plan/", {}, content_type="application/json")
    assert approver.post(url + "approve/").status_code == 200
    # Someone holding both roles edits another operator's approved campaign and plans it again...
    both = login("ben", "operator", "approver")
    edited = both.patch(url, {"pools": ["a"]}, content_type="application/json")
    assert edited.status_code == 200 and edited.json()["status"] == CampaignStatus.DRAFT
    both.post(url + "plan/", {}, content_type="application/json")
    # ...and may not approve the plan they wrote: an approver who had no hand in it must.
    refused = both.post(url + "approve/")
    assert refused.status_code == 403 and "edited or planned" in refused.json()["detail"]
    assert Campaign.objects.get(pk=campaign["id"]).status == CampaignStatus.PLANNED
    assert approver.post(url + "approve/").status_code == 200
    assert Campaign.objects.get(pk=campaign["id"]).status == CampaignStatus.APPROVED
