"""Every webhook event, made the way the service makes it, fits its JSON Schema; its links are
absolute under GPUSWEEP_BASE_URL, its dates one format (RFC 3339, UTC, Z), and its advisories
public ids. The schemas are in the OpenAPI document."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import pytest
from django.utils import timezone
from jsonschema import Draft202012Validator

from tests.webhooks.test_webhooks import SECRET
from webhooks import events, payloads, queue, schemas, services, wire
from webhooks.choices import EventType, Template
from webhooks.models import Event, Subscription

pytestmark = pytest.mark.django_db
BASE = "https://gpusweep.example.org/sec"
LOOKS_LIKE_A_DATE = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")


@pytest.fixture
def quiet(monkeypatch, settings):  # type: ignore[no-untyped-def]
    from campaigns import queue as campaign_queue

    settings.GPUSWEEP_BASE_URL = BASE
    monkeypatch.setattr(queue, "ENQUEUE", [lambda sid, countdown=0: None])
    monkeypatch.setattr(campaign_queue, "ENQUEUE", [lambda *args, **kwargs: None])


def _every_event(capture: Any) -> None:
    from advisories.models import Exposure
    from campaigns import services as campaigns
    from inventory.models import Cluster
    from tests.api.seed import seed
    from tests.campaigns.fleet import approved_campaign, drive, make_fleet, user

    subscription = Subscription.objects.create(name="all", url="http://127.0.0.1:9/", secret=SECRET)
    with capture(execute=True):
        seed()
    live = Exposure.objects.filter(state="open")
    Exposure.objects.filter(pk=live.first().pk).update(deadline=timezone.now() - dt.timedelta(days=2))
    Exposure.objects.filter(pk=live.last().pk).update(deadline=timezone.now() + dt.timedelta(days=2))
    assert events.scan_deadlines() >= 2  # the seed has deadlines of its own
    Cluster.objects.filter(name="local").update(name="seeded")  # make_fleet makes its own "local"
    fleet, _cluster = make_fleet(nodes=2, spares=1)
    fleet.inject("patch", "local/gpu00", "permanent", times=10)
    with capture(execute=True):
        campaign = approved_campaign(user("olga-ops", "operator"), user("abe-appr", "approver"), name="failing sweep",
                                     error_budget="5")
        campaigns.start(campaign.pk, campaign.requested_by)
        drive(campaign.pk)
    services.send_test(subscription, None)


def _strings(value: Any, key: str = "") -> list[tuple[str, str]]:
    if isinstance(value, dict):
        return [pair for k, v in value.items() for pair in _strings(v, k)]
    if isinstance(value, list):
        return [pair for v in value for pair in _strings(v, key)]
    return [(key, value)] if isinstance(value, str) else []


def test_every_event_fits_its_schema_with_absolute_links_and_one_date_format(quiet,
                                                                            django_capture_on_commit_callbacks):
    _every_event(django_capture_on_commit_callbacks)
    seen = set()
    for event in Event.objects.order_by("id"):
        body = json.loads(payloads.body_for(Template.GENERIC, services.event_body(event), {}))
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in
                  Draft202012Validator(schemas.BODY[event.kind]).iter_errors(body)]
        assert not errors, (event.kind, errors, body)
        for key, text in _strings(body):
            if key == "url":
                assert text.startswith(BASE + "/"), (event.kind, text)
            if LOOKS_LIKE_A_DATE.fullmatch(text[:16]) and len(text) > 10 and key not in ("summary", "error"):
                assert re.fullmatch(wire.RFC3339_Z, text), (event.kind, key, text)
        seen.add(event.kind)
    assert seen == set(EventType.values())
    ingested = Event.objects.filter(kind=EventType.ADVISORY_INGESTED).first()
    assert ingested.data["advisory"].startswith("nvidia-")
    assert ingested.data["url"] == f"{BASE}/advisories/{ingested.data['advisory']}/"


def test_old_events_go_out_in_the_one_format_too():
    event = {"id": 1, "kind": EventType.NODE_FAILED, "at": "2026-01-01T00:00:00.123456+00:00", "subject": "node:1",
             "summary": "s", "data": {"url": "/campaigns/2/", "evidence": {"at": "2026-01-01 01:00:00+01:00"},
                                      "when": dt.datetime(2026, 1, 1, 3, tzinfo=dt.UTC), "day": "2026-01-01"}}
    body = json.loads(payloads.body_for(Template.GENERIC, event, {}))
    assert body["at"] == "2026-01-01T00:00:00Z" and body["data"]["evidence"]["at"] == "2026-01-01T00:00:00Z"
    assert body["data"]["when"] == "2026-01-01T03:00:00Z" and body["data"]["day"] == "2026-01-01"
    assert body["data"]["url"].startswith(("http://", "https://")) and body["data"]["url"].endswith("/campaigns/2/")


def test_the_openapi_document_carries_each_event_schema():
    from tests.campaigns.test_api import login

    document = login("vic", "viewer").get("/api/schema/", HTTP_ACCEPT="application/json").json()
    components = document["components"]["schemas"]
    for kind in EventType.values():
        assert components[schemas.component_name(kind)]["properties"]["type"]["enum"] == [kind]
    assert components["WebhookCampaignStateChanged"]["properties"]["data"]["properties"]["deadline"]["nullable"]
