"""One identity per job (#26): a Slurm job whose payload runs under gpusweep-run is one workload row.

The Slurm side is the real mapping (`node_from_slurm`, `workload_from_slurm`) over `sinfo --json` /
`squeue --json` dictionaries as Slurm 22.05 prints them, applied as the sync applies them; no slurmctld
runs here (the join is the inventory's, and tests/inventory/test_slurm_sync.py covers reading a real
cluster). The agent side is a signed heartbeat posted to the real endpoint, shaped as the agent sends it.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from campaigns import services
from executors.base import inventory_ref
from executors.memory import Fleet
from inventory.choices import ChangeSource, ClusterKind, WorkloadKind
from inventory.models import ChangeLog, Cluster, Node, Workload
from inventory.services import ObservedNode, Snapshot, apply_snapshot, move_workload
from inventory.sources.kubernetes import workload_from_pod
from inventory.sources.slurm import node_from_slurm, workload_from_slurm
from tests.campaigns.fleet import FIXED, OLD, user
from tests.inventory.test_agent_heartbeat import fleet_secret, post  # noqa: F401 - the fixture, applied to every test

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cluster() -> Cluster:
    # The memory executor stands in for slurmctld when planning (no campaign step runs here).
    return Cluster.objects.create(name="local", kind=ClusterKind.SLURM, connection={"executor": "memory"})


def sinfo_node(name: str, gres: str = "gpu:4") -> dict[str, Any]:
    return {
        "name": name,
        "gres": gres,
        "state": "idle",
        "active_features": "",
        "partitions": ["gpu"],
        "cpus": 32,
        "real_memory": 256000,
        "operating_system": "Linux 6.1.0-27-amd64 #1 SMP",
    }


def squeue_job(job_id: int, node: str = "gpu01", gpus: int = 1) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "job_state": "RUNNING",
        "batch_host": node,
        "nodes": node,
        "name": "train",
        "user_name": "alice",
        "tres_per_node": f"gres:gpu:{gpus}",
        "node_count": 1,
        "start_time": 1_796_000_000,
        "time_limit": 600,
    }


def slurm_sync(cluster: Cluster, jobs: list[dict[str, Any]], nodes: tuple[str, ...] = ("gpu01", "gpu02")):
    """What `sync_cluster` does with what sinfo and squeue printed."""
    snapshot = Snapshot(
        nodes=[node_from_slurm(sinfo_node(n), {"nvdriver_": "driver"}) for n in nodes],
        workloads=[w for w in map(workload_from_slurm, jobs) if w is not None],
        complete=True,
        workload_kinds=frozenset({WorkloadKind.SLURM_JOB}),
    )
    return apply_snapshot(cluster, snapshot, ChangeSource.SLURM)


def registration(job_id: int, owner: bool = True) -> dict[str, Any]:
    """gpusweep-run's registration inside job `job_id`, as the agent's heartbeat lists it."""
    item = {
        "kind": "process",
        "scheduler_id": f"slurm-{job_id}",
        "name": "train.sh",
        "gpus": 0,
        "started_at": "2026-12-01T07:00:00Z",
        "checkpoint_engine": "criu",
        "engine": "vllm",
        "engine_version": "0.6.3",
        "model_name": "llama",
        "model_version": "3.1",
    }
    return {**item, "owner": {"kind": "slurm_job", "id": str(job_id)}} if owner else item


def heartbeat(client: Client, workloads: list[dict[str, Any]], node: str = "gpu01", driver: str = OLD):
    payload = {
        "schema": "gpusweep.heartbeat/1",
        "cluster": "local",
        "node": node,
        "facts": {
            "gpu_model": "NVIDIA H100 80GB HBM3",
            "gpu_count": 4,
            "components": {"driver": driver, "cuda": "12.8"},
        },
        "workloads": workloads,
    }
    response = post(client, payload, identity=f"local/{node}")
    assert response.status_code == 200, response.content
    return response.json()


def the_job(cluster: Cluster, job_id: int = 1) -> dict[str, Any]:
    rows = list(
        Workload.objects.filter(cluster=cluster).values(
            "kind", "scheduler_id", "gpus", "user", "checkpoint_engine", "engine", "model_name", "node__name", "gone_at"
        )
    )
    assert len(rows) == 1, rows  # one row for the job, whoever reported it
    assert (rows[0]["kind"], rows[0]["scheduler_id"]) == (WorkloadKind.SLURM_JOB, str(job_id))
    return rows[0]


@pytest.mark.parametrize("owner", [True, False], ids=["agent-names-the-job", "older-agent-by-its-id"])
def test_a_heartbeat_then_the_sync_make_one_row_with_each_sources_fields(client, cluster, owner):
    slurm_sync(cluster, [])
    heartbeat(client, [registration(1, owner)])
    first = the_job(cluster)
    assert (first["checkpoint_engine"], first["engine"], first["node__name"]) == ("criu", "vllm", "gpu01")
    slurm_sync(cluster, [squeue_job(1, gpus=1)])
    job = the_job(cluster)
    # The scheduler's GPUs and user, the registration's checkpoint engine and model.
    assert (job["gpus"], job["user"], job["checkpoint_engine"], job["engine"], job["model_name"]) == (
        1,
        "alice",
        "criu",
        "vllm",
        "llama",
    )


def test_the_sync_then_a_heartbeat_make_the_same_row(client, cluster):
    slurm_sync(cluster, [squeue_job(1, gpus=2)])
    assert the_job(cluster)["checkpoint_engine"] == "none"
    heartbeat(client, [registration(1)])
    job = the_job(cluster)
    assert (job["gpus"], job["user"], job["checkpoint_engine"], job["engine"]) == (2, "alice", "criu", "vllm")


def test_repeated_syncs_and_heartbeats_change_nothing(client, cluster):
    slurm_sync(cluster, [squeue_job(1)])
    heartbeat(client, [registration(1)])
    logged = ChangeLog.objects.filter(object_type="workload").count()
    for _ in range(3):
        assert slurm_sync(cluster, [squeue_job(1)]).workloads_changed == 0
        heartbeat(client, [registration(1)])
    assert ChangeLog.objects.filter(object_type="workload").count() == logged
    assert the_job(cluster)["checkpoint_engine"] == "criu"


def test_a_job_that_ends_is_gone_and_a_late_heartbeat_does_not_bring_it_back(client, cluster):
    slurm_sync(cluster, [squeue_job(1)])
    heartbeat(client, [registration(1)])
    slurm_sync(cluster, [])  # the job ended
    assert the_job(cluster)["gone_at"] is not None
    answer = heartbeat(client, [registration(1)])  # the agent had not seen the end yet
    assert the_job(cluster)["gone_at"] is not None
    # No digest kept: the agent's next heartbeat is a full one, joined once Slurm runs the job again.
    assert Node.objects.get(name="gpu01").heartbeat_digest == ""
    assert answer["digest"]
    slurm_sync(cluster, [squeue_job(1, node="gpu02")])  # requeued and running on gpu02
    heartbeat(client, [registration(1)], node="gpu02")
    job = the_job(cluster)
    assert (job["gone_at"], job["node__name"], job["checkpoint_engine"]) == (None, "gpu02", "criu")


def test_a_registration_in_no_job_stays_a_process(client, cluster):
    slurm_sync(cluster, [])
    heartbeat(client, [{**registration(1, owner=False), "scheduler_id": "wl-3f2a"}])
    assert list(Workload.objects.values_list("kind", "scheduler_id")) == [(WorkloadKind.PROCESS, "wl-3f2a")]


def test_the_executors_id_of_a_job_is_its_row_and_a_move_keeps_the_job_id(client, cluster):
    slurm_sync(cluster, [squeue_job(1)])
    heartbeat(client, [registration(1)])
    row = Workload.objects.get(cluster=cluster)
    assert inventory_ref("gpu01", "slurm-1") == "1"
    # A restore returns the executor's id (slurm-<jobid>): the row keeps the job's id.
    gpu02 = Node.objects.get(name="gpu02")
    assert move_workload(row.pk, gpu02.pk, "slurm-1", ChangeSource.CAMPAIGN)
    job = the_job(cluster)
    assert job["node__name"] == "gpu02"


def test_the_plan_promises_exactly_one_move_for_the_job(client, cluster):
    fleet = Fleet()
    fleet.reset()
    for name in ("gpu01", "gpu02"):
        fleet.add_node(
            "local", name, gpu_model="NVIDIA H100 80GB HBM3", gpu_count=4, versions={"driver": OLD, "cuda": "12.8"}
        )
    fleet.add_workload("local", "gpu01", "slurm-1", name="train", gpus=1, engine="criu", rate=1000)
    slurm_sync(cluster, [squeue_job(1)])
    heartbeat(client, [registration(1)])
    heartbeat(client, [], node="gpu02")
    requester = user("req", "operator")
    campaign = services.Campaign.objects.create(
        name="sweep",
        requested_by=requester,
        node_selector={"names": ["gpu01"]},
        canary="0",
        target_versions={"driver": {"R570": FIXED}},
    )
    plan = services.make_plan(campaign.pk, requester)
    node = next(n for n in plan.content["nodes"].values() if n["name"] == "gpu01")
    assert [(m["workload"], m["action"]) for m in node["moves"]] == [("1", "migrate")], node["moves"]


# -- Kubernetes: a pod whose container runs under gpusweep-run, named by its UID in the agent's heartbeat --
POD_UID = "7c1e2f0a-5b6d-4c3e-9f8a-1b2c3d4e5f60"


def kubernetes_sync(cluster: Cluster, pods: list[dict[str, Any]]) -> None:
    """What the Kubernetes sync writes of these pods (`workload_from_pod` over the API's pod objects)."""
    snapshot = Snapshot(
        nodes=[ObservedNode("gpu01")],
        workloads=[w for w in map(workload_from_pod, pods) if w is not None],
        complete=False,
        workload_kinds=frozenset({WorkloadKind.K8S_POD}),
    )
    apply_snapshot(cluster, snapshot, ChangeSource.KUBERNETES)


def pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "infer-0", "namespace": "ml", "uid": POD_UID},
        "spec": {"nodeName": "gpu01", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
        "status": {"phase": "Running", "startTime": "2026-12-01T07:00:00Z"},
    }


def pod_registration() -> dict[str, Any]:
    return {**registration(1), "scheduler_id": "wl-3f2a", "owner": {"kind": "k8s_pod", "id": POD_UID}}


def the_pod(cluster: Cluster) -> dict[str, Any]:
    rows = list(Workload.objects.filter(cluster=cluster).values("kind", "scheduler_id", "gpus", "checkpoint_engine"))
    assert len(rows) == 1, rows
    return rows[0]


def test_a_pods_registration_fills_the_pods_row_in_either_order(client):
    cluster = Cluster.objects.create(name="local", kind=ClusterKind.KUBERNETES)
    kubernetes_sync(cluster, [])
    heartbeat(client, [pod_registration()])  # before the sync saw the pod: nothing yet, and no digest kept
    assert not Workload.objects.exists() and Node.objects.get(name="gpu01").heartbeat_digest == ""
    kubernetes_sync(cluster, [pod()])
    assert the_pod(cluster) == {"kind": "k8s_pod", "scheduler_id": "ml/infer-0", "gpus": 2, "checkpoint_engine": "none"}
    heartbeat(client, [pod_registration()])  # the next (full) heartbeat joins it
    assert the_pod(cluster) == {"kind": "k8s_pod", "scheduler_id": "ml/infer-0", "gpus": 2, "checkpoint_engine": "criu"}
    kubernetes_sync(cluster, [pod()])  # a pod without the annotation says nothing of its engine
    assert the_pod(cluster)["checkpoint_engine"] == "criu"
