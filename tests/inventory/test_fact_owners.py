"""Facts with an owner (#26): what a node's agent measured outranks what a scheduler declares, an empty
report never erases a known value, and two sources that disagree make one visible conflict instead of an
alternating change log.

The Slurm side is the real mapping (`node_from_slurm`) over `sinfo --json` nodes as Slurm prints them,
applied as the sync applies them (no slurmctld: the rule is the inventory's); the agent side is a signed
heartbeat posted to the real endpoint. The sweep runs on the memory executor (a test double of a back end;
the requirement it records is the engine's).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from campaigns import services
from campaigns.choices import CampaignStatus, MoveState
from campaigns.models import WorkloadMove
from inventory.choices import ChangeSource
from inventory.models import ChangeLog, Cluster, Node
from inventory.services import Snapshot, apply_snapshot
from inventory.sources.slurm import node_from_slurm
from tests.campaigns.fleet import OLD, approved_campaign, drive, make_fleet, user
from tests.inventory.test_agent_heartbeat import fleet_secret, post  # noqa: F401 - the fixture, applied to every test

pytestmark = pytest.mark.django_db(transaction=True)

MEASURED = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def cluster() -> Cluster:
    return Cluster.objects.create(name="local", kind="slurm")


def slurm_sync(cluster: Cluster, gres: str, nodes: tuple[str, ...] = ("gpu01",)) -> None:
    """What the Slurm sync writes of these nodes (their GRES as sinfo prints it)."""
    observed = [node_from_slurm({"name": n, "gres": gres, "state": "idle", "partitions": ["gpu"]}, {}) for n in nodes]
    apply_snapshot(cluster, Snapshot(nodes=observed, workloads=None, complete=False), ChangeSource.SLURM)


def heartbeat(client: Client, node: str = "gpu01", model: str = MEASURED, count: int = 4) -> None:
    payload: dict[str, Any] = {
        "schema": "gpusweep.heartbeat/1",
        "cluster": "local",
        "node": node,
        "facts": {"gpu_model": model, "gpu_count": count, "components": {"driver": OLD, "cuda": "12.8"}},
        "workloads": [],
    }
    response = post(client, payload, identity=f"local/{node}")
    assert response.status_code == 200, response.content


def model_changes(node: Node) -> list[dict[str, Any]]:
    return [
        log.changes
        for log in ChangeLog.objects.filter(object_type="node", object_id=node.pk).order_by("id")
        if {"gpu_model", "fact_conflicts"} & log.changes.keys()
    ]


@pytest.mark.parametrize("agent_first", [True, False], ids=["heartbeat-then-sync", "sync-then-heartbeat"])
def test_an_untyped_gres_sync_keeps_the_measured_model(client, cluster, agent_first):
    steps = [lambda: heartbeat(client), lambda: slurm_sync(cluster, "gpu:4")]
    for step in steps if agent_first else steps[::-1]:
        step()
    for _ in range(3):  # and the syncs and heartbeats that follow
        slurm_sync(cluster, "gpu:4")
        heartbeat(client)
    node = Node.objects.get(name="gpu01")
    assert (node.gpu_model, node.gpu_count, node.fact_conflicts) == (MEASURED, 4, {})
    assert node.fact_sources == {"gpu_model": "agent", "gpu_count": "agent"}
    # The model was written once (a node the sync made first had none), and never emptied.
    wanted = [[None, MEASURED]] if agent_first else [[None, ""], ["", MEASURED]]
    assert [c["gpu_model"] for c in model_changes(node) if "gpu_model" in c] == wanted


def test_a_typed_gres_naming_the_same_gpu_is_no_conflict(client, cluster):
    heartbeat(client)
    slurm_sync(cluster, "gpu:h100:4(S:0-1)")
    node = Node.objects.get(name="gpu01")
    assert (node.gpu_model, node.fact_conflicts) == (MEASURED, {})


def test_conflicting_models_make_one_review_item_and_no_flapping(client, cluster):
    heartbeat(client)
    for _ in range(4):
        slurm_sync(cluster, "gpu:a100:4")
        heartbeat(client)
    node = Node.objects.get(name="gpu01")
    assert node.gpu_model == MEASURED  # the measured model stays
    conflict = node.fact_conflicts["gpu_model"]
    assert {k: v for k, v in conflict.items() if k != "since"} == {"agent": MEASURED, "slurm": "a100"}
    # Created with the model, then one row: the conflict opening. Nothing alternates.
    changes = model_changes(node)
    assert len(changes) == 2 and changes[0]["gpu_model"] == [None, MEASURED]
    assert changes[1]["fact_conflicts"][0] == {} and "gpu_model" not in changes[1]
    # Visible on the API and the node page.
    viewer = User.objects.create_superuser("root", password="pw-root-123456")
    client.force_login(viewer)
    api = client.get(f"/api/v1/inventory/nodes/{node.pk}/").json()
    assert api["fact_conflicts"]["gpu_model"]["slurm"] == "a100"
    page = client.get(f"/nodes/{node.pk}/").content.decode()
    assert "Sources disagree" in page and "slurm says a100" in page
    # The site fixes its GRES: the conflict closes, in one more row.
    slurm_sync(cluster, "gpu:h100:4")
    node.refresh_from_db()
    assert node.fact_conflicts == {} and node.gpu_model == MEASURED
    assert len(model_changes(node)) == 3


@pytest.mark.parametrize("agent_first", [True, False], ids=["heartbeat-then-sync", "sync-then-heartbeat"])
def test_a_sweep_started_between_the_two_reports_records_the_measured_model(client, agent_first):
    """The sweep's requirement is the agent's model, whichever source reported last (the sync declares
    none); another sync and heartbeat while the sweep runs change nothing; the job is restored."""
    fleet, cluster = make_fleet(nodes=1, spares=1)
    Node.objects.update(gpu_model="")  # known to no source yet
    for name in ("gpu00", "spare00"):
        fleet.add_node("local", name, gpu_model=MEASURED, gpu_count=8, versions={"driver": OLD, "cuda": "12.8"})
    fleet.add_workload("local", "gpu00", "gpu00-w0", name="job-gpu00-w0", gpus=2, engine="criu", rate=1000)
    def heartbeats() -> None:
        for name in ("gpu00", "spare00"):
            heartbeat(client, name, count=8)

    steps = [heartbeats, lambda: slurm_sync(cluster, "gpu:8", nodes=("gpu00", "spare00"))]  # untyped: no model
    for step in steps if agent_first else steps[::-1]:
        step()
    requester, approver = user("rita", "operator"), user("alan", "approver")
    campaign = approved_campaign(requester, approver, node_selector={"names": ["gpu00"]})
    services.start(campaign.pk, requester)
    for step in steps[::-1] if agent_first else steps:  # the other order, once the sweep has begun
        step()
    assert drive(campaign.pk).status == CampaignStatus.COMPLETED
    [move] = WorkloadMove.objects.all()
    assert move.detail["requires"]["must"]["gpu_model"] == MEASURED
    assert move.state == MoveState.RESTORED


def test_a_model_no_source_knows_is_no_requirement():
    """An unknown fact is no requirement: a checkpoint needing `gpu_model: ""` would fit no node at all."""
    from campaigns.engine.targets import requirements
    from inventory.models import Workload

    row = Workload(kind="slurm_job", scheduler_id="1", gpus=1, checkpoint_engine="criu")
    needed = requirements(None, row, "criu", {"gpu_model": "", "driver": OLD, "kernel": "6.1.0"})
    assert needed.must == {"driver": OLD, "kernel": "6.1.0"}


def test_a_stale_version_feature_is_one_conflict_and_a_component_only_slurm_knows_stays(client, cluster):
    """The agent's driver against Slurm's `nvdriver_` feature: the agent's stays, the disagreement shows once;
    a component only the Slurm features name (`cuda_`, here the agent reads none) is not erased by the agent."""

    def sync(features: str) -> None:
        node = {"name": "gpu01", "gres": "gpu:4", "state": "idle", "active_features": features}
        observed = node_from_slurm(node, {"nvdriver_": "driver", "cuda_": "cuda"})
        apply_snapshot(cluster, Snapshot(nodes=[observed], workloads=None, complete=False), ChangeSource.SLURM)

    def agent() -> None:
        payload = {
            "schema": "gpusweep.heartbeat/1",
            "cluster": "local",
            "node": "gpu01",
            "facts": {"gpu_model": MEASURED, "gpu_count": 4, "components": {"driver": OLD}},
            "workloads": [],
        }
        assert post(client, payload).status_code == 200

    agent()
    for _ in range(3):
        sync("nvdriver_570.195.03,cuda_12.8")
        agent()
    node = Node.objects.get(name="gpu01")
    assert node.component_versions() == {"driver": OLD, "cuda": "12.8"}
    conflict = {k: v for k, v in node.fact_conflicts["component:driver"].items() if k != "since"}
    assert conflict == {"agent": OLD, "slurm": "570.195.03"}
    logged = [log.changes for log in ChangeLog.objects.filter(object_type="node", object_id=node.pk)]
    assert sum("fact_conflicts" in c for c in logged) == 1
    assert sum("component:cuda" in c for c in logged) == 1  # added once, never erased and added again
    sync(f"nvdriver_{OLD},cuda_12.8")  # the site fixes its feature
    node.refresh_from_db()
    assert node.fact_conflicts == {}


def test_model_names_agree_by_the_one_reading_of_gpu_models():
    """Each source writes the model its own way; an A10 is still not an A100 (a substring would say so)."""
    from inventory.owners import agree

    assert agree("gpu_model", "h100", "NVIDIA H100 80GB HBM3")
    assert agree("gpu_model", "NVIDIA-H100-80GB-HBM3", "NVIDIA H100 80GB HBM3")
    assert not agree("gpu_model", "a10", "NVIDIA A100-SXM4-80GB")
    assert not agree("gpu_model", "NVIDIA H100 80GB HBM3", "NVIDIA H100 94GB")
    assert not agree("gpu_model", "", "NVIDIA H100 80GB HBM3")
