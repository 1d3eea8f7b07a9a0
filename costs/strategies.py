"""The three ways to patch a fleet, replayed on the same placed trace.

Every strategy starts when the advisory is released (R) and patches every node of the fleet.
Idle GPU-hours are GPU capacity out of service while it computes nothing (a drained node's free
GPUs, a node being patched, the fleet during a window, the hours held-back jobs could have run
before the window, work paused while it is checkpointed and restored). Recomputed GPU-hours are
the work lost by kills (`Scenario.kill_cost`); a cold start is a task killed and started over.
Tasks that would start on a node after it was drained go elsewhere in the fleet at no cost.

1. `window`: the next maintenance window opens `window_phase` x the cadence's period after R and
   lasts `window_hours`; every node is patched in it. A reservation set `reservation_days` ahead
   holds every task starting in those days whose limit crosses the window (it waits until the
   window ends); tasks still running when it opens are killed.
2. `drain_wait`: `scontrol reboot ASAP`, k nodes of each cluster at a time in name order: a node
   takes no new work, waits for its tasks to end (killing what still runs after `wait_limit_h`),
   is patched, returns, and the next node starts.
3. `sweep`: the campaign planner plans the sweep (`costs.planning.plan_sweep`: waves of k, the
   receivers of moved work, the driver-group rule for the last group) and nodes are admitted as
   the engine admits them; each node, in the engine's order, waits for the tasks the plan lets
   finish first, then checkpoints its checkpointable tasks to their receivers, cold-starts the
   rest, and is patched. Where cold restart is not allowed (`last_group` "fail", a campaign's
   default) a node whose checkpoint has no receiver, or whose waited task outlives the wait limit,
   fails as the engine fails it and stays unpatched. Tasks that arrived after R are moved if
   checkpointable, else follow `not_checkpointable`.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass, field

from campaigns import policy
from campaigns.planner import parse_limit
from costs.fleet import SimNode
from costs.model import CADENCE_DAYS, Params
from costs.placement import Placement
from costs.planning import BLOCKED, COLD_START, FINISH_FIRST, MIGRATE, RETURN_HOME, Resident, SweepPlan, plan_sweep
from costs.trace import Task, Trace

DAY = 86400.0
HOUR = 3600.0
INF = float("inf")


@dataclass
class Scenario:
    nodes: list[SimNode]
    trace: Trace
    placement: Placement
    params: Params
    release: float  # on the trace's clock

    @property
    def deadline(self) -> float:
        return self.release + self.params.deadline_days * DAY

    @property
    def patch_s(self) -> float:
        return self.params.patch_minutes * 60

    def gpus(self, task: Task) -> float:
        return task.milli / 1000

    def kill_cost(self, task: Task, at: float) -> float:
        """GPU-hours a kill at `at` throws away."""
        if task.service:
            return self.gpus(task) * self.params.service_warmup_min / 60
        elapsed = max(0.0, at - task.start)
        if self.params.save_every_h:
            elapsed %= self.params.save_every_h * HOUR
        return self.gpus(task) * elapsed / HOUR

    def checkpoint_s(self, task: Task, node: SimNode) -> float:
        gib = self.gpus(task) * self.params.gpu_memory(node.gpu_model) + task.memory_gib
        return gib * (self.params.checkpoint_s_per_gib + self.params.restore_s_per_gib)

    def placed(self) -> list[Task]:
        return [t for t, n in zip(self.trace.tasks, self.placement.node_of, strict=True) if n is not None]

    def residents(self, node: int, moment: float) -> list[int]:
        return [i for i in self.placement.by_node[node] if self.trace.tasks[i].alive(moment)]


@dataclass
class Outcome:
    strategy: str
    cadence: str
    patched_at: list[float]
    idle_gpu_hours: float = 0.0
    recomputed_gpu_hours: float = 0.0
    cold_starts: int = 0
    notes: list[str] = field(default_factory=list)
    plan_summary: dict[str, object] | None = None
    holds: list[Hold] = field(default_factory=list)


@dataclass(frozen=True)
class Failure:
    """A node the engine fails in a sweep (it stays unpatched), the workloads that failed it, and why."""

    node: str
    tasks: tuple[str, ...]
    why: str  # "no receiver for its checkpoint" or "outlived the wait limit"


@dataclass(frozen=True)
class Hold:
    """A workload that held a node's patch: the node waited `hours` for it, then it `ended`."""

    node: str
    task: str
    hours: float
    ended: str  # "finished" or "killed at the wait limit"


class Ledger:
    """Kills and idle time, added up."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.idle = 0.0
        self.recomputed = 0.0
        self.cold = 0
        self.holds: list[Hold] = []
        self.failures: list[Failure] = []

    def kill(self, task: Task, at: float) -> None:
        self.recomputed += self.scenario.kill_cost(task, at)
        self.cold += 1

    def outcome(self, strategy: str, cadence: str, patched: list[float], notes: list[str]) -> Outcome:
        return Outcome(strategy=strategy, cadence=cadence, patched_at=patched, idle_gpu_hours=self.idle,
                       recomputed_gpu_hours=self.recomputed, cold_starts=self.cold, notes=notes,
                       holds=sorted(self.holds, key=lambda h: (-h.hours, h.node, h.task)))


def window(scenario: Scenario, cadence: str) -> Outcome:
    p = scenario.params
    opens = scenario.release + p.window_phase * CADENCE_DAYS[cadence] * DAY
    length = p.window_hours * HOUR
    reserved_from = opens - p.reservation_days * DAY
    ledger = Ledger(scenario)
    ledger.idle = sum(n.gpus for n in scenario.nodes) * length / HOUR
    held = 0
    for task in scenario.placed():
        if reserved_from <= task.start < opens and (task.limit is None or task.start + task.limit > opens):
            held += 1
            ledger.idle += scenario.gpus(task) * (opens - task.start) / HOUR
        elif task.alive(opens):
            ledger.kill(task, opens)
    notes = [f"window opens {scenario.trace.at(opens):%Y-%m-%d %H:%M} UTC, {p.window_hours:g} h; "
             f"reservation from {p.reservation_days:g} days before held {held} task(s)"]
    if opens > scenario.trace.end:
        notes.append("the window opens after the trace ends: only the tasks the trace knows are held or killed")
    return ledger.outcome("window", cadence, [opens + length] * len(scenario.nodes), notes)


def _per_cluster(scenario: Scenario, parallelism: str) -> dict[str, int]:
    sizes: dict[str, int] = defaultdict(int)
    for node in scenario.nodes:
        sizes[node.cluster] += 1
    return {c: parse_limit(parallelism, size, "parallelism") for c, size in sizes.items()}


def _seen(since: float, moment: float, poll: float) -> float:
    """When a watcher that looks at `since` and every `poll` seconds after sees `moment` pass."""
    if poll <= 0 or moment <= since or moment == INF:
        return moment
    return since + math.ceil((moment - since) / poll - 1e-9) * poll


def _wait_for(scenario: Scenario, ledger: Ledger, tasks: list[Task], since: float, node: SimNode,
              poll: float = 0.0, kill: bool = True) -> float:
    """Wait for `tasks` to end (killing them at the wait limit, or with `kill` False leaving them
    running); the moment the node is seen empty, or the wait limit.

    With `poll`, the waiter looks every `poll` seconds (the engine's WAIT_POLL_S): an end, or the
    wait limit, counts at the first look after it. Adds the node's free GPUs over the wait to the
    idle hours."""
    until = _seen(since, max((t.ends() for t in tasks), default=since), poll)
    limit = scenario.params.wait_limit_h or 0.0
    killed = bool(limit) and until > since + limit * HOUR
    if killed:
        until = _seen(since, since + limit * HOUR, poll)
    at_limit = "killed at the wait limit" if kill else "still running at the wait limit: the node failed"
    for task in tasks:
        if task.ends() > since:
            ended = at_limit if task.alive(until) else "finished"
            ledger.holds.append(Hold(node.name, task.name, (min(task.ends(), until) - since) / HOUR, ended))
        if killed and kill and task.alive(until):
            ledger.kill(task, until)
    if until < INF:
        busy = sum(scenario.gpus(t) * (min(t.ends(), until) - since) for t in tasks)
        ledger.idle += (node.gpus * (until - since) - busy) / HOUR
    return until


def drain_wait(scenario: Scenario, parallelism: str) -> Outcome:
    ledger = Ledger(scenario)
    patched = [INF] * len(scenario.nodes)
    limits = _per_cluster(scenario, parallelism)
    slots: dict[str, list[float]] = {c: [scenario.release] * k for c, k in limits.items()}
    stuck = 0
    for node in sorted(scenario.nodes, key=lambda n: (n.cluster, n.pool, n.name)):
        starts = heapq.heappop(slots[node.cluster])
        if starts == INF:
            heapq.heappush(slots[node.cluster], INF)
            stuck += 1
            continue
        tasks = [scenario.trace.tasks[i] for i in scenario.residents(node.index, starts)]
        empty = _wait_for(scenario, ledger, tasks, starts, node)
        if empty == INF:
            stuck += 1
            heapq.heappush(slots[node.cluster], INF)
            continue
        patched[node.index] = empty + scenario.patch_s
        ledger.idle += node.gpus * scenario.patch_s / HOUR
        heapq.heappush(slots[node.cluster], patched[node.index])
    notes = [f"{k} node(s) at a time in {c}" for c, k in limits.items()]
    if stuck:
        notes.append(f"{stuck} node(s) never patched: a task without end holds its drain (no wait limit)")
    return ledger.outcome("drain_wait", parallelism, patched, notes)


def plan_of(scenario: Scenario, parallelism: str) -> SweepPlan:
    p = scenario.params
    residents: dict[int, list[Resident]] = {}
    slowest = 0.0
    for node in scenario.nodes:
        here = scenario.residents(node.index, scenario.release)
        residents[node.index] = [
            Resident(task=i, name=scenario.trace.tasks[i].name, milli=scenario.trace.tasks[i].milli,
                     checkpointable=p.checkpointable(scenario.trace.tasks[i].name),
                     constrained=bool(scenario.trace.tasks[i].gpu_models)) for i in here]
        slowest = max(slowest, sum(scenario.checkpoint_s(scenario.trace.tasks[i], node) for i in here))
    versions_known = any("driver" in n.versions for n in scenario.nodes)
    nodes = scenario.nodes if versions_known else [
        SimNode(index=n.index, name=n.name, gpus=n.gpus, cluster=n.cluster, pool=n.pool, gpu_model=n.gpu_model,
                versions={"driver": "unpatched", **n.versions}) for n in scenario.nodes]
    return plan_sweep(
        nodes, residents, start=scenario.trace.at(scenario.release), parallelism=parallelism,
        node_seconds=max(1, math.ceil(scenario.patch_s + slowest)), target={"driver": "fixed"},
        last_group_cold_restart=p.last_group == "cold_restart",
        not_checkpointable_waits=p.not_checkpointable == "wait",
        deadline=scenario.trace.at(scenario.deadline), checkpoint_engine=p.checkpoint_engine,
        canary=p.canary, soak_s=round(p.soak_minutes * 60), growth=p.wave_growth, growth_step=p.growth_step,
    )


@dataclass
class Turn:
    """One node's turn in a sweep: when it is back, patched (INF: never: it failed, or it waits for
    work without end), and when it gives back its slot and stops holding the wave order (when it
    ends, in the engine: patched or failed; with `Params.wave_order` "own_work", a what-if, as soon
    as it waits for its own work)."""

    back: float
    released: float


def _sweep_node(scenario: Scenario, ledger: Ledger, node: SimNode, begins: float,
                planned: list[tuple[int, str]]) -> Turn:
    """One node's turn from `begins`, in the engine's order (campaigns.engine.steps): it waits first
    for the work the policy waits for (`_wait_first`: nothing else on the node stops meanwhile), then
    checkpoints and moves, or cold-starts, what still runs, and is patched. Without cold restarts
    (`last_group` "fail", a campaign's default) the engine fails the node, which stays unpatched,
    when a waited job outlives the wait limit or a checkpoint has no receiver (`_park_or_fail`)."""
    p = scenario.params
    todo = [(i, a) for i, a in planned if scenario.trace.tasks[i].alive(begins)]
    # Arrived after the plan was made: moved when checkpointable, else by policy.
    for i in scenario.residents(node.index, begins):
        task = scenario.trace.tasks[i]
        if task.start > scenario.release:
            todo.append((i, MIGRATE if p.checkpointable(task.name) else
                         FINISH_FIRST if p.not_checkpointable == "wait" else COLD_START))
    waits = (FINISH_FIRST, BLOCKED) if p.last_group == "wait" else (FINISH_FIRST,)
    waiting = [scenario.trace.tasks[i] for i, action in todo if action in waits]
    fails = p.last_group == "fail"
    empty = _wait_for(scenario, ledger, waiting, begins, node, p.wait_poll_s, kill=not fails)
    own_work = bool(waiting) and p.wave_order == "own_work"
    if empty == INF:
        return Turn(INF, begins if own_work else INF)
    outlived = [t.name for t in waiting if fails and t.alive(empty)]
    if outlived:  # past the wait limit, and no cold restart: the node fails as it is
        ledger.failures.append(Failure(node.name, tuple(outlived), "outlived the wait limit"))
        return Turn(INF, empty)
    moving = 0.0
    unmovable: list[str] = []
    for i, action in todo:
        task = scenario.trace.tasks[i]
        if action in waits or not task.alive(empty):
            continue
        if action == COLD_START:
            ledger.kill(task, empty)
            continue
        # Checkpointed: paused while it moves; one restored at home after the patch waits for the
        # patch too; one without receiver is restored where it was when the node fails.
        seconds = scenario.checkpoint_s(task, node)
        moving += seconds
        ledger.idle += scenario.gpus(task) * (seconds + (scenario.patch_s if action == RETURN_HOME else 0)) / HOUR
        if action not in (MIGRATE, RETURN_HOME):
            unmovable.append(task.name)
    if unmovable:
        ledger.failures.append(Failure(node.name, tuple(unmovable), "no receiver for its checkpoint"))
        return Turn(INF, empty + moving)
    done = empty + moving + scenario.patch_s
    ledger.idle += node.gpus * (done - empty) / HOUR
    return Turn(done, begins if own_work else done)


def _planned(plan: SweepPlan) -> dict[int, list[tuple[int, str]]]:
    planned: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for (node_index, task_index), fate in plan.fates.items():
        planned[node_index].append((task_index, fate.action))
    return planned


def sweep(scenario: Scenario, parallelism: str) -> Outcome:
    """Execute the plan as the campaign engine admits nodes (`campaigns.policy.admits`, as
    `campaigns.engine.dispatch` calls it): in wave order, at most the plan's limit per cluster at
    once, a node of wave v only once every wave up to v - 2 is done (so the nodes receiving its work
    have not started). A node holds its slot and the order until it is patched or fails, while it
    waits for its own work too (`wave_order` "strict": to the engine a draining node is a working,
    active sweep); "own_work" is the what-if where a waiting node gives both back at once."""
    plan = plan_of(scenario, parallelism)
    ledger = Ledger(scenario)
    patched = [INF] * len(scenario.nodes)
    planned = _planned(plan)
    pending = [(wave, node) for wave, nodes in enumerate(plan.waves, start=1) for node in nodes]
    unfinished: dict[int, int] = defaultdict(int)
    for wave, _node in pending:
        unfinished[wave] += 1
    in_flight: dict[str, int] = defaultdict(int)
    # (moment, 0: releases the order / 1: back in service, wave, node)
    events: list[tuple[float, int, int, int]] = []
    moment = scenario.release
    soak_until: float | None = None  # set once the canary wave is done
    while pending or events:
        lowest = min((w for w, n in unfinished.items() if n), default=0)
        if plan.canary and soak_until is None and not unfinished[1]:
            soak_until = moment + plan.soak_s
        holding = plan.canary and (unfinished[1] > 0 or (soak_until is not None and moment < soak_until))
        if holding and not events and soak_until is not None:
            moment = soak_until  # nothing runs during the soak: time goes straight to its end
            holding = False
        kept = []
        for wave, node_index in pending:
            cluster = scenario.nodes[node_index].cluster
            if (holding and wave > 1) or not policy.admits(wave, lowest, in_flight[cluster],
                                                            plan.limits.get(cluster, 1)):
                kept.append((wave, node_index))
                continue
            turn = _sweep_node(scenario, ledger, scenario.nodes[node_index], moment, planned[node_index])
            in_flight[cluster] += 1
            heapq.heappush(events, (turn.released, 0, wave, node_index))
            heapq.heappush(events, (turn.back, 1, wave, node_index))
        pending = kept
        if not events:
            break
        at, kind, wave, node_index = heapq.heappop(events)
        if at == INF:
            break  # every node still out holds a task without end: nothing more finishes
        moment = at
        if kind == 0:  # done for the order; a node parked on its own work also gives its slot back
            unfinished[wave] -= 1
            in_flight[scenario.nodes[node_index].cluster] -= 1
        else:
            patched[node_index] = at
    return _sweep_outcome(ledger, plan, parallelism, patched)


def _sweep_outcome(ledger: Ledger, plan: SweepPlan, parallelism: str, patched: list[float]) -> Outcome:
    notes = [f"planned by campaigns.planner: {plan.summary.get('waves')} wave(s), "
             f"{plan.summary.get('migrations')} migration(s), {plan.summary.get('cold_starts')} cold start(s), "
             f"{plan.summary.get('finish_first')} finish first, {plan.summary.get('no_capacity')} without capacity"]
    notes.extend(failure_notes(ledger.failures))
    waiting = sum(1 for t in patched if t == INF) - len(ledger.failures)
    if waiting:
        notes.append(f"{waiting} node(s) never patched: a task without end holds its node (no wait limit)")
    outcome = ledger.outcome("sweep", parallelism, patched, notes)
    outcome.plan_summary = {**plan.summary, "expected_end": plan.expected_end}
    return outcome


def failure_notes(failures: list[Failure], most: int = 5) -> list[str]:
    """What the engine does where cold restart is not allowed, said once per run."""
    if not failures:
        return []
    unmoved = sum(1 for f in failures if f.why != "outlived the wait limit")
    named = ", ".join(f"{f.node} ({', '.join(f.tasks)}: {f.why})" for f in failures[:most])
    more = f" and {len(failures) - most} more" if len(failures) > most else ""
    notes = [f"{len(failures)} node(s) failed and stay unpatched, as the engine fails them when cold restart is "
             f"not allowed (campaigns.engine.steps): {named}{more}"]
    if unmoved:
        notes.append(f"{unmoved} of them had work no node could receive: its checkpoint is valid only on a node "
                     "like its own (a cuda image: the same GPU model, driver and CUDA), waves v-1 to v+1 take "
                     "nothing and patched nodes run the new driver, so the last two waves of each driver group "
                     "have no receiver; more nodes a wave put more nodes there (--last-group cold_restart: cold "
                     "restarts instead)")
    notes.append("a campaign halts once its failed nodes exceed its error budget (default 1); not simulated: "
                 "the sweep goes on")
    return notes
