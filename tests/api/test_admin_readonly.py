"""The admin shows approvals, the evidence log and exposures, and changes none of them: those are
written only by service functions that record evidence (issue 15: an admin-made self-approval
read "approvals 1/1", and an exposure's state and remediated_at were editable)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from advisories.ingest import ingest_documents
from advisories.models import Exposure
from advisories.sources import FolderSource
from campaigns.models import Approval, EvidenceEvent
from tests.advisories.conftest import FIXTURES
from tests.campaigns.fleet import approved_campaign, make_fleet, user

pytestmark = pytest.mark.django_db


@pytest.fixture
def superuser() -> Client:
    make_fleet(nodes=2, spares=1)
    approved_campaign(user("olga", "operator"), user("abe", "approver"))
    ingest_documents(FolderSource(str(FIXTURES)).items())
    client = Client()
    client.force_login(User.objects.create_superuser("root-admin", password="pw-root-admin-123456"))
    return client


def state() -> tuple[list, list, list]:
    return (list(Approval.objects.values_list("id", "user_id", "plan_id")),
            list(EvidenceEvent.objects.values_list("id", "hash")),
            list(Exposure.objects.values_list("id", "state", "remediated_at")))


@pytest.mark.parametrize("model", ["campaigns/approval", "campaigns/evidenceevent", "advisories/exposure"])
def test_the_admin_shows_but_never_adds_changes_or_deletes(superuser, model):
    objects = {"campaigns/approval": Approval, "campaigns/evidenceevent": EvidenceEvent,
               "advisories/exposure": Exposure}[model]
    row = objects.objects.order_by("pk").first()
    assert row is not None
    before = state()
    assert superuser.get(f"/admin/{model}/").status_code == 200
    detail = superuser.get(f"/admin/{model}/{row.pk}/change/")
    assert detail.status_code == 200 and b'name="_save"' not in detail.content  # a view, no form
    assert superuser.get(f"/admin/{model}/add/").status_code == 403
    assert superuser.post(f"/admin/{model}/add/", {"comment": "self-approved"}).status_code == 403
    changed = superuser.post(f"/admin/{model}/{row.pk}/change/",
                             {"state": "remediated", "remediated_at_0": "2026-01-01", "comment": "edited"})
    assert changed.status_code == 403
    assert superuser.post(f"/admin/{model}/{row.pk}/delete/", {"post": "yes"}).status_code == 403
    bulk = superuser.post(f"/admin/{model}/", {"action": "delete_selected", "_selected_action": [row.pk],
                                                "post": "yes"})
    assert bulk.status_code in (200, 302, 403)
    assert state() == before
