"""The executor contract on the Slurm back end, on a real Slurm cluster (tests/executors/slurm_fleet.py):
munged, slurmctld, a slurmd and a real node agent per node, a batch job whose payload counts steps
under gpusweep-run, checkpointed by the signal engine.

Two site shapes (issue 26's matrix, at the executor level where one cluster start serves many tests):
- the contract's: typed GRES (``gpu:h100:4``), versions and GPU model published as node features
  (``gpumodel_H100``...), one checkpoint folder every agent shares, ``JobFileAppend=1``;
- ``TestUntypedSite``: untyped GRES (``gpu:4``), no node features (the GPU model and versions only
  from the agents), no shared folder (the images travel between agents), ``JobFileAppend`` left at
  Slurm's default 0 (a requeue truncates output files); its tests are the ones that shape changes:
  the move with output kept, and the way back when restores fail.
Job output goes to real files (``SlurmCluster.output_of``).

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
from executors.slurm import OUTPUT_MODES, SlurmExecutor, read_record
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
    with SlurmFleet(tmp_path_factory.mktemp("slurm-contract"), NODES, gres_type="h100", job_file_append=1) as fleet:
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
        assert taken.manifest["output"] == OUTPUT_MODES["append"], "JobFileAppend=1: the evidence says Slurm appends"
        with pytest.raises(PermanentExecutorError, match="restored already"):
            ex.restore(a, taken.checkpoint_id, op("mv-elsewhere"))
        ex.undo(a, op("mv-undo"))

    def test_a_just_in_time_reservation_covers_the_drained_node_and_only_someone_elses_is_a_hold(
            self, harness: Harness, fleet: SlurmFleet) -> None:
        # The site's own admin account runs in gpusweep's reservations (default: root).
        cluster = Cluster(name=agents.CLUSTER, kind="slurm",
                          connection={**fleet.connection, "maintenance_reservations": True, "reservation_minutes": 30,
                                      "reservation_users": "daemon"})
        ex = get_executor(cluster, secret=agents.FLEET_SECRET)
        fleet.cluster.run("scontrol", "create", "reservation", "reservationname=site-maint", "users=root",
                          "nodes=gpu01", "starttime=now", "duration=60", "flags=maint,ignore_jobs")
        assert "site-maint" in ex.maintenance_hold(harness.a)
        ex.drain(harness.b, op("resv-drain"))
        ex.drain(harness.b, op("resv-drain"))  # a retry finds the reservation: still one
        shown = fleet.cluster.run("scontrol", "show", "reservation", "-o")
        ours = [line for line in shown.splitlines() if line.startswith("ReservationName=gpusweep-c900-s1 ")]
        assert len(ours) == 1 and "Nodes=gpu02 " in ours[0] and "MAINT" in ours[0], shown
        assert "Users=daemon " in ours[0], ours[0]
        assert ex.maintenance_hold(harness.b) == "", "gpusweep's own reservation is no hold"
        ex.undo(harness.b, op("resv-undo"))
        shown = fleet.cluster.run("scontrol", "show", "reservation", "-o")
        assert "gpusweep-" not in shown and "site-maint" in shown, "only gpusweep's reservation goes"


@pytest.fixture(scope="class")
def untyped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmFleet]:
    ok, reason = can_run_slurm()
    need(ok, reason)
    with SlurmFleet(tmp_path_factory.mktemp("slurm-untyped"), NODES, shared_artifacts=False, features={}) as fleet:
        yield fleet


class TestUntypedSite:
    """Untyped GRES, no features, images transferred between agents, JobFileAppend=0 (Slurm's default)."""

    @pytest.fixture
    def ex(self, untyped: SlurmFleet) -> SlurmExecutor:
        untyped.reset()
        cluster = Cluster(name=agents.CLUSTER, kind="slurm", connection=untyped.connection)
        made = get_executor(cluster, secret=agents.FLEET_SECRET, operation_timeout=60, restore_wait_s=30)
        assert isinstance(made, SlurmExecutor)
        return made

    @staticmethod
    def started(fleet: SlurmFleet, log: Path, engine: str = "signal") -> str:
        job = fleet.counter_job(log, "gpu01", engine=engine, prints=True)
        assert fleet.cluster.wait_running([job]), fleet.cluster.logs()
        agents.wait_steps(log, 10)
        return job

    @pytest.mark.parametrize("engine", ["signal", "criu"])
    def test_a_moved_job_keeps_every_line_it_printed_although_slurm_truncates_at_the_requeue(
            self, untyped: SlurmFleet, ex: SlurmExecutor, tmp_path: Path, engine: str) -> None:
        """Issue 26 item 4: the job prints a line, then one per step, to its output file; after the move (images
        fetched by gpu02's agent, GPU model and versions from the agents alone) its output file still holds
        the first run's lines, then the second's, every step once, and the evidence says gpusweep-run kept it.
        The signal engine's payload starts again on the requeued job's descriptors; CRIU's reopens its file."""
        if engine == "criu":
            need(agents.criu_usable(), agents.CRIU_HINT)
        log = tmp_path / "counter.log"
        job = self.started(untyped, log, engine)
        a, b = untyped.ref("gpu01"), untyped.ref("gpu02")
        ex.drain(a, op("out-drain"))
        taken = ex.checkpoint(a, f"slurm-{job}", engine, op("out-ck"))
        assert taken.manifest["output"] == OUTPUT_MODES["kept"]
        printed = untyped.cluster.output_of(job).read_text().splitlines()
        before = [line for line in printed if line.endswith(" ok")]
        assert printed[0] == "job begins on gpu01" and len(before) >= 10
        ex.restore(b, taken.checkpoint_id, op("out-restore"))
        at_restore = len(agents.steps(log))
        agents.wait_steps(log, at_restore + 10)
        output = untyped.cluster.output_of(job).read_text().splitlines()
        assert output[:len(printed)] == printed, "what the job printed before the requeue is still there"
        assert "job begins on gpu02" in output[len(printed):]
        counted = [int(line.split()[0]) for line in output if line.endswith(" ok")]
        assert counted == list(range(1, len(counted) + 1)) and len(counted) > len(before), counted
        ex.undo(a, op("out-undo"))

    def test_the_own_node_is_resumed_only_once_its_job_runs_there_again(
            self, untyped: SlurmFleet, ex: SlurmExecutor, tmp_path: Path) -> None:
        """Issue 26 item 3, the node's own unwind: undo keeps the node drained while its checkpointed job waits
        to come home; the restore there admits that job alone (a reservation for it replaces the drain) and
        the undo after it gives the node back, with no gpusweep reservation left."""
        log = tmp_path / "counter.log"
        job = self.started(untyped, log)
        a = untyped.ref("gpu01")
        ex.drain(a, op("home-drain"))
        taken = ex.checkpoint(a, f"slurm-{job}", "signal", op("home-ck"))
        ex.undo(a, op("home-undo"))
        assert not untyped.takes_work("gpu01"), "drained while its job has not come back"
        ex.restore(a, taken.checkpoint_id, op("home-return"))
        found = untyped.job(job)
        assert found is not None and found["job_state"] == "RUNNING" and found["batch_host"] == "gpu01"
        ex.undo(a, op("home-undo"))
        assert untyped.takes_work("gpu01")
        assert "gpusweep-" not in untyped.cluster.run("scontrol", "show", "reservation", "-o", check=False)
        after = agents.wait_steps(log, len(agents.steps(log)) + 5)
        assert agents.unbroken(after) == len(after), "the counter went on from its checkpoint"

    def test_a_checkpoint_no_node_takes_is_released_to_slurm_and_blocks_no_later_campaign(
            self, untyped: SlurmFleet, ex: SlurmExecutor, tmp_path: Path) -> None:
        """Issue 26 item 3, the fault: the checkpoint's requirements hold nowhere (injected: a driver no node
        has), so its restore is refused on the other node and on its own, which stays drained with gpusweep's
        reason. Released, the job is no longer held and carries no gpusweep record; once an operator gives the
        node back it runs again, and the next campaign checkpoints it with no "already checkpointed" refusal."""
        log = tmp_path / "counter.log"
        job = self.started(untyped, log)
        a, b = untyped.ref("gpu01"), untyped.ref("gpu02")
        ex.drain(a, op("lost-drain"))
        taken = ex.checkpoint(a, f"slurm-{job}", "signal", op("lost-ck"), requires={"must": {"driver": "0.0.0"}})
        ex.undo(a, op("lost-undo"))
        for target in (b, a):
            with pytest.raises(PermanentExecutorError, match="cannot be restored"):
                ex.restore(target, taken.checkpoint_id, op(f"lost-restore-{target.name}"))
        assert untyped.node("gpu01")["reason"] == f"gpusweep: campaign 900 op {op('lost-drain')}"
        said = ex.release_held(a, f"slurm-{job}", taken.checkpoint_id, op("lost-release"))
        assert "released to Slurm" in said
        assert ex.release_held(a, f"slurm-{job}", taken.checkpoint_id, op("lost-release")) == said
        found = untyped.job(job)
        assert found is not None and found["job_state"] == "PENDING" and found["priority"] > 0, found
        assert "held" not in str(found["state_reason"]).lower() and read_record(found) == {}, found
        assert found["required_nodes"] == "gpu01", "its own node list, as submitted"
        ex.undo(a, op("lost-undo"))  # nothing comes home any more: the node is given back
        assert untyped.cluster.wait_running([job]), untyped.cluster.logs()
        assert untyped.takes_work("gpu01") or untyped.running("gpu01")
        agents.wait_steps(log, len(agents.steps(log)) + 5)
        ex.drain(a, op("next-drain"))
        again = ex.checkpoint(a, f"slurm-{job}", "signal", "gs-901-1-ck")
        assert again.checkpoint_id != taken.checkpoint_id
        ex.undo(a, op("next-undo"))
