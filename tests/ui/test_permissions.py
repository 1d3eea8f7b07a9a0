"""The permission matrix: each role against each action, through the pages and through the API.

A role that may act gets the action done (the state moves); one that may not gets 403 and nothing
changes. The UI and the API must agree, action by action.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from advisories.exposure import recompute
from advisories.models import DeadlinePolicy, Exposure, ReviewItem
from campaigns import services
from campaigns.models import Campaign
from tests.advisories.conftest import FIXTURES
from tests.campaigns.fleet import make_fleet, user

pytestmark = pytest.mark.django_db

ROLES = ("viewer", "operator", "approver", "admin")
DEFINITION = {"name": "m", "node_selector": {"sweep": "yes"}, "canary": "0",
              "target_versions": {"driver": {"R570": "570.195.03"}}}


def _campaign(status: str, requester: Any, approver: Any) -> Campaign:
    campaign = services.create_campaign(requester, dict(DEFINITION))
    if status != "draft":
        services.make_plan(campaign.pk, requester)
    if status in ("approved", "running", "paused"):
        services.approve(campaign.pk, approver)
    if status in ("running", "paused"):
        services.start(campaign.pk, requester)
    if status == "paused":
        services.pause(campaign.pk, requester)
    return campaign


def _status(campaign: Campaign) -> str:
    return Campaign.objects.get(pk=campaign.pk).status


# action: (state before, roles allowed, state after)
LIFECYCLE = {
    "plan": ("draft", {"operator", "admin"}, "planned"),
    "approve": ("planned", {"approver", "admin"}, "approved"),
    "start": ("approved", {"operator", "admin"}, "running"),
    "pause": ("running", {"operator", "admin"}, "paused"),
    "resume": ("paused", {"operator", "admin"}, "running"),
    "abort": ("running", {"operator", "admin"}, "aborted"),
}


def _clients() -> dict[str, Client]:
    clients = {}
    for role in ROLES:
        clients[role] = Client()
        clients[role].force_login(user(f"u-{role}", role))
    return clients


@pytest.mark.parametrize("surface", ["ui", "api"])
@pytest.mark.parametrize("action", sorted(LIFECYCLE))
def test_campaign_actions_by_role(action: str, surface: str):
    make_fleet(nodes=2, spares=1)
    before, allowed, after = LIFECYCLE[action]
    clients = _clients()
    requester, approver = user("req", "operator"), user("appr", "approver")
    # Those who may not, first, on one campaign; then each who may, on a fresh one.
    for role in sorted(ROLES, key=lambda r: r in allowed):
        if role in allowed or role == ROLES[0]:
            for old in Campaign.objects.exclude(status__in=["completed", "aborted"]):
                services.abort(old.pk, requester)
            campaign = _campaign(before, requester, approver)
        client = clients[role]
        body = {"reason": "a test of the matrix"} if action == "abort" else {}
        if surface == "ui":
            response = client.post(f"/campaigns/{campaign.pk}/{action}/", body)
            ok = response.status_code == 302
        else:
            response = client.post(f"/api/v1/campaigns/campaigns/{campaign.pk}/{action}/", body,
                                   content_type="application/json")
            ok = response.status_code in (200, 201)
        if role in allowed:
            assert ok and _status(campaign) == after, (role, response.content[:300])
        else:
            assert response.status_code == 403 and _status(campaign) == before, role


@pytest.fixture
def exposed() -> Exposure:
    call_command("ingest_advisories", str(FIXTURES), verbosity=0)
    make_fleet(nodes=1, spares=0)
    recompute()
    found = Exposure.objects.filter(state="open").first()
    assert found is not None
    return found


def _accept_risk(client: Client, exposure: Exposure, surface: str) -> int:
    if surface == "ui":
        return client.post("/advisories/exposures/bulk/", {
            "action": "accept_risk", "exposure": [exposure.pk], "reason": "an isolated lab node", "days": "10"},
        ).status_code
    return client.post(f"/api/v1/advisories/exposures/{exposure.pk}/accept_risk/", {
        "reason": "an isolated lab node", "expires_at": (timezone.now() + dt.timedelta(days=10)).isoformat()},
        content_type="application/json").status_code


def _not_affected(client: Client, exposure: Exposure, surface: str) -> int:
    body = {"justification": "vulnerable_code_not_in_execute_path", "reason": "the module is never loaded"}
    if surface == "ui":
        return client.post(f"/advisories/exposures/{exposure.pk}/decide/", {**body, "decision": "not_affected"}
                           ).status_code
    return client.post(f"/api/v1/advisories/exposures/{exposure.pk}/not_affected/", body,
                       content_type="application/json").status_code


def _dismiss(client: Client, exposure: Exposure, surface: str) -> int:
    item = ReviewItem.objects.filter(state="open").first()
    assert item is not None
    if surface == "ui":
        return client.post(f"/advisories/review-items/{item.pk}/resolve/", {
            "resolution": "dismiss", "reason": "not a product we run"}).status_code
    return client.post(f"/api/v1/advisories/review-items/{item.pk}/dismiss/", {"reason": "not a product we run"},
                       content_type="application/json").status_code


def _policy(client: Client, exposure: Exposure, surface: str) -> int:
    body = {"critical_days": 10, "high_days": 20, "medium_days": 90, "low_days": 180, "basis": "publication",
            "use_kev": True}
    if surface == "ui":
        return client.post("/settings/", {**body, "use_kev": "on"}).status_code
    return client.put("/api/v1/advisories/deadline-policy/current/", body, content_type="application/json"
                      ).status_code


def _create(client: Client, exposure: Exposure, surface: str) -> int:
    if surface == "ui":
        return client.post("/campaigns/new/", {
            "name": "made", "parallelism_per_cluster": "1", "error_budget": "1", "workload_policy": "checkpoint",
            "approvals_required": "1", "then": "draft"}).status_code
    return client.post("/api/v1/campaigns/campaigns/", {"name": "made"}, content_type="application/json").status_code


def _changed(kind: str, exposure: Exposure) -> bool:
    exposure.refresh_from_db()
    return {
        "accept_risk": lambda: exposure.state == "risk_accepted",
        "not_affected": lambda: exposure.state == "not_affected",
        "dismiss_review_item": lambda: ReviewItem.objects.filter(state="dismissed").exists(),
        "deadline_policy": lambda: DeadlinePolicy.current().critical_days == 10,
        "create_campaign": lambda: Campaign.objects.filter(name="made").exists(),
    }[kind]()


OTHER: dict[str, tuple[Callable[[Client, Exposure, str], int], set[str]]] = {
    "accept_risk": (_accept_risk, {"approver", "admin"}),
    "not_affected": (_not_affected, {"approver", "admin"}),
    "dismiss_review_item": (_dismiss, {"admin"}),
    "deadline_policy": (_policy, {"admin"}),
    "create_campaign": (_create, {"operator", "admin"}),
}


def _undo(kind: str, exposure: Exposure) -> None:
    """Put the world back for the next role (directly: the test's own bookkeeping, not an action)."""
    Exposure.objects.filter(pk=exposure.pk).update(state="open", justification="", risk_expires_at=None)
    ReviewItem.objects.update(state="open")
    DeadlinePolicy.objects.filter(pk=DeadlinePolicy.current().pk).update(critical_days=15)
    Campaign.objects.filter(name="made").update(name="made before")


@pytest.mark.parametrize("surface", ["ui", "api"])
@pytest.mark.parametrize("action", sorted(OTHER))
def test_decisions_and_settings_by_role(action: str, surface: str, exposed: Exposure):
    act, allowed = OTHER[action]
    for role, client in sorted(_clients().items(), key=lambda item: item[0] in allowed):
        code = act(client, exposed, surface)
        if role in allowed:
            assert code in (200, 201, 302) and _changed(action, exposed), (role, code)
            _undo(action, exposed)
        else:
            assert code == 403 and not _changed(action, exposed), (role, code)


@pytest.mark.parametrize("role", ROLES)
def test_every_role_reads_every_page(role: str, exposed: Exposure):
    client = Client()
    client.force_login(user(f"u-{role}", role))
    campaign = Campaign.objects.create(name="read me")
    pages: list[Any] = ["/", "/advisories/", f"/advisories/{exposed.advisory.public_id}/", "/advisories/exposures/",
                        f"/nodes/{exposed.node_id}/", "/nodes/", "/campaigns/", f"/campaigns/{campaign.pk}/",
                        f"/campaigns/{campaign.pk}/board/", "/settings/"]
    for path in pages:
        assert client.get(path).status_code == 200, path
    wizard = client.get("/campaigns/new/").status_code
    assert wizard == (200 if role in ("operator", "admin") else 403)
