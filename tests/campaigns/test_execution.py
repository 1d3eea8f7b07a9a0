"""Execution with the memory executor (a test double: no agents here) on the default database."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from campaigns import engine, queue, services
from campaigns.choices import CampaignStatus, MoveState, SweepState
from campaigns.engine import admission, steps
from campaigns.models import Campaign, EvidenceEvent, NodeSweep, WorkloadMove
from campaigns.services import CampaignError
from executors.memory import MemoryExecutor
from inventory.models import Node, Workload
from tests.campaigns.fleet import FIXED, approved_campaign, drive, make_fleet, user

pytestmark = pytest.mark.django_db


@pytest.fixture
def people():
    return user("rita", "operator"), user("alan", "approver"), user("bea", "approver")


def test_it_sweeps_every_node_and_every_workload_continues(people):
    fleet, _cluster = make_fleet(nodes=4, spares=2)
    requester, approver, _ = people
    campaign = approved_campaign(requester, approver)
    services.start(campaign.pk, requester)
    campaign = drive(campaign.pk)
    assert campaign.status == CampaignStatus.COMPLETED
    states = set(NodeSweep.objects.filter(campaign=campaign).values_list("state", flat=True))
    assert states == {SweepState.DONE}
    snapshot = fleet.snapshot()
    for name in ("gpu00", "gpu01", "gpu02", "gpu03"):
        node = snapshot["nodes"][f"local/{name}"]
        assert node["versions"]["driver"] == FIXED and node["patches"] == {"driver": 1}
        assert node["maintenance"] is False
    # Every workload runs exactly once somewhere, further along than when it was checkpointed.
    running = [w for n in snapshot["nodes"].values() for w in n["workloads"].values() if w["state"] == "running"]
    assert sorted(w["name"] for w in running) == [f"job-gpu{i:02d}-w0" for i in range(4)]
    for move in WorkloadMove.objects.all():
        assert move.state == MoveState.RESTORED
        assert move.steps_after >= move.steps_before > 0
    # The inventory follows: new versions, workloads where they went, nodes in service.
    assert set(Node.objects.filter(name__startswith="gpu").values_list("components__version", flat=True)) >= {FIXED}
    assert not Workload.objects.filter(node__name__startswith="gpu").exists()
    call_command("verify_evidence", campaign=campaign.pk)


def test_a_failed_checkpoint_never_leads_to_a_patch(people):
    fleet, _ = make_fleet(nodes=2, spares=2)
    fleet.inject("checkpoint", "local/gpu00", "permanent")
    requester, approver, _ = people
    campaign = approved_campaign(requester, approver, error_budget="1")
    services.start(campaign.pk, requester)
    drive(campaign.pk)
    failed = NodeSweep.objects.get(node__name="gpu00")
    assert failed.state == SweepState.FAILED and "injected" in failed.error
    node = fleet.snapshot()["nodes"]["local/gpu00"]
    assert node["patches"] == {} and node["maintenance"] is False
    assert [w["state"] for w in node["workloads"].values()] == ["running"]
    assert NodeSweep.objects.get(node__name="gpu01").state == SweepState.DONE


def test_the_error_budget_halts_the_campaign(people):
    fleet, _ = make_fleet(nodes=4, spares=2)
    fleet.inject("patch", "*", "permanent", times=10)
    requester, approver, _ = people
    campaign = approved_campaign(requester, approver, error_budget="1", parallelism_per_cluster="1")
    services.start(campaign.pk, requester)
    campaign = drive(campaign.pk)
    assert campaign.status == CampaignStatus.HALTED
    assert "exceed the error budget of 1" in campaign.status_reason
    assert NodeSweep.objects.filter(campaign=campaign, state=SweepState.FAILED).count() == 2
    assert NodeSweep.objects.filter(campaign=campaign, state=SweepState.PENDING).count() == 2


def test_a_window_in_the_future_makes_it_wait(people):
    make_fleet(nodes=2, spares=2)
    requester, approver, _ = people
    now = timezone.now()
    later = now + timedelta(hours=3)
    window = {"days": [later.weekday()], "start": later.strftime("%H:00"), "end": (later + timedelta(hours=1))
              .strftime("%H:00"), "tz": "UTC"}
    campaign = approved_campaign(requester, approver, windows=[window])
    services.start(campaign.pk, requester)
    engine.dispatch(campaign.pk)
    campaign.refresh_from_db()
    assert campaign.status == CampaignStatus.WAITING
    assert set(NodeSweep.objects.filter(campaign=campaign).values_list("state", flat=True)) == {SweepState.PENDING}
    assert EvidenceEvent.objects.filter(campaign=campaign, kind="waiting_for_window").count() == 1


def test_an_unapproved_campaign_cannot_start_and_the_requester_cannot_approve(people):
    make_fleet(nodes=2, spares=0)
    requester, _approver, _ = people
    campaign = Campaign.objects.create(name="x", requested_by=requester, target_versions={"driver": FIXED})
    services.make_plan(campaign.pk, requester)
    with pytest.raises(CampaignError, match="must be approved"):
        services.start(campaign.pk, requester)
    with pytest.raises(CampaignError, match="requester cannot approve"):
        services.approve(campaign.pk, requester)
    assert Campaign.objects.get(pk=campaign.pk).status == CampaignStatus.PLANNED


def test_it_needs_as_many_approvers_as_the_campaign_asks(people):
    make_fleet(nodes=1, spares=1)
    requester, alan, bea = people
    campaign = Campaign.objects.create(name="x", requested_by=requester, target_versions={"driver": FIXED},
                                       approvals_required=2)
    services.make_plan(campaign.pk, requester)
    services.approve(campaign.pk, alan)
    services.approve(campaign.pk, alan)  # twice by one person counts once
    assert Campaign.objects.get(pk=campaign.pk).status == CampaignStatus.PLANNED
    services.approve(campaign.pk, bea)
    assert Campaign.objects.get(pk=campaign.pk).status == CampaignStatus.APPROVED


def test_a_node_is_in_at_most_one_active_campaign(people):
    make_fleet(nodes=2, spares=2)
    requester, approver, _ = people
    first = approved_campaign(requester, approver)
    second = approved_campaign(requester, approver)
    services.start(first.pk, requester)
    with pytest.raises(CampaignError, match="is in active campaign"):
        services.start(second.pk, requester)
    assert Campaign.objects.get(pk=second.pk).status == CampaignStatus.APPROVED
    assert not NodeSweep.objects.filter(campaign=second).exists()


def test_abort_returns_unpatched_nodes_with_their_workloads(people):
    fleet, _ = make_fleet(nodes=4, spares=2)
    requester, approver, _ = people
    campaign = approved_campaign(requester, approver)
    services.start(campaign.pk, requester)
    engine.dispatch(campaign.pk)
    admitted = list(NodeSweep.objects.filter(campaign=campaign, state=SweepState.DRAINING))
    for sweep in admitted:
        engine.advance(sweep.pk, max_steps=1)  # drained
        engine.advance(sweep.pk, max_steps=1)  # checkpointed, not yet restored
    services.abort(campaign.pk, requester, reason="change freeze")
    for sweep in admitted:
        engine.advance(sweep.pk)
    states = dict(NodeSweep.objects.filter(campaign=campaign).values_list("node__name", "state"))
    assert sorted(states.values()) == [SweepState.ROLLED_BACK] * 2 + [SweepState.SKIPPED] * 2
    snapshot = fleet.snapshot()
    for name in ("gpu00", "gpu01", "gpu02", "gpu03"):
        node = snapshot["nodes"][f"local/{name}"]
        assert node["patches"] == {} and node["maintenance"] is False
        assert [w["state"] for w in node["workloads"].values()].count("running") == 1
    assert Campaign.objects.get(pk=campaign.pk).status == CampaignStatus.ABORTED


def test_a_step_whose_worker_died_is_redriven_and_nothing_runs_twice(people):
    fleet, _ = make_fleet(nodes=2, spares=2)
    requester, approver, _ = people
    campaign = approved_campaign(requester, approver, step_timeout_s=60)
    services.start(campaign.pk, requester)
    engine.dispatch(campaign.pk)
    sweep = NodeSweep.objects.filter(campaign=campaign).order_by("position").first()
    # A worker claimed the step and died: the lease holds until the step deadline.
    NodeSweep.objects.filter(pk=sweep.pk).update(lease_owner="dead-worker")
    assert engine.advance(sweep.pk) is None
    NodeSweep.objects.filter(pk=sweep.pk).update(step_deadline=timezone.now() - timedelta(seconds=1))
    sent = []
    queue.ENQUEUE.insert(0, lambda task, object_id, countdown: sent.append((task, object_id)))
    try:
        assert engine.redrive()["steps"] == 1
    finally:
        queue.ENQUEUE.pop(0)
    assert ("advance", sweep.pk) in sent
    drive(campaign.pk)
    assert fleet.snapshot()["nodes"][f"local/{sweep.node.name}"]["patches"] == {"driver": 1}


def test_verification_compares_versions_and_health(people):
    fleet, _ = make_fleet(nodes=1, spares=1)
    fleet.set_healthy("local/gpu00", False)
    requester, approver, _ = people
    campaign = approved_campaign(requester, approver)
    services.start(campaign.pk, requester)
    drive(campaign.pk)
    sweep = NodeSweep.objects.get(campaign=campaign)
    assert sweep.state == SweepState.FAILED
    assert "verification failed: healthy=False" in sweep.error


def test_events_cannot_be_changed_through_the_orm(people):
    make_fleet(nodes=1, spares=1)
    requester, approver, _ = people
    campaign = approved_campaign(requester, approver)
    event = EvidenceEvent.objects.filter(campaign=campaign).first()
    event.actor = "someone else"
    with pytest.raises(ValueError, match="append-only"):
        event.save()
    with pytest.raises(ValueError, match="append-only"):
        event.delete()


def test_default_targets_are_the_fixed_versions_in_each_nodes_own_branch_most_urgent_first(people):
    from advisories.models import Advisory, AffectedRange, Exposure
    from tests.campaigns.fleet import add_node

    fleet, cluster = make_fleet(nodes=2, spares=0)
    add_node(fleet, cluster, "r580", driver="580.82.07", labels={"sweep": "yes"}, workloads=0)
    advisory = Advisory.objects.create(publisher_id="5703", title="GPU Display Driver", source_kind="file",
                                       source="5703.json")
    now = timezone.now()
    for branch, fixed, detected, names, days in (("R570", FIXED, "570.86.15", ["gpu00", "gpu01"], 30),
                                                 ("R580", "580.95.05", "580.82.07", ["r580"], 5)):
        rng = AffectedRange.objects.create(advisory=advisory, product_id=f"linux{branch}", component="driver",
                                           branch=branch, raw=f"prior to {fixed}", fixed_version=fixed)
        for name in names:
            Exposure.objects.create(node=Node.objects.get(name=name), advisory=advisory, affected_range=rng,
                                    component="driver", detected_version=detected, first_seen=now,
                                    deadline=now + timedelta(days=days))
    requester, _approver, _ = people
    campaign = Campaign.objects.create(name="from advisories", requested_by=requester,
                                       node_selector={"sweep": "yes"}, parallelism_per_cluster="1")
    campaign.advisories.add(advisory)
    plan = services.make_plan(campaign.pk, requester)
    nodes = {item["name"]: item for item in plan.content["nodes"].values()}
    assert nodes["gpu00"]["target"] == {"driver": FIXED}
    assert nodes["r580"]["target"] == {"driver": "580.95.05"}
    assert nodes["r580"]["wave"] == 1, "the earliest deadline goes first"


def test_a_workload_that_policy_waits_for_holds_the_node_until_it_ends(people):
    fleet, _ = make_fleet(nodes=1, spares=1)
    requester, approver, _ = people
    campaign = approved_campaign(requester, approver, workload_overrides={"job-gpu00-w0": "wait"})
    services.start(campaign.pk, requester)
    drive(campaign.pk, rounds=5)
    sweep = NodeSweep.objects.get(campaign=campaign)
    assert sweep.state == SweepState.CHECKPOINTING and sweep.lease_owner == ""
    assert EvidenceEvent.objects.filter(sweep=sweep, kind="waiting").exists()
    assert fleet.snapshot()["nodes"]["local/gpu00"]["patches"] == {}
    fleet.finish("local/gpu00", "gpu00-w0")
    assert drive(campaign.pk).status == CampaignStatus.COMPLETED
    assert WorkloadMove.objects.get(sweep=sweep).state == MoveState.FINISHED


def test_a_workload_that_cannot_be_checkpointed_cold_restarts_only_when_allowed(people):
    fleet, _ = make_fleet(nodes=1, spares=1, engine="none")
    requester, approver, _ = people
    refused = approved_campaign(requester, approver)
    services.start(refused.pk, requester)
    drive(refused.pk)
    sweep = NodeSweep.objects.get(campaign=refused)
    assert sweep.state == SweepState.FAILED and "cold restart is not allowed" in sweep.error
    assert fleet.snapshot()["nodes"]["local/gpu00"]["patches"] == {}
    allowed = approved_campaign(requester, approver, cold_restart_allowed=True)
    assert allowed.approved_plan.content["cold_starts"][0]["workload"] == "gpu00-w0"
    services.start(allowed.pk, requester)
    assert drive(allowed.pk).status == CampaignStatus.COMPLETED
    assert WorkloadMove.objects.get(sweep__campaign=allowed).state == MoveState.STOPPED
    assert EvidenceEvent.objects.filter(campaign=allowed, kind="stopped").exists()


class WorkerDied(BaseException):
    """Stands for SIGKILL at an exact line: nothing after it runs, nothing is cleaned up."""


@pytest.mark.parametrize("dies_in", ["_checkpointed", "_resumed"])
def test_a_worker_dying_right_after_the_agent_acted_loses_and_duplicates_nothing(people, monkeypatch, dies_in):
    fleet, _ = make_fleet(nodes=1, spares=2)
    requester, approver, _ = people
    campaign = approved_campaign(requester, approver)
    services.start(campaign.pk, requester)
    engine.dispatch(campaign.pk)
    sweep = NodeSweep.objects.get(campaign=campaign)
    real = getattr(steps, dies_in)

    def die_once(*args, **kwargs):
        monkeypatch.setattr(steps, dies_in, real)
        raise WorkerDied

    monkeypatch.setattr(steps, dies_in, die_once)
    with pytest.raises(WorkerDied):
        for _ in range(3):
            engine.advance(sweep.pk)
    # The lease of the dead worker runs out; the step is driven again.
    NodeSweep.objects.filter(pk=sweep.pk).update(step_deadline=timezone.now() - timedelta(seconds=1))
    assert drive(campaign.pk).status == CampaignStatus.COMPLETED
    snapshot = fleet.snapshot()
    copies = [(name, w) for name, n in snapshot["nodes"].items() for w in n["workloads"].values()
              if w["state"] == "running"]
    assert len(copies) == 1 and copies[0][0].startswith("local/spare")
    move = WorkloadMove.objects.get(sweep=sweep)
    assert move.state == MoveState.RESTORED and move.steps_after >= move.steps_before > 0
    assert snapshot["nodes"]["local/gpu00"]["patches"] == {"driver": 1}


def test_abort_lets_a_node_already_patching_finish_and_skips_the_rest(people):
    fleet, _ = make_fleet(nodes=3, spares=2)
    requester, approver, _ = people
    campaign = approved_campaign(requester, approver, parallelism_per_cluster="1")
    services.start(campaign.pk, requester)
    engine.dispatch(campaign.pk)
    sweep = NodeSweep.objects.get(campaign=campaign, state=SweepState.DRAINING)
    while NodeSweep.objects.get(pk=sweep.pk).state != SweepState.PATCHING:
        engine.advance(sweep.pk, max_steps=1)
    services.abort(campaign.pk, requester)
    drive(campaign.pk)
    states = sorted(NodeSweep.objects.filter(campaign=campaign).values_list("state", flat=True))
    assert states == [SweepState.DONE, SweepState.SKIPPED, SweepState.SKIPPED]
    assert fleet.snapshot()["nodes"][f"local/{sweep.node.name}"]["versions"]["driver"] == FIXED
    assert Campaign.objects.get(pk=campaign.pk).status == CampaignStatus.ABORTED


def test_an_operator_resumes_a_halted_campaign(people):
    fleet, _ = make_fleet(nodes=3, spares=2)
    fleet.inject("patch", "*", "permanent", times=1)
    requester, approver, _ = people
    campaign = approved_campaign(requester, approver, error_budget="0", parallelism_per_cluster="1")
    services.start(campaign.pk, requester)
    assert drive(campaign.pk).status == CampaignStatus.HALTED
    services.resume(campaign.pk, requester)
    campaign = drive(campaign.pk)
    assert campaign.status == CampaignStatus.COMPLETED
    states = sorted(NodeSweep.objects.filter(campaign=campaign).values_list("state", flat=True))
    assert states == [SweepState.DONE, SweepState.DONE, SweepState.FAILED]


def test_a_workload_that_cannot_move_comes_home_and_its_node_returns_to_service(people):
    fleet, _ = make_fleet(nodes=1, spares=1)
    # Every restore away from home fails: the workload must be restored on its own node, which
    # therefore has to leave maintenance first (a node in maintenance admits no work).
    fleet.inject("restore", "local/spare00", "permanent", times=10)
    requester, approver, _ = people
    campaign = approved_campaign(requester, approver, error_budget="1")
    services.start(campaign.pk, requester)
    drive(campaign.pk)
    sweep = NodeSweep.objects.get(node__name="gpu00")
    assert sweep.state == SweepState.FAILED
    node = fleet.snapshot()["nodes"]["local/gpu00"]
    assert node["patches"] == {} and node["maintenance"] is False
    assert [w["state"] for w in node["workloads"].values()].count("running") == 1
    assert WorkloadMove.objects.get(sweep=sweep).state == MoveState.RETURNED
    assert Node.objects.get(name="gpu00").service_state == "in_service"


def test_admission_reads_pending_nodes_a_page_at_a_time_in_plan_order(people, monkeypatch):
    make_fleet(nodes=5, spares=2)
    requester, approver, _ = people
    campaign = approved_campaign(requester, approver, parallelism_per_cluster="3")
    services.start(campaign.pk, requester)
    monkeypatch.setattr(admission, "ADMIT_PAGE", 2)  # the three admitted take two pages
    admitted = engine.dispatch(campaign.pk)
    in_order = list(NodeSweep.objects.filter(campaign=campaign).order_by("wave", "position").values_list(
        "pk", flat=True))
    assert admitted == in_order[:3]
    assert set(NodeSweep.objects.filter(pk__in=in_order[3:]).values_list("state", flat=True)) == {SweepState.PENDING}
    # The cluster is at its limit: the next dispatch admits nobody.
    assert engine.dispatch(campaign.pk) == []


def test_the_worker_that_ends_a_sweep_admits_the_next_node(people, django_capture_on_commit_callbacks):
    make_fleet(nodes=2, spares=2)
    requester, approver, _ = people
    campaign = approved_campaign(requester, approver, parallelism_per_cluster="1")
    services.start(campaign.pk, requester)
    sent = []
    queue.ENQUEUE.insert(0, lambda task, object_id, countdown: sent.append((task, object_id)))
    try:
        [first] = engine.dispatch(campaign.pk)
        with django_capture_on_commit_callbacks(execute=True):
            assert engine.advance(first) == SweepState.DONE
    finally:
        queue.ENQUEUE.pop(0)
    second = NodeSweep.objects.exclude(pk=first).get(campaign=campaign)
    assert second.state == SweepState.DRAINING, "admitted by the worker that finished the first"
    assert [task for task in sent if task[0] == "dispatch"] == []
    assert ("advance", second.pk) in sent


def test_an_abort_during_a_step_unwinds_the_node_before_its_next_step(people, monkeypatch):
    fleet, _ = make_fleet(nodes=1, spares=1)
    requester, approver, _ = people
    campaign = approved_campaign(requester, approver)
    services.start(campaign.pk, requester)
    [sweep_id] = engine.dispatch(campaign.pk)
    drain = MemoryExecutor.drain

    def drain_then_abort(self: MemoryExecutor, node: Any, operation_id: str) -> None:
        drain(self, node, operation_id)
        services.abort(campaign.pk, requester, reason="change freeze")

    monkeypatch.setattr(MemoryExecutor, "drain", drain_then_abort)
    # The same worker goes on after the drain: it learns of the abort with that transition.
    assert engine.advance(sweep_id) == SweepState.ROLLED_BACK
    kinds = list(EvidenceEvent.objects.filter(sweep_id=sweep_id).order_by("node_seq").values_list("kind", flat=True))
    assert "checkpointed" not in kinds and kinds[-1] == SweepState.ROLLED_BACK
    node = fleet.snapshot()["nodes"]["local/gpu00"]
    assert node["patches"] == {} and node["maintenance"] is False
