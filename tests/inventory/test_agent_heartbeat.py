from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from gpusweep_agent.auth import derive_node_key, sign
from gpusweep_agent.heartbeat import HeartbeatAuthError, HeartbeatRejected, HeartbeatSender

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


def post(client: Client, payload: dict, identity: str = "local/gpu01", key: str | None = None):
    body = json.dumps(payload).encode()
    cluster, node = identity.split("/")
    headers = sign(key or derive_node_key(SECRET, cluster, node), identity, "POST", PATH, body)
    return client.post(PATH, body, content_type="application/json",
                       headers={k: v for k, v in headers.items()})


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
    assert response.status_code == 400 and "nowhere" in response.json()["errors"]["cluster"]


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
