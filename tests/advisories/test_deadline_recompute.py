"""A deadline-policy or override change answers at once; a Celery task recomputes the deadlines.

Real parts: PostgreSQL, Redis and a real Celery worker process on a queue of this test's own.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client

from advisories.choices import ExposureState
from advisories.exposure import DeadlineRules, assign_deadlines, recompute, refresh_deadlines
from advisories.ingest import ingest_documents
from advisories.models import ClusterDeadlineOverride, DeadlinePolicy, Exposure
from advisories.services import deadlines_changed
from advisories.sources import FileSource
from conftest import need
from inventory.models import Cluster
from tests.advisories.conftest import FIXTURES, PUBLISHED_5703, add_node
from tests.advisories.test_api import API, login
from tests.helpers import REPO, clean_env, stop_process_group, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fleet() -> None:
    ingest_documents(FileSource(str(FIXTURES / "5703.json")).items())
    lab = Cluster.objects.create(name="lab", kind="kubernetes")
    add_node(lab, "l1", driver="535.261.03")
    recompute()


def deadline() -> dt.datetime:
    return Exposure.objects.get(node__name="l1").deadline


@pytest.mark.postgres
@pytest.mark.redis
def test_a_policy_change_answers_at_once_and_a_worker_recomputes_ending_with_the_later_change(
        fleet, settings, tmp_path: Path):
    url = os.environ.get("CELERY_BROKER_URL", "")
    need(connection.vendor == "postgresql" and url.startswith("redis"),
         "needs DATABASE_URL=postgres://... and CELERY_BROKER_URL=redis://... (a worker process shares them)")
    queue = f"deadlines-{uuid.uuid4().hex[:12]}"
    settings.CELERY_TASK_DEFAULT_QUEUE = queue
    admin = Client()
    login(admin, "admin")
    before = deadline()
    first = admin.patch(f"{API}/deadline-policy/current/", {"high_days": 10}, content_type="application/json")
    assert first.status_code == 200
    assert first.json()["recomputing"] is True and first.json()["high_days"] == 10
    second = admin.patch(f"{API}/deadline-policy/current/", {"high_days": 7}, content_type="application/json")
    assert second.json()["recomputing"] is True and second.json()["generation"] == first.json()["generation"] + 1
    assert deadline() == before  # nothing recomputed in the requests
    page = admin.get("/advisories/exposures/")
    assert b'id="deadlines-recomputing"' in page.content

    db = connection.settings_dict
    env = clean_env(DATABASE_URL=f"postgres://{db['USER'] or 'root'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/"
                                 f"{db['NAME']}", CELERY_BROKER_URL=url, GPUSWEEP_CELERY_QUEUE=queue,
                    GPUSWEEP_ADVISORY_SOURCES="")
    log = tmp_path / "worker.log"
    with log.open("ab") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "gpusweep", "worker", "--concurrency", "2", "--queues", queue,
             "--without-heartbeat", "--without-mingle", "--without-gossip"],
            env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        done = wait_for(lambda: not admin.get(f"{API}/deadline-policy/current/").json()["recomputing"], timeout=60)
        assert done, log.read_text()[-3000:]
    finally:
        stop_process_group(worker)
    assert deadline() == PUBLISHED_5703 + dt.timedelta(days=7)  # the later change
    assert b'id="deadlines-recomputing"' not in admin.get("/advisories/exposures/").content
    policy = DeadlinePolicy.current()
    assert policy.recomputed_generation == policy.generation and policy.recomputed_at is not None


@pytest.mark.django_db
def test_a_recompute_superseded_by_a_later_change_yields_whichever_runs_first(
        fleet, django_capture_on_commit_callbacks):
    """The tasks run here, in the order a worker pool may run them (the queued ones are dropped)."""
    with django_capture_on_commit_callbacks(execute=False) as queued:
        DeadlinePolicy.objects.filter(pk=1).update(high_days=10)
        first = deadlines_changed()
        DeadlinePolicy.objects.filter(pk=1).update(high_days=7)
        second = deadlines_changed()
    assert len(queued) == 2
    # The later task first: it applies the later policy; the earlier one then changes nothing.
    assert refresh_deadlines(second) == 1
    assert refresh_deadlines(first) is None
    assert deadline() == PUBLISHED_5703 + dt.timedelta(days=7)
    assert not DeadlinePolicy.current().recomputing
    # Done once: the same task delivered again (acks_late redelivery) writes nothing.
    assert refresh_deadlines(second) == 0
    with django_capture_on_commit_callbacks(execute=False):
        third = deadlines_changed()
    assert DeadlinePolicy.current().recomputing
    assert refresh_deadlines(third) == 0  # same deadlines: no row rewritten
    assert not DeadlinePolicy.current().recomputing


@pytest.mark.postgres
@pytest.mark.django_db
@pytest.mark.parametrize("basis", ["publication", "first_exposure"])
def test_the_fleet_wide_update_sets_the_deadlines_the_rule_gives_each_exposure(basis):
    """PostgreSQL's one-statement refresh against the rule evaluated per exposure in Python."""
    need(connection.vendor == "postgresql", "the set-based refresh is PostgreSQL's (others take the per-group path)")
    ingest_documents(FileSource(str(FIXTURES / "5703.json")).items())
    ingest_documents(FileSource(str(FIXTURES / "5582.json")).items())
    prod, lab = Cluster.objects.create(name="prod", kind="slurm"), Cluster.objects.create(name="lab", kind="slurm")
    add_node(prod, "p1", driver="580.82.07", container_toolkit="1.16.1")
    add_node(lab, "l1", driver="535.261.03")
    recompute()
    Exposure.objects.filter(node__name="l1").update(first_seen=dt.datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=dt.UTC))
    DeadlinePolicy.objects.filter(pk=1).update(basis=basis, high_days=11)
    ClusterDeadlineOverride.objects.create(cluster=lab, severity="high", days=4)
    assert assign_deadlines(refresh=True) > 0
    exposures = list(Exposure.objects.filter(state__in=ExposureState.ACTIVE).select_related("node"))
    rules = DeadlineRules({e.affected_range_id for e in exposures})
    assert len(exposures) >= 3
    for e in exposures:
        assert (e.deadline, e.deadline_source) == rules.deadline(e.affected_range_id, e.node.cluster_id, e.first_seen)
    assert assign_deadlines(refresh=True) == 0  # nothing changed: nothing written
