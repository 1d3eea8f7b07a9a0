"""No workload left stopped (issue 25): a property of the engine over every combination of workload
policies on one node and every way its sweep can end.

The node gpu00 runs five workloads, one per policy: `mig` (CRIU, checkpoint and move), `sig` (signal
engine: its image needs nothing of the node, so with placement "home" it is parked for the node's
return), `wait` (the campaign waits for it to end), `cold` (cold restart) and `none` (not
checkpointable, stopped since a cold restart is allowed). Each run ends one way: done, a health gate
failing for good (the node stays out) or once (it returns on its old versions), a failing patch, an
abort at each step before the patch, or a worker killed right after each executor call (the lease
runs out and the step is driven again). Afterwards every workload is running exactly once or is
accounted for (stopped for its owner, ended by itself, or stranded with its checkpoint kept), none is
left checkpointed or parked, and none was frozen longer than its own move: the wait of `wait` freezes
nobody.

Runs on the memory executor (a test double, executors/memory.py): the property is the engine's; the
executors' own contract tests run the same operations against real Slurm, Kubernetes and agents.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from campaigns import engine, services
from campaigns.choices import AfterRollback, CampaignStatus, MoveState, Placement, SweepState
from campaigns.models import Campaign, EvidenceEvent, NodeSweep, WorkloadMove
from executors.memory import Fleet, MemoryExecutor
from inventory.choices import ServiceState
from inventory.models import Cluster, Node, Workload
from tests.campaigns.fleet import FIXED, OLD, add_node, approved_campaign, driver_advisory, user

pytestmark = pytest.mark.django_db

WAIT_S = 1.6  # how long `wait` runs on after the sweep reaches the node
# A move on the memory executor takes milliseconds (0.5 s seen at load 6); a freeze through the wait
# takes WAIT_S.
FROZEN_MAX_S = 1.0
POLICIES = {"mig": ("criu", ""), "sig": ("signal", ""), "wait": ("criu", "wait"), "cold": ("criu", "cold_restart"),
            "none": ("none", "")}
ENDS = ("done", "gate_stays_out", "gate_returns", "patch_fails", "abort_draining", "abort_checkpointing",
        "abort_migrating")
CALLS = ("drain", "checkpoint", "stop", "restore", "patch", "reboot", "verify", "health", "rollback",
         "return_to_service", "undo")


class WorkerDied(BaseException):
    """Stands for SIGKILL right after an executor call: nothing after it runs."""


@pytest.fixture
def people():
    return user("rita", "operator"), user("alan", "approver")


def _fleet(tag: str) -> tuple[Fleet, Cluster, Node]:
    fleet = Fleet()
    fleet.reset()  # operation ids repeat across tests whose database rolled back
    cluster = Cluster.objects.create(name=tag, kind="static", connection={"executor": "memory"})
    node = add_node(fleet, cluster, "gpu00", labels={"sweep": tag}, workloads=0)
    for spare in ("spare00", "spare01"):
        add_node(fleet, cluster, spare, labels={"sweep": "no"}, workloads=0)
    for name, (engine_name, _policy) in POLICIES.items():
        ref = f"gpu00-{name}"
        Workload.objects.create(cluster=cluster, node=node, kind="process", scheduler_id=ref, name=ref, gpus=2,
                                checkpoint_engine=engine_name)
        fleet.add_workload(tag, "gpu00", ref, name=ref, gpus=2, engine=engine_name, rate=1000)
    return fleet, cluster, node


def _campaign(people: tuple[Any, Any], tag: str, placement: str, end: str) -> Campaign:
    requester, approver = people
    return approved_campaign(
        requester, approver, node_selector={"sweep": tag}, cold_restart_allowed=True, workload_placement=placement,
        workload_overrides={f"gpu00-{n}": p for n, (_e, p) in POLICIES.items() if p},
        after_rollback=AfterRollback.RETURN if end == "gate_returns" else AfterRollback.STAY_OUT,
        error_budget="1")


def _run(campaign: Campaign, fleet: Fleet, tag: str, on_step: Callable[[NodeSweep], None] | None = None) -> Campaign:
    """Dispatch and advance one step at a time (as workers do), `wait` ending WAIT_S after the sweep
    first looks at the node; a WorkerDied leaves the step to the lease's expiry and a later worker."""
    services.start(campaign.pk, campaign.requested_by)
    started, ended = time.monotonic(), False
    for _ in range(2000):
        if not ended and time.monotonic() - started > WAIT_S:
            fleet.finish(f"{tag}/gpu00", "gpu00-wait")
            ended = True
        try:
            engine.dispatch(campaign.pk)
            for sweep in NodeSweep.objects.filter(campaign=campaign, state__in=SweepState.WORKING):
                if on_step is not None:
                    on_step(sweep)
                engine.advance(sweep.pk, max_steps=1)
        except WorkerDied:
            NodeSweep.objects.filter(campaign=campaign).update(step_deadline=timezone.now() - timedelta(seconds=1))
            continue
        current = Campaign.objects.get(pk=campaign.pk)
        busy = NodeSweep.objects.filter(campaign=campaign, state__in=SweepState.ACTIVE).exists()
        if not busy and current.status not in (CampaignStatus.RUNNING, CampaignStatus.WAITING):
            return current
        time.sleep(0.02)
    raise AssertionError(f"campaign {campaign.pk} never came to rest")


def _assert_every_workload_accounted_for(fleet: Fleet, campaign: Campaign, tag: str) -> dict[str, str]:
    """Each workload runs exactly once, or its move says where it is; none frozen through a wait."""
    nodes = {key: node for key, node in fleet.snapshot()["nodes"].items() if key.startswith(f"{tag}/")}
    running: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for key, node in nodes.items():
        for workload in node["workloads"].values():
            if workload["state"] == "running":
                running.setdefault(workload["name"], []).append((key, workload))
    moves = {m.workload_ref: m for m in WorkloadMove.objects.filter(sweep__campaign=campaign)}
    # (A move still planned is a workload never touched: it runs on, checked below.)
    left = {m.workload_ref: m.state for m in moves.values() if m.state in (MoveState.CHECKPOINTED, MoveState.PARKED)}
    assert not left, f"workloads left in a checkpoint with no way back: {left}"
    where = {}
    for name in POLICIES:
        ref = f"gpu00-{name}"
        copies = running.get(ref, [])
        assert len(copies) <= 1, f"{ref} runs twice: {[k for k, _ in copies]}"
        if copies:
            key, workload = copies[0]
            assert workload.get("frozen_s", 0.0) < FROZEN_MAX_S, (
                f"{ref} was frozen {workload['frozen_s']:.2f} s (its own move takes milliseconds)")
            where[name] = key
            continue
        move = moves.get(ref)
        assert move is not None, f"{ref} stopped with no record of it"
        assert move.state in (MoveState.STOPPED, MoveState.FINISHED, MoveState.STRANDED), (ref, move.state)
        if move.state == MoveState.STRANDED:
            assert EvidenceEvent.objects.filter(sweep=move.sweep, kind="stranded").exists()
        where[name] = move.state
    return where


@pytest.mark.parametrize("placement", [Placement.MOVE, Placement.HOME])
@pytest.mark.parametrize("end", ENDS)
def test_every_workload_runs_or_is_accounted_for_at_every_end(people, placement, end):
    tag = f"{end[:12]}-{placement}".replace("_", "-")
    fleet, _cluster, node = _fleet(tag)
    campaign = _campaign(people, tag, placement, end)
    if end == "gate_stays_out":
        fleet.fail_check(f"{tag}/gpu00", "site:ecc", "GPU 3: 12 uncorrectable ECC errors")
    elif end == "gate_returns":
        fleet.fail_check(f"{tag}/gpu00", "site:ecc", "GPU 3: 12 uncorrectable ECC errors", times=1)
    elif end == "patch_fails":
        fleet.inject("patch", f"{tag}/gpu00", "permanent")
    aborted: list[str] = []

    def abort_at(sweep: NodeSweep) -> None:
        if end.startswith("abort_") and not aborted and sweep.state == end.removeprefix("abort_"):
            services.abort(campaign.pk, campaign.requested_by, "operator's abort")
            aborted.append(sweep.state)

    done = _run(campaign, fleet, tag, abort_at)
    where = _assert_every_workload_accounted_for(fleet, done, tag)
    sweep = NodeSweep.objects.get(campaign=done, node=node)
    node.refresh_from_db()
    expected = {
        "done": (SweepState.DONE, ServiceState.IN_SERVICE, CampaignStatus.COMPLETED),
        "gate_stays_out": (SweepState.FAILED, ServiceState.OFFLINE, CampaignStatus.HALTED),
        "gate_returns": (SweepState.FAILED, ServiceState.IN_SERVICE, CampaignStatus.HALTED),
        "patch_fails": (SweepState.FAILED, ServiceState.OFFLINE, CampaignStatus.HALTED),
    }.get(end, (SweepState.ROLLED_BACK, ServiceState.IN_SERVICE, CampaignStatus.ABORTED))
    assert (sweep.state, node.service_state, done.status) == expected, (sweep.error, where)
    if end.startswith("abort_"):
        assert aborted, f"the sweep never reached {end}"
    # A workload the wait did not concern was checkpointed only once the wait was over (or never).
    if end not in ("abort_draining", "abort_checkpointing"):
        assert where["wait"] == MoveState.FINISHED
    if placement == Placement.HOME and end == "gate_returns":
        assert where["sig"] == f"{tag}/gpu00", "the parked workload comes home once its node returns"
    if end in ("gate_stays_out", "patch_fails"):
        assert where["sig"].startswith(f"{tag}/spare"), "a node that stays out sends its parked work elsewhere"


@pytest.mark.parametrize("placement", [Placement.MOVE, Placement.HOME])
def test_a_worker_killed_after_any_executor_call_leaves_every_workload_accounted_for(people, placement, monkeypatch):
    calls: list[str] = []
    kill_at: list[int] = [0]

    def counted(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: MemoryExecutor, *args: Any, **kwargs: Any) -> Any:
            result = real(self, *args, **kwargs)
            calls.append(name)
            if len(calls) == kill_at[0]:
                raise WorkerDied
            return result
        return call

    for name in CALLS:
        monkeypatch.setattr(MemoryExecutor, name, counted(name, getattr(MemoryExecutor, name)))
    # A run with no death counts the calls a sweep makes; then one run dies after each of them.
    total = None
    k = 0
    while total is None or k <= total:
        tag = f"kill{k}-{placement}"
        fleet, _cluster, node = _fleet(tag)
        campaign = _campaign(people, tag, placement, "done")
        calls.clear()
        kill_at[0] = k
        done = _run(campaign, fleet, tag)
        if total is None:
            total = len(calls)
            assert total >= 8, calls
        _assert_every_workload_accounted_for(fleet, done, tag)
        sweep = NodeSweep.objects.get(campaign=done, node=node)
        assert (sweep.state, done.status) == (SweepState.DONE, CampaignStatus.COMPLETED), (k, sweep.error)
        assert fleet.snapshot()["nodes"][f"{tag}/gpu00"]["patches"] == {"driver": 1}, "patched once"
        k += 1


def _agent_reports(cluster: Cluster, node: Node, driver: str) -> None:
    """The node's agent reports its versions, as its heartbeat does (inventory.agent -> apply_snapshot)."""
    from inventory.choices import ChangeSource
    from inventory.services import ObservedNode, Snapshot, apply_snapshot

    apply_snapshot(cluster, Snapshot(nodes=[ObservedNode(node.name, components={"driver": driver, "cuda": "12.8"})],
                                     complete=False, replace_components=True), ChangeSource.AGENT)


def _exposure(node: Node) -> Any:
    from advisories.models import Exposure

    return Exposure.objects.get(node=node, advisory=driver_advisory([node], "9901"))


@pytest.mark.parametrize("gate", ["passes", "fails"])
def test_an_agent_report_before_the_gates_is_held_and_credited_to_the_campaign_only_when_they_pass(
        people, gate, django_capture_on_commit_callbacks):
    from advisories.choices import ExposureState
    from inventory.services import PENDING_VERIFICATION

    tag = f"agent-first-{gate}"
    fleet, cluster, node = _fleet(tag)
    exposure = _exposure(node)
    assert exposure.state == ExposureState.OPEN
    if gate == "fails":
        fleet.fail_check(f"{tag}/gpu00", "site:ecc", "GPU 3: 12 uncorrectable ECC errors")
    campaign = _campaign(people, tag, Placement.MOVE, "done")
    fleet.finish(f"{tag}/gpu00", "gpu00-wait")
    services.start(campaign.pk, campaign.requested_by)
    engine.dispatch(campaign.pk)
    sweep = NodeSweep.objects.get(campaign=campaign, node=node)
    while NodeSweep.objects.get(pk=sweep.pk).state != SweepState.VERIFYING:
        engine.advance(sweep.pk, max_steps=1)
    # Rebooted onto the new driver; its agent's heartbeat lands before the gates have run.
    with django_capture_on_commit_callbacks(execute=True):
        _agent_reports(cluster, node, FIXED)
    node.refresh_from_db()
    exposure.refresh_from_db()
    assert node.components.get(component="driver").version == OLD, "not credited before the gates"
    assert node.facts[PENDING_VERIFICATION]["versions"] == {"driver": FIXED}
    assert exposure.state == ExposureState.OPEN and not exposure.remediated_by
    with django_capture_on_commit_callbacks(execute=True):
        engine.advance(sweep.pk, max_steps=1)  # verify: versions, then the health gates
        sweep.refresh_from_db()
        if gate == "fails":
            # Reverted: the agent reports the old driver again, which it is.
            _agent_reports(cluster, node, OLD)
    node.refresh_from_db()
    exposure.refresh_from_db()
    assert PENDING_VERIFICATION not in node.facts
    if gate == "passes":
        driver = node.components.get(component="driver")
        assert (driver.version, driver.source) == (FIXED, "campaign")
        assert exposure.state == ExposureState.REMEDIATED
        assert exposure.remediated_by == f"campaign {campaign.pk}, sweep {sweep.pk}"
    else:
        assert sweep.state == SweepState.FAILED and "health gate failed" in sweep.error
        assert node.components.get(component="driver").version == OLD
        assert exposure.state == ExposureState.OPEN and not exposure.remediated_by


def test_a_workload_no_node_can_take_back_is_stranded_alerted_and_recovered_by_the_command(people):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from metrics.collect import DatabaseCollector

    tag = "stranded"
    fleet, _cluster, node = _fleet(tag)
    fleet.finish(f"{tag}/gpu00", "gpu00-wait")
    campaign = _campaign(people, tag, Placement.HOME, "patch_fails")
    fleet.inject("patch", f"{tag}/gpu00", "permanent")
    spares = Node.objects.filter(cluster=node.cluster, name__startswith="spare")

    def spares_taken(sweep: NodeSweep) -> None:
        # Once the moves are done the spares go out of service: the parked workload has nowhere to go.
        if sweep.state == SweepState.PATCHING:
            spares.update(service_state=ServiceState.OFFLINE)

    done = _run(campaign, fleet, tag, spares_taken)
    sweep = NodeSweep.objects.get(campaign=done, node=node)
    stranded = WorkloadMove.objects.get(sweep=sweep, state=MoveState.STRANDED)
    assert stranded.workload_ref == "gpu00-sig"
    [failed] = EvidenceEvent.objects.filter(sweep=sweep, kind="failed")
    assert [w["workload"] for w in failed.data["stranded_workloads"]] == ["gpu00-sig"]
    assert "recover_stranded" in failed.data["stranded_workloads"][0]["to_do"]
    gauges = {m.name: m for m in DatabaseCollector().collect()}
    assert [(s.labels["campaign"], s.value) for s in gauges["gpusweep_workloads_stranded"].samples] == [
        (str(done.pk), 1.0)]
    with pytest.raises(CommandError, match="1 workload"):
        call_command("recover_stranded", done.pk)
    spares.filter(name="spare00").update(service_state=ServiceState.IN_SERVICE)
    call_command("recover_stranded", done.pk, actor="alan")
    stranded.refresh_from_db()
    assert stranded.state == MoveState.RESTORED and stranded.target_node.name == "spare00"
    running = [w for w in fleet.snapshot()["nodes"][f"{tag}/spare00"]["workloads"].values()
               if w["name"] == "gpu00-sig" and w["state"] == "running"]
    assert len(running) == 1
    assert EvidenceEvent.objects.filter(campaign=done, sweep=None, kind="workload_recovered",
                                        actor="user:alan").count() == 1
    gauges = {m.name: m for m in DatabaseCollector().collect()}
    assert gauges["gpusweep_workloads_stranded"].samples == []


def test_a_step_that_failed_for_good_stays_failed_when_its_worker_dies_during_the_recovery(people, monkeypatch):
    """Issue 28, item 6: the failure is recorded first; a worker killed before the revert finishes
    leaves a sweep whose redrive resumes the revert and never runs the failed step again."""
    from campaigns.engine import recovery

    tag = "dies-in-recovery"
    fleet, _cluster, node = _fleet(tag)
    fleet.finish(f"{tag}/gpu00", "gpu00-wait")
    fleet.fail_check(f"{tag}/gpu00", "site:ecc", "GPU 3: 12 uncorrectable ECC errors", times=1)  # fails once
    campaign = _campaign(people, tag, Placement.MOVE, "gate_stays_out")
    real = recovery._revert

    def dies(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(recovery, "_revert", real)
        raise WorkerDied

    monkeypatch.setattr(recovery, "_revert", dies)
    done = _run(campaign, fleet, tag)
    sweep = NodeSweep.objects.get(campaign=done, node=node)
    # Run again, the gate would have passed (it fails once): the node stays failed and reverted.
    assert sweep.state == SweepState.FAILED and "health gate failed" in sweep.error
    assert EvidenceEvent.objects.filter(sweep=sweep, kind="step_failed").count() == 1
    assert EvidenceEvent.objects.filter(sweep=sweep, kind="reverted").count() == 1
    assert not EvidenceEvent.objects.filter(sweep=sweep, kind="done").exists()
    assert fleet.snapshot()["nodes"][f"{tag}/gpu00"]["versions"]["driver"] == OLD


def test_an_exception_that_is_no_executor_error_is_retried_with_its_traceback_then_fails_the_node(people,
                                                                                                monkeypatch):
    """Issue 28, item 6: a full disk's OSError from a back end is never retried silently."""
    tag = "full-disk"
    fleet, _cluster, node = _fleet(tag)
    campaign = _campaign(people, tag, Placement.MOVE, "done")

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(MemoryExecutor, "checkpoint", full)
    done = _run(campaign, fleet, tag)
    sweep = NodeSweep.objects.get(campaign=done, node=node)
    retries = list(EvidenceEvent.objects.filter(sweep=sweep, kind="retry").order_by("node_seq"))
    assert len(retries) == 4 and all("OSError: [Errno 28] No space left on device" in r.data["error"]
                                     and "Traceback" in r.data["error"] for r in retries)
    assert sweep.state == SweepState.FAILED and "gave up after 5 attempts: OSError" in sweep.error
    # Nothing was patched and every workload is back on its node.
    _assert_every_workload_accounted_for(fleet, done, tag)
    assert fleet.snapshot()["nodes"][f"{tag}/gpu00"]["patches"] == {}


@pytest.mark.parametrize("case", ["waited_for", "cold_started", "past_the_limit"])
def test_a_workload_no_node_could_receive_is_never_frozen_for_nothing(people, case):
    """The plan's "finishes first" or "cold start", decided at run time on the receivers as they are:
    a CRIU workload whose only possible receiver is already on the new driver is waited for (its
    node fails once the wait limit passes) or, with cold restarts allowed, stopped for one; it is
    never checkpointed only to find no node that takes it."""
    from tests.campaigns.fleet import add_node

    tag = f"no-receiver-{case}".replace("_", "-")
    fleet = Fleet()
    fleet.reset()
    cluster = Cluster.objects.create(name=tag, kind="static", connection={"executor": "memory"})
    node = add_node(fleet, cluster, "gpu00", labels={"sweep": tag}, workloads=1, engine="criu")
    add_node(fleet, cluster, "spare00", labels={"sweep": "no"}, workloads=0, driver=FIXED)
    requester, approver = people
    campaign = approved_campaign(requester, approver, node_selector={"sweep": tag},
                                 cold_restart_allowed=case == "cold_started",
                                 wait_limit=timedelta(seconds=1) if case == "past_the_limit" else None)
    [planned] = campaign.approved_plan.content["nodes"][str(node.pk)]["moves"]
    assert planned["action"] == ("cold_start" if case == "cold_started" else "blocked")
    services.start(campaign.pk, requester)
    started = time.monotonic()
    for _ in range(500):
        if case == "waited_for" and time.monotonic() - started > 1.0:
            fleet.finish(f"{tag}/gpu00", "gpu00-w0")
        engine.dispatch(campaign.pk)
        for sweep in NodeSweep.objects.filter(campaign=campaign, state__in=SweepState.WORKING):
            engine.advance(sweep.pk, max_steps=1)
        if not NodeSweep.objects.filter(campaign=campaign, state__in=SweepState.ACTIVE).exists():
            break
        time.sleep(0.05)
    sweep = NodeSweep.objects.get(campaign=campaign, node=node)
    kinds = list(EvidenceEvent.objects.filter(sweep=sweep).values_list("kind", flat=True))
    assert "checkpointed" not in kinds, "frozen for nothing"
    [move] = WorkloadMove.objects.filter(sweep=sweep)
    workload = fleet.snapshot()["nodes"][f"{tag}/gpu00"]["workloads"]["gpu00-w0"]
    if case == "waited_for":
        assert sweep.state == SweepState.DONE and move.state == MoveState.FINISHED
        waits = EvidenceEvent.objects.filter(sweep=sweep, kind="waiting").first()
        assert waits is not None and "no node where the checkpoint of job-gpu00-w0 would be valid" in (
            waits.data["reason"])
    elif case == "cold_started":
        assert sweep.state == SweepState.DONE and move.state == MoveState.STOPPED
        assert "no node where its checkpoint would be valid" in move.detail["cold_start_because"]
        assert "waiting" not in kinds
    else:
        assert sweep.state == SweepState.FAILED and "still runs after the wait limit" in sweep.error
        assert workload["state"] == "running", "it ran on through the wait and after it"
        node.refresh_from_db()
        assert node.service_state == ServiceState.IN_SERVICE
