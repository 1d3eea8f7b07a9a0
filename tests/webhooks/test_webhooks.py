"""Webhooks without a worker: payload templates, signatures, emitting once, in-order delivery with
backoff and giving up, the advisory and deadline events, and who may do what (API and pages)."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.test import Client
from django.utils import timezone

from tests.webhooks.receiver import Receiver
from webhooks import events, payloads, queue, services
from webhooks.choices import DeliveryState, EventType, Template
from webhooks.models import Delivery, Event, Subscription

pytestmark = pytest.mark.django_db

SECRET = "a-secret-of-sixteen+"
EVENT = {"id": 7, "kind": EventType.EXPOSURE_OVERDUE, "at": "2026-01-01T00:00:00+00:00", "subject": "advisory:1",
         "summary": "3 exposures to 5703 in prod overdue since 2026-01-01",
         "data": {"severity": "critical", "advisory": "5703", "cluster": "prod"}}


@pytest.fixture
def enqueued(monkeypatch):  # type: ignore[no-untyped-def]
    calls: list[tuple[int, float]] = []
    monkeypatch.setattr(queue, "ENQUEUE", [lambda sid, countdown=0: calls.append((sid, countdown))])
    return calls


def test_jira_and_servicenow_bodies_are_what_their_create_calls_take():
    issue = json.loads(payloads.body_for(Template.JIRA, EVENT, {"project": "SEC", "issue_type": "Bug"}))
    assert issue["fields"]["project"] == {"key": "SEC"} and issue["fields"]["issuetype"] == {"name": "Bug"}
    assert issue["fields"]["summary"] == EVENT["summary"] and issue["fields"]["priority"] == {"name": "Highest"}
    assert "gpusweep-event-7" in issue["fields"]["labels"] and "5703" in issue["fields"]["description"]
    incident = json.loads(payloads.body_for(Template.SERVICENOW_INCIDENT, EVENT, {"assignment_group": "SecOps"}))
    assert incident["urgency"] == "1" and incident["correlation_id"] == "gpusweep-7"
    assert incident["short_description"] == EVENT["summary"] and incident["assignment_group"] == "SecOps"
    change = json.loads(payloads.body_for(Template.SERVICENOW_CHANGE, {**EVENT, "kind": EventType.CAMPAIGN_STATE,
                                                                        "data": {"expected_start": "2026-02-01"}}, {}))
    assert change["type"] == "normal" and change["start_date"] == "2026-02-01"
    generic = json.loads(payloads.body_for(Template.GENERIC, EVENT, {}))
    assert generic["type"] == EventType.EXPOSURE_OVERDUE and generic["data"]["cluster"] == "prod"


def test_a_signature_checks_only_with_the_secret_the_body_and_a_fresh_time():
    body = b'{"a":1}'
    now = 1_800_000_000
    header = services.sign(SECRET, now, body)
    assert services.verify_signature(SECRET, header, body, now=now + 10)
    assert not services.verify_signature("another-secret-xx", header, body, now=now)
    assert not services.verify_signature(SECRET, header, b'{"a":2}', now=now)
    assert not services.verify_signature(SECRET, header, body, now=now + 3600)  # a replayed old request
    assert not services.verify_signature(SECRET, "garbage", body, now=now)


def test_an_event_is_emitted_once_per_key_and_only_when_someone_listens(enqueued, django_capture_on_commit_callbacks):
    assert services.emit(EventType.NODE_FAILED, "k1", "node:1", "failed", {}) is None  # nobody subscribed
    assert Event.objects.count() == 0
    soc = Subscription.objects.create(name="soc", url="http://127.0.0.1:9/", secret=SECRET,
                                      events=[EventType.NODE_FAILED])
    Subscription.objects.create(name="other", url="http://127.0.0.1:9/", secret=SECRET,
                                events=[EventType.EXPOSURE_OVERDUE])
    with django_capture_on_commit_callbacks(execute=True):
        assert services.emit(EventType.NODE_FAILED, "k1", "node:1", "failed", {}) is not None
        assert services.emit(EventType.NODE_FAILED, "k1", "node:1", "failed", {}) is None
    assert list(Delivery.objects.values_list("subscription__name", flat=True)) == ["soc"]
    assert enqueued == [(soc.pk, 0)]
    with pytest.raises(ValueError):
        services.emit("campaign.exploded", "k2", "x", "y", {})


def test_deliveries_wait_behind_a_failing_one_then_it_is_given_up(enqueued, settings):
    settings.GPUSWEEP_WEBHOOK_BACKOFF_MS = 1
    settings.GPUSWEEP_WEBHOOK_MAX_ATTEMPTS = 3
    receiver = Receiver(SECRET, fail_first=3)
    subscription = Subscription.objects.create(name="soc", url=receiver.start(), secret=SECRET)
    try:
        first = services.emit(EventType.TEST, "one", "x", "first", {})
        second = services.emit(EventType.TEST, "two", "x", "second", {})
        assert first and second
        for _ in range(3):
            head = Delivery.objects.get(event=first)
            if head.next_attempt_at:
                Delivery.objects.filter(pk=head.pk).update(next_attempt_at=timezone.now())
            services.deliver(subscription.pk)
            if Delivery.objects.get(event=first).state == DeliveryState.RETRYING:
                assert Delivery.objects.get(event=second).attempts == 0  # nothing overtakes the head
        head = Delivery.objects.get(event=first)
        assert head.state == DeliveryState.FAILED and head.attempts == 3 and head.response_status == 503
        assert Delivery.objects.get(event=second).state == DeliveryState.DELIVERED
        assert [r.body["id"] for r in receiver.requests] == [first.pk] * 3 + [second.pk]
        # Backoff doubles: the retry after attempt n waits base * 2**(n-1).
        settings.GPUSWEEP_WEBHOOK_BACKOFF_MS = 1000
        assert [services.backoff_s(n) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
        assert services.backoff_s(30) == services.MAX_BACKOFF_S
        # A replay goes to the end of the line and is delivered.
        again = services.replay(head.pk, None)
        services.deliver(subscription.pk)
        again.refresh_from_db()
        assert again.state == DeliveryState.DELIVERED and again.replay_of_id == head.pk
    finally:
        receiver.stop()


def test_a_bulletin_that_hits_the_fleet_and_overdue_exposures_are_announced(enqueued,
                                                                          django_capture_on_commit_callbacks):
    from advisories.models import Exposure
    from campaigns import queue as campaign_queue
    from tests.api.seed import seed

    Subscription.objects.create(name="jira", url="http://127.0.0.1:9/", secret=SECRET, template=Template.JIRA,
                                events=[EventType.ADVISORY_INGESTED, EventType.EXPOSURE_OVERDUE,
                                        EventType.EXPOSURE_DUE_SOON])
    campaign_queue.ENQUEUE.insert(0, lambda *args: None)
    try:
        with django_capture_on_commit_callbacks(execute=True):  # advisories_matched is sent on commit
            seed()
    finally:
        campaign_queue.ENQUEUE.pop(0)
    ingested = Event.objects.filter(kind=EventType.ADVISORY_INGESTED)
    hit = {e.advisory.public_id for e in Exposure.objects.filter(state__in=events.LIVE).select_related("advisory")}
    assert {e.data["advisory"] for e in ingested} == hit and hit
    assert all(sum(e.data["exposures_by_cluster"].values()) > 0 for e in ingested)
    # The subject (and the key the events API shows) name the advisory by its public id, never its pk.
    assert all(e.subject == f"advisory:{e.data['advisory']}" and e.key.startswith(f"{e.subject}:") for e in ingested)

    open_rows = Exposure.objects.filter(state="open")
    late = open_rows.first()
    Exposure.objects.filter(pk=late.pk).update(deadline=timezone.now() - dt.timedelta(days=2))
    Exposure.objects.filter(state="open").exclude(pk=late.pk).update(deadline=timezone.now() + dt.timedelta(days=90))
    assert events.scan_deadlines() == 1
    overdue = Event.objects.get(kind=EventType.EXPOSURE_OVERDUE)
    assert overdue.data["exposures"] == 1 and overdue.data["nodes"] == [late.node.name]
    assert overdue.subject == f"advisory:{late.advisory.public_id}" and f":{late.advisory.public_id}:" in overdue.key
    assert events.scan_deadlines() == 0  # once per advisory, cluster and deadline
    Exposure.objects.filter(pk=open_rows.exclude(pk=late.pk).first().pk).update(
        deadline=timezone.now() + dt.timedelta(days=2))
    assert events.scan_deadlines() == 1 and Event.objects.filter(kind=EventType.EXPOSURE_DUE_SOON).count() == 1


def _as(user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user)
    return client


def test_who_may_do_what_with_webhooks(make_user, enqueued):
    viewer, operator = make_user("vera", "viewer"), make_user("olga", "operator")
    approver = make_user("abe", "approver")
    admin, nobody = make_user("ada", "admin"), make_user("nora")
    body = {"name": "soc", "url": "https://soc.example/hook", "secret": SECRET, "events": [EventType.NODE_FAILED],
            "template": Template.SERVICENOW_INCIDENT}
    api = "/api/v1/webhooks/subscriptions/"
    for user in (viewer, operator, approver):
        assert _as(user).post(api, body, content_type="application/json").status_code == 403
    made = _as(admin).post(api, body, content_type="application/json")
    assert made.status_code == 201 and "secret" not in made.json()
    bad = _as(admin).post(api, {**body, "name": "x", "events": ["nope"], "secret": "short"},
                          content_type="application/json")
    assert bad.status_code == 400 and {"events", "secret"} <= {k.split(".")[0] for k in bad.json()["errors"]}
    pk = made.json()["id"]
    for user in (viewer, operator, approver, admin):
        assert _as(user).get(api).status_code == 200
        assert _as(user).get("/settings/webhooks/").status_code == 200
    assert _as(nobody).get(api).status_code == 403 and _as(nobody).get("/settings/webhooks/").status_code == 403
    # Test events and replays are operators' (and admins'); viewers and approvers only read.
    for user in (viewer, approver):
        assert _as(user).post(f"{api}{pk}/test/").status_code == 403
        assert _as(user).post(f"/settings/webhooks/{pk}/test/").status_code == 403
    assert _as(operator).post(f"{api}{pk}/test/").status_code == 202
    delivery = Delivery.objects.get()
    assert _as(viewer).post(f"/api/v1/webhooks/deliveries/{delivery.pk}/replay/").status_code == 403
    assert _as(operator).post(f"/api/v1/webhooks/deliveries/{delivery.pk}/replay/").status_code == 202
    assert _as(operator).post(f"/settings/webhooks/deliveries/{delivery.pk}/replay/").status_code == 302
    assert Delivery.objects.count() == 3
    # The page: admins get the form and create through it; others do not.
    page = _as(admin).get("/settings/webhooks/").content.decode()
    assert "New subscription" in page and "soc.example" in page
    assert "New subscription" not in _as(operator).get("/settings/webhooks/").content.decode()
    assert _as(operator).post("/settings/webhooks/", {"name": "n", "url": "https://x.example/"}).status_code == 403
    created = _as(admin).post("/settings/webhooks/", {"name": "jira", "url": "https://jira.example/rest/api/2/issue",
                                                      "secret": SECRET, "template": Template.JIRA,
                                                      "options": '{"project": "SEC"}', "active": "on",
                                                      "events": [EventType.EXPOSURE_OVERDUE]})
    assert created.status_code == 302, created.content.decode()[:2000]
    assert Subscription.objects.get(name="jira").options == {"project": "SEC"}
    assert _as(operator).post(f"/settings/webhooks/{pk}/delete/").status_code == 403
    assert _as(admin).post(f"/settings/webhooks/{pk}/delete/").status_code == 302
    assert not Subscription.objects.filter(pk=pk).exists()


def test_tokens_page_makes_shows_once_and_revokes_your_own(make_user):
    from accounts import services as tokens

    vera, olga = make_user("vera", "viewer"), make_user("olga", "operator")
    client = _as(vera)
    page = client.post("/settings/tokens/", {"name": "laptop", "expires_in_days": "30"}).content.decode()
    token = vera.api_tokens.get()
    assert "shown only once" in page and token.prefix in page and token.expires_at is not None
    assert "shown only once" not in client.get("/settings/tokens/").content.decode()
    theirs, _key = tokens.issue(olga, "olga's")
    client.post(f"/settings/tokens/{theirs.pk}/revoke/")
    theirs.refresh_from_db()
    assert theirs.revoked_at is None and "olga's" not in client.get("/settings/tokens/").content.decode()
    client.post(f"/settings/tokens/{token.pk}/revoke/")
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_a_failed_node_and_each_campaign_state_become_events(enqueued, django_capture_on_commit_callbacks):
    from campaigns import queue as campaign_queue
    from campaigns import services as campaigns
    from tests.campaigns.fleet import approved_campaign, drive, make_fleet, user

    Subscription.objects.create(name="ops", url="http://127.0.0.1:9/", secret=SECRET, template=Template.GENERIC,
                                events=[EventType.NODE_FAILED, EventType.CAMPAIGN_STATE,
                                        EventType.APPROVAL_REQUESTED])
    fleet, _cluster = make_fleet(nodes=2, spares=1)
    fleet.inject("patch", "local/gpu00", "permanent", times=10)
    operator, approver = user("olga", "operator"), user("abe", "approver")
    campaign_queue.ENQUEUE.insert(0, lambda *args: None)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            campaign = approved_campaign(operator, approver, name="failing sweep", error_budget="5")
            campaigns.start(campaign.pk, operator)
            drive(campaign.pk)
    finally:
        campaign_queue.ENQUEUE.pop(0)
    failed = Event.objects.get(kind=EventType.NODE_FAILED)
    assert failed.data["node"] == "gpu00" and failed.data["campaign"] == campaign.pk and failed.data["error"]
    states = list(Event.objects.filter(kind=EventType.CAMPAIGN_STATE).order_by("id")
                  .values_list("data__state", flat=True))
    assert states[0] == "planned" and "running" in states and states[-1] in ("completed", "halted")
    assert Event.objects.filter(kind=EventType.APPROVAL_REQUESTED).count() == 1


def test_events_kept_with_an_advisorys_database_id_are_renamed_to_its_public_id():
    """Issue 31: a stored event (and so a pending delivery) named ``advisory:<pk>``; the migration names
    it by the public id and keeps its key, so the same occurrence is not announced twice."""
    import importlib

    from django.apps import apps

    from advisories.models import Advisory

    migration = importlib.import_module("webhooks.migrations.0002_public_advisory_ids")
    advisory = Advisory.objects.create(publisher="NVIDIA", publisher_id="5999", title="t")
    now = timezone.now()
    old = [Event.objects.create(kind=EventType.ADVISORY_INGESTED, key=f"advisory:{advisory.pk}:1.2",
                                subject=f"advisory:{advisory.pk}", summary="s", at=now),
           Event.objects.create(kind=EventType.EXPOSURE_OVERDUE, key=f"exposure.overdue:{advisory.pk}:4:2026-12-01",
                                subject=f"advisory:{advisory.pk}", summary="s", at=now),
           Event.objects.create(kind=EventType.CAMPAIGN_STATE, key="campaign:7:completed", subject="campaign:7",
                                summary="s", at=now)]
    migration.forwards(apps, None)
    assert [(e.key, e.subject) for e in Event.objects.filter(pk__in=[e.pk for e in old]).order_by("pk")] == [
        ("advisory:nvidia-5999:1.2", "advisory:nvidia-5999"),
        ("exposure.overdue:nvidia-5999:4:2026-12-01", "advisory:nvidia-5999"),
        ("campaign:7:completed", "campaign:7")]


def test_the_subscription_form_is_rendered_like_the_consoles_other_forms(make_user):
    admin = _as(make_user("ada", "admin"))
    page = admin.get("/settings/webhooks/").content.decode()
    form = page[page.index('<form method="post" id="subscription-form">'):]
    form = form[:form.index("</form>")]
    assert "<p><label" not in form and form.count('class="field') >= 7 and 'class="grid2"' in form
    assert ">Receiver URL</label>" in form and ">Signing secret</label>" in form and ":</label>" not in form
    assert 'role="group" aria-labelledby="events-l"' in form
    subscription = Subscription.objects.create(name="soc", url="https://soc.example/hook", secret=SECRET)
    edit = admin.get(f"/settings/webhooks/{subscription.pk}/").content.decode()
    assert 'id="subscription-form"' in edit and ">Receiver URL</label>" in edit and "<p><label" not in edit
