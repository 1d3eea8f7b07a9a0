"""The engine's rules (issue 11) with the memory executor (a test double: no agents, no heartbeats)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from advisories.choices import ExposureState
from advisories.models import Advisory, Exposure
from campaigns import engine, services
from campaigns.choices import CampaignStatus, EvidenceKind, MoveState, SweepState
from campaigns.models import Campaign, EvidenceEvent, NodeSweep, WorkloadMove
from inventory.models import ChangeLog, Cluster, Node
from tests.campaigns.fleet import FIXED, OLD, add_node, approved_campaign, drive, driver_advisory, make_fleet, user

pytestmark = pytest.mark.django_db


@pytest.fixture
def people():
    return user("rita", "operator"), user("alan", "approver")


def _exposed(nodes: list[Node]) -> Advisory:
    return driver_advisory(nodes)


def test_a_campaign_with_no_heartbeats_remediates_its_exposures_and_logs_every_change(
        people, django_capture_on_commit_callbacks):
    _fleet, _cluster = make_fleet(nodes=2, spares=2)
    swept = list(Node.objects.filter(name__startswith="gpu"))
    advisory = _exposed(swept)
    assert Exposure.objects.filter(node__in=swept, state=ExposureState.OPEN).count() == 2
    requester, approver = people
    campaign = Campaign.objects.create(name="from the advisory", requested_by=requester, canary="0",
                                       node_selector={"sweep": "yes"}, parallelism_per_cluster="2")
    campaign.advisories.add(advisory)
    services.make_plan(campaign.pk, requester)
    services.approve(campaign.pk, approver)
    services.start(campaign.pk, requester)
    with django_capture_on_commit_callbacks(execute=True):
        campaign = drive(campaign.pk)
    assert campaign.status == CampaignStatus.COMPLETED
    for node in swept:
        sweep = NodeSweep.objects.get(campaign=campaign, node=node)
        exposure = Exposure.objects.get(node=node, advisory=advisory)
        assert exposure.state == ExposureState.REMEDIATED
        assert exposure.fixed_by_version == FIXED
        assert exposure.remediated_by == f"campaign {campaign.pk}, sweep {sweep.pk}"
        logs = ChangeLog.objects.filter(object_type="node", object_id=node.pk, source="campaign").order_by("id")
        assert [log.changes for log in logs if "component:driver" in log.changes] == [
            {"component:driver": [OLD, FIXED]}]
        states = [tuple(log.changes["service_state"]) for log in logs if "service_state" in log.changes]
        assert states == [("in_service", "draining"), ("draining", "patching"), ("patching", "in_service")]
        assert {log.reference for log in logs} == {f"campaign {campaign.pk}, sweep {sweep.pk}"}
    # The memory executor sent no heartbeat: the inventory learnt the versions from the campaign.
    assert set(Node.objects.filter(pk__in=[n.pk for n in swept]).values_list(
        "components__version", flat=True)) == {FIXED, "12.8"}


def _signal_pool(count: int, engine_name: str = "signal") -> tuple[object, Cluster]:
    fleet, cluster = make_fleet(nodes=0, spares=0)
    for index in range(count):
        add_node(fleet, cluster, f"gpu{index:02d}", labels={"sweep": "yes"}, engine=engine_name)
    return fleet, cluster


def test_a_pool_of_signal_workloads_sweeps_itself_with_no_spare_and_every_counter_continues(people):
    fleet, _cluster = _signal_pool(6)
    requester, approver = people
    campaign = approved_campaign(requester, approver, parallelism_per_cluster="1")
    plan = campaign.approved_plan.content
    assert plan["summary"]["cold_starts"] == plan["summary"]["no_capacity"] == 0
    services.start(campaign.pk, requester)
    assert drive(campaign.pk, rounds=400).status == CampaignStatus.COMPLETED
    waves = dict(NodeSweep.objects.filter(campaign=campaign).values_list("node__name", "wave"))
    first = NodeSweep.objects.get(campaign=campaign, wave=1)
    [first_move] = WorkloadMove.objects.filter(sweep=first)
    assert waves[first_move.target_node.name] >= 3, "the first node's work goes to a node not yet drained"
    later = WorkloadMove.objects.filter(sweep__campaign=campaign, sweep__wave__gte=3, state=MoveState.RESTORED)
    assert any(waves[m.target_node.name] < m.sweep.wave for m in later), "later work lands on patched nodes"
    for move in WorkloadMove.objects.filter(sweep__campaign=campaign):
        assert move.state == MoveState.RESTORED
        assert move.steps_after >= move.steps_before > 0, "each counter goes on from where it stopped"
    snapshot = fleet.snapshot()
    running = [w for n in snapshot["nodes"].values() for w in n["workloads"].values() if w["state"] == "running"]
    assert sorted(w["name"] for w in running) == sorted(f"job-gpu{i:02d}-w0" for i in range(6))
    assert all(n["versions"]["driver"] == FIXED for n in snapshot["nodes"].values())


def test_with_the_cuda_engine_the_same_pool_names_the_last_groups_choice(people):
    _signal_pool(6, engine_name="cuda")
    requester, approver = people
    waits = approved_campaign(requester, approver, parallelism_per_cluster="1", workload_policy="wait").approved_plan
    assert len(waits.content["finish_first"]) >= 1
    assert all("waits for" in " ".join(waits.content["nodes"][str(f["node"])]["risks"])
               for f in waits.content["finish_first"])
    colds = approved_campaign(requester, approver, name="cold", parallelism_per_cluster="1",
                              cold_restart_allowed=True).approved_plan.content
    assert colds["cold_starts"], "the last group has no old-driver node left to go to"
    cold_nodes = {c["node"] for c in colds["cold_starts"]}
    # The last group: no node on the old driver is left outside its wave and the next.
    assert {n for w in colds["waves"][-2:] for n in w["nodes"]} <= cold_nodes
    assert colds["nodes"][str(colds["waves"][0]["nodes"][0])]["moves"][0]["action"] == "migrate"
    assert all(c["restarted_by"] == "" and "nobody restarts it" in c["why"] for c in colds["cold_starts"])


def test_a_permanent_error_with_a_failing_unwind_fails_the_node_once(people):
    fleet, _ = make_fleet(nodes=2, spares=2)
    fleet.inject("checkpoint", "local/gpu00", "permanent", times=10)
    fleet.inject("undo", "local/gpu00", "permanent", times=10)
    requester, approver = people
    campaign = approved_campaign(requester, approver, error_budget="1", parallelism_per_cluster="1")
    services.start(campaign.pk, requester)
    assert drive(campaign.pk).status == CampaignStatus.COMPLETED
    sweep = NodeSweep.objects.get(node__name="gpu00")
    assert sweep.state == SweepState.FAILED and sweep.attempt == 1
    assert "injected permanent fault in checkpoint" in sweep.error
    failed = EvidenceEvent.objects.get(sweep=sweep, kind=EvidenceKind.FAILED)
    assert "injected permanent fault in undo" in failed.data["unwind_error"]
    assert failed.data["left"] == "drained"
    assert Node.objects.get(name="gpu00").service_state == "draining", "left as the evidence says"
    kinds = list(EvidenceEvent.objects.filter(sweep=sweep).order_by("node_seq").values_list("kind", flat=True))
    assert kinds.count(EvidenceKind.STEP_FAILED) == 1 and kinds[-1] == EvidenceKind.FAILED
    # Nothing more happens to it, however often it is driven.
    count = EvidenceEvent.objects.filter(sweep=sweep).count()
    NodeSweep.objects.filter(pk=sweep.pk).update(step_deadline=timezone.now() - timedelta(seconds=1))
    engine.redrive()
    engine.advance(sweep.pk)
    assert EvidenceEvent.objects.filter(sweep=sweep).count() == count
    # The error budget counted it: one more failure halts the campaign.
    assert NodeSweep.objects.get(node__name="gpu01").state == SweepState.DONE
    other = approved_campaign(requester, approver, name="again", error_budget="0", node_selector={"names": ["gpu01"]},
                              target_versions={"driver": "570.211.01"})
    fleet.inject("patch", "local/gpu01", "permanent")
    services.start(other.pk, requester)
    assert drive(other.pk).status == CampaignStatus.HALTED


def test_a_node_the_executor_cannot_reach_is_blocked_at_planning(people):
    cluster = Cluster.objects.create(name="agents", kind="static", connection={"executor": "local"})
    reachable = Node.objects.create(cluster=cluster, name="a", gpu_model="H100", gpu_count=8,
                                    agent_endpoint="http://127.0.0.1:1")
    Node.objects.create(cluster=cluster, name="b", gpu_model="H100", gpu_count=8)
    for node in Node.objects.filter(cluster=cluster):
        node.components.create(component="driver", version=OLD, branch="R570",
                               version_key="000000570.000000086.000000015")
    requester, _approver = people
    campaign = Campaign.objects.create(name="reach", requested_by=requester, clusters=["agents"], canary="0",
                                       target_versions={"driver": FIXED})
    content = services.make_plan(campaign.pk, requester).content
    reasons = {b["name"]: b["reason"] for b in content["blocked"]}
    assert "no agent endpoint" in reasons["b"]
    # `a` has an endpoint, but nothing answers there: its state cannot be read, so it is blocked too.
    assert "could not be read" in reasons["a"] and str(reachable.pk) not in content["nodes"]
    assert content["nodes"] == {} and content["summary"]["blocked"] == 2
    services.approve(campaign.pk, _approver)
    with pytest.raises(services.CampaignError, match="its plan sweeps no node; blocked: "):
        services.start(campaign.pk, requester)


def test_a_failing_canary_halts_the_campaign_with_no_other_node_drained(people):
    fleet, _ = make_fleet(nodes=5, spares=2)
    requester, approver = people
    campaign = approved_campaign(requester, approver, canary="auto", soak_s=0, parallelism_per_cluster="3",
                                 error_budget="2")
    [canary] = campaign.approved_plan.content["canary"]["nodes"]
    fleet.set_healthy(f"local/{Node.objects.get(pk=canary).name}", False)  # its verification will fail
    services.start(campaign.pk, requester)
    campaign = drive(campaign.pk)
    assert campaign.status == CampaignStatus.HALTED and "the canary failed" in campaign.status_reason
    states = dict(NodeSweep.objects.filter(campaign=campaign).values_list("node_id", "state"))
    assert states.pop(canary) == SweepState.FAILED
    assert set(states.values()) == {SweepState.PENDING}
    snapshot = fleet.snapshot()["nodes"]
    assert not any(n["maintenance"] for name, n in snapshot.items() if not name.endswith(
        Node.objects.get(pk=canary).name)), "no other node was drained"
    assert EvidenceEvent.objects.filter(campaign=campaign, kind=EvidenceKind.CANARY_FAILED).exists()


def test_the_canary_soaks_before_the_next_wave_and_the_soak_is_in_the_evidence(people, time_machine):
    time_machine.move_to(timezone.now(), tick=True)  # a clock that runs, and is moved past the soak below
    make_fleet(nodes=3, spares=2)
    requester, approver = people
    campaign = approved_campaign(requester, approver, canary="1", soak_s=2, parallelism_per_cluster="2")
    services.start(campaign.pk, requester)
    drive(campaign.pk, rounds=5)
    states = sorted(NodeSweep.objects.filter(campaign=campaign).values_list("wave", "state"))
    assert states[0] == (1, SweepState.DONE) and {s for _w, s in states[1:]} == {SweepState.PENDING}
    soaking = EvidenceEvent.objects.get(campaign=campaign, kind=EvidenceKind.SOAKING)
    assert soaking.data["soak_s"] == 2
    time_machine.shift(timedelta(seconds=2.2))
    assert drive(campaign.pk).status == CampaignStatus.COMPLETED
    soaked = EvidenceEvent.objects.get(campaign=campaign, kind=EvidenceKind.SOAKED)
    assert soaked.data["soaked_s"] >= 2 and soaked.at > soaking.at
    first_of_wave_2 = EvidenceEvent.objects.filter(campaign=campaign, kind=EvidenceKind.ADMITTED,
                                                   sweep__wave=2).order_by("at").first()
    assert first_of_wave_2.at >= soaked.at


def test_a_node_someone_else_holds_is_held_in_the_plan_and_keeps_its_hold(people):
    fleet, _ = make_fleet(nodes=3, spares=2)
    fleet.hold("local/gpu01", "admin", "RMA 4711")
    requester, approver = people
    skipping = approved_campaign(requester, approver)
    held = skipping.approved_plan.content["held"]
    assert [h["name"] for h in held] == ["gpu01"] and "RMA 4711" in held[0]["hold"]
    assert str(Node.objects.get(name="gpu01").pk) not in skipping.approved_plan.content["nodes"]
    services.start(skipping.pk, requester)
    assert drive(skipping.pk).status == CampaignStatus.COMPLETED
    gpu01 = fleet.snapshot()["nodes"]["local/gpu01"]
    assert gpu01["patches"] == {} and gpu01["holds"] == {"admin": "RMA 4711"}
    # Swept while keeping the other hold: patched, and still out of service at the end.
    sweeping = approved_campaign(requester, approver, name="sweep held", held_nodes="sweep",
                                 node_selector={"names": ["gpu01"]})
    services.start(sweeping.pk, requester)
    assert drive(sweeping.pk).status == CampaignStatus.COMPLETED
    gpu01 = fleet.snapshot()["nodes"]["local/gpu01"]
    assert gpu01["versions"]["driver"] == FIXED and gpu01["holds"] == {"admin": "RMA 4711"}
    assert not gpu01["maintenance"], "no mark of gpusweep's is left"
    done = EvidenceEvent.objects.get(campaign=sweeping, kind=EvidenceKind.STEP_DONE, data__step="returning")
    assert "RMA 4711" in done.data["foreign_hold_kept"]["held_now"]
    assert Node.objects.get(name="gpu01").service_state == "offline"


def test_an_abort_leaves_someone_elses_hold_in_place(people):
    fleet, _ = make_fleet(nodes=2, spares=2)
    fleet.hold("local/gpu00", "admin", "bad fan")
    requester, approver = people
    campaign = approved_campaign(requester, approver, held_nodes="sweep", parallelism_per_cluster="2")
    services.start(campaign.pk, requester)
    engine.dispatch(campaign.pk)
    for sweep in NodeSweep.objects.filter(campaign=campaign, state=SweepState.DRAINING):
        engine.advance(sweep.pk, max_steps=2)
    services.abort(campaign.pk, requester)
    drive(campaign.pk)
    snapshot = fleet.snapshot()["nodes"]
    assert snapshot["local/gpu00"]["holds"] == {"admin": "bad fan"}
    assert not any(n["maintenance"] for n in snapshot.values()), "no mark of gpusweep's is left"


def test_a_restore_the_back_end_could_not_verify_is_said_so_in_the_evidence(people, monkeypatch):
    """Issue 27: a back end that saw the workload run but not its state come back (the Kubernetes kubelet path
    without a progress marker) says why; the engine writes it into the restored event as it is."""
    from dataclasses import replace

    from executors.memory import MemoryExecutor

    real = MemoryExecutor.restore
    monkeypatch.setattr(MemoryExecutor, "restore", lambda self, *args: replace(
        real(self, *args), unverified="restore unverified: no progress marker"))
    make_fleet(nodes=1, spares=1)
    campaign = approved_campaign(*people)
    services.start(campaign.pk, people[0])
    assert drive(campaign.pk).status == CampaignStatus.COMPLETED
    restored = EvidenceEvent.objects.filter(campaign=campaign, kind=EvidenceKind.RESTORED)
    assert restored and all(e.data["unverified"] == "restore unverified: no progress marker" for e in restored)
