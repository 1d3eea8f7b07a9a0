"""Short heartbeats (a digest of unchanged content) and batched last_seen, inventory/heartbeats.py.

Real parts: the agent's HeartbeatSender over HTTP, PostgreSQL, Redis, and gunicorn with two
workers for the killed-worker test.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from gpusweep_agent.auth import HEADER_NONCE, HEADER_SIGNATURE_2, derive_node_key, sign
from gpusweep_agent.heartbeat import HeartbeatError, HeartbeatSender, HeartbeatStale, content_digest

from conftest import need
from inventory import heartbeats
from inventory.choices import ChangeSource
from inventory.models import ChangeLog, Node, Workload
from inventory.services import record_versions
from inventory.signals import node_versions_changed
from tests.helpers import REPO, clean_env, free_port, stop_process_group, wait_for
from tests.inventory.test_agent_heartbeat import (
    PATH,
    SECRET,
    cluster,  # noqa: F401 (fixture)
    driver_of,
    facts,
    heartbeat_payload,
    post,
    send,
    sender,
    signed_heartbeat,
    workload,
)

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def redis_ledger(settings):
    """Each test on a Redis of its own keys (they are prefixed with the test database's name)."""
    url = os.environ.get("CELERY_BROKER_URL", "")
    need(url.startswith("redis"), "set CELERY_BROKER_URL=redis://127.0.0.1:6379/<n>: heartbeats go through Redis")
    settings.GPUSWEEP_AGENT_FLEET_SECRET = SECRET
    settings.GPUSWEEP_HEARTBEAT_REDIS_URL = url
    settings.GPUSWEEP_HEARTBEAT_FLUSH_S = 3600.0  # flushes only when a test calls flush()
    client = heartbeats._client(url)
    for key in heartbeats._keys():
        client.delete(key)
    yield
    for key in heartbeats._keys():
        client.delete(key)


def short_payload(digest: str, node: str = "gpu01") -> dict:
    return {"schema": "gpusweep.heartbeat/1", "cluster": "local", "node": node, "digest": digest}


def full(driver: str = "570.86.15") -> dict:
    return {**heartbeat_payload(driver), "endpoint": "http://10.0.0.5:17100"}


def test_an_unchanged_heartbeat_is_one_read_and_reaches_the_database_at_the_flush(live_server, cluster):  # noqa: F811
    agent = sender(live_server.url)
    first = agent.send()
    assert first["digest"] == content_digest(agent.payload())
    node = Node.objects.get(name="gpu01")
    assert node.heartbeat_digest == first["digest"]
    logs = ChangeLog.objects.count()
    # The first short heartbeat of a flush period flushes; later ones in the period only count.
    assert send(Client(), *signed_heartbeat(short_payload(first["digest"]))).status_code == 200
    before = Node.objects.get(pk=node.pk).last_seen

    body, headers = signed_heartbeat(short_payload(first["digest"]))
    heard = dt.datetime.now(dt.UTC)
    with CaptureQueriesContext(connection) as queries:
        answer = send(Client(), body, headers)
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"node_id": node.pk, "changed": [], "next_heartbeat_s": 30, "digest": first["digest"]}
    assert len(queries) == 1, [q["sql"] for q in queries]  # the node, its digest and counter
    assert ChangeLog.objects.count() == logs
    assert Node.objects.get(pk=node.pk).last_seen == before  # not yet: batched

    assert heartbeats.flush() == 1
    node = Node.objects.get(pk=node.pk)
    assert node.last_seen >= heard and node.heartbeat_at >= heard
    assert node.heartbeat_counter == int(headers["X-Gpusweep-Nonce"])
    assert Workload.objects.get(scheduler_id="wl-1").last_seen >= heard
    assert heartbeats.flush() == 0  # nothing pending


def test_the_agent_sends_digests_and_everything_again_when_its_driver_changes(live_server, cluster):  # noqa: F811
    driver = ["570.86.15"]
    agent = sender(live_server.url, facts=lambda: facts(driver[0]))
    agent.send()
    assert agent.send()["changed"] == [] and agent.acked_digest  # a short one
    changed_events: list[list[int]] = []

    def seen(sender, node_ids, **kwargs):
        changed_events.append(list(node_ids))

    node_versions_changed.connect(seen, dispatch_uid="test-digest")
    try:
        driver[0] = "570.124.06"
        answer = agent.send()
    finally:
        node_versions_changed.disconnect(dispatch_uid="test-digest")
    node = Node.objects.get(name="gpu01")
    assert answer["changed"] == ["driver"] and driver_of() == "570.124.06"
    assert changed_events == [[node.pk]]  # exposures recomputed for this node
    entry = ChangeLog.objects.filter(object_id=node.pk, source=ChangeSource.AGENT).latest("id")
    assert entry.changes == {"component:driver": ["570.86.15", "570.124.06"]}
    assert node.heartbeat_digest == answer["digest"] == content_digest(agent.payload())


def test_a_digest_the_node_does_not_hold_asks_for_the_full_heartbeat(live_server, cluster):  # noqa: F811
    client = Client()
    unknown = post(client, short_payload("a" * 64))  # a node never seen: registration is a full one
    assert unknown.status_code == 409 and unknown.json()["send"] == "full"
    assert not Node.objects.exists()

    assert post(client, full()).status_code == 200
    node = Node.objects.get(name="gpu01")
    other = post(client, short_payload("b" * 64))
    assert other.status_code == 409 and other.json()["send"] == "full", other.content
    assert Node.objects.get(pk=node.pk).heartbeat_counter == node.heartbeat_counter  # nothing taken
    assert heartbeats.newest(node.pk) == 0
    assert post(client, short_payload("not hex")).status_code == 400

    # Another source changes what the agent reports: the agent's next short heartbeat is refused and
    # its full one puts the node back to what the node itself runs.
    agent = sender(live_server.url)
    agent.send()
    agent.send()
    record_versions(node.pk, {"driver": "535.1.1"}, ChangeSource.CAMPAIGN, reference="test")
    assert Node.objects.get(pk=node.pk).heartbeat_digest == ""
    answer = agent.send()  # short, 409 send full, then full
    assert answer["changed"] == ["driver"] and driver_of() == "570.86.15"


def test_an_old_agents_full_heartbeat_is_still_accepted(cluster):  # noqa: F811
    client = Client()
    old = heartbeat_payload("570.86.15")  # the wire format before digests: no digest, no endpoint
    answer = post(client, old)
    assert answer.status_code == 200, answer.content
    assert answer.json()["changed"] == ["cuda", "driver", "kernel"]
    # Version 1 signature only, ordered by its timestamp: still refused when replayed.
    body = json.dumps(heartbeat_payload("570.124.06")).encode()
    headers = sign(derive_node_key(SECRET, "local", "gpu01"), "local/gpu01", "POST", PATH, body, now=time.time() + 5)
    for name in (HEADER_NONCE, HEADER_SIGNATURE_2):
        headers.pop(name)
    assert send(client, body, headers).status_code == 200
    assert driver_of() == "570.124.06"
    assert send(client, body, headers).status_code == 409


def test_a_replayed_or_older_short_heartbeat_is_refused_before_and_after_the_flush(cluster):  # noqa: F811
    client = Client()
    digest = post(client, full()).json()["digest"]
    older = signed_heartbeat(short_payload(digest))
    newer = signed_heartbeat(short_payload(digest))
    assert send(client, *newer).status_code == 200
    for replay in (newer, older):  # counters in Redis, not yet in the database
        refused = send(client, *replay)
        assert refused.status_code == 409 and refused.json()["newest_counter"] == int(newer[1]["X-Gpusweep-Nonce"])
    heartbeats.flush()
    heartbeats._client(os.environ["CELERY_BROKER_URL"]).delete(heartbeats._keys()[0])
    assert send(client, *newer).status_code == 409  # Redis lost its counters: the database's refuses
    # A full heartbeat replayed after short ones is refused too (it would roll the node back).
    captured = signed_heartbeat(full("535.1.1"))
    assert send(client, *signed_heartbeat(short_payload(digest))).status_code == 200
    assert send(client, *captured).status_code == 409
    assert driver_of() == "570.86.15"


def test_without_its_redis_a_short_heartbeat_writes_its_row_and_replays_stay_refused(settings, cluster):  # noqa: F811
    client = Client()
    digest = post(client, full()).json()["digest"]
    settings.GPUSWEEP_HEARTBEAT_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    heard = dt.datetime.now(dt.UTC)
    body, headers = signed_heartbeat(short_payload(digest))
    assert send(client, body, headers).status_code == 200
    node = Node.objects.get(name="gpu01")
    assert node.last_seen >= heard and node.heartbeat_counter == int(headers["X-Gpusweep-Nonce"])
    assert send(client, body, headers).status_code == 409


def test_last_seen_is_flushed_within_its_resolution_after_a_worker_is_killed(tmp_path: Path, cluster):  # noqa: F811
    """gunicorn with two workers; both are SIGKILLed right after answering gpu01's short heartbeat,
    which therefore never reached the database from them; heartbeats of gpu02 to the workers
    gunicorn starts again flush it within GPUSWEEP_HEARTBEAT_FLUSH_S."""
    flush_s = 2
    settings_db = connection.settings_dict
    env = clean_env(
        DATABASE_URL=f"postgres://{settings_db['USER'] or 'root'}@{settings_db['HOST'] or '127.0.0.1'}:"
                     f"{settings_db['PORT'] or 5432}/{settings_db['NAME']}",
        CELERY_BROKER_URL=os.environ["CELERY_BROKER_URL"], GPUSWEEP_AGENT_FLEET_SECRET=SECRET,
        GPUSWEEP_HEARTBEAT_FLUSH_S=str(flush_s), GPUSWEEP_ADVISORY_SOURCES="")
    port = free_port()
    log = tmp_path / "gunicorn.log"
    with log.open("ab") as out:
        web = subprocess.Popen([sys.executable, "-m", "gunicorn", "gpusweep.wsgi:application", "--bind",
                                f"127.0.0.1:{port}", "--workers", "2"], env=env, cwd=REPO, stdout=out,
                               stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        one, two = sender(url, "gpu01"), sender(url, "gpu02")
        assert wait_for(lambda: _sends(one), timeout=60), log.read_text()[-3000:]
        two.send()
        time.sleep(flush_s)  # the flush period that began with these full heartbeats ends
        two.send()  # short: takes this period's flush (of nothing but itself)
        heard = dt.datetime.now(dt.UTC)
        one.send()  # short, pending in Redis until the next period's flush
        workers = subprocess.run(["pgrep", "-P", str(web.pid)], capture_output=True, text=True).stdout.split()
        assert len(workers) == 2
        for pid in workers:
            os.kill(int(pid), signal.SIGKILL)
        assert Node.objects.get(name="gpu01").last_seen < heard

        def flushed() -> bool:
            try:
                two.send()
            except HeartbeatStale:
                pass
            except HeartbeatError:  # gunicorn is starting its workers again
                return False
            return Node.objects.get(name="gpu01").last_seen >= heard

        assert wait_for(flushed, timeout=30, interval=0.2), log.read_text()[-3000:]
        lag = (dt.datetime.now(dt.UTC) - heard).total_seconds()
        assert lag <= flush_s + 1.5, lag
    finally:
        stop_process_group(web)


def _sends(agent: HeartbeatSender) -> bool:
    try:
        agent.send()
    except HeartbeatError:
        return False
    return True


def test_the_digest_covers_what_a_heartbeat_reports_not_when_or_by_which_agent():
    base = {"endpoint": "e", "facts": facts(), "workloads": [workload()]}
    assert content_digest({**base, "sent_at": "x", "agent_version": "1"}) == content_digest(base)
    assert content_digest({**base, "workloads": []}) != content_digest(base)
