"""The campaign page: only the actions a state allows, the live board partial, events named by step."""

from __future__ import annotations

import pytest
from django.test import Client

from campaigns import services
from campaigns.models import Campaign
from tests.campaigns.fleet import approved_campaign, drive, make_fleet, user

pytestmark = pytest.mark.django_db


def _buttons(page: str) -> set[str]:
    import re

    actions = re.search(r'id="actions".*?</div>', page, re.S)
    return set(re.findall(r"<button[^>]*>([^<]+)</button>", actions.group(0))) if actions else set()


def test_it_shows_only_the_actions_valid_in_each_state():
    make_fleet(nodes=2, spares=1)
    otto, anna = user("otto", "operator"), user("anna", "approver")
    boss = user("boss", "operator", "approver")
    operator, approver, both = Client(), Client(), Client()
    operator.force_login(otto)
    approver.force_login(anna)
    both.force_login(boss)
    campaign = Campaign.objects.create(name="c", requested_by=otto, node_selector={"sweep": "yes"}, canary="0",
                                       target_versions={"driver": {"R570": "570.195.03"}})
    url = f"/campaigns/{campaign.pk}/"
    assert _buttons(operator.get(url).content.decode()) == {"Make a new plan", "Abort"}
    assert _buttons(approver.get(url).content.decode()) == set()
    services.make_plan(campaign.pk, otto)
    assert _buttons(operator.get(url).content.decode()) == {"Make a new plan", "Abort"}
    assert _buttons(approver.get(url).content.decode()) == {"Approve"}
    services.approve(campaign.pk, anna)
    assert _buttons(operator.get(url).content.decode()) == {"Start", "Make a new plan", "Abort"}
    assert _buttons(approver.get(url).content.decode()) == set()  # approved: nothing more to approve
    services.start(campaign.pk, otto)
    assert _buttons(both.get(url).content.decode()) == {"Pause", "Abort"}
    services.pause(campaign.pk, otto)
    assert _buttons(both.get(url).content.decode()) == {"Resume", "Abort"}
    services.resume(campaign.pk, otto)
    assert drive(campaign.pk).status == "completed"
    page = both.get(url).content.decode()
    assert _buttons(page) == set() and "Completed" in page
    # Over: the board no longer polls.
    assert "hx-trigger" not in page


def test_the_live_board_shows_progress_plan_against_actual_and_named_steps():
    make_fleet(nodes=2, spares=1)
    otto, anna = user("otto", "operator"), user("anna", "approver")
    campaign = approved_campaign(otto, anna)
    client = Client()
    client.force_login(otto)
    page = client.get(f"/campaigns/{campaign.pk}/").content.decode()
    assert f'hx-get="/campaigns/{campaign.pk}/board/"' in page and "every 2s" in page
    assert "Wave 1" in page and "moves to spare00" in page  # the plan as a timeline with destinations
    assert "0 of 2 nodes done" in page
    services.start(campaign.pk, otto)
    drive(campaign.pk)
    partial = client.get(f"/campaigns/{campaign.pk}/board/").content.decode()
    assert partial.lstrip().startswith("<section") and "<html" not in partial
    assert "2 of 2 nodes done (100%)" in partial
    assert "Draining done, next: Checkpointing" in partial or "Patching done" in partial
    assert "step_done" not in partial and "{'" not in partial
    assert "Finished" in partial
