from __future__ import annotations

import json
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from gpusweep_agent.auth import HEADER_NONCE, HEADER_SIGNATURE_2, derive_node_key, sign
from gpusweep_agent.heartbeat import HeartbeatAuthError, HeartbeatRejected, HeartbeatSender, HeartbeatStale

from inventory.choices import ChangeSource, ClusterKind, WorkloadKind
from inventory.models import ChangeLog, Cluster, Node, Workload

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "fleet-secret-for-tests-0123456789"
PATH = "/api/v1/inventory/agent/heartbeat"


@pytest.fixture(autouse=True)
def fleet_secret(settings):
    settings.GPUSWEEP_AGENT_FLEET_SECRET = SECRET


@pytest.fixture
def cluster() -> Cluster:
    return Cluster.objects.create(name="local", kind=ClusterKind.STATIC)


def facts(driver: str = "570.86.15") -> dict:
    return {"gpu_model": "NVIDIA H100 80GB HBM3", "gpu_count": 8, "product_line": "tesla", "os_family": "linux",
            "components": {"driver": driver, "cuda": "12.8", "kernel": "6.1.0-27-amd64"}}


def workload(wid: str = "wl-1") -> dict:
    return {"kind": "process", "scheduler_id": wid, "name": "trainer", "gpus": 1,
            "started_at": "2026-11-30T07:00:00Z", "checkpoint_engine": "criu"}


def sender(url: str, node: str = "gpu01", key: str | None = None, **kw) -> HeartbeatSender:
    return HeartbeatSender(url, "local", node, key or derive_node_key(SECRET, "local", node),
                           "http://10.0.0.5:17100", kw.get("facts", facts), kw.get("workloads", lambda: [workload()]))


# Heartbeat nonces are counters, as the agent makes them: the clock in microseconds, or one more.
LAST = [0]


def signed_heartbeat(payload: dict, identity: str = "local/gpu01", key: str | None = None) -> tuple[bytes, dict]:
    body = json.dumps(payload).encode()
    cluster, node = identity.split("/")
    now = time.time()
    LAST[0] = max(LAST[0] + 1, int(now * 1_000_000))
    headers = sign(key or derive_node_key(SECRET, cluster, node), identity, "POST", PATH, body, now=now,
                   nonce=str(LAST[0]))
    return body, headers


def send(client: Client, body: bytes, headers: dict):
    return client.post(PATH, body, content_type="application/json", headers=headers)


def post(client: Client, payload: dict, identity: str = "local/gpu01", key: str | None = None):
    return send(client, *signed_heartbeat(payload, identity, key))


def heartbeat_payload(driver: str) -> dict:
    return {"schema": "gpusweep.heartbeat/1", "cluster": "local", "node": "gpu01", "facts": facts(driver),
            "workloads": [workload()]}


def driver_of(node_name: str = "gpu01") -> str:
    return Node.objects.get(name=node_name).components.get(component="driver").version


def test_the_real_agent_registers_its_node_over_http_and_reports_changes(live_server, cluster):
    first = sender(live_server.url).send()
    node = Node.objects.get(cluster=cluster, name="gpu01")
    assert first["node_id"] == node.pk and first["next_heartbeat_s"] == 30
    assert set(first["changed"]) == {"driver", "cuda", "kernel"}
    assert node.agent_endpoint == "http://10.0.0.5:17100" and node.last_seen is not None
    assert Workload.objects.get(kind=WorkloadKind.PROCESS).node == node

    assert sender(live_server.url).send()["changed"] == []
    upgraded = sender(live_server.url, facts=lambda: facts("580.95.05"), workloads=lambda: []).send()
    assert upgraded["changed"] == ["driver"]
    assert Workload.objects.get(scheduler_id="wl-1").gone_at is not None
    assert ChangeLog.objects.filter(source=ChangeSource.AGENT, object_type="node", object_id=node.pk).count() == 2


def test_it_refuses_a_wrong_key_a_stale_request_and_another_nodes_identity(live_server, cluster):
    with pytest.raises(HeartbeatAuthError, match="bad signature"):
        sender(live_server.url, key=derive_node_key("another-secret", "local", "gpu01")).send()
    client = Client()
    payload = sender(live_server.url).payload()
    body = json.dumps(payload).encode()
    old = sign(derive_node_key(SECRET, "local", "gpu01"), "local/gpu01", "POST", PATH, body, now=1_000_000)
    assert client.post(PATH, body, content_type="application/json", headers=old).status_code == 401
    # gpu02's valid key cannot speak for gpu01.
    response = post(client, payload, identity="local/gpu02")
    assert response.status_code == 400 and "node" in response.json()["errors"]
    assert Node.objects.count() == 0


def test_it_rejects_an_invalid_payload_naming_the_fields_and_writes_nothing(live_server, cluster):
    bad = sender(live_server.url, workloads=lambda: [{"kind": "vm", "scheduler_id": "", "gpus": -1}])
    with pytest.raises(HeartbeatRejected) as caught:
        bad.send()
    assert set(caught.value.errors) >= {"workloads[0].kind", "workloads[0].scheduler_id", "workloads[0].gpus"}
    assert Node.objects.count() == 0 and ChangeLog.objects.count() == 0


def test_it_needs_the_cluster_to_exist(cluster):
    payload = {"schema": "gpusweep.heartbeat/1", "cluster": "nowhere", "node": "gpu01", "facts": facts()}
    response = post(Client(), payload, identity="nowhere/gpu01")
    assert response.status_code == 400 and "nowhere" in response.json()["errors"]["cluster"][0]


def test_it_refuses_heartbeats_when_no_fleet_secret_is_configured(settings, cluster):
    settings.GPUSWEEP_AGENT_FLEET_SECRET = ""
    response = Client().post(PATH, b"{}", content_type="application/json")
    assert response.status_code == 401 and "GPUSWEEP_AGENT_FLEET_SECRET" in response.json()["detail"]


def test_agent_key_prints_the_derived_node_key(cluster):
    out = StringIO()
    call_command("agent_key", "local", "gpu01", stdout=out)
    assert out.getvalue().strip() == derive_node_key(SECRET, "local", "gpu01")
    with pytest.raises(CommandError, match="no cluster named 'other'"):
        call_command("agent_key", "other", "gpu01")


def test_it_stores_agent_processes_and_leaves_jobs_and_pods_to_their_schedulers(live_server, cluster):
    reported = [
        workload("wl-1"),
        {"kind": "gpu_process", "scheduler_id": "4242", "name": "python", "gpus": 1, "started_at": ""},
        {"kind": "slurm_step", "scheduler_id": "17.batch", "name": "step", "gpus": 2},
        {"kind": "k8s_pod", "scheduler_id": "0b6d-uid", "name": "pod 0b6d-uid", "gpus": 1},
    ]
    sender(live_server.url, workloads=lambda: reported).send()
    stored = set(Workload.objects.values_list("kind", "scheduler_id"))
    assert stored == {("process", "wl-1"), ("process", "gpu01:pid:4242")}


def test_it_accepts_the_facts_the_agent_gathers_on_this_host(live_server, cluster):
    from gpusweep_agent.config import AgentConfig
    from gpusweep_agent.facts import gather

    gathered = gather(AgentConfig(node="gpu01"))
    answer = sender(live_server.url, facts=lambda: gathered, workloads=lambda: []).send()
    node = Node.objects.get(pk=answer["node_id"])
    assert node.component_versions()["kernel"] == gathered["components"]["kernel"]


def test_a_replayed_or_older_heartbeat_is_refused_and_rolls_nothing_back(cluster):
    client = Client()
    older = signed_heartbeat(heartbeat_payload("570.195.03"))
    newer = signed_heartbeat(heartbeat_payload("570.211.01"))
    assert send(client, *newer).status_code == 200
    changes = ChangeLog.objects.count()
    for captured in (newer, older):  # sent again, and an older one arriving late
        response = send(client, *captured)
        assert response.status_code == 409, response.content
        assert "replayed or out-of-order" in response.json()["detail"]
    assert driver_of() == "570.211.01"
    assert ChangeLog.objects.count() == changes
    node = Node.objects.get(name="gpu01")
    assert node.heartbeat_counter == int(newer[1][HEADER_NONCE])


def test_an_agent_older_than_nonces_still_reports_and_cannot_be_replayed(cluster):
    """Version 1 signatures only, as agents before replay protection send them."""
    client = Client()
    legacy_headers = ("X-Gpusweep-Node", "X-Gpusweep-Timestamp", "X-Gpusweep-Signature")

    def legacy(driver: str, now: float) -> tuple[bytes, dict]:
        body = json.dumps(heartbeat_payload(driver)).encode()
        headers = sign(derive_node_key(SECRET, "local", "gpu01"), "local/gpu01", "POST", PATH, body, now=now)
        return body, {k: v for k, v in headers.items() if k in legacy_headers}

    now = time.time()
    first = legacy("570.195.03", now - 60)
    assert send(client, *first).status_code == 200
    assert send(client, *first).status_code == 409
    assert send(client, *legacy("570.211.01", now)).status_code == 200
    assert send(client, *legacy("570.172.08", now - 30)).status_code == 409
    assert driver_of() == "570.211.01"


def test_a_new_agents_heartbeat_stripped_of_its_nonce_is_refused(cluster):
    client = Client()
    body, headers = signed_heartbeat(heartbeat_payload("570.211.01"))
    assert send(client, body, headers).status_code == 200
    stripped = {k: v for k, v in headers.items() if k not in (HEADER_NONCE, HEADER_SIGNATURE_2)}
    assert send(client, body, stripped).status_code == 409
    unsigned_nonce = {**headers, HEADER_NONCE: str(int(headers[HEADER_NONCE]) + 1)}
    assert send(client, body, unsigned_nonce).status_code == 401  # the nonce is signed
    assert Node.objects.get(name="gpu01").heartbeat_counter == int(headers[HEADER_NONCE])


def test_a_heartbeat_nonce_must_be_a_counter(cluster):
    body = json.dumps(heartbeat_payload("570.211.01")).encode()
    headers = sign(derive_node_key(SECRET, "local", "gpu01"), "local/gpu01", "POST", PATH, body)  # random hex
    response = send(Client(), body, headers)
    assert response.status_code == 401 and "counter" in response.json()["detail"]
    assert not Node.objects.exists()


def test_the_agent_jumps_past_a_counter_from_a_clock_that_was_ahead(live_server, cluster):
    heartbeat = sender(live_server.url)
    heartbeat.send()
    ahead = (time.time_ns() // 1000) + 3_600_000_000  # the clock was an hour ahead, then corrected
    Node.objects.filter(name="gpu01").update(heartbeat_counter=ahead)
    with pytest.raises(HeartbeatStale, match="409"):
        heartbeat.send()
    assert heartbeat.send()["changed"] == []
    assert Node.objects.get(name="gpu01").heartbeat_counter == ahead + 1
