"""/metrics through Django's test client: the token, and each family against what the tables hold.

Campaigns run on the memory executor (the test double of executors/memory.py) driven in this
process; the evidence they write is what the step, error and checkpoint families are folded from.
The queue depth is read from whichever real broker the run uses (the filesystem broker by default,
Redis under CI), on a queue of this test's own.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from advisories.models import Exposure
from campaigns.choices import CampaignStatus, SweepState
from campaigns.models import EvidenceEvent
from gpusweep.celery import app as celery_app
from inventory.choices import ChangeSource
from inventory.models import Cluster, Node
from inventory.services import ObservedNode, Snapshot, apply_snapshot
from metrics import rollup
from metrics.models import EvidenceCursor, EvidenceTotal
from tests.advisories.conftest import add_node as add_exposed_node
from tests.advisories.test_exposure import ingest
from tests.campaigns.fleet import approved_campaign, drive, make_fleet, user

pytestmark = pytest.mark.django_db

TOKEN = "metrics-token-for-tests-0123456789abcdef"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(autouse=True)
def token(settings) -> str:  # type: ignore[no-untyped-def]
    settings.GPUSWEEP_METRICS_TOKEN = TOKEN
    return TOKEN


def scrape(client: Client | None = None) -> tuple[Samples, set[str]]:
    """The samples of one scrape, parsed by prometheus_client's own text parser, and the family names."""
    response = (client or Client()).get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    samples: Samples = {}
    names = set()
    for family in text_string_to_metric_families(response.content.decode()):
        names.add(family.name)
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples, names


def value(samples: Samples, name: str, /, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def matching(samples: Samples, name: str, /, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    return {key: v for (n, key), v in samples.items() if n == name and set(labels.items()) <= key}


def test_it_answers_only_a_scraper_holding_the_token(settings):
    client = Client()
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics").headers["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}x"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": f"Token {TOKEN}"}).status_code == 401
    assert client.post("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 405
    # A logged-in user is not a scraper: the page is the token's only.
    admin = user("ada", "admin")
    client.force_login(admin)
    assert client.get("/metrics").status_code == 401
    settings.GPUSWEEP_METRICS_TOKEN = ""
    off = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert off.status_code == 404 and "GPUSWEEP_METRICS_TOKEN" in off.json()["detail"]
    assert EvidenceCursor.objects.count() == 0, "a refused scrape folded evidence"


def test_a_short_token_stops_the_process_at_start(tmp_path):
    from tests.helpers import clean_env, manage

    env = clean_env(GPUSWEEP_METRICS_TOKEN="short", GPUSWEEP_VAR_DIR=str(tmp_path))
    result = manage("check", env=env)
    assert result.returncode != 0 and "GPUSWEEP_METRICS_TOKEN must be at least 32" in result.stderr, result


def test_it_counts_open_exposures_by_severity_and_state_and_those_overdue_or_due_within_7_days():
    cluster = Cluster.objects.create(name="prod", kind="slurm")
    for name in ("late", "soon", "later", "accepted"):
        add_exposed_node(cluster, name, driver="570.172.08")
    add_exposed_node(cluster, "patched", driver="570.195.03")
    ingest("5703")
    now = timezone.now()
    deadlines = {"late": now - dt.timedelta(hours=1), "soon": now + dt.timedelta(days=6),
                 "later": now + dt.timedelta(days=8), "accepted": now - dt.timedelta(days=1)}
    for name, deadline in deadlines.items():
        Exposure.objects.filter(node__name=name).update(deadline=deadline)
    Exposure.objects.filter(node__name="accepted").update(state="risk_accepted")

    samples, _ = scrape()
    assert value(samples, "gpusweep_exposures_open", severity="high", state="open") == 3
    assert value(samples, "gpusweep_exposures_open", severity="high", state="risk_accepted") == 1
    assert value(samples, "gpusweep_exposures_open", severity="critical", state="open") == 0
    # The accepted risk is past its deadline too, but an approver accepted it: not overdue.
    assert value(samples, "gpusweep_exposures_overdue", severity="high") == 1
    assert value(samples, "gpusweep_exposures_due_7d", severity="high") == 1
    Exposure.objects.filter(node__name="late").update(state="remediated")
    samples, _ = scrape()
    assert value(samples, "gpusweep_exposures_overdue", severity="high") == 0
    assert value(samples, "gpusweep_exposures_open", severity="high", state="open") == 2


def test_a_campaign_shows_its_sweeps_by_state_and_its_steps_errors_and_checkpoints(monkeypatch):
    monkeypatch.setenv("GPUSWEEP_MEMORY_EXECUTOR_STEP_S", "0.02")
    fleet, _cluster = make_fleet(nodes=3)
    rita, alan = user("rita", "operator"), user("alan", "approver")
    campaign = approved_campaign(rita, alan, parallelism_per_cluster="1", error_budget="1")
    # gpu01's checkpoint fails twice for a moment (retried), gpu02's drain for good (the node fails).
    fleet.inject("checkpoint", "local/gpu01", "temporary", times=2)
    fleet.inject("drain", "local/gpu02", "permanent", times=1)
    from campaigns import services

    services.start(campaign.pk, rita)
    samples, _ = scrape()
    names = (str(campaign.pk), campaign.name)
    by_state = {dict(k)["state"]: v for k, v in matching(samples, "gpusweep_node_sweeps", campaign=names[0]).items()}
    assert by_state["pending"] == 3 and sum(by_state.values()) == 3
    assert set(by_state) == set(SweepState.values()), "every state is exposed, zeros included"
    assert value(samples, "gpusweep_campaign_status", campaign=names[0], name=names[1], status="running") == 1

    finished = drive(campaign.pk)
    assert finished.status == CampaignStatus.COMPLETED, finished.status_reason
    samples, _ = scrape()
    by_state = {dict(k)["state"]: v for k, v in matching(samples, "gpusweep_node_sweeps", campaign=names[0]).items()}
    assert (by_state["done"], by_state["failed"], by_state["pending"]) == (2, 1, 0)

    # Step durations: one per node and step that finished (two nodes went all the way), each at
    # least the executor's step time.
    for step in ("draining", "checkpointing", "patching", "rebooting", "verifying", "returning"):
        count = value(samples, "gpusweep_step_duration_seconds_count", step=step, executor="memory")
        assert count == 2, step
        assert value(samples, "gpusweep_step_duration_seconds_sum", step=step, executor="memory") >= 2 * 0.02
        assert value(samples, "gpusweep_step_duration_seconds_bucket", step=step, executor="memory", le="+Inf") == 2
    buckets = matching(samples, "gpusweep_step_duration_seconds_bucket", step="patching")
    ordered = sorted(buckets.items(), key=lambda kv: float(dict(kv[0])["le"]))
    assert [v for _, v in ordered] == sorted(v for _, v in ordered), "buckets are cumulative"
    assert value(samples, "gpusweep_executor_errors_total", kind="temporary", step="checkpointing",
                 executor="memory") == 2
    assert value(samples, "gpusweep_executor_errors_total", kind="permanent", step="draining", executor="memory") == 1
    # Checkpoints: one per workload of the two nodes that got there, sized as the executor said.
    sizes = [e.data["bytes"] for e in EvidenceEvent.objects.filter(campaign=campaign, kind="checkpointed")]
    assert len(sizes) == 2
    assert value(samples, "gpusweep_checkpoint_bytes_count", engine="criu", executor="memory") == 2
    assert value(samples, "gpusweep_checkpoint_bytes_sum", engine="criu", executor="memory") == sum(sizes)
    # gpu01's checkpoint came after a retry's back-off: only gpu00's is timed.
    assert value(samples, "gpusweep_checkpoint_seconds_count", engine="criu", executor="memory") == 1
    assert value(samples, "gpusweep_checkpoint_seconds_sum", engine="criu", executor="memory") >= 0.02

    again, _ = scrape()
    assert _without_timing(again) == _without_timing(samples), "a second scrape counted something twice"


def _without_timing(samples: Samples) -> Samples:
    return {key: v for key, v in samples.items() if key[0] != "gpusweep_metrics_scrape_seconds"}


def test_an_event_committed_after_a_later_one_is_still_folded_once():
    """PostgreSQL hands out ids at insert, so a transaction that began first may commit a lower id
    after a fold has passed it; the fold looks for the missed ids again."""
    make_fleet(nodes=1)
    rita, alan = user("rita", "operator"), user("alan", "approver")
    campaign = approved_campaign(rita, alan)
    from campaigns import services

    services.start(campaign.pk, rita)
    assert drive(campaign.pk).status == CampaignStatus.COMPLETED
    events = list(EvidenceEvent.objects.filter(campaign=campaign, kind="step_done").order_by("id"))
    held_back = events[3]
    # Simulate the late commit: take the event out of sight before the fold, put it back after.
    _hide(held_back.pk)
    rollup.fold()
    cursor = EvidenceCursor.objects.get()
    assert cursor.last_id > held_back.pk and held_back.pk in [gap for gap, _ in cursor.gaps]
    step = held_back.data["step"]
    assert _count(step) == 0
    EvidenceEvent.objects.bulk_create([held_back])
    rollup.fold()
    assert _count(step) == 1
    assert held_back.pk not in [gap for gap, _ in EvidenceCursor.objects.get().gaps]
    rollup.fold()
    assert _count(step) == 1


def _count(step: str) -> int:
    row = EvidenceTotal.objects.filter(family="gpusweep_step_duration_seconds",
                                       labels=rollup.series_key(rollup.STEP_SECONDS,
                                                                {"step": step, "executor": "memory"})).first()
    return row.count if row else 0


def _hide(event_id: int) -> None:
    # Raw SQL: the model refuses deletes (the log is append-only).
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {EvidenceEvent._meta.db_table} WHERE id = %s", [event_id])


def test_a_batch_limit_leaves_the_rest_for_the_next_scrape(settings):
    make_fleet(nodes=2)
    rita, alan = user("rita", "operator"), user("alan", "approver")
    campaign = approved_campaign(rita, alan)
    from campaigns import services

    services.start(campaign.pk, rita)
    assert drive(campaign.pk).status == CampaignStatus.COMPLETED
    total = EvidenceEvent.objects.count()
    assert rollup.fold(batch=5) == 5
    assert sum(rollup.fold(batch=5) for _ in range(total)) == total - 5
    assert sum(r.count for r in EvidenceTotal.objects.filter(family="gpusweep_step_duration_seconds")) == \
        EvidenceEvent.objects.filter(kind="step_done").count()


def test_heartbeat_age_is_the_agents_own_not_a_scheduler_sync():
    cluster = Cluster.objects.create(name="c", kind="slurm")
    apply_snapshot(cluster, Snapshot(nodes=[ObservedNode(name="n1"), ObservedNode(name="n2")], complete=True),
                   ChangeSource.SLURM)
    apply_snapshot(cluster, Snapshot(nodes=[ObservedNode(name="n1")], complete=False), ChangeSource.AGENT)
    Node.objects.filter(name="n1").update(heartbeat_at=timezone.now() - dt.timedelta(seconds=120))
    # A later scheduler sync sees both nodes: the agent of n1 is still 120 s silent.
    apply_snapshot(cluster, Snapshot(nodes=[ObservedNode(name="n1")], complete=False), ChangeSource.SLURM)
    samples, _ = scrape()
    ages = matching(samples, "gpusweep_agent_heartbeat_age_seconds")
    assert set(ages) == {frozenset({("cluster", "c"), ("node", "n1")})}, "n2 has no agent"
    assert 120 <= next(iter(ages.values())) < 180
    assert value(samples, "gpusweep_agent_heartbeat_interval_seconds") == 30


def test_webhook_deliveries_are_exposed_once_a_delivery_log_exists(settings):
    samples, names = scrape()
    assert "gpusweep_webhook_deliveries" in names and not matching(samples, "gpusweep_webhook_deliveries")
    # A stand-in for the webhooks app's log (being built on another branch): any model and field.
    settings.GPUSWEEP_METRICS_WEBHOOK_DELIVERIES = "inventory.Node:service_state"
    make_fleet(nodes=2, spares=1)
    Node.objects.filter(name="gpu00").update(service_state="draining")
    samples, _ = scrape()
    assert matching(samples, "gpusweep_webhook_deliveries") == {
        frozenset({("result", "draining")}): 1, frozenset({("result", "in_service")}): 2}
    settings.GPUSWEEP_METRICS_WEBHOOK_DELIVERIES = "inventory.Node:nonsense"
    with pytest.raises(Exception, match="GPUSWEEP_METRICS_WEBHOOK_DELIVERIES"):
        Client(raise_request_exception=True).get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})


@pytest.fixture
def private_queue(settings) -> Iterator[str]:  # type: ignore[no-untyped-def]
    queue = f"metrics-{uuid.uuid4().hex[:12]}"
    settings.CELERY_TASK_DEFAULT_QUEUE = queue
    yield queue
    with celery_app.connection_for_write() as conn:
        conn.default_channel.queue_purge(queue)


def test_queue_depth_counts_the_messages_waiting_in_the_broker(private_queue):
    samples, _ = scrape()
    assert value(samples, "gpusweep_celery_broker_up") == 1
    assert value(samples, "gpusweep_celery_queue_depth", queue=private_queue) == 0
    for _ in range(3):
        celery_app.send_task("campaigns.redrive", queue=private_queue)
    samples, _ = scrape()
    assert value(samples, "gpusweep_celery_queue_depth", queue=private_queue) == 3


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_scrapes_folding_at_once_count_every_event_once():
    """Four threads (four connections, as four web processes) fold the same new events together."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections

    from conftest import need

    need(connection.vendor == "postgresql", "set DATABASE_URL=postgres://... to race folds on PostgreSQL row locks")
    make_fleet(nodes=3)
    rita, alan = user("rita", "operator"), user("alan", "approver")
    campaign = approved_campaign(rita, alan)
    from campaigns import services

    services.start(campaign.pk, rita)
    assert drive(campaign.pk).status == CampaignStatus.COMPLETED

    def one_fold() -> int:
        try:
            return sum(rollup.fold(batch=100) for _ in range(20))
        finally:
            connections.close_all()

    with ThreadPoolExecutor(4) as pool:
        read = sum(pool.map(lambda _: one_fold(), range(4)))
    assert read == EvidenceEvent.objects.count()
    assert sum(r.count for r in EvidenceTotal.objects.filter(family="gpusweep_step_duration_seconds")) == \
        EvidenceEvent.objects.filter(kind="step_done").count()
