"""The executor contract on the Slurm back end, on a real Slurm cluster (tests/executors/slurm_fleet.py):
munged, slurmctld, a slurmd and a real node agent per node, a batch job whose payload counts steps
under gpusweep-run, checkpointed by the signal engine into the agents' shared folder.

The back end's own view is Slurm's: a node takes work when sinfo shows it neither drained nor down;
a workload runs on a node when Slurm runs its job there and that node's agent runs its payload.
Someone else's hold is an administrator's `scontrol update state=DRAIN reason=...`.

One cluster for the module (about 15 s to start); each test gets a fresh job and resumed nodes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import need
from executors.base import Executor, NodeRef, PermanentExecutorError, get_executor
from executors.slurm import read_record
from inventory.models import Cluster
from tests.executors.contract import ExecutorContract, Harness, op
from tests.executors.slurm_fleet import SlurmFleet, agents
from tests.slurm_cluster import can_run_slurm

pytestmark = [pytest.mark.slurm]
NODES = ["gpu01", "gpu02"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmFleet]:
    ok, reason = can_run_slurm()
    need(ok, reason)
    with SlurmFleet(tmp_path_factory.mktemp("slurm-contract"), NODES) as fleet:
        yield fleet


@pytest.fixture
def executor(fleet: SlurmFleet) -> Executor:
    cluster = Cluster(name=agents.CLUSTER, kind="slurm", connection=fleet.connection)
    return get_executor(cluster, secret=agents.FLEET_SECRET, operation_timeout=60, restore_wait_s=60)


class TestSlurmExecutor(ExecutorContract):
    @pytest.fixture
    def harness(self, fleet: SlurmFleet, executor: Executor, tmp_path: Path) -> Iterator[Harness]:
        fleet.reset()
        log = tmp_path / "counter.log"
        job = fleet.counter_job(log, "gpu01")
        assert fleet.cluster.wait_running([job]), fleet.cluster.logs()
        agents.wait_steps(log, 3)

        def hold(node: NodeRef, reason: str) -> None:
            fleet.cluster.run("scontrol", "update", f"nodename={node.name}", "state=DRAIN", f"reason={reason}")

        yield Harness(
            executor=executor, a=fleet.ref("gpu01"), b=fleet.ref("gpu02"), workload=f"slurm-{job}", engine="signal",
            component="driver", version="570.195.03", unknown=NodeRef(agents.CLUSTER, "nowhere"),
            takes_work=lambda node: fleet.takes_work(node.name), running=lambda node: fleet.running(node.name),
            progress=lambda _workload: agents.unbroken(agents.steps(log)) if log.exists() else None, hold=hold,
            fail_check=lambda node, output: fleet.fail_check(node.name, output),
        )
        fleet.reset()

    def test_a_drain_is_slurms_drain_with_gpusweeps_reason_and_undo_resumes_only_that(
            self, harness: Harness, fleet: SlurmFleet) -> None:
        ex, b = harness.executor, harness.b
        ex.drain(b, op("drain"))
        info = fleet.node("gpu02")
        assert "DRAIN" in info["state_flags"]
        assert info["reason"] == f"gpusweep: campaign 900 op {op('drain')}"
        ex.drain(b, op("drain-again"))  # a second drain finds the first: the reason stays the first one
        assert fleet.node("gpu02")["reason"] == f"gpusweep: campaign 900 op {op('drain')}"
        ex.undo(b, op("undo"))
        assert "DRAIN" not in fleet.node("gpu02")["state_flags"]

    def test_a_moved_job_keeps_its_id_and_is_held_requeued_and_released_onto_the_target(
            self, harness: Harness, fleet: SlurmFleet) -> None:
        ex, a, b = harness.executor, harness.a, harness.b
        job_id = harness.workload.removeprefix("slurm-")
        ex.drain(a, op("mv-drain"))
        taken = ex.checkpoint(a, harness.workload, "signal", op("mv-ck"))
        job = fleet.job(job_id)
        assert job is not None and read_record(job)["ck"] == taken.checkpoint_id
        assert job["job_state"] in ("PENDING", "COMPLETING") and job["restart_cnt"] >= 1
        restored = ex.restore(b, taken.checkpoint_id, op("mv-restore"))
        job = fleet.job(job_id)
        assert job is not None and job["job_state"] == "RUNNING" and job["batch_host"] == "gpu02"
        assert restored.workload_id == harness.workload and job["required_nodes"] == "gpu02"
        assert fleet.running("gpu02") == {harness.workload}
        with pytest.raises(PermanentExecutorError, match="restored already"):
            ex.restore(a, taken.checkpoint_id, op("mv-elsewhere"))
        ex.undo(a, op("mv-undo"))

    def test_a_just_in_time_reservation_covers_the_drained_node_and_only_someone_elses_is_a_hold(
            self, harness: Harness, fleet: SlurmFleet) -> None:
        cluster = Cluster(name=agents.CLUSTER, kind="slurm",
                          connection={**fleet.connection, "maintenance_reservations": True, "reservation_minutes": 30})
        ex = get_executor(cluster, secret=agents.FLEET_SECRET)
        fleet.cluster.run("scontrol", "create", "reservation", "reservationname=site-maint", "users=root",
                          "nodes=gpu01", "starttime=now", "duration=60", "flags=maint,ignore_jobs")
        assert "site-maint" in ex.maintenance_hold(harness.a)
        ex.drain(harness.b, op("resv-drain"))
        ex.drain(harness.b, op("resv-drain"))  # a retry finds the reservation: still one
        shown = fleet.cluster.run("scontrol", "show", "reservation", "-o")
        ours = [line for line in shown.splitlines() if line.startswith("ReservationName=gpusweep-c900-s1 ")]
        assert len(ours) == 1 and "Nodes=gpu02 " in ours[0] and "MAINT" in ours[0], shown
        assert ex.maintenance_hold(harness.b) == "", "gpusweep's own reservation is no hold"
        ex.undo(harness.b, op("resv-undo"))
        shown = fleet.cluster.run("scontrol", "show", "reservation", "-o")
        assert "gpusweep-" not in shown and "site-maint" in shown, "only gpusweep's reservation goes"
