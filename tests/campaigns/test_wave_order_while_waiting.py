"""Issue 32: a node waiting for a receiver keeps its slot but does not hold the wave order.

The engine's wave order (campaigns.policy.admits) starts wave v once every wave up to v-2 is done.
A node whose workload no node could receive now waits for it (campaigns.engine.steps._wait_first, up
to the campaign's wait limit); while it waits for that alone its sweep carries `waiting_since`, and
dispatch leaves it out of the lowest wave (receivers are looked for again at every look, and
choose_target never picks a node being swept), while it still counts against the parallelism limit.
Once it stops waiting (a receiver appears, the workload ends, the wait limit fails the node) it holds
the order as before.

Fleet: gpu00 is the only A100 (its CRIU workload's image needs an A100 on the old driver: no node
could receive it); gpu01 to gpu07 are H100s with nothing to move. Parallelism 2, waves of 2.
Runs on the memory executor (a test double, executors/memory.py): the rule is the engine's.
About 7 s of test time in all (13 s with the test database set up) on the shared 2-core VM.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from campaigns import engine, services
from campaigns.choices import MoveState, SweepState
from campaigns.engine.ending import RunAgain, end_step
from campaigns.models import Campaign, EvidenceEvent, NodeSweep, WorkloadMove
from executors.memory import Fleet, MemoryExecutor
from inventory.models import Cluster, Node
from tests.campaigns.fleet import add_node, approved_campaign, user

pytestmark = pytest.mark.django_db


@pytest.fixture
def people():
    return user("rita", "operator"), user("alan", "approver")


def _fleet(tag: str) -> tuple[Fleet, Cluster, Node]:
    fleet = Fleet()
    fleet.reset()
    cluster = Cluster.objects.create(name=tag, kind="static", connection={"executor": "memory"})
    waiter = add_node(fleet, cluster, "gpu00", labels={"sweep": tag}, gpu_model="A100", workloads=1)
    for index in range(1, 8):
        add_node(fleet, cluster, f"gpu{index:02d}", labels={"sweep": tag}, workloads=0)
    return fleet, cluster, waiter


def _campaign(people: tuple[Any, Any], tag: str, **fields: Any) -> Campaign:
    requester, approver = people
    campaign = approved_campaign(requester, approver, node_selector={"sweep": tag}, **fields)
    services.start(campaign.pk, requester)
    return campaign


def _sweeps(campaign: Campaign) -> dict[str, NodeSweep]:
    return {s.node.name: s for s in NodeSweep.objects.filter(campaign=campaign).select_related("node")}


def _round(campaign: Campaign) -> int:
    """One dispatch and one step of every working sweep, as workers do; the nodes working meanwhile."""
    engine.dispatch(campaign.pk)
    working = list(NodeSweep.objects.filter(campaign=campaign, state__in=SweepState.WORKING))
    for sweep in working:
        engine.advance(sweep.pk, max_steps=1)
    return len(working)


def test_a_node_waiting_for_a_receiver_keeps_its_slot_but_not_the_wave_order(people, monkeypatch):
    """gpu00 (wave 1) waits for a receiver: every other node is patched meanwhile, waves 3 and 4
    included, never more than one beside it (the limit is 2: gpu00 keeps its slot); under the old rule
    waves 3 and 4 would wait for gpu00. Then an A100 on the old driver joins: gpu00's next look finds
    it, and the node goes on, holding the order again, and is patched."""
    fleet, cluster, waiter = _fleet("wo-receiver")
    campaign = _campaign(people, "wo-receiver")
    sweeps = _sweeps(campaign)
    assert sweeps["gpu00"].wave == 1 and max(s.wave for s in sweeps.values()) == 4
    [planned] = campaign.approved_plan.content["nodes"][str(waiter.pk)]["moves"]
    assert planned["action"] == "blocked"
    most = 0
    for _ in range(200):
        most = max(most, _round(campaign))
        if all(s.state == SweepState.DONE for name, s in _sweeps(campaign).items() if name != "gpu00"):
            break
    sweeps = _sweeps(campaign)
    assert all(s.state == SweepState.DONE for name, s in sweeps.items() if name != "gpu00"), {
        n: s.state for n, s in sweeps.items()
    }
    assert most <= 2, "the waiting node keeps its slot: one other node at a time"
    gpu00 = sweeps["gpu00"]
    assert gpu00.state == SweepState.CHECKPOINTING and gpu00.waiting_since is not None
    wait = EvidenceEvent.objects.filter(sweep=gpu00, kind="waiting").first()
    assert wait is not None and wait.data["for_receiver"] is True
    assert "no node where the checkpoint of job-gpu00-w0 would be valid" in wait.data["reason"]
    # A receiver appears: the next look finds it, and the node holds the order again before anything
    # of it is checkpointed (no dispatch meanwhile drains a later wave its workload may go to).
    add_node(fleet, cluster, "spare-a100", labels={"sweep": "no"}, gpu_model="A100", workloads=0)
    seen: list[Any] = []
    real = MemoryExecutor.checkpoint

    def checkpoint(self: MemoryExecutor, *args: Any, **kwargs: Any) -> Any:
        seen.append(NodeSweep.objects.values_list("waiting_since", flat=True).get(pk=gpu00.pk))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(MemoryExecutor, "checkpoint", checkpoint)
    for _ in range(50):
        _round(campaign)
        if Campaign.objects.get(pk=campaign.pk).status == "completed":
            break
    gpu00.refresh_from_db()
    assert gpu00.state == SweepState.DONE and gpu00.waiting_since is None
    [move] = WorkloadMove.objects.filter(sweep=gpu00)
    assert move.state == MoveState.RESTORED and move.target_node is not None
    assert move.target_node.name == "spare-a100"
    assert seen == [None]


def _at(campaign: Campaign, states: dict[str, str], waiting: set[str]) -> None:
    """Put the campaign's sweeps where a test needs them (the engine's own steps get them there in the
    test above; here only admission is looked at)."""
    for name, sweep in _sweeps(campaign).items():
        NodeSweep.objects.filter(pk=sweep.pk).update(
            state=states.get(name, sweep.state), waiting_since=timezone.now() if name in waiting else None
        )


def test_admission_leaves_a_waiting_node_out_of_the_wave_order_and_in_its_slot(people):
    """Admission alone: gpu00 (wave 1) checkpointing, every other node of waves 1 and 2 done. While
    gpu00 waits for a receiver, wave 3 is admitted, one node, the limit of 2 less gpu00's slot; once
    it stops waiting (the same sweep, `waiting_since` cleared) it holds the order: nothing of wave 3
    or later starts, as before this rule."""
    _fleet("wo-admit")
    campaign = _campaign(people, "wo-admit")
    sweeps = _sweeps(campaign)
    by_wave: dict[int, list[str]] = {}
    for name, sweep in sorted(sweeps.items(), key=lambda item: (item[1].wave, item[1].position)):
        by_wave.setdefault(sweep.wave, []).append(name)
    assert by_wave[1][0] == "gpu00" and len(by_wave[1]) == len(by_wave[2]) == 2
    done = {name: SweepState.DONE for name in [*by_wave[1][1:], *by_wave[2]]}
    _at(campaign, {**done, "gpu00": SweepState.CHECKPOINTING}, waiting=set())
    assert engine.dispatch(campaign.pk) == []  # gpu00 goes on (or waits for its own work): wave 3 waits
    _at(campaign, {**done, "gpu00": SweepState.CHECKPOINTING}, waiting={"gpu00"})
    admitted = engine.dispatch(campaign.pk)
    assert [NodeSweep.objects.get(pk=pk).node.name for pk in admitted] == by_wave[3][:1]
    assert engine.dispatch(campaign.pk) == []  # both slots taken: gpu00's and the wave-3 node's
    # The wave-3 node is done; gpu00 still waits: the next wave-3 node starts, and then wave 4 may.
    _at(campaign, {by_wave[3][0]: SweepState.DONE}, waiting={"gpu00"})
    assert [NodeSweep.objects.get(pk=pk).node.name for pk in engine.dispatch(campaign.pk)] == by_wave[3][1:2]
    # gpu00 stops waiting (its receiver found): wave 4 (> 1 + 1) is held again, as before.
    _at(campaign, {by_wave[3][1]: SweepState.DONE}, waiting=set())
    assert engine.dispatch(campaign.pk) == []
    # Every node left waits for a receiver: nothing is pending to admit and the campaign is not complete.
    _at(campaign, {name: SweepState.DONE for name in by_wave[4]}, waiting={"gpu00"})
    assert engine.dispatch(campaign.pk) == []
    assert Campaign.objects.get(pk=campaign.pk).status == "running"


@pytest.mark.parametrize("case", ["finished", "past_the_limit", "cold_restart_allowed"])
def test_when_the_node_stops_waiting_it_ends_as_before(people, case):
    """The workload ends by itself: the node is patched, nothing moved. The wait limit passes: the
    node fails, unpatched, its workload untouched, and `waiting_since` is cleared with the failure.
    Cold restarts allowed: the node never waits (the workload is stopped at once), so it never
    leaves the order."""
    tag = f"wo-{case}".replace("_", "-")
    fleet, _cluster, _waiter = _fleet(tag)
    fields: dict[str, Any] = {"cold_restart_allowed": case == "cold_restart_allowed"}
    if case == "past_the_limit":
        fields["wait_limit"] = timedelta(seconds=1.5)
    campaign = _campaign(people, tag, **fields)
    started, waited = time.monotonic(), False
    for _ in range(300):
        _round(campaign)
        gpu00 = _sweeps(campaign)["gpu00"]
        waited = waited or gpu00.waiting_since is not None
        if case == "finished" and time.monotonic() - started > 0.5:
            fleet.finish(f"{tag}/gpu00", "gpu00-w0")
        if (
            Campaign.objects.get(pk=campaign.pk).status != "running"
            and not NodeSweep.objects.filter(campaign=campaign, state__in=SweepState.ACTIVE).exists()
        ):
            break
        time.sleep(0.02)
    gpu00 = _sweeps(campaign)["gpu00"]
    assert gpu00.waiting_since is None
    [move] = WorkloadMove.objects.filter(sweep=gpu00)
    workload = fleet.snapshot()["nodes"][f"{tag}/gpu00"]["workloads"]["gpu00-w0"]
    if case == "finished":
        assert waited and gpu00.state == SweepState.DONE and move.state == MoveState.FINISHED
    elif case == "past_the_limit":
        assert waited and gpu00.state == SweepState.FAILED and "still runs after the wait limit" in gpu00.error
        assert workload["state"] == "running"
    else:
        assert not waited and gpu00.state == SweepState.DONE and move.state == MoveState.STOPPED
        assert not EvidenceEvent.objects.filter(sweep=gpu00, kind="waiting").exists()


def test_waiting_since_is_kept_by_every_look_and_written_only_under_the_lease(people):
    """Idempotent and race-safe: the first look sets `waiting_since`; a later look (a retry after a
    worker died, the step re-driven) keeps the first look's time; a worker that no longer holds the
    lease writes nothing (its end is refused), so a racing worker can neither set nor clear it."""
    _fleet("wo-lease")
    campaign = _campaign(people, "wo-lease")
    for _ in range(20):
        _round(campaign)
        gpu00 = _sweeps(campaign)["gpu00"]
        if gpu00.waiting_since is not None:
            break
    first = gpu00.waiting_since
    assert first is not None
    # The step is driven again after its deadline (its worker died): the time is kept.
    NodeSweep.objects.filter(pk=gpu00.pk).update(step_deadline=timezone.now() - timedelta(seconds=1))
    assert engine.advance(gpu00.pk, worker="second", max_steps=1) == SweepState.CHECKPOINTING
    gpu00.refresh_from_db()
    assert gpu00.waiting_since == first
    # A worker without the lease ending the step (say, a stale one clearing the wait) writes nothing.
    stale = NodeSweep.objects.select_related("campaign", "node").get(pk=gpu00.pk)
    end_step(stale, "stale-worker", RunAgain(1.0, "retry", {"error": "late"}))
    gpu00.refresh_from_db()
    assert gpu00.waiting_since == first
    assert not EvidenceEvent.objects.filter(sweep=gpu00, kind="retry").exists()


def test_the_simulator_predicts_the_engines_order_while_a_node_waits_for_a_receiver(people):
    """The simulator (costs.strategies.sweep) follows the engine rule for rule: given this campaign's
    policy (costs.inputs.campaign_params) and the same fleet, with gpu00's workload as a service that
    never ends, it patches the other seven nodes in the order the engine did, one beside gpu00 at a
    time, and leaves gpu00 waiting; under the old rule (`hold`) it would not reach waves 3 and 4."""
    from datetime import UTC, datetime

    from costs import fleet as simfleet
    from costs.inputs import campaign_params
    from costs.model import Params
    from costs.placement import place
    from costs.strategies import INF, Scenario, sweep
    from costs.trace import Task, Trace

    _fleet("wo-sim")
    campaign = _campaign(people, "wo-sim")
    order: list[str] = []
    for _ in range(200):
        _round(campaign)
        for name, sweep_row in _sweeps(campaign).items():
            if sweep_row.state == SweepState.DONE and name not in order:
                order.append(name)
        if len(order) == 7:
            break
    assert "gpu00" not in order and len(order) == 7
    nodes = simfleet.from_cluster("wo-sim")
    service = Task(name="job-gpu00-w0", submit=0, start=0, end=None, milli=2000, limit=None, service=True, node="gpu00")
    trace = Trace(tasks=[service], origin=datetime(2026, 1, 1, tzinfo=UTC), end=30 * 86400.0, kind="sacct")
    base = Params(checkpoint_engine="criu", checkpointable_share=1.0, cadences=("monthly",))
    params = campaign_params(campaign.pk, base)
    assert params.wave_order == "strict" and params.last_group == "wait"

    def simulated(wave_order: str) -> list[float]:
        changed = params.with_(wave_order=wave_order)
        scenario = Scenario(nodes=nodes, trace=trace, placement=place(trace.tasks, nodes), params=changed, release=0.0)
        return sweep(scenario, changed.parallelism[0]).patched_at

    patched = simulated("strict")
    names = [n.name for n in nodes]
    assert patched[names.index("gpu00")] == INF
    predicted = sorted((t, name) for name, t in zip(names, patched, strict=True) if t < INF)
    assert [name for _t, name in predicted] == order
    held = simulated("hold")
    assert sum(1 for t in held if t < INF) < 7
