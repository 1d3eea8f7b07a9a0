"""Sync against a real Slurm cluster on localhost (tests/slurm_cluster.py): munged, slurmctld,
four slurmd daemons and real batch jobs. Needs root and Debian's slurm-wlm and munge."""

from __future__ import annotations

import socket
import threading
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from conftest import need
from inventory.choices import ClusterKind, ServiceState, WorkloadKind
from inventory.models import Cluster, Node, Workload
from inventory.sources.slurm import CliSlurmClient, SlurmError, parse_gres
from tests.slurm_cluster import SlurmCluster, can_run_slurm

pytestmark = [pytest.mark.slurm, pytest.mark.django_db(transaction=True)]

NODES = ["gpu01", "gpu02", "gpu03", "gpu04"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    ok, reason = can_run_slurm()
    need(ok, reason)
    features = {name: "nvdriver_570.86.15,cuda_12.8,gpumodel_h100" for name in NODES}
    features["gpu04"] = "nvdriver_580.95.05,cuda_13.0,gpumodel_h100"
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=NODES, gpus_per_node=4, features=features)
    with cluster:
        yield cluster


def make_cluster(slurm: SlurmCluster, **connection) -> Cluster:
    return Cluster.objects.create(
        name="hpc", kind=ClusterKind.SLURM, connection={"slurm_conf": str(slurm.conf), **connection}
    )


def sync(*names: str) -> str:
    out = StringIO()
    call_command("sync_inventory", *[a for n in names for a in ("--cluster", n)], "--no-progress", stdout=out)
    return out.getvalue()


def test_it_finds_every_node_and_running_job_and_a_second_run_changes_nothing(slurm):
    jobs = [slurm.sbatch("sleep 300", nodelist="gpu01", gpus=2, name="train"),
            slurm.sbatch("sleep 300", nodelist="gpu03", gpus=1, name="serve")]
    assert slurm.wait_running(jobs), slurm.run("squeue")
    make_cluster(slurm)

    first = sync("hpc")
    assert "4 added" in first and "2 added" in first

    nodes = {n.name: n for n in Node.objects.filter(cluster__name="hpc")}
    assert set(nodes) == set(NODES)
    assert all(n.gpu_count == 4 and n.gpu_model == "h100" and n.pool == "gpu" for n in nodes.values())
    assert nodes["gpu01"].component_versions()["driver"] == "570.86.15"
    assert nodes["gpu04"].component_versions()["driver"] == "580.95.05"
    assert "kernel" in nodes["gpu01"].component_versions()
    assert nodes["gpu01"].scheduler_state.startswith("mixed")

    workloads = {w.scheduler_id: w for w in Workload.objects.filter(kind=WorkloadKind.SLURM_JOB)}
    assert set(workloads) == set(jobs)
    assert (workloads[jobs[0]].node.name, workloads[jobs[0]].gpus, workloads[jobs[0]].name) == ("gpu01", 2, "train")
    assert workloads[jobs[1]].node.name == "gpu03"
    assert workloads[jobs[0]].time_limit is not None and workloads[jobs[0]].started_at is not None

    assert "cluster hpc: no changes" in sync("hpc")

    slurm.run("scancel", jobs[1])
    assert slurm.wait_ended(jobs[1])
    slurm.run("scontrol", "update", "nodename=gpu02", "state=drain", "reason=patch")
    third = sync("hpc")
    assert "2 changed" in third and "1 removed" in third  # gpu02 drained, gpu03 idle again; job 2 ended
    assert Node.objects.get(name="gpu03").scheduler_state == "idle"
    assert Workload.objects.get(scheduler_id=jobs[1]).gone_at is not None
    assert Node.objects.get(name="gpu02").service_state == ServiceState.DRAINING
    slurm.run("scontrol", "update", "nodename=gpu02", "state=resume")
    slurm.run("scancel", jobs[0])


def test_it_records_every_node_of_a_multi_node_job(slurm):
    job = slurm.sbatch("sleep 300", nodelist="gpu02,gpu04", nodes=2, gpus=1, name="allreduce")
    assert slurm.wait_running([job]), slurm.run("squeue")
    make_cluster(slurm)
    try:
        sync("hpc")
        workload = Workload.objects.get(scheduler_id=job)
        assert set(workload.nodes.values_list("name", flat=True)) == {"gpu02", "gpu04"}
        assert workload.node.name == "gpu02" and workload.gpus == 2
        # Either node shows the job as its work.
        assert Node.objects.get(name="gpu04").all_workloads.get() == workload
    finally:
        slurm.run("scancel", job)
        slurm.wait_ended(job)


def test_it_marks_a_node_removed_from_the_cluster_gone(slurm):
    make_cluster(slurm)
    sync("hpc")
    slurm.reconfigure(["gpu01", "gpu02", "gpu03"])
    try:
        out = sync("hpc")
        assert "1 removed" in out
        gone = Node.objects.get(name="gpu04")
        assert gone.service_state == ServiceState.GONE and gone.gone_at is not None
        assert Node.objects.filter(service_state=ServiceState.GONE).count() == 1
    finally:
        slurm.reconfigure(NODES)
        for name in NODES[3:]:
            slurm.start_slurmd(name)


def test_it_names_the_command_when_slurm_cannot_be_reached(slurm, tmp_path):
    # A real sinfo against a controller port where nothing listens.
    conf = tmp_path / "slurm.conf"
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()
    conf.write_text(slurm.conf.read_text().replace(f"SlurmctldPort={slurm.ctld_port}", f"SlurmctldPort={port}"))
    Cluster.objects.create(name="down", kind=ClusterKind.SLURM, connection={"slurm_conf": str(conf)})
    with pytest.raises(CommandError, match=r"down: `scontrol ping` failed \(exit 1\): Slurmctld\(primary\) .* DOWN"):
        sync("down")
    assert "scontrol ping" in Cluster.objects.get(name="down").last_sync_error
    with pytest.raises(SlurmError, match=r"`sinfo --json` failed"):
        CliSlurmClient({"slurm_conf": str(conf)}).nodes()
    assert Node.objects.count() == 0


def test_it_times_out_a_hanging_slurm_command(slurm, tmp_path):
    # A controller that accepts connections and never answers: real sinfo waits; we stop it.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        silent.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(silent.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    conf = tmp_path / "slurm.conf"
    port = silent.getsockname()[1]
    conf.write_text(slurm.conf.read_text().replace(f"SlurmctldPort={slurm.ctld_port}", f"SlurmctldPort={port}"))
    try:
        with pytest.raises(SlurmError, match=r"`sinfo --json` timed out after 2 s"):
            CliSlurmClient({"slurm_conf": str(conf), "timeout_s": 2}).nodes()
    finally:
        stop.set()
        thread.join(5)
        for conn in accepted:
            conn.close()
        silent.close()


def test_it_reads_typed_and_untyped_gres():
    assert parse_gres("gpu:h100:8(S:0-1)") == ("h100", 8)
    assert parse_gres("gpu:4") == ("", 4)
    assert parse_gres("gpu:a100:2,gpu:t4:1") == ("a100", 3)
    assert parse_gres("(null)") == ("", 0)
