"""Campaigns on a Slurm site shaped as issue 26 found one: untyped GRES (``gpu:4``), no node features (the
GPU model and versions come from the node agents' heartbeats alone), no shared checkpoint folder (images
travel between agents), ``JobFileAppend`` left at Slurm's default 0 (a requeue truncates output files),
accounting through slurmdbd. Real parts: munged, slurmctld, slurmdbd into the machine's MariaDB, two
`slurmd -N` nodes, a real agent per node, a batch job whose payload counts steps under gpusweep-run (CRIU
engine) and prints to its real output file. The engine is driven synchronously, as Celery runs its tasks
(tests/campaigns/fleet.py ``drive``).

gpu01 is swept; gpu02 is the only possible receiver. Done-when 1 of issue 26: with gpu02 already on the
fixed driver no node can take the CRIU image (it needs the old driver), so the plan says cold start (cold
restarts allowed) or a wait (not allowed) and the engine does exactly that; with gpu02 on the old driver
the job migrates. In every case the plan lists the job once: the job the Slurm sync reports and the
registration its gpusweep-run makes through the agent's heartbeat are one workload.
Done-when 3's last part: a worker killed between the unwind's undo and its restore.

One cluster for the module; each test resumes the nodes and starts its own job."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from campaigns import engine, policy, queue, services
from campaigns.choices import CampaignStatus, MoveState, SweepState
from campaigns.models import Campaign, EvidenceEvent, NodeSweep, WorkloadMove
from conftest import need
from executors.base import PermanentExecutorError
from executors.slurm import OUTPUT_MODES, SlurmExecutor, read_record
from inventory.models import Workload
from metrics.collect import DatabaseCollector
from tests.campaigns.fleet import FIXED, drive_until_rest, user
from tests.executors.slurm_fleet import SlurmFleet, agents
from tests.helpers import wait_for
from tests.slurm_cluster import can_run_slurm

pytestmark = [pytest.mark.slurm, pytest.mark.django_db(transaction=True)]
NODES = ["gpu01", "gpu02"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmFleet]:
    ok, reason = can_run_slurm(accounting=True)
    need(ok, reason)
    need(agents.criu_usable(), agents.CRIU_HINT)
    with SlurmFleet(tmp_path_factory.mktemp("slurm-untyped-campaign"), NODES, accounting=True,
                    shared_artifacts=False, features={}) as fleet:
        yield fleet


@pytest.fixture(autouse=True)
def synchronous(settings: Any) -> Iterator[list[tuple[str, int]]]:
    """Nothing goes to a broker: drive() runs every step itself; what the engine enqueues is kept."""
    settings.GPUSWEEP_AGENT_FLEET_SECRET = agents.FLEET_SECRET
    enqueued: list[tuple[str, int]] = []
    queue.ENQUEUE.insert(0, lambda task, object_id, countdown: enqueued.append((task, object_id)))
    yield enqueued
    queue.ENQUEUE.pop(0)


def criu_job(fleet: SlurmFleet, log: Path, node: str = "gpu01") -> str:
    """A CRIU job printing to its output file, counted 10 steps in ("": wherever Slurm starts it)."""
    job = fleet.counter_job(log, node, engine="criu", name="trainer", prints=True)
    assert fleet.cluster.wait_running([job]), fleet.cluster.logs()
    agents.wait_steps(log, 10)
    return job


def planned(cluster_spare_driver: str | None, fleet: SlurmFleet, log: Path, admin_comment: str = "",
            heartbeat_first: bool = False, **fields: Any) -> tuple[str, Campaign, list[dict[str, Any]]]:
    """gpu02 on `cluster_spare_driver` (None: the old one), a CRIU job on gpu01 (with the site's `admin_comment`),
    and an approved campaign over gpu01 (started), the inventory made by the Slurm sync then the agents'
    heartbeats (or the reverse: `heartbeat_first`): the job, the campaign, and the plan's moves for gpu01."""
    fleet.reset()
    fleet.set_driver("gpu02", cluster_spare_driver)
    job = criu_job(fleet, log)
    if admin_comment:
        fleet.cluster.run("scontrol", "update", f"jobid={job}", f"admincomment={admin_comment}")
    cluster = fleet.make_cluster(heartbeat_first=heartbeat_first)
    rita, alan = user("rita", "operator"), user("alan", "approver")
    made = Campaign.objects.create(**{"name": "untyped", "requested_by": rita, "node_selector": {"names": ["gpu01"]},
                                      "target_versions": {"driver": {"R570": FIXED}}, "parallelism_per_cluster": "1",
                                      "step_timeout_s": 120, "canary": "0", **fields})
    services.make_plan(made.pk, rita)
    services.approve(made.pk, alan)
    services.start(made.pk, rita)
    made.refresh_from_db()
    assert made.approved_plan is not None
    [node] = [n for n in made.approved_plan.content["nodes"].values() if n["name"] == "gpu01"]
    # One row for the job: the Slurm sync's (its id, its GPU) joined with its gpusweep-run registration's engine.
    rows = list(Workload.objects.filter(cluster=cluster, gone_at__isnull=True).values_list(
        "scheduler_id", "kind", "gpus", "checkpoint_engine"))
    assert rows == [(job, "slurm_job", 1, "criu")], rows
    return job, made, node["moves"]


def the_move(moves: list[dict[str, Any]], job: str) -> dict[str, Any]:
    """The plan's one entry for the job (it lists the job once, with Slurm's GPUs and the agent's engine)."""
    assert [(m["name"], m["gpus"], m["engine"]) for m in moves] == [("trainer", 1, "criu")], moves
    assert job in moves[0]["workload"], moves
    return moves[0]


def sacct_runs(fleet: SlurmFleet, job: str) -> list[tuple[str, str]]:
    return [(r["State"], r["NodeList"]) for r in fleet.cluster.sacct("-j", job)]


def test_with_the_spare_on_the_fixed_driver_cold_restarts_allowed_the_job_is_cold_started_as_planned(
        fleet: SlurmFleet, tmp_path: Path) -> None:
    """The plan says cold start (the CRIU image needs the old driver, which no node keeps); the engine stops
    the job without a checkpoint: Slurm requeues it and runs it again on gpu01 once it is patched, from its
    first line, as the plan and the evidence say; the site's admin comment on the job is its own again, and
    (JobFileAppend=0) the output file still holds what the first run printed."""
    log = tmp_path / "counter.log"
    job, made, moves = planned(FIXED, fleet, log, cold_restart_allowed=True, admin_comment="site: project 7")
    entry = the_move(moves, job)
    assert entry["action"] == "cold_start" and "Slurm" in entry["restarted_by"], entry
    done = drive_until_rest(made.pk, timeout=90)
    assert done.status == CampaignStatus.COMPLETED, done.status_reason
    sweep = NodeSweep.objects.get(campaign=done)
    [move] = WorkloadMove.objects.filter(sweep=sweep)
    assert (sweep.state, move.state) == (SweepState.DONE, MoveState.STOPPED), (sweep.error, move.state)
    kinds = list(EvidenceEvent.objects.filter(sweep=sweep).values_list("kind", flat=True))
    assert "checkpointed" not in kinds and "restored" not in kinds, kinds
    stopped = EvidenceEvent.objects.get(sweep=sweep, kind="stopped").data
    assert stopped["workload"] == "trainer" and stopped["restarted_by"].startswith("Slurm"), stopped
    assert stopped["output"] == OUTPUT_MODES["kept"], stopped
    # Slurm: the first run ended requeued on gpu01; the job waits to run again from its first line (Slurm delays a
    # requeued job's start by its BeginTime), with the site's own admin comment and no gpusweep record left.
    assert sacct_runs(fleet, job)[0] == ("REQUEUED", "gpu01"), sacct_runs(fleet, job)
    info = fleet.job(job) or {}
    assert info["job_state"] in ("PENDING", "RUNNING") and info["restart_cnt"] >= 1, info
    assert info["admin_comment"] == "site: project 7" and read_record(info) == {}, info["admin_comment"]
    assert fleet.agents["gpu01"].client.get("/v1/facts")["components"]["driver"] == FIXED
    assert fleet.takes_work("gpu01")
    # Nothing of the first run goes on: the counter stopped with the requeue.
    at_end = len(agents.steps(log))
    time.sleep(1.0)  # 20 steps of the counter, were it still running
    assert len(agents.steps(log)) == at_end, "the first run goes on after its requeue"
    printed = fleet.cluster.output_of(job).read_text().splitlines()
    # It runs again from its first line (starting it now, as an administrator may, rather than after Slurm's
    # delay of a requeued job), and what its first run printed is still in its output file, before the second's.
    fleet.cluster.run("scontrol", "update", f"jobid={job}", "starttime=now")
    assert fleet.cluster.wait_running([job], 30), fleet.cluster.run("scontrol", "show", "job", job)
    assert (fleet.job(job) or {})["batch_host"] == "gpu01"
    after = agents.wait_steps(log, at_end + 5)
    assert after[at_end:at_end + 5] == [1, 2, 3, 4, 5], after[at_end - 3:]
    output = fleet.cluster.output_of(job).read_text().splitlines()
    assert printed[0] == "job begins on gpu01" and len([p for p in printed if p.endswith(" ok")]) >= 10, printed
    assert output[:len(printed)] == printed, "what the job printed before its cold restart is still there"
    assert "job begins on gpu01" in output[len(printed):], output[len(printed):]


def test_with_the_spare_on_the_fixed_driver_and_no_cold_restart_the_node_waits_for_the_job(
        fleet: SlurmFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No cold restart allowed: the plan says the node waits for the job, and the engine waits, the job running
    on gpu01 untouched (never checkpointed, never requeued) until it ends (its owner cancels it); then gpu01 is
    patched. Here the agents' heartbeats reach the inventory before the Slurm sync: the job is one row all the
    same."""
    monkeypatch.setattr(policy, "WAIT_POLL_S", 0.5)
    log = tmp_path / "counter.log"
    job, made, moves = planned(FIXED, fleet, log, cold_restart_allowed=False, heartbeat_first=True)
    entry = the_move(moves, job)
    assert entry["action"] == "blocked" and "waits for it to end" in entry["why"], entry
    engine.dispatch(made.pk)
    sweep = NodeSweep.objects.get(campaign=made)
    for _ in range(6):
        engine.advance(sweep.pk)
    sweep.refresh_from_db()
    assert sweep.state == SweepState.CHECKPOINTING, sweep.state
    waiting = EvidenceEvent.objects.filter(sweep=sweep, kind="waiting").first()
    assert waiting is not None and "trainer" in waiting.data["reason"], waiting
    info = fleet.job(job) or {}
    assert info["job_state"] == "RUNNING" and info["batch_host"] == "gpu01" and info["restart_cnt"] == 0, info
    at = len(agents.steps(log))
    assert agents.unbroken(agents.wait_steps(log, at + 5)) == len(agents.steps(log)), "it runs on, untouched"
    fleet.cluster.run("scancel", job)
    assert fleet.cluster.wait_ended(job, 30)
    done = drive_until_rest(made.pk, timeout=90)
    assert done.status == CampaignStatus.COMPLETED, done.status_reason
    sweep.refresh_from_db()
    [move] = WorkloadMove.objects.filter(sweep=sweep)
    assert (sweep.state, move.state) == (SweepState.DONE, MoveState.FINISHED), (sweep.error, move.state)
    kinds = list(EvidenceEvent.objects.filter(sweep=sweep).values_list("kind", flat=True))
    assert "checkpointed" not in kinds and "stopped" not in kinds, kinds
    [run] = fleet.cluster.sacct("-j", job)
    assert run["State"].startswith("CANCELLED") and run["NodeList"] == "gpu01", run
    output = fleet.cluster.output_of(job).read_text().splitlines()
    counted = [int(line.split()[0]) for line in output if line.endswith(" ok")]
    assert output.count("job begins on gpu01") == 1 and counted == list(range(1, len(counted) + 1)), output[:3]
    assert sweep.patched_at is not None and run["End"] <= sweep.patched_at.astimezone().strftime("%Y-%m-%dT%H:%M:%S")


def test_with_the_spare_on_the_old_driver_the_job_migrates_keeping_its_output(
        fleet: SlurmFleet, tmp_path: Path) -> None:
    """The plan says migrate to gpu02; the job is checkpointed with CRIU, its images fetched by gpu02's agent, and
    it runs on there from its step, same job id, with everything it printed before still in its output file."""
    log = tmp_path / "counter.log"
    job, made, moves = planned(None, fleet, log, cold_restart_allowed=True)
    entry = the_move(moves, job)
    assert (entry["action"], entry["to_name"]) == ("migrate", "gpu02"), entry
    printed = fleet.cluster.output_of(job).read_text().splitlines()
    done = drive_until_rest(made.pk, timeout=90)
    assert done.status == CampaignStatus.COMPLETED, done.status_reason
    [move] = WorkloadMove.objects.filter(sweep__campaign=done).select_related("target_node")
    assert move.state == MoveState.RESTORED and move.target_node is not None and move.target_node.name == "gpu02"
    assert move.gpus == 1 and move.new_workload_ref == f"slurm-{job}"
    checkpointed = EvidenceEvent.objects.get(campaign=done, kind="checkpointed").data
    assert checkpointed["engine"] == "criu" and checkpointed["output"] == OUTPUT_MODES["kept"], checkpointed
    # Its requirements are the agent's measured facts: no empty GPU model (untyped GRES says none), the old driver.
    must = checkpointed["requires"]["must"]
    assert (must["gpu_model"], must["driver"]) == ("H100", agents.FACTS["components"]["driver"]), must
    restored = EvidenceEvent.objects.get(campaign=done, kind="restored").data
    assert (restored["to"], restored["as_planned"]) == ("gpu02", True), restored
    info = fleet.job(job) or {}
    assert info["job_state"] == "RUNNING" and info["batch_host"] == "gpu02", info
    expected = [("REQUEUED", "gpu01"), ("RUNNING", "gpu02")]
    assert agents.wait_steps(log, len(agents.steps(log)) + 5)
    assert agents.unbroken(agents.steps(log)) == len(agents.steps(log)), "restarted, skipped or repeated a step"
    runs = sacct_runs(fleet, job)
    assert runs == expected, runs
    output = fleet.cluster.output_of(job).read_text().splitlines()
    assert output[:len(printed)] == printed, "what the job printed before the requeue is still there"
    counted = [int(line.split()[0]) for line in output if line.endswith(" ok")]
    assert counted == list(range(1, len(counted) + 1)) and len(counted) > 10, counted[:20]


class WorkerDied(BaseException):
    """Stands for SIGKILL of the worker right after a call returned: nothing after it runs."""


@pytest.mark.parametrize("dies", [False, True], ids=["no-death", "killed-after-undo"])
def test_a_worker_killed_between_the_unwinds_undo_and_its_restore_leaves_the_same_outcome_after_redrive(
        fleet: SlurmFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        synchronous: list[tuple[str, int]], dies: bool) -> None:
    """Done-when 3 on this shape, then its last part: the same outcome with and without the death. On the real
    cluster with the crash injected at that exact point (a worker cannot be SIGKILLed there reliably from
    outside): every restore of the checkpoint is refused (injected in the executor), so the sweep fails and
    unwinds; the worker dies right after the unwind's `scontrol` undo returned, before its restore. Once the
    step's lease runs out, the periodic redrive enqueues the step and a new worker finishes the recovery: the
    job is released to Slurm (never left requeued held), which starts it again on the other node, from its
    first line, its output file keeping the first run's lines; the node stays drained with gpusweep's reason;
    the sweep says so (failed, the job released, nothing stranded) on the campaign page, with no
    stranded-workload alert."""
    fleet.reset()
    fleet.set_driver("gpu02", None)
    log = tmp_path / "counter.log"
    job = criu_job(fleet, log, node="")
    node = (fleet.job(job) or {})["batch_host"]
    fleet.make_cluster()

    def refused(self: SlurmExecutor, target: Any, checkpoint_id: str, operation_id: str) -> Any:
        raise PermanentExecutorError(f"injected: checkpoint {checkpoint_id} cannot be restored on {target.name}")

    undone: list[str] = []
    real_undo = SlurmExecutor.undo

    def undo_then_die(self: SlurmExecutor, ref: Any, operation_id: str) -> None:
        real_undo(self, ref, operation_id)
        undone.append(operation_id)
        if dies and len(undone) == 1:
            raise WorkerDied

    monkeypatch.setattr(SlurmExecutor, "restore", refused)
    monkeypatch.setattr(SlurmExecutor, "undo", undo_then_die)
    rita, alan = user("rita", "operator"), user("alan", "approver")
    made = Campaign.objects.create(name="killed", requested_by=rita, node_selector={"names": [node]},
                                   target_versions={"driver": {"R570": FIXED}}, parallelism_per_cluster="1",
                                   step_timeout_s=120, canary="0", error_budget="1")
    services.make_plan(made.pk, rita)
    services.approve(made.pk, alan)
    services.start(made.pk, rita)
    engine.dispatch(made.pk)
    sweep = NodeSweep.objects.get(campaign=made)
    if dies:
        with pytest.raises(WorkerDied):
            for _ in range(10):
                engine.advance(sweep.pk)
        sweep.refresh_from_db()
        assert undone and sweep.error and sweep.state in SweepState.WORKING, (undone, sweep.state, sweep.error)
        [move] = WorkloadMove.objects.filter(sweep=sweep)
        assert move.state == MoveState.CHECKPOINTED, move.state
        held = fleet.job(job) or {}
        assert held["job_state"] in ("PENDING", "COMPLETING") and read_record(held).get("ck") == move.checkpoint_id
        # Nothing advances the step while its dead worker's lease lasts; once it has run out the redrive takes it.
        assert engine.advance(sweep.pk) is None
        synchronous.clear()
        NodeSweep.objects.filter(pk=sweep.pk).update(step_deadline=timezone.now() - timedelta(seconds=1))
        engine.redrive()
        assert ("advance", sweep.pk) in synchronous, synchronous
        engine.advance(sweep.pk)
    done = drive_until_rest(made.pk, timeout=60)
    sweep.refresh_from_db()
    [move] = WorkloadMove.objects.filter(sweep=sweep)
    if dies:
        assert len(undone) >= 2 and undone[0] == undone[1], "the redriven unwind repeats its undo's operation id"
    assert sweep.state == SweepState.FAILED and "injected" in sweep.error, (sweep.state, sweep.error)
    assert move.state == MoveState.STOPPED, move.state
    assert EvidenceEvent.objects.filter(sweep=sweep, kind="step_failed").count() == 1
    [released] = EvidenceEvent.objects.filter(sweep=sweep, kind="stopped").values_list("data", flat=True)
    assert released["action"] == "released to its scheduler: no node took its checkpoint", released
    end = EvidenceEvent.objects.get(sweep=sweep, kind="failed").data
    assert end["left"] == "drained" and [w["workload"] for w in end["workloads_released"]] == ["trainer"], end
    assert "stranded_workloads" not in end, end
    info = fleet.node(node)
    assert "DRAIN" in info["state_flags"] and info["reason"].startswith("gpusweep: "), info
    client = Client()
    client.force_login(done.requested_by)
    page = client.get(f"/campaigns/{done.pk}/").content.decode()
    assert "Released to its scheduler" in page and "recover_stranded" not in page
    gauges = {m.name: m for m in DatabaseCollector().collect()}
    assert gauges["gpusweep_workloads_stranded"].samples == []
    # Slurm starts the released job on the other node, where gpusweep-run restores its checkpoint.
    monkeypatch.undo()
    assert fleet.cluster.wait_running([job], 60), fleet.job(job)
    info = fleet.job(job) or {}
    assert info["batch_host"] != node and read_record(info) == {}, info
    # On this shape the other node's agent holds no copy of the image (no shared folder; only a restore gpusweep
    # drives fetches it), so the released job starts from its first line there: a cold start, as released for.
    def second_run() -> list[int]:
        counted = agents.steps(log)
        again = counted.index(1, 1) if 1 in counted[1:] else len(counted)
        return counted[again:]

    assert agents.wait_steps(log, 1) and wait_for(lambda: len(second_run()) >= 5, 30, interval=0.2)
    assert second_run()[:5] == [1, 2, 3, 4, 5], agents.steps(log)
    output = fleet.cluster.output_of(job).read_text().splitlines()
    assert output[0] == f"job begins on {node}" and f"job begins on {info['batch_host']}" in output, output[:3]
