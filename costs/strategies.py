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
   the engine admits them; each node, in the engine's order (campaigns.engine.steps._wait_first),
   first waits for the tasks the plan lets finish first and, where cold restart is not allowed
   (`last_group` "wait", a campaign's default), for the checkpointable tasks no node can receive
   (the plan's "blocked", and tasks that came after the plan and find no receiver), deciding that
   again at every look on the receivers as they are (`Receivers`); then it checkpoints the rest to
   their receivers, cold-starts what is to be cold-started, and is patched. A node whose waited
   task still runs at the wait limit fails as the engine fails it: unpatched, its work untouched.
   With cold restarts allowed (`last_group` "cold_restart") work no node can receive is
   cold-started at once, and a waited task still running at the limit is stopped. "fail" and
   "wait_then_cold_restart" are what-ifs (see `costs.model.Params.last_group`).
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
from executors import portability
from executors.portability import GPU_MODEL

DAY = 86400.0
HOUR = 3600.0
INF = float("inf")

# What a sweep's patch changes, where the fleet's versions are not known (see planned_nodes).
TARGET = {"driver": "fixed"}
# A task that came after the plan and has a receiver when its node's turn begins (moved like MIGRATE).
LATER = "later"
# Why a sweep waited for a task, and why a node failed.
WAITED_BY_POLICY = "its policy waits for it"
NO_RECEIVER = "no receiver for its checkpoint"
NO_RECEIVER_AT_LIMIT = "no receiver for its checkpoint, still running at the wait limit"
OUTLIVED = "outlived the wait limit"
# `Params.last_group` values under which the work no node can receive waits on its node, and under
# which a waited task still running at the wait limit fails its node (cold restart not allowed).
BLOCKED_WAITS = ("wait", "wait_then_cold_restart")
NO_COLD_RESTART = ("wait", "fail")


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
    why: str  # NO_RECEIVER_AT_LIMIT, OUTLIVED or NO_RECEIVER (the what-if "fail")


@dataclass(frozen=True)
class Hold:
    """A workload that held a node's patch: the node waited `hours` for it, then it `ended`."""

    node: str
    task: str
    hours: float
    ended: str  # "finished", "killed at the wait limit" or "still running at the wait limit: the node failed"
    why: str = ""  # why the node waited for it: WAITED_BY_POLICY or NO_RECEIVER ("" in a drain)


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


def planned_nodes(scenario: Scenario) -> list[SimNode]:
    """The fleet as the planner and the engine see it: without driver versions, every node is on
    "unpatched" and the patch brings "fixed" (so a `cuda` image stays valid only on unpatched nodes)."""
    if any("driver" in n.versions for n in scenario.nodes):
        return scenario.nodes
    return [SimNode(index=n.index, name=n.name, gpus=n.gpus, cluster=n.cluster, pool=n.pool, gpu_model=n.gpu_model,
                    versions={"driver": "unpatched", **n.versions}) for n in scenario.nodes]


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
    return plan_sweep(
        planned_nodes(scenario), residents, start=scenario.trace.at(scenario.release), parallelism=parallelism,
        node_seconds=max(1, math.ceil(scenario.patch_s + slowest)), target=TARGET,
        last_group_cold_restart=p.last_group == "cold_restart",
        not_checkpointable_waits=p.not_checkpointable == "wait",
        deadline=scenario.trace.at(scenario.deadline), checkpoint_engine=p.checkpoint_engine,
        canary=p.canary, soak_s=round(p.soak_minutes * 60), growth=p.wave_growth, growth_step=p.growth_step,
    )


class Receivers:
    """Where a checkpoint could go at a moment, as the engine looks when it decides whether a workload
    has anywhere to go (`campaigns.engine.steps._nowhere_to_go`, `choose_target`, `queries.candidates`):
    a node of the same cluster where the image is valid (executors.portability), with room, neither
    being swept nor in this or the next wave. In a sweep: a node of a later wave that has not
    started, a patched one (on the new versions), or one that failed before it was patched (the
    engine puts it back in service as it was: campaigns.engine.recovery.unwind). The emptiest is
    chosen, as the engine chooses where the plan named none.

    Each node's turn is worked out when it is admitted, so a look sees the nodes admitted before
    (a node that failed at the moment of another's look counts for it: the engine's worker ends one
    step before it takes the next). Room is the node's GPUs less the work on it at the look (its
    placed tasks, and the work moved to it by then: the plan's migrations, at their node's
    checkpoint, and the moves made here), as the engine counts it (`queries._FREE`); the plan's
    own migrations go where the plan sends them."""

    def __init__(self, scenario: Scenario, plan: SweepPlan, planned: dict[int, list[tuple[int, str]]]) -> None:
        self.scenario = scenario
        self.planned = planned
        self.nodes = planned_nodes(scenario)
        self.wave_of = {node: wave for wave, nodes in enumerate(plan.waves, start=1) for node in nodes}
        self.begun: dict[int, float] = {}
        self.back: dict[int, float] = {}  # patched at
        self.failed: dict[int, float] = {}  # failed, back in service unpatched, at
        # (task index, moved at, by the plan) per receiving node
        self.moved_in: dict[int, list[tuple[int, float, bool]]] = defaultdict(list)
        self.target_of = {key: fate.to for key, fate in plan.fates.items()
                          if fate.action == MIGRATE and fate.to is not None}
        self.facts_now = {n.index: portability.node_facts(n.gpu_model, n.versions) for n in self.nodes}
        self.facts_after = {n.index: portability.node_facts(n.gpu_model, {**n.versions, **TARGET})
                            for n in self.nodes}
        # Nodes with the same cluster and facts, checked once per kind of checkpoint.
        self.groups: dict[tuple[str, tuple[tuple[str, str], ...], bool], list[int]] = defaultdict(list)
        for n in self.nodes:
            for after in (False, True):
                facts = (self.facts_after if after else self.facts_now)[n.index]
                self.groups[(n.cluster, tuple(sorted(facts.items())), after)].append(n.index)
        self._valid: dict[tuple[object, ...], bool] = {}

    def admitted(self, node: SimNode, begins: float, back: float) -> None:
        self.begun[node.index] = begins
        if back < INF:
            self.back[node.index] = back

    def fail(self, node: SimNode, at: float) -> None:
        self.failed[node.index] = at

    def moments(self) -> list[float]:
        """When a node became a receiver: patched, or failed and back in service."""
        return [*self.back.values(), *self.failed.values()]

    def arrived(self, node: SimNode, at: float) -> list[int]:
        """Tasks moved here by this simulation (not by the plan) and still running at `at`."""
        tasks = self.scenario.trace.tasks
        return [i for i, moved, by_plan in self.moved_in[node.index]
                if not by_plan and moved <= at and tasks[i].alive(at)]

    def migrated(self, node: SimNode, indexes: list[int], at: float) -> None:
        """The plan's migrations from `node`, checkpointed at `at`, now on their planned receivers."""
        for i in indexes:
            to = self.target_of.get((node.index, i))
            if to is not None:
                self.moved_in[to].append((i, at, True))

    def needs(self, index: int, source: SimNode) -> portability.Requirements:
        task, mine = self.scenario.trace.tasks[index], self.nodes[source.index]
        return portability.requirements(self.scenario.params.checkpoint_engine, self.facts_now[source.index],
                                        gpus=task.milli,
                                        requires={GPU_MODEL: mine.gpu_model} if task.gpu_models else None)

    def home(self, index: int, source: SimNode) -> bool:
        """Is its checkpoint valid on its own node after the patch (restored there: RETURN_HOME)?"""
        return portability.compatible(self.needs(index, source), self.facts_after[source.index])

    def _state(self, index: int, at: float) -> str:
        if self.failed.get(index, INF) <= at:
            return "failed"
        if self.back.get(index, INF) <= at:
            return "patched"
        return "working" if self.begun.get(index, INF) <= at else "pending"

    def _free(self, index: int, state: str, at: float) -> int:
        tasks = self.scenario.trace.tasks
        here = set(self.scenario.residents(index, at))
        since = self.back[index] if state == "patched" else -INF  # its work before went elsewhere, or home
        if state == "patched":
            here = {i for i in here if tasks[i].start >= since}
            here |= {i for i, action in self.planned.get(index, ()) if action == RETURN_HOME and tasks[i].alive(at)}
        here |= {i for i, when, _by_plan in self.moved_in[index] if since <= when <= at and tasks[i].alive(at)}
        return self.nodes[index].gpus * 1000 - sum(tasks[i].milli for i in here)

    def find(self, index: int, source: SimNode, at: float, taken: dict[int, int] | None = None) -> int | None:
        """The node that would take task `index` checkpointed on `source` at `at` (the emptiest), or None.
        `taken`: room already given to other tasks in the same look."""
        needed = self.needs(index, source)
        milli = self.scenario.trace.tasks[index].milli
        wave = self.wave_of.get(source.index, 0)
        best: tuple[tuple[int, str], int] | None = None
        for (cluster, facts, after), members in self.groups.items():
            if cluster != source.cluster:
                continue
            key = (needed.engine, tuple(sorted(needed.must.items())), facts)
            valid = self._valid.get(key)
            if valid is None:
                valid = self._valid[key] = portability.compatible(needed, dict(facts))
            if not valid:
                continue
            for other in members:
                if other == source.index:
                    continue
                state = self._state(other, at)
                if after != (state == "patched") or state == "working" or (
                        state == "pending" and self.wave_of.get(other, INF) <= wave + 1):
                    continue
                free = self._free(other, state, at) - (taken or {}).get(other, 0)
                rank = (-free, self.nodes[other].name)  # the emptiest, then by name
                if free >= milli and (best is None or rank < best[0]):
                    best = (rank, other)
        return None if best is None else best[1]

    def take(self, indexes: list[int], source: SimNode, at: float) -> dict[int, str] | None:
        """Receivers for every one of the tasks `indexes` (checkpointed on `source`) at `at`, task
        index -> node name, then counted on those nodes; None, taking nothing, when one has none."""
        taken: dict[int, int] = defaultdict(int)
        chosen: dict[int, int] = {}
        for index in indexes:
            where = self.find(index, source, at, taken)
            if where is None:
                return None
            taken[where] += self.scenario.trace.tasks[index].milli
            chosen[index] = where
        for index, where in chosen.items():
            self.moved_in[where].append((index, at, False))
        return {index: self.nodes[where].name for index, where in chosen.items()}


@dataclass
class Turn:
    """One node's turn in a sweep: when it is back, patched (INF: never: it failed, or it waits for
    work without end), and when it gives back its slot and stops holding the wave order (when it
    ends, in the engine: patched or failed; with `Params.wave_order` "own_work", a what-if, as soon
    as it waits for its own work)."""

    back: float
    released: float
    # (from, until): while it waits for a receiver alone it holds no wave order, its slot kept (the
    # engine's rule, `wave_order` "strict"); it holds the order again from `until` when that is
    # before `released` (it goes on after its wait). None: it holds the order while it holds its slot.
    free: tuple[float, float] | None = None


def _sweep_node(scenario: Scenario, ledger: Ledger, node: SimNode, begins: float,
                planned: list[tuple[int, str]], receivers: Receivers) -> Turn:
    """One node's turn from `begins`, in the engine's order (campaigns.engine.steps._wait_first):
    every wait is decided before anything on the node stops. It waits for the work the policy waits
    for and, where cold restart is not allowed (`last_group` "wait", a campaign's default), for the
    checkpointable work no node could receive (`_nowhere_to_go`: the plan's BLOCKED, and work that
    came after the plan, decided on the receivers as they are), looking every `wait_poll_s`;
    nothing on the node stops meanwhile. The wait ends at the first look at which every such task
    has ended or has a receiver after all (`Receivers`: a node that failed, or was patched,
    meanwhile). A waited task still running at the wait limit fails the node, which stays unpatched
    with its work untouched (cold restart not allowed), or is stopped for a cold restart. Then it
    checkpoints and moves, or cold-starts, what still runs, and is patched.

    The what-if `last_group` "fail" (the engine before it waited) checkpoints the work no node can
    receive and fails the node; "wait_then_cold_restart" waits for it, then kills it at the limit."""
    p = scenario.params
    tasks = scenario.trace.tasks
    todo = [(i, a) for i, a in planned if tasks[i].alive(begins)]
    # Came after the plan was made (started here, or moved here by this simulation): decided now, as
    # the engine decides a workload the plan does not name.
    later = [i for i in scenario.residents(node.index, begins) if tasks[i].start > scenario.release]
    for i in dict.fromkeys([*later, *receivers.arrived(node, begins)]):
        if not p.checkpointable(tasks[i].name):
            todo.append((i, FINISH_FIRST if p.not_checkpointable == "wait" else COLD_START))
        elif receivers.home(i, node):
            todo.append((i, RETURN_HOME))
        elif receivers.find(i, node, begins) is not None:
            todo.append((i, LATER))
        else:
            todo.append((i, COLD_START if p.last_group == "cold_restart" else BLOCKED))
    waits = (FINISH_FIRST, BLOCKED) if p.last_group in BLOCKED_WAITS else (FINISH_FIRST,)
    waited = [(i, action) for i, action in todo if action in waits]
    fails = p.last_group in NO_COLD_RESTART
    # Where work without receiver waits, work that came after the plan and has a receiver now is
    # looked at again with the waited work (`_nowhere_to_go` at every look): sent when the wait ends.
    movable = [i for i, action in todo if action == LATER] if p.last_group in BLOCKED_WAITS else []
    empty, received, at_limit, alone = _sweep_wait(scenario, ledger, node, begins, waited, movable,
                                                   [i for i, _ in todo], receivers, kill=not fails)
    own_work = (bool(waited) or empty > begins) and p.wave_order == "own_work"
    # The engine's rule (`strict`): from the first look at which it waits for receivers alone to the
    # end of its wait, the node holds no wave order (NodeSweep.waiting_since); it keeps its slot.
    free = (alone, empty) if p.wave_order == "strict" and alone < empty else None
    if empty == INF:
        return Turn(INF, begins if own_work else INF, free)
    left = [(i, action) for i, action in [*waited, *((i, LATER) for i in movable)]
            if at_limit and tasks[i].alive(empty) and i not in received]
    if left and fails:  # past the wait limit, and no cold restart: the node fails as it is, nothing moved
        why = NO_RECEIVER_AT_LIMIT if any(action != FINISH_FIRST for _, action in left) else OUTLIVED
        ledger.failures.append(Failure(node.name, tuple(tasks[i].name for i, _ in left), why))
        receivers.fail(node, empty)
        return Turn(INF, begins if own_work else empty, free)
    killed = {i for i, _action in left}  # stopped at the limit by the wait (a cold restart)
    # Checkpointed now and sent to the receivers as they are: work that came after the plan (where no
    # wait looked for it) and, in the what-if "fail", the work no node could receive.
    sent = [i for i, action in todo if tasks[i].alive(empty) and i not in received and i not in killed and (
        action == LATER or (action == BLOCKED and p.last_group == "fail"))]
    got = receivers.take(sent, node, empty) if sent else {}
    cold = set(sent) if got is None and p.last_group == "cold_restart" else set()  # `_cold_start_instead`
    received = {**received, **(got or {})}
    moving = 0.0
    unmovable: list[str] = []
    for i, action in todo:
        task = tasks[i]
        if not task.alive(empty) or i in killed or (action in waits and i not in received):
            continue
        if action == COLD_START or i in cold:
            ledger.kill(task, empty)
            continue
        # Checkpointed: paused while it moves; one restored at home after the patch waits for the
        # patch too; one without receiver is restored where it was when the node fails.
        seconds = scenario.checkpoint_s(task, node)
        moving += seconds
        ledger.idle += scenario.gpus(task) * (seconds + (scenario.patch_s if action == RETURN_HOME else 0)) / HOUR
        if action not in (MIGRATE, RETURN_HOME) and i not in received:
            unmovable.append(task.name)
    if unmovable:
        ledger.failures.append(Failure(node.name, tuple(unmovable), NO_RECEIVER))
        receivers.fail(node, empty + moving)
        return Turn(INF, begins if own_work else empty + moving, free)
    receivers.migrated(node, [i for i, action in todo if action == MIGRATE and tasks[i].alive(empty)], empty)
    done = empty + moving + scenario.patch_s
    ledger.idle += node.gpus * (done - empty) / HOUR
    return Turn(done, begins if own_work else done, free)


def _sweep_wait(scenario: Scenario, ledger: Ledger, node: SimNode, begins: float, waited: list[tuple[int, str]],
                movable: list[int], running: list[int], receivers: Receivers,
                kill: bool) -> tuple[float, dict[int, str], bool, float]:
    """The node's wait (`_wait_first`) for the tasks `waited` (index, plan action), while the tasks
    `running` (its work, the waited too) run on: (the look at which it ends, receivers found for the
    work no node could receive and for the work `movable` (task index -> node name), whether it
    ended at the wait limit, the first look from which it waited for receivers alone (INF: never):
    from then on it holds no wave order, `policy.admits`).

    It looks at `begins` and every `wait_poll_s` after (an end, a node that became a receiver, or the
    limit counts at the first look at or after it). At the limit what still runs is killed with
    `kill` (a cold restart), else left running (the caller fails the node). INF: it waits for
    ever. Holds and the node's idle GPUs over the wait (all of its work runs on meanwhile) go to the
    ledger."""
    if not waited and not movable:
        return begins, {}, False, INF
    p = scenario.params
    tasks = scenario.trace.tasks
    poll = p.wait_poll_s
    limit = (p.wait_limit_h or 0.0) * HOUR
    limit_look = _seen(begins, begins + limit, poll) if limit else INF
    candidates = {max(begins, _seen(begins, tasks[i].ends(), poll)) for i, _action in waited}
    if movable or any(action == BLOCKED for _i, action in waited):
        # The engine decides again at every look: at the first, and once a node became a receiver.
        candidates |= {begins, *(max(begins, _seen(begins, at, poll)) for at in receivers.moments())}
    until, at_limit, alone = INF, False, INF
    received: dict[int, str] = {}
    for look in sorted(m for m in candidates | {limit_look} if m <= limit_look):
        if look == INF:
            break  # a task without end, and no wait limit: it waits for ever
        if any(action != BLOCKED and tasks[i].alive(look) for i, action in waited):
            if look < limit_look:
                continue
            until, at_limit = look, True  # a job the policy waits for outlived the limit
            break
        stuck = [i for i, action in waited if action == BLOCKED and tasks[i].alive(look)]
        stuck += [i for i in movable if tasks[i].alive(look)]
        found = receivers.take(stuck, node, look) if stuck else {}
        if found is not None:
            until, received = look, found
            break
        alone = min(alone, look)  # no receiver at this look, and nothing the policy waits for runs
        if look == limit_look:
            until, at_limit = look, True
            break
    ended = "killed at the wait limit" if kill else "still running at the wait limit: the node failed"
    held = [*waited, *((i, BLOCKED) for i in movable if until > begins)]
    for i, action in held if until > begins else []:
        task = tasks[i]
        if task.ends() <= begins:
            continue
        if i in received:
            outcome = f"moved to {received[i]} once that node could take it"
        else:
            outcome = ended if task.alive(until) else "finished"
        ledger.holds.append(Hold(node.name, task.name, (min(task.ends(), until) - begins) / HOUR, outcome,
                                 NO_RECEIVER if action == BLOCKED else WAITED_BY_POLICY))
    if at_limit and kill:
        for i in [*(i for i, _action in waited), *movable]:
            if tasks[i].alive(until) and i not in received:
                ledger.kill(tasks[i], until)
    if until < INF:
        busy = sum(scenario.gpus(tasks[i]) * max(0.0, min(tasks[i].ends(), until) - begins) for i in running)
        ledger.idle += max(0.0, node.gpus * (until - begins) - busy) / HOUR
    return until, received, at_limit, alone if alone < until else INF


def _planned(plan: SweepPlan) -> dict[int, list[tuple[int, str]]]:
    planned: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for (node_index, task_index), fate in plan.fates.items():
        planned[node_index].append((task_index, fate.action))
    return planned


def sweep(scenario: Scenario, parallelism: str) -> Outcome:
    """Execute the plan as the campaign engine admits nodes (`campaigns.policy.admits`, as
    `campaigns.engine.dispatch` calls it): in wave order, at most the plan's limit per cluster at
    once, a node of wave v only once every wave up to v - 2 is done (so the nodes receiving its work
    have not started). A node holds its slot until it is patched or fails, and the wave order too,
    except while it waits for a receiver alone (`wave_order` "strict", the engine: its sweep's
    `waiting_since`); "hold" (the engine before that rule) and "own_work" (a waiting node gives its
    slot back too) are what-ifs."""
    plan = plan_of(scenario, parallelism)
    ledger = Ledger(scenario)
    patched = [INF] * len(scenario.nodes)
    planned = _planned(plan)
    receivers = Receivers(scenario, plan, planned)
    pending = [(wave, node) for wave, nodes in enumerate(plan.waves, start=1) for node in nodes]
    holding: dict[int, int] = defaultdict(int)  # nodes holding each wave's order: pending, or admitted and not free
    left: dict[int, int] = defaultdict(int)  # nodes of each wave not ended (the canary's gate)
    for wave, _node in pending:
        holding[wave] += 1
        left[wave] += 1
    holds: dict[int, bool] = {}
    in_flight: dict[str, int] = defaultdict(int)
    # (moment, kind, wave, node): kinds in ORDER_FREE, ORDER_AGAIN, DONE, BACK (processed in that order at a moment)
    events: list[tuple[float, int, int, int]] = []
    moment = scenario.release
    soak_until: float | None = None  # set once the canary wave is done
    while pending or events:
        lowest = min((w for w, n in holding.items() if n), default=0)
        if plan.canary and soak_until is None and not left[1]:
            soak_until = moment + plan.soak_s
        canary = plan.canary and (left[1] > 0 or (soak_until is not None and moment < soak_until))
        if canary and not events and soak_until is not None:
            moment = soak_until  # nothing runs during the soak: time goes straight to its end
            canary = False
        kept = []
        for wave, node_index in pending:
            cluster = scenario.nodes[node_index].cluster
            if (canary and wave > 1) or not policy.admits(wave, lowest, in_flight[cluster],
                                                           plan.limits.get(cluster, 1)):
                kept.append((wave, node_index))
                continue
            turn = _sweep_node(scenario, ledger, scenario.nodes[node_index], moment, planned[node_index], receivers)
            receivers.admitted(scenario.nodes[node_index], moment, turn.back)
            in_flight[cluster] += 1
            holds[node_index] = True
            if turn.free is not None:
                heapq.heappush(events, (turn.free[0], ORDER_FREE, wave, node_index))
                if turn.free[1] < turn.released:
                    heapq.heappush(events, (turn.free[1], ORDER_AGAIN, wave, node_index))
            heapq.heappush(events, (turn.released, DONE, wave, node_index))
            heapq.heappush(events, (turn.back, BACK, wave, node_index))
        pending = kept
        if not events:
            break
        at, kind, wave, node_index = heapq.heappop(events)
        if at == INF:
            break  # every node still out holds a task without end: nothing more finishes
        moment = at
        if kind == BACK:
            patched[node_index] = at
            continue
        if kind == DONE:  # a node parked on its own work (own_work) also gives its slot back
            left[wave] -= 1
            in_flight[scenario.nodes[node_index].cluster] -= 1
        if holds[node_index] != (kind == ORDER_AGAIN):
            holds[node_index] = kind == ORDER_AGAIN
            holding[wave] += 1 if kind == ORDER_AGAIN else -1
    return _sweep_outcome(ledger, plan, parallelism, patched)


# What happens to a node in a sweep, in the order the simulation takes events of one moment.
ORDER_FREE, ORDER_AGAIN, DONE, BACK = range(4)


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
    named = ", ".join(f"{f.node} ({', '.join(f.tasks)}: {f.why})" for f in failures[:most])
    more = f" and {len(failures) - most} more" if len(failures) > most else ""
    notes = [f"{len(failures)} node(s) failed and stay unpatched, as the engine fails them when cold restart is "
             f"not allowed (campaigns.engine.steps): {named}{more}"]
    waited = sum(1 for f in failures if f.why == NO_RECEIVER_AT_LIMIT)
    at_once = sum(1 for f in failures if f.why == NO_RECEIVER)
    why = ("its checkpoint is valid only on a node like its own (a cuda image: the same GPU model, driver and "
           "CUDA), waves v-1 to v+1 take nothing and patched nodes run the new driver, so the last two waves of "
           "each driver group have no receiver; more nodes a wave put more nodes there")
    if waited:
        notes.append(f"{waited} of them waited up to the wait limit for work no node could receive, as the engine "
                     f"waits for it (campaigns.engine.steps._wait_first), and it still ran: {why} (--last-group "
                     "cold_restart: cold restarts at once instead)")
    if at_once:
        notes.append(f"{at_once} of them had work no node could receive and failed at once (--last-group fail, a "
                     f"what-if: the engine waits for such work up to the wait limit): {why}")
    notes.append("a campaign halts once its failed nodes exceed its error budget (default 1); not simulated: "
                 "the sweep goes on")
    return notes
