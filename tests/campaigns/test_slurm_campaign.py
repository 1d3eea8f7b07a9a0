"""Campaigns through the engine on a real Slurm cluster (tests/executors/slurm_fleet.py): munged,
slurmctld, slurmdbd into the machine's MariaDB, four `slurmd -N` nodes, a real node agent per node,
batch jobs whose payload is a step counter under gpusweep-run, checkpointed with real CRIU and the
signal engine. The engine is driven synchronously, as Celery would run its tasks
(tests/campaigns/fleet.py ``drive``). The reboot is the agents' modelled one (the agent restarts
with the patched versions and restarts that node's slurmd; see docs/architecture/campaigns.md, Slurm).

One cluster for the module; each test resumes every node and starts its own jobs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from gpusweep_agent.workloads import device_holders

from campaigns import engine, policy, queue, services
from campaigns.choices import CampaignStatus, MoveState, SweepState
from campaigns.models import Campaign, EvidenceEvent, NodeSweep, WorkloadMove
from conftest import need
from executors.base import UNDECLARED, PermanentExecutorError
from executors.slurm import SlurmExecutor, read_record
from inventory.sources.slurm import expand_hostlist, parse_key_values
from metrics.collect import DatabaseCollector
from tests.campaigns.fleet import FIXED, drive, drive_until_rest, user
from tests.executors.slurm_fleet import SlurmFleet, agents
from tests.helpers import HOLDER, cgroups_writable, in_cgroup, wait_for
from tests.slurm_cluster import can_run_slurm

pytestmark = [pytest.mark.slurm, pytest.mark.django_db(transaction=True)]
NODES = ["gpu01", "gpu02", "gpu03", "gpu04"]
NEW_KERNEL = "9.0.0-1-amd64"  # above any host kernel the tests run on


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmFleet]:
    ok, reason = can_run_slurm(accounting=True)
    need(ok, reason)
    need(agents.criu_usable(), agents.CRIU_HINT)
    with SlurmFleet(tmp_path_factory.mktemp("slurm-campaign"), NODES, accounting=True) as fleet:
        yield fleet


@pytest.fixture(autouse=True)
def synchronous(settings: Any) -> Iterator[None]:
    """drive() runs every step itself: nothing goes to a broker."""
    settings.GPUSWEEP_AGENT_FLEET_SECRET = agents.FLEET_SECRET
    queue.ENQUEUE.insert(0, lambda task, object_id, countdown: None)
    yield
    queue.ENQUEUE.pop(0)


def start_campaign(names: list[str], **fields: object) -> Campaign:
    rita, alan = user("rita", "operator"), user("alan", "approver")
    made = Campaign.objects.create(**{"name": "slurm", "requested_by": rita, "node_selector": {"names": names},
                                      "target_versions": {"driver": {"R570": FIXED}},
                                      "parallelism_per_cluster": "2", "step_timeout_s": 120, "canary": "0", **fields})
    services.make_plan(made.pk, rita)
    services.approve(made.pk, alan)
    services.start(made.pk, rita)
    return made


def completed_moves(done: Campaign) -> dict[str, WorkloadMove]:
    """The campaign's workload moves by workload, once it is known to have completed."""
    assert done.status == CampaignStatus.COMPLETED, (done.status_reason, list(
        NodeSweep.objects.filter(campaign=done).values_list("node__name", "state", "error")))
    return {m.workload_ref: m for m in WorkloadMove.objects.filter(sweep__campaign=done).select_related(
        "target_node", "sweep")}


def runs_of(fleet: SlurmFleet, job_id: str, expected: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(State, NodeList) of each run of the job in sacct, once accounting shows `expected` (slurmdbd
    records a requeued job's new run a moment after slurmctld starts it: PENDING until then)."""
    def runs() -> list[tuple[str, str]]:
        return [(r["State"], r["NodeList"]) for r in fleet.cluster.sacct("-j", job_id)]

    return wait_for(lambda: runs() == expected and expected, timeout=20, interval=0.5) or runs()


def counter_pids(log: Path) -> list[int]:
    """Every process on this host running the counter that writes `log` (any node's)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(log).encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return [pid for pid in found if pid != os.getpid()]


def test_a_campaign_over_two_of_four_nodes_moves_each_job_which_goes_on_and_stays_a_slurm_job(
        fleet: SlurmFleet, tmp_path: Path) -> None:
    """Done-when 1 and 4: a CRIU job and a signal job on the two swept nodes each continue on a spare
    from their step, keep their job id, are requeued as sacct shows; the nodes come back idle with the
    new version in their facts and features, no job started on them while drained; scancel of a moved
    job stops its restored process everywhere."""
    fleet.reset()
    logs = {"gpu01": tmp_path / "criu.log", "gpu02": tmp_path / "signal.log"}
    jobs = {"gpu01": fleet.counter_job(logs["gpu01"], "gpu01", engine="criu", name="criu-job"),
            "gpu02": fleet.counter_job(logs["gpu02"], "gpu02", engine="signal", name="signal-job")}
    assert fleet.cluster.wait_running(list(jobs.values())), fleet.cluster.logs()
    for log in logs.values():
        agents.wait_steps(log, 5)
    fleet.make_cluster()
    booted = {node: fleet.node(node)["slurmd_start_time"] for node in logs}

    done = drive(start_campaign(["gpu01", "gpu02"]).pk)
    moves = completed_moves(done)
    assert sorted(moves) == sorted(f"slurm-{j}" for j in jobs.values())
    # The evidence says how the CRIU image was taken (plain here: no dirty-memory tracking in this kernel,
    # with CRIU's words; else after pre-dumps), round by round, and how long CRIU kept the job frozen.
    dumps = {e.data["engine"]: e.data.get("dump") for e in EvidenceEvent.objects.filter(campaign=done,
                                                                                        kind="checkpointed")}
    assert dumps["signal"] is None and dumps["criu"]["rounds"][-1]["kind"] == "dump", dumps
    assert dumps["criu"]["frozen_ms"] > 0 and (dumps["criu"]["mode"] == "pre-dump"
                                               or "mem_dirty_track" in dumps["criu"]["plain_because"])
    for node, job_id in jobs.items():
        move = moves[f"slurm-{job_id}"]
        assert move.target_node is not None
        assert move.state == MoveState.RESTORED and move.target_node.name in ("gpu03", "gpu04")
        assert move.new_workload_ref == f"slurm-{job_id}", "the job id is kept"
        job = fleet.job(job_id)
        assert job is not None and job["job_state"] == "RUNNING" and job["batch_host"] == move.target_node.name
        # Its log goes on from where it stopped: no restart from step 1, no gap, no repeat.
        at_end = len(agents.steps(logs[node]))
        after = agents.wait_steps(logs[node], at_end + 5)
        assert agents.unbroken(after) == len(after), f"the counter of {node} restarted, skipped or repeated a step"
        # sacct: the first run on the swept node ended REQUEUED, the second runs on the spare.
        expected = [("REQUEUED", node), ("RUNNING", move.target_node.name)]
        assert runs_of(fleet, job_id, expected) == expected
    for node in ("gpu01", "gpu02"):
        info = fleet.node(node)
        assert info["state"] == "idle" and not info["state_flags"], info
        assert f"nvdriver_{FIXED}" in info["active_features"].split(",")
        assert info["slurmd_start_time"] > booted[node], "slurmd registered again after the (modelled) reboot"
        assert fleet.agents[node].client.get("/v1/facts")["components"]["driver"] == FIXED
        # No job started on a swept node once the campaign began (sacct has every run of every job).
        assert done.started_at is not None
        # sacct's times have whole seconds: a job that started in the second the campaign began (its own
        # first run, requeued since) is no later start, so only a later second counts.
        began = done.started_at.astimezone().strftime("%Y-%m-%dT%H:%M:%S")
        started_here = [r for r in fleet.cluster.sacct("--allusers", "-S", "now-1hour")
                        if r["NodeList"] == node and r["Start"] > began]
        assert started_here == [], started_here

    # Done-when 4: scancel of a moved job stops its restored process; nothing of it is left anywhere.
    for node, job_id in jobs.items():
        assert counter_pids(logs[node]), "the restored counter runs"
        fleet.cluster.run("scancel", job_id)
        assert fleet.cluster.wait_ended(job_id, 30)
        assert wait_for(lambda log=logs[node]: not counter_pids(log), 20, interval=0.2), counter_pids(logs[node])


def test_without_a_shared_folder_the_images_travel_between_agents_and_scancel_still_stops_the_job(
        fleet: SlurmFleet, tmp_path: Path) -> None:
    """Done-when 4 without a shared folder: the target's agent fetches the CRIU images from the source's
    (token, SHA-256 checked), the job continues there, and scancel leaves no process of it."""
    fleet.share_artifacts(False)
    try:
        fleet.reset()
        log = tmp_path / "criu.log"
        job_id = fleet.counter_job(log, "gpu01", engine="criu")
        assert fleet.cluster.wait_running([job_id]), fleet.cluster.logs()
        agents.wait_steps(log, 5)
        fleet.make_cluster()
        done = drive(start_campaign(["gpu01"]).pk)
        assert done.status == CampaignStatus.COMPLETED, (done.status_reason, list(
            NodeSweep.objects.filter(campaign=done).values_list("node__name", "state", "error")))
        move = WorkloadMove.objects.select_related("target_node").get(sweep__campaign=done)
        assert move.target_node is not None
        target = move.target_node.name
        assert move.state == MoveState.RESTORED and target != "gpu01"
        # The image now lies in both nodes' own stores, identical file by file.
        source_dir = fleet.root / "artifacts-gpu01" / move.checkpoint_id
        target_dir = fleet.root / f"artifacts-{target}" / move.checkpoint_id
        listed = sorted(p.name for p in source_dir.iterdir() if p.suffix == ".img")
        assert listed and listed == sorted(p.name for p in target_dir.iterdir() if p.suffix == ".img")
        after = agents.wait_steps(log, len(agents.steps(log)) + 5)
        assert agents.unbroken(after) == len(after), "the counter restarted, skipped or repeated a step"
        assert fleet.job(job_id)["batch_host"] == target  # type: ignore[index]
        assert counter_pids(log)
        fleet.cluster.run("scancel", job_id)
        assert fleet.cluster.wait_ended(job_id, 30)
        assert wait_for(lambda: not counter_pids(log), 20, interval=0.2), counter_pids(log)
    finally:
        fleet.share_artifacts(True)


def test_a_kernel_only_patch_brings_the_job_back_to_its_own_node_after_the_reboot(
        fleet: SlurmFleet, tmp_path: Path) -> None:
    """Done-when 2: no spare (the other nodes are held by an administrator); the signal checkpoint stays
    valid on the node after a kernel patch, so the job waits held and comes back there, same job id."""
    fleet.reset()
    log = tmp_path / "signal.log"
    job_id = fleet.counter_job(log, "gpu01", engine="signal")
    assert fleet.cluster.wait_running([job_id]), fleet.cluster.logs()
    agents.wait_steps(log, 5)
    for other in ("gpu02", "gpu03", "gpu04"):
        fleet.cluster.run("scontrol", "update", f"nodename={other}", "state=DRAIN", "reason=RMA 4711")
    fleet.make_cluster()
    done = drive_until_rest(start_campaign(["gpu01"], target_versions={"kernel": NEW_KERNEL}).pk)
    assert done.status == CampaignStatus.COMPLETED, (done.status_reason, list(
        NodeSweep.objects.filter(campaign=done).values_list("node__name", "state", "error")))
    move = WorkloadMove.objects.select_related("target_node").get(sweep__campaign=done)
    assert move.target_node is not None and move.state == MoveState.RESTORED and move.target_node.name == "gpu01"
    job = fleet.job(job_id)
    assert job is not None and job["job_state"] == "RUNNING" and job["batch_host"] == "gpu01"
    after = agents.wait_steps(log, len(agents.steps(log)) + 5)
    assert agents.unbroken(after) == len(after), "the counter restarted, skipped or repeated a step"
    assert runs_of(fleet, job_id, [("REQUEUED", "gpu01"), ("RUNNING", "gpu01")]) == [
        ("REQUEUED", "gpu01"), ("RUNNING", "gpu01")]
    assert fleet.agents["gpu01"].client.get("/v1/facts")["components"]["kernel"] == NEW_KERNEL
    for other in ("gpu02", "gpu03", "gpu04"):
        assert fleet.node(other)["reason"] == "RMA 4711", "the administrator's drains stay theirs"


def test_a_down_agent_fails_its_node_untouched_a_waited_job_keeps_its_node_drained_and_a_cold_one_requeues(
        fleet: SlurmFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Done-when 3 and 5 in one campaign (error budget 1): gpu01's agent is down, so gpu01 fails and is
    resumed with its job running as before; gpu02's job (not under gpusweep-run, policy wait) keeps gpu02
    drained until it ends, then gpu02 is patched; gpu03's job (cold_restart) is requeued by Slurm, which
    runs it again from its first line, and the plan and the evidence say so."""
    monkeypatch.setattr(policy, "WAIT_POLL_S", 1.0)  # the engine looks again every second, not every 30 s
    fleet.reset()
    log = tmp_path / "signal.log"
    untouched = fleet.counter_job(log, "gpu01", engine="signal", name="trainer")
    waited = fleet.cluster.sbatch("sleep 12", nodelist="gpu02", gpus=1, name="waiter")
    cold = fleet.cluster.sbatch("sleep 600", nodelist="gpu03", gpus=1, name="coldjob")
    assert fleet.cluster.wait_running([untouched, waited, cold]), fleet.cluster.logs()
    agents.wait_steps(log, 5)
    fleet.make_cluster()
    fleet.agents["gpu01"].stop()
    made = start_campaign(["gpu01", "gpu02", "gpu03"], parallelism_per_cluster="3", error_budget="1",
                          workload_policy="wait", workload_overrides={"coldjob": "cold_restart"})
    made.refresh_from_db()
    assert made.approved_plan is not None
    plan = {w["name"]: w for node in made.approved_plan.content["nodes"].values() for w in node.get("moves", [])}
    assert plan["coldjob"]["action"] == "cold_start" and "Slurm" in plan["coldjob"]["why"], plan["coldjob"]
    done = drive_until_rest(made.pk, timeout=150)
    assert done.status == CampaignStatus.COMPLETED, done.status_reason
    states = dict(NodeSweep.objects.filter(campaign=done).values_list("node__name", "state"))
    assert states == {"gpu01": SweepState.FAILED, "gpu02": SweepState.DONE, "gpu03": SweepState.DONE}, states
    # gpu01: resumed, its job never touched.
    assert fleet.takes_work("gpu01")
    job = fleet.job(untouched)
    assert job is not None and job["job_state"] == "RUNNING" and job["restart_cnt"] == 0
    assert agents.unbroken(agents.wait_steps(log, len(agents.steps(log)) + 5)) == len(agents.steps(log))
    # gpu02: the waited job ran to its end there, and gpu02 was patched only after it.
    [run] = fleet.cluster.sacct("-j", waited)
    sweep = NodeSweep.objects.get(campaign=done, node__name="gpu02")
    assert run["State"] == "COMPLETED" and run["NodeList"] == "gpu02"
    assert sweep.patched_at is not None and run["End"] <= sweep.patched_at.astimezone().strftime("%Y-%m-%dT%H:%M:%S")
    # gpu03: requeued by Slurm (cold): Slurm runs it again from its first line (here on gpu03, its --nodelist).
    runs = fleet.cluster.sacct("-j", cold)
    assert runs[0]["State"] == "REQUEUED" and runs[0]["NodeList"] == "gpu03", runs
    again = fleet.job(cold) or {}
    assert again.get("job_state") in ("PENDING", "RUNNING") and again.get("restart_cnt", 0) >= 1, again
    stopped = EvidenceEvent.objects.get(campaign=done, kind="stopped")
    assert stopped.data["restarted_by"].startswith("Slurm") and stopped.data["workload"] == "coldjob"
    for node in ("gpu02", "gpu03"):
        assert fleet.takes_work(node) and fleet.agents[node].client.get("/v1/facts")["components"]["driver"] == FIXED


def test_an_abort_leaves_no_node_drained_and_no_reservation(fleet: SlurmFleet, tmp_path: Path) -> None:
    """Done-when 3's abort: a campaign stopped after its drains leaves every node as it was and none of
    its reservations; an administrator's drain stays."""
    fleet.reset()
    fleet.cluster.run("scontrol", "update", "nodename=gpu02", "state=DRAIN", "reason=RMA 4711")
    fleet.make_cluster(maintenance_reservations=True)  # each drained node gets its own just-in-time reservation
    made = start_campaign(["gpu01", "gpu03"])
    engine.dispatch(made.pk)
    for sweep in NodeSweep.objects.filter(campaign=made, state=SweepState.DRAINING):
        engine.advance(sweep.pk, max_steps=1)
    assert not fleet.takes_work("gpu01") and fleet.node("gpu01")["reason"].startswith("gpusweep:")
    assert "ReservationName=gpusweep-" in fleet.cluster.run("scontrol", "show", "reservation", "-o")
    services.abort(made.pk, None, "operator changed their mind")
    done = drive_until_rest(made.pk)
    assert done.status == CampaignStatus.ABORTED
    assert all(fleet.takes_work(n) for n in ("gpu01", "gpu03", "gpu04"))
    assert fleet.node("gpu02")["reason"] == "RMA 4711"
    assert "ReservationName" not in fleet.cluster.run("scontrol", "show", "reservation", "-o", check=False)


def test_a_checkpoint_no_node_takes_leaves_its_node_drained_and_the_job_released_to_slurm_never_held(
        fleet: SlurmFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26 item 3, the fault on the real cluster: every restore of the checkpoint is refused (injected in
    the executor: the spare, then the node's own unwind, then the settling), so the sweep fails; the node
    stays drained with gpusweep's reason, as the evidence says, and the job (submitted with no node list) is
    released to Slurm, not left requeued held, with no gpusweep record: Slurm starts it again on another node,
    where its gpusweep-run restores the checkpoint (valid there), and it counts on."""
    fleet.reset()
    log = tmp_path / "signal.log"
    job_id = fleet.counter_job(log, "", engine="signal", name="trainer")
    assert fleet.cluster.wait_running([job_id]), fleet.cluster.logs()
    agents.wait_steps(log, 5)
    node = (fleet.job(job_id) or {})["batch_host"]
    fleet.make_cluster()

    def refused(self: SlurmExecutor, target: Any, checkpoint_id: str, operation_id: str) -> Any:
        raise PermanentExecutorError(f"injected: checkpoint {checkpoint_id} cannot be restored on {target.name}")

    monkeypatch.setattr(SlurmExecutor, "restore", refused)
    done = drive_until_rest(start_campaign([node], error_budget="1").pk)
    sweep = NodeSweep.objects.get(campaign=done)
    assert sweep.state == SweepState.FAILED and "injected" in sweep.error
    [move] = WorkloadMove.objects.filter(sweep=sweep)
    assert move.state == MoveState.STOPPED, move.state
    released = EvidenceEvent.objects.get(sweep=sweep, kind="stopped").data
    assert released["action"] == "released to its scheduler: no node took its checkpoint"
    assert "released to Slurm" in released["restarted_by"]
    end = EvidenceEvent.objects.get(sweep=sweep, kind="failed").data
    assert end["left"] == "drained" and [w["workload"] for w in end["workloads_released"]] == ["trainer"], end
    info = fleet.node(node)
    assert "DRAIN" in info["state_flags"] and info["reason"].startswith("gpusweep: "), info
    # What the operator reads: the campaign page names the release; nothing is stranded (no alert).
    client = Client()
    client.force_login(done.requested_by)
    page = client.get(f"/campaigns/{done.pk}/").content.decode()
    assert "Released to its scheduler" in page and "recover_stranded" not in page
    gauges = {m.name: m for m in DatabaseCollector().collect()}
    assert gauges["gpusweep_workloads_stranded"].samples == []
    monkeypatch.undo()
    assert fleet.cluster.wait_running([job_id]), {k: v for k, v in (fleet.job(job_id) or {}).items() if k in (
        "job_state", "state_reason", "priority", "required_nodes", "resv_name")}
    job = fleet.job(job_id) or {}
    assert job["batch_host"] != node and read_record(job) == {}, job
    after = agents.wait_steps(log, len(agents.steps(log)) + 5)
    assert agents.unbroken(after) == len(after), "restored from its checkpoint where Slurm started it again"
    # Gone with its job, so nothing of it reaches the next test's nodes.
    fleet.cluster.run("scancel", job_id)
    assert fleet.cluster.wait_ended(job_id, 30)
    assert wait_for(lambda: not counter_pids(log), 20, interval=0.2), counter_pids(log)


def wave_reservations(fleet: SlurmFleet) -> dict[str, list[str]]:
    """Every maintenance reservation Slurm holds (`scontrol show reservation`): name -> its nodes."""
    found = {}
    for line in fleet.cluster.run("scontrol", "show", "reservation", "-o", check=False).splitlines():
        if line.startswith("ReservationName="):
            fields = parse_key_values(line)
            assert "MAINT" in fields["Flags"].split(","), fields
            found[fields["ReservationName"]] = expand_hostlist(fields["Nodes"])
    return found


def test_each_wave_holds_a_maintenance_reservation_of_its_own_nodes_only_while_it_runs(fleet: SlurmFleet) -> None:
    """Issue 12's just-in-time reservations: a 2-node campaign in 2 waves. The plan lists one reservation
    per wave; while a wave runs Slurm holds exactly that wave's reservation, over that wave's node alone;
    none before the campaign, none after it; the evidence records each creation and deletion."""
    fleet.reset()
    fleet.make_cluster(executor_options={"operation_timeout": 60, "restore_wait_s": 60,
                                         "maintenance_reservation": "wave"})
    made = start_campaign(["gpu01", "gpu02"], parallelism_per_cluster="1")
    made.refresh_from_db()
    assert made.approved_plan is not None
    content = made.approved_plan.content
    planned = {w["wave"]: [(r["name"], r["nodes"]) for r in w["reservations"]] for w in content["waves"]}
    order = [content["nodes"][str(w["nodes"][0])]["name"] for w in content["waves"]]
    assert sorted(order) == ["gpu01", "gpu02"]
    assert planned == {1: [(f"gpusweep-c{made.pk}-w1", [order[0]])], 2: [(f"gpusweep-c{made.pk}-w2", [order[1]])]}
    assert wave_reservations(fleet) == {}, "nothing is reserved ahead"

    seen: list[tuple[list[tuple[int, str]], dict[str, list[str]]]] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        engine.dispatch(made.pk)
        working = sorted(NodeSweep.objects.filter(campaign=made, state__in=SweepState.WORKING).values_list(
            "wave", "node__name"))
        if not working:
            break
        now = (working, wave_reservations(fleet))
        if not seen or seen[-1] != now:
            seen.append(now)
        for sweep_id in NodeSweep.objects.filter(campaign=made, state__in=SweepState.WORKING).values_list(
                "pk", flat=True):
            engine.advance(sweep_id)
    done = Campaign.objects.get(pk=made.pk)
    assert done.status == CampaignStatus.COMPLETED, (done.status_reason, list(
        NodeSweep.objects.filter(campaign=done).values_list("node__name", "state", "error")))
    assert seen == [([(1, order[0])], {f"gpusweep-c{made.pk}-w1": [order[0]]}),
                    ([(2, order[1])], {f"gpusweep-c{made.pk}-w2": [order[1]]})], seen
    assert wave_reservations(fleet) == {}, "none left after the campaign"
    events = list(EvidenceEvent.objects.filter(campaign=done, kind__startswith="reservation_").order_by("seq")
                  .values_list("kind", "data__name", "data__nodes"))
    assert events == [("reservation_created", f"gpusweep-c{made.pk}-w1", [order[0]]),
                      ("reservation_deleted", f"gpusweep-c{made.pk}-w1", None),
                      ("reservation_created", f"gpusweep-c{made.pk}-w2", [order[1]]),
                      ("reservation_deleted", f"gpusweep-c{made.pk}-w2", None)], events
    assert all(fleet.takes_work(n) for n in ("gpu01", "gpu02"))


def test_an_abort_deletes_the_running_waves_reservation(fleet: SlurmFleet) -> None:
    """Abort after the first wave's drain: its reservation goes with the abort, and the unwound node
    takes work again."""
    fleet.reset()
    fleet.make_cluster(executor_options={"operation_timeout": 60, "maintenance_reservation": "wave"})
    made = start_campaign(["gpu01", "gpu02"], parallelism_per_cluster="1")
    engine.dispatch(made.pk)
    [sweep] = NodeSweep.objects.filter(campaign=made, state=SweepState.DRAINING)
    engine.advance(sweep.pk, max_steps=1)
    assert wave_reservations(fleet) == {f"gpusweep-c{made.pk}-w1": [sweep.node.name]}
    assert not fleet.takes_work(sweep.node.name)
    services.abort(made.pk, None, "operator changed their mind")
    done = drive_until_rest(made.pk)
    assert done.status == CampaignStatus.ABORTED
    assert wave_reservations(fleet) == {}, "no reservation left after the abort"
    assert all(fleet.takes_work(n) for n in ("gpu01", "gpu02"))
    deleted = EvidenceEvent.objects.get(campaign=done, kind="reservation_deleted")
    assert deleted.data["name"] == f"gpusweep-c{made.pk}-w1" and deleted.data["why"] == "campaign aborted"


def test_under_a_wave_reservation_a_kernel_patched_nodes_job_still_comes_home(
        fleet: SlurmFleet, tmp_path: Path) -> None:
    """The node leaves its wave's reservation when it returns to service, so its held job (checkpoint
    still valid after a kernel patch) can start there again before the wave is over."""
    fleet.reset()
    log = tmp_path / "signal.log"
    job_id = fleet.counter_job(log, "gpu01", engine="signal")
    assert fleet.cluster.wait_running([job_id]), fleet.cluster.logs()
    agents.wait_steps(log, 5)
    for other in ("gpu02", "gpu03", "gpu04"):
        fleet.cluster.run("scontrol", "update", f"nodename={other}", "state=DRAIN", "reason=RMA 4711")
    fleet.make_cluster(executor_options={"operation_timeout": 60, "restore_wait_s": 60,
                                         "maintenance_reservation": "wave"})
    done = drive_until_rest(start_campaign(["gpu01"], target_versions={"kernel": NEW_KERNEL}).pk)
    assert done.status == CampaignStatus.COMPLETED, (done.status_reason, list(
        NodeSweep.objects.filter(campaign=done).values_list("node__name", "state", "error")))
    job = fleet.job(job_id)
    assert job is not None and job["job_state"] == "RUNNING" and job["batch_host"] == "gpu01"
    assert agents.unbroken(agents.wait_steps(log, len(agents.steps(log)) + 5)) == len(agents.steps(log))
    assert EvidenceEvent.objects.filter(campaign=done, kind="reservation_created").count() == 1
    assert wave_reservations(fleet) == {}


def test_jobs_without_gpu_gres_that_the_agent_finds_holding_a_gpu_are_checkpointed_or_waited_for(
        fleet: SlurmFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, item 6: neither job asks for GPU gres, so Slurm never reports them as GPU jobs; each node's
    agent finds it holding the node's (stand-in) GPU: "sneaky" by the slurm-<jobid> its gpusweep-run
    registered, "waiter" by its cgroup (slurmstepd's /slurm_gpu02/uid_0/job_<id>/step_batch on this host,
    which runs a slurmd per node, made here by hand: the test cluster tracks jobs by process, not cgroup).
    The engine treats them as GPU jobs: sneaky (policy checkpoint) is checkpointed by the agent, requeued
    held and continues on a spare with its job id and one GPU reserved for it; gpu02 stays drained while
    waiter (policy wait) runs and is patched after it ends. The plan shows both with their policy, the
    evidence says the agent found them."""
    ok, reason = cgroups_writable()
    need(ok, reason)
    monkeypatch.setattr(policy, "WAIT_POLL_S", 1.0)
    fleet.reset()
    log = tmp_path / "sneaky.log"
    sneaky = fleet.counter_job(log, "gpu01", engine="signal", name="sneaky", gpus=0, holds=fleet.gpu_device("gpu01"))
    waiter = fleet.cluster.sbatch(f"{sys.executable} {HOLDER} {fleet.gpu_device('gpu02')} sleep 25",
                                  nodelist="gpu02", name="waiter")
    assert fleet.cluster.wait_running([sneaky, waiter]), fleet.cluster.logs()
    agents.wait_steps(log, 5)
    pattern = str(fleet.gpu_device("gpu02").parent / "nvidia[0-9]*")
    [pid] = wait_for(lambda: list(device_holders([pattern])), 10, interval=0.2)
    with in_cgroup(pid, f"/slurm_gpu02/uid_0/job_{waiter}/step_batch"):
        fleet.make_cluster()
        made = start_campaign(["gpu01", "gpu02"], workload_overrides={"waiter": "wait"})
        made.refresh_from_db()
        assert made.approved_plan is not None
        shown = {e["name"]: [(u["owner"], u["action"]) for u in e["users"]]
                 for e in made.approved_plan.content["unreported_gpu_users"]}
        assert shown == {"gpu01": [({"kind": "slurm_job", "id": sneaky}, "checkpoint it")],
                         "gpu02": [({"kind": "slurm_job", "id": waiter}, "wait for it to end")]}, shown
        done = drive_until_rest(made.pk, timeout=150)
    moves = completed_moves(done)
    assert sorted(moves) == sorted([f"slurm-{sneaky}", f"slurm-{waiter}"])
    # sneaky: checkpointed, requeued, running on a spare from its step, as one job.
    move = moves[f"slurm-{sneaky}"]
    assert move.state == MoveState.RESTORED and move.target_node is not None and move.gpus == 1
    assert move.target_node.name in ("gpu03", "gpu04") and move.new_workload_ref == f"slurm-{sneaky}"
    job = fleet.job(sneaky)
    assert job is not None and job["job_state"] == "RUNNING" and job["batch_host"] == move.target_node.name
    after = agents.wait_steps(log, len(agents.steps(log)) + 5)
    assert agents.unbroken(after) == len(after), "the counter restarted, skipped or repeated a step"
    expected = [("REQUEUED", "gpu01"), ("RUNNING", move.target_node.name)]
    assert runs_of(fleet, sneaky, expected) == expected
    # waiter: ran to its end on gpu02, which was patched only after it, having waited for it.
    assert moves[f"slurm-{waiter}"].state == MoveState.FINISHED
    [run] = fleet.cluster.sacct("-j", waiter)
    sweep = NodeSweep.objects.get(campaign=done, node__name="gpu02")
    assert run["State"] == "COMPLETED" and run["NodeList"] == "gpu02"
    assert sweep.patched_at is not None and run["End"] <= sweep.patched_at.astimezone().strftime("%Y-%m-%dT%H:%M:%S")
    evidence = EvidenceEvent.objects.filter(campaign=done)
    [checkpointed] = [e.data for e in evidence.filter(kind="checkpointed")]
    waited = [e.data for e in evidence.filter(kind="waiting", sweep=sweep)]
    [finished] = [e.data for e in evidence.filter(kind="finished")]
    assert checkpointed["workload"] == "sneaky" and checkpointed["origin"] == UNDECLARED
    assert waited and all(w["origin"] == UNDECLARED and "waiter" in w["reason"] for w in waited)
    assert finished["workload"] == "waiter" and finished["origin"] == UNDECLARED
    for node in ("gpu01", "gpu02"):
        assert fleet.takes_work(node) and fleet.agents[node].client.get("/v1/facts")["components"]["driver"] == FIXED


def test_gpu_processes_in_no_job_are_checkpointed_to_a_spare_or_stopped_by_the_policy(
        fleet: SlurmFleet, tmp_path: Path) -> None:
    """Issue 19, item 6: two processes started on the nodes by hand, in no job, each hold their node's
    (stand-in) GPU; the agents list them as workloads (gpu-pid-<pid>) and the engine acts on each by policy
    through the agent: gpu01's (checkpoint) is saved by the cuda engine (a stand-in libcuda, real CRIU) and
    restored by a spare's agent from the shared checkpoint folder; gpu02's (cold_restart) is stopped, and
    nobody starts it again (Slurm requeues jobs, not these)."""
    need(shutil.which("gcc") is not None, "needs gcc (apt-get install build-essential)")
    fleet.reset()
    standin = tmp_path / "libcuda-standin.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(standin), str(agents.DATA / "libcuda_standin.c")],
                   check=True)
    fleet.use_libcuda(standin)
    procs: list[subprocess.Popen[bytes]] = []
    restored_pid = 0
    try:
        for node in ("gpu01", "gpu02"):
            procs.append(subprocess.Popen([sys.executable, str(HOLDER), str(fleet.gpu_device(node)), "sleep", "600"],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True))
            # Reaped the moment it is stopped: CRIU restores a process under its own pid, which must be free.
            threading.Thread(target=procs[-1].wait, daemon=True).start()
        moved, stopped = procs
        expected = {moved.pid: "gpu01", stopped.pid: "gpu02"}
        wait_for(lambda: all(pid in device_holders([str(fleet.gpu_device(node))]) for pid, node in expected.items()),
                 10, interval=0.1)
        fleet.make_cluster()
        made = start_campaign(["gpu01", "gpu02"], workload_overrides={f"gpu-pid-{stopped.pid}": "cold_restart"})
        made.refresh_from_db()
        assert made.approved_plan is not None
        shown = {(e["name"], u["pid"]): (u["owner"]["kind"], u["action"])
                 for e in made.approved_plan.content["unreported_gpu_users"] for u in e["users"]}
        assert shown == {("gpu01", moved.pid): ("process", "checkpoint it"),
                         ("gpu02", stopped.pid): ("process", "stop it")}, shown
        done = drive_until_rest(made.pk, timeout=150)
        moves = completed_moves(done)
        assert sorted(moves) == sorted([f"gpu-pid-{moved.pid}", f"gpu-pid-{stopped.pid}"])
        move = moves[f"gpu-pid-{moved.pid}"]
        assert move.state == MoveState.RESTORED and move.target_node is not None and move.gpus == 1
        target = move.target_node.name
        assert target in ("gpu03", "gpu04") and move.new_workload_ref == f"gpu-pid-{moved.pid}"
        [listed] = [w for w in fleet.agents[target].client.get("/v1/workloads")["workloads"]
                    if w["id"] == move.new_workload_ref]
        restored_pid = int(listed["pid"])
        assert listed["state"] == "running" and moved.poll() is not None
        # It came back holding the descriptor it had (CRIU reopens the file).
        assert restored_pid in device_holders([str(fleet.gpu_device("gpu01"))])
        assert moves[f"gpu-pid-{stopped.pid}"].state == MoveState.STOPPED and stopped.poll() is not None
        events = EvidenceEvent.objects.filter(campaign=done)
        [checkpointed] = [e.data for e in events.filter(kind="checkpointed")]
        [stop] = [e.data for e in events.filter(kind="stopped")]
        assert checkpointed["engine"] == "cuda" and checkpointed["origin"] == stop["origin"] == UNDECLARED
        assert stop["restarted_by"] == "nobody: its owner must start it again"
        for node in ("gpu01", "gpu02"):
            facts = fleet.agents[node].client.get("/v1/facts")
            assert fleet.takes_work(node) and facts["components"]["driver"] == FIXED
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        if restored_pid:
            agents.kill_pid(restored_pid)
        fleet.use_libcuda(None)
