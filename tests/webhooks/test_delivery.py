"""Done when 2: a campaign's events reach a local receiver through a real Celery worker (Redis,
PostgreSQL), each signed with HMAC-SHA256, in order, and a receiver that fails twice gets the
first event on the third try (after an exponential backoff) with nothing overtaking it; a
replay from the delivery log sends it again.

The campaign runs in this process on the memory executor (its steps are not what is tested);
the deliveries are the worker's.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client

from campaigns import queue as campaign_queue
from campaigns import services as campaigns
from campaigns.models import EvidenceEvent
from conftest import need
from tests.campaigns.fleet import approved_campaign, drive, make_fleet, user
from tests.helpers import REPO, clean_env, stop_process_group, wait_for
from tests.webhooks.receiver import Receiver
from webhooks.choices import DeliveryState, EventType
from webhooks.models import Delivery, Subscription

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

SECRET = "s3cret-for-the-receiver-only"
BACKOFF_MS = 400


@pytest.fixture
def worker(tmp_path: Path, settings, monkeypatch):  # type: ignore[no-untyped-def]
    need(os.environ.get("DATABASE_URL", "").startswith("postgres")
         and os.environ.get("CELERY_BROKER_URL", "").startswith("redis"),
         "set DATABASE_URL=postgres://... and CELERY_BROKER_URL=redis://... to deliver through a real worker")
    queue = f"webhooks-{uuid.uuid4().hex[:12]}"
    settings.CELERY_TASK_DEFAULT_QUEUE = queue
    db = connection.settings_dict
    env = clean_env(DATABASE_URL=f"postgres://{db['USER'] or 'root'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
                                 f"/{db['NAME']}",
                    CELERY_BROKER_URL=os.environ["CELERY_BROKER_URL"], GPUSWEEP_CELERY_QUEUE=queue,
                    GPUSWEEP_WEBHOOK_BACKOFF_MS=str(BACKOFF_MS), GPUSWEEP_ADVISORY_SOURCES="")
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "gpusweep", "worker", "--concurrency", "2",
                                 "--loglevel", "INFO", "--without-heartbeat", "--without-mingle", "--without-gossip"],
                                env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    # The campaign's own steps run in this process (drive); only deliveries go to the worker.
    monkeypatch.setattr(campaign_queue, "ENQUEUE", [lambda *args: None])
    yield log
    stop_process_group(proc)


def test_campaign_events_arrive_signed_in_order_and_survive_two_failures(worker):
    receiver = Receiver(SECRET, fail_first=2)
    url = receiver.start()
    try:
        subscription = Subscription.objects.create(
            name="soc", url=url, secret=SECRET,
            events=[EventType.CAMPAIGN_STATE, EventType.APPROVAL_REQUESTED, EventType.NODE_FAILED])
        _fleet, _cluster = make_fleet(nodes=2, spares=1)
        operator, approver = user("olga", "operator"), user("abe", "approver")
        campaign = approved_campaign(operator, approver, name="webhook sweep")
        campaigns.start(campaign.pk, operator)
        assert drive(campaign.pk).status == "completed"

        expected = list(Delivery.objects.filter(subscription=subscription).order_by("id")
                        .values_list("event_id", flat=True))
        kinds = [k for k in Delivery.objects.filter(subscription=subscription).order_by("id")
                 .values_list("event__kind", flat=True)]
        assert kinds[:2] == [EventType.CAMPAIGN_STATE, EventType.APPROVAL_REQUESTED]  # planned, then asks
        assert wait_for(lambda: len(receiver.delivered()) >= len(expected), timeout=60, interval=0.2), (
            [(r.answered, r.body.get("id")) for r in receiver.requests], worker.read_text()[-3000:])

        delivered = receiver.delivered()
        assert [r.body["id"] for r in delivered] == expected  # every event, once, in order
        assert all(r.signed for r in receiver.requests)
        states = [r.body["data"]["state"] for r in delivered if r.body["type"] == EventType.CAMPAIGN_STATE]
        assert states[0] == "planned" and states[-1] == "completed" and "running" in states
        seqs = [r.body["data"]["evidence"]["seq"] for r in delivered if r.body["type"] == EventType.CAMPAIGN_STATE]
        assert seqs == sorted(seqs)
        chain = set(EvidenceEvent.objects.filter(campaign=campaign, sweep__isnull=True).values_list("hash", flat=True))
        assert {r.body["data"]["evidence"]["hash"] for r in delivered} <= chain

        # The first event: refused twice, delivered on the third try, after 1x then 2x the backoff.
        first = [r for r in receiver.requests if r.body["id"] == expected[0]]
        assert [r.answered for r in first] == [503, 503, 200]
        gaps = [b.at - a.at for a, b in itertools.pairwise(first)]
        assert gaps[0] >= BACKOFF_MS / 1000 * 0.9 and gaps[1] >= 2 * BACKOFF_MS / 1000 * 0.9, gaps
        head = Delivery.objects.get(subscription=subscription, event_id=expected[0])
        assert head.state == DeliveryState.DELIVERED and head.attempts == 3 and head.response_status == 200
        assert first[-1].headers["X-Gpusweep-Event"] == EventType.CAMPAIGN_STATE
        assert first[-1].headers["X-Gpusweep-Delivery"] == str(head.pk)

        # An operator replays it from the log: the receiver gets the same event once more.
        client = Client()
        client.force_login(operator)
        replayed = client.post(f"/api/v1/webhooks/deliveries/{head.pk}/replay/")
        assert replayed.status_code == 202, replayed.content
        assert wait_for(lambda: len(receiver.delivered()) == len(expected) + 1, timeout=30, interval=0.2)
        assert receiver.delivered()[-1].body["id"] == expected[0]
    finally:
        receiver.stop()
