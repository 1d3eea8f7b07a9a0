"""The planner: pure, typed and fast (no database; 10,000 nodes in well under 10 s).

Input: the nodes in scope (each with its target versions, workloads and deadline), the other
nodes of the same clusters (possible receivers), and the policy. Output: a JSON-ready plan.

- Waves: nodes sorted by urgency (earliest deadline first), each put into the first wave whose
  per-cluster and per-pool counts are below the parallelism limits; nodes added as the campaign's
  last group come after all others. A wave is a group of the fleet going through the upgrade
  together. Execution starts wave w only when every wave up to w-2 has finished.
- Capacity: waves are simulated in order. Every workload on a node of wave w (including those
  moved there earlier) needs a receiver where its checkpoint is valid: the portability rule of its
  checkpoint engine (executors.portability: a `cuda` image needs the same GPU model, driver and
  CUDA; a `signal` one nothing of the node), judged against the receiver's versions as they will
  be when the workload lands: a node of wave w-2 or earlier is patched by then, one of wave w+2 or
  later is not yet drained (waves w-1 to w+1 may be draining meanwhile and take nothing).
  Receivers outside the campaign that are not exposed come first, then patched nodes of the
  campaign, then exposed nodes outside it, then later waves (whose work moves again), so work
  moves as seldom as possible and lands on exposed nodes last; every exposed receiver used is
  named with an offer to add it as a last group. With placement "home", or when nothing else is
  free, a checkpoint that stays valid on its own node after the patch (e.g. a kernel-only update
  for a `cuda` or `signal` image) is parked and restored there after the reboot. Otherwise the
  workload finishes first (policy "wait") or cold-starts (policy "cold restart", or cold restart
  allowed) and the plan says who restarts it (the cluster's scheduler, or nobody); else the node
  carries a "no capacity" risk. All named in advance.
- A node whose target is a livepatch alone (advisories.osplan: a Livepatch notice covers its running
  kernel) is neither drained nor checkpointed: its work stays (`stays`), it takes and frees no
  capacity, and its steps are patch and verify only (SweepState.steps_of).
- Time: each wave takes `node_seconds`, starts at the earliest moment inside a window, outside
  any blackout, with room for the whole wave; a node ending after its deadline is at risk.
"""

from __future__ import annotations

import bisect
import functools
import gc
import itertools
import math
import operator
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from campaigns.choices import SweepState, in_place
from executors import portability
from inventory.choices import WorkloadPolicy
from inventory.versions import LIVEPATCH, OS_PACKAGES

FAR = datetime.max.replace(tzinfo=UTC)
OUT_OF_SCOPE = 10**9  # the "wave" of a receiver that the campaign never drains
HOME, MOVE = "home", "move"


class PlanError(ValueError):
    """The campaign's policy cannot be planned (bad limit, bad window); the message names the field."""


@functools.cache
def _checkpointable(engine: str) -> bool:
    return portability.rule(engine).checkpointable  # an unknown engine raises (and is not cached)


@dataclass(frozen=True)
class PlanWorkload:
    ref: str
    name: str = ""
    gpus: int = 1
    policy: str = WorkloadPolicy.CHECKPOINT
    # How it is checkpointed (executors.portability decides where the image is valid).
    checkpoint_engine: str = "cuda"
    # The inference engine it runs (a node component such as "triton") and its model.
    inference_engine: str = ""
    engine_version: str = ""
    model_name: str = ""
    model_version: str = ""
    requires: tuple[tuple[str, str], ...] = ()
    # The controller that would start it again (inventory Workload.owner), "" for none.
    owner: str = ""
    # How it moves, in its scheduler's words (Workload.placement's notes: stop-first, a zone, pinned).
    notes: tuple[str, ...] = ()

    @property
    def checkpointable(self) -> bool:
        return _checkpointable(self.checkpoint_engine)

    def requirements(self, facts: dict[str, str]) -> portability.Requirements:
        return portability.requirements(
            self.checkpoint_engine, facts, gpus=self.gpus, inference_engine=self.inference_engine,
            engine_version=self.engine_version, model_name=self.model_name, model_version=self.model_version,
            requires=dict(self.requires))

    def cache_key(self) -> tuple[Any, ...]:
        """What its requirements depend on besides the node's facts (fleets repeat a few of these)."""
        return (self.checkpoint_engine, self.gpus > 0, self.inference_engine, self.engine_version,
                self.model_name, self.model_version, self.requires)


@dataclass(frozen=True)
class PlanNode:
    id: int
    name: str
    cluster: str
    pool: str = ""
    gpu_model: str = ""
    gpu_count: int = 0
    versions: dict[str, str] = field(default_factory=dict)
    workloads: tuple[PlanWorkload, ...] = ()
    target: dict[str, str] = field(default_factory=dict)
    deadline: datetime | None = None
    # Swept after every other node (added to the campaign as its last group).
    last: bool = False
    # Advisories of the campaign this node is exposed to (for a receiver outside the campaign).
    exposed_to: tuple[str, ...] = ()
    # What fixes its OS advisories' exposures (advisories.osplan): "livepatch" (no drain, no
    # checkpoint: its work stays), "reboot", "livepatch+reboot", "packages"; "" for other patches.
    remedy: str = ""


@dataclass(frozen=True)
class Window:
    days: frozenset[int]
    start: time
    end: time
    tz: str = "UTC"


@dataclass(frozen=True)
class Policy:
    start: datetime
    per_cluster: str = "1"
    per_pool: str = ""
    windows: tuple[Window, ...] = ()
    blackouts: tuple[tuple[datetime, datetime], ...] = ()
    node_seconds: int = 1800
    cold_restart_allowed: bool = False
    deadline: datetime | None = None
    placement: str = MOVE
    # Who restarts a workload stopped for a cold start, per cluster ("" or absent: nobody).
    restarters: dict[str, str] = field(default_factory=dict)
    # The first wave as a canary ("auto": one node per driver group and cluster; "N" nodes; "0":
    # none), then `soak_s` before the next wave; later waves grow "fixed", "linear" (+step) or
    # "exponential" (x step), always within the parallelism limits.
    canary: str = "0"
    soak_s: int = 0
    growth: str = "fixed"
    growth_step: int = 2


def parse_limit(text: str, total: int, field_name: str) -> int:
    """'3' -> 3; '25%' -> a quarter of `total` rounded down, at least 1."""
    raw = text.strip()
    try:
        if raw.endswith("%"):
            percent = float(raw[:-1])
            if not 0 < percent <= 100:
                raise ValueError
            return max(1, math.floor(total * percent / 100))
        value = int(raw)
        if value < 1:
            raise ValueError
        return value
    except ValueError:
        raise PlanError(
            f"{field_name}={text!r}: use a whole number of nodes (>= 1) or a percentage like '25%'"
        ) from None


def parse_windows(raw: list[dict[str, Any]]) -> tuple[Window, ...]:
    windows = []
    for index, item in enumerate(raw):
        try:
            days = frozenset(int(d) for d in item.get("days", range(7)))
            if not days or not days <= set(range(7)):
                raise ValueError("days must be 0 (Monday) to 6 (Sunday)")
            start = time.fromisoformat(str(item["start"]))
            end = time.fromisoformat(str(item["end"]))
            tz = str(item.get("tz", "UTC"))
            ZoneInfo(tz)
        except (KeyError, TypeError, ValueError, ZoneInfoNotFoundError) as exc:
            raise PlanError(f"windows[{index}] is invalid ({exc}); expected "
                            '{"days": [0-6], "start": "HH:MM", "end": "HH:MM", "tz": "Area/City"}') from None
        windows.append(Window(days=days, start=start, end=end, tz=tz))
    return tuple(windows)


def parse_blackouts(raw: list[dict[str, Any]]) -> tuple[tuple[datetime, datetime], ...]:
    result = []
    for index, item in enumerate(raw):
        try:
            start = datetime.fromisoformat(str(item["start"]))
            end = datetime.fromisoformat(str(item["end"]))
            if start.tzinfo is None or end.tzinfo is None or end <= start:
                raise ValueError("need two ISO timestamps with time zones, end after start")
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError(f"blackouts[{index}] is invalid ({exc})") from None
        result.append((start, end))
    return tuple(sorted(result))


class Calendar:
    """When work may run: window intervals minus blackouts, precomputed over a horizon."""

    def __init__(self, windows: tuple[Window, ...], blackouts: tuple[tuple[datetime, datetime], ...],
                 start: datetime, horizon_days: int = 400) -> None:
        self.always = not windows
        self.blackouts = blackouts
        intervals: list[tuple[datetime, datetime]] = []
        if windows:
            first = start.astimezone(UTC).date() - timedelta(days=1)
            for offset in range(horizon_days):
                for window in windows:
                    zone = ZoneInfo(window.tz)
                    day: date = first + timedelta(days=offset)
                    if day.weekday() not in window.days:
                        continue
                    opens = datetime.combine(day, window.start, tzinfo=zone)
                    closes = datetime.combine(day, window.end, tzinfo=zone)
                    if closes <= opens:
                        closes += timedelta(days=1)
                    intervals.append((opens.astimezone(UTC), closes.astimezone(UTC)))
        intervals.sort()
        self.intervals = intervals
        self.ends = [end for _start, end in intervals]

    def is_open(self, moment: datetime) -> bool:
        return self.earliest(moment, timedelta(0)) == moment

    def earliest(self, moment: datetime, duration: timedelta) -> datetime | None:
        """The earliest start >= moment with [start, start + duration] inside a window and no blackout."""
        candidate = moment
        for _ in range(100_000):
            if not self.always:
                index = bisect.bisect_right(self.ends, candidate)
                while index < len(self.intervals):
                    opens, closes = self.intervals[index]
                    start = max(candidate, opens)
                    if start + duration <= closes:
                        candidate = start
                        break
                    index += 1
                else:
                    return None
            clash = next((b for b in self.blackouts if b[0] < candidate + duration and candidate < b[1]), None)
            if clash is None:
                return candidate
            candidate = clash[1]
        return None


def canary_nodes(nodes: list[PlanNode], canary: str) -> list[int]:
    """The canary: the most urgent node of each driver group and cluster ("auto"), or the N most urgent."""
    text = (canary or "0").strip().lower()
    if text in ("", "0", "none", "off"):
        return []
    if text == "auto":
        chosen: dict[tuple[str, str], int] = {}
        for node in nodes:
            chosen.setdefault((node.cluster, node.versions.get("driver", "")), node.id)
        return list(chosen.values())
    try:
        count = int(text)
    except ValueError:
        raise PlanError(f"canary={canary!r}: use 'auto', a whole number of nodes, or 0 for none") from None
    if count < 0:
        raise PlanError(f"canary={canary!r}: use 'auto', a whole number of nodes, or 0 for none")
    return [node.id for node in nodes[:count]]


def _grown(growth: str, step: int, base: int, wave: int) -> int | None:
    """Nodes per cluster in wave `wave` (the canary, or the first wave, being `base`), None for no cap."""
    if growth == "linear":
        return base + step * (wave - 1)
    if growth == "exponential":
        return base * max(step, 1) ** (wave - 1)
    return None


def assign_waves(nodes: list[PlanNode], per_cluster: dict[str, int], per_pool: dict[tuple[str, str], int] | None,
                 canary: list[int] | None = None, growth: str = "fixed", step: int = 2) -> dict[int, int]:
    """Greedy, urgency first: each node goes to the first wave with room in its cluster and pool.

    The canary nodes, if any, are wave 1 alone. Wave sizes then grow per cluster as `growth` says,
    within the limits. Nodes of the last group (`last`) start after the last wave of the others.
    """
    cluster_count: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    pool_count: dict[tuple[str, str], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    waves: dict[int, int] = {}
    chosen = set(canary or [])
    base: dict[str, int] = defaultdict(int)
    for node in nodes:
        if node.id in chosen:
            waves[node.id] = 1
            cluster_count[node.cluster][1] += 1
            pool_count[(node.cluster, node.pool)][1] += 1
            base[node.cluster] += 1
    start = 2 if chosen else 1
    first_open: dict[tuple[str, str], int] = defaultdict(lambda: start)
    floor = start
    grows = _grown(growth, step, 1, 1) is not None  # "fixed": the limits alone
    for node in nodes:
        if node.id in chosen:
            continue
        if node.last and floor == start:
            floor = max(waves.values(), default=0) + 1
        cluster = node.cluster
        key = (cluster, node.pool)
        wave = max(first_open[key], floor)
        limit_p = per_pool[key] if per_pool is not None else None
        in_cluster, in_pool, limit = cluster_count[cluster], pool_count[key], per_cluster[cluster]
        while True:
            limit_c = min(limit, _grown(growth, step, max(base[cluster], 1), wave) or 0) if grows else limit
            if in_cluster[wave] < limit_c and (limit_p is None or in_pool[wave] < limit_p):
                break
            wave += 1
        first_open[key] = wave
        waves[node.id] = wave
        in_cluster[wave] += 1
        in_pool[wave] += 1
    return waves


@functools.lru_cache(maxsize=4096)
def _iso_of(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _iso(moment: datetime | None) -> str | None:
    # Memoised: every node of a wave shares its times, and deadlines repeat across a fleet.
    return _iso_of(moment) if moment else None


class _Lane:
    """Candidate receivers in preference order (full ones dropped as they are found).

    In the lane of later waves the search starts where the last one ended (`rotor`), so work
    carried ahead spreads over those nodes instead of piling onto the very last wave.
    """

    __slots__ = ("ids", "rotor", "waves")

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.rotor = 0
        self.waves: list[int] = []  # minus the wave of each id (the lane is sorted latest first)


# Lanes in the order receivers are preferred.
CLEAN, PATCHED, EXPOSED, LATER = range(4)


_GPUS = operator.attrgetter("gpus")

# Nodes grouped by (cluster, shared facts): the cluster, the facts and the node ids in order.
_Groups = dict[tuple[str, int], tuple[str, dict[str, str], list[int]]]


def _positions(nodes: list[PlanNode]) -> Callable[[], dict[int, int]]:
    """Each node's position in `nodes`, computed at the first call (only merges need it), then kept."""
    @functools.cache
    def position() -> dict[int, int]:
        return {node.id: i for i, node in enumerate(nodes)}
    return position


def _add(index: dict[tuple[str, ...], list[_Lane]], lane: int, facts: tuple[str, ...], groups: _Groups,
         position: Callable[[], dict[int, int]]) -> None:
    """Append the grouped nodes to `lane` of the index of `facts` under their keys: each key's nodes
    in the order `position` gives (theirs in the list grouped), as appending them one by one would."""
    by_key: dict[tuple[str, ...], list[list[int]]] = defaultdict(list)
    for cluster, values, ids in groups.values():
        by_key[(cluster, *[values.get(f, "") for f in facts])].append(ids)
    for key, lists in by_key.items():
        ids = index[key][lane].ids
        if len(lists) == 1:
            ids.extend(lists[0])
        else:  # several groups share the key (the facts tell them apart, the index does not)
            ids.extend(sorted(itertools.chain.from_iterable(lists), key=position().__getitem__))


class Capacity:
    """Where moved work can land, wave by wave: free GPUs and facts (as patched or not) per node.

    Receivers are indexed per set of facts a checkpoint depends on (one index per distinct set:
    a handful, built when first needed) and per cluster and values of those facts, in lanes.
    """

    def __init__(self, scope: list[PlanNode], receivers: list[PlanNode], waves: dict[int, int]) -> None:
        every = [*scope, *receivers]
        self.by_id = dict(zip(map(_ID, every), every, strict=True))
        self.wave_of = dict.fromkeys(map(_ID, receivers), OUT_OF_SCOPE) | waves
        # Fleets repeat a few sets of facts: equal ones are one shared (read-only) dict, so the
        # caches and indexes below key on its identity instead of hashing its contents per node.
        shared: dict[tuple[Any, ...], dict[str, str]] = {}

        def facts_of(gpu_model: str, versions: dict[str, str]) -> dict[str, str]:
            key = (gpu_model, *versions.items())
            found = shared.get(key)
            if found is None:
                found = shared[key] = portability.node_facts(gpu_model, versions)
            return found

        after: dict[tuple[Any, ...], dict[str, str]] = {}

        def facts_after(node: PlanNode) -> dict[str, str]:
            # The shared facts now (its GPU model and versions) and the target fix the facts after.
            key = (id(self.facts_now[node.id]), *node.target.items())
            found = after.get(key)
            if found is None:
                found = after[key] = facts_of(node.gpu_model, {**node.versions, **node.target})
            return found

        self.facts_now = {n.id: facts_of(n.gpu_model, n.versions) for n in self.by_id.values()}
        self.facts_after = {n.id: facts_after(n) for n in scope}
        self.free = {n.id: n.gpu_count - sum(map(_GPUS, n.workloads)) for n in self.by_id.values()}
        self.receivers = receivers
        # Latest wave first, by name within a wave (bucketed by wave: each bucket sorted on names alone).
        by_wave: dict[int, list[PlanNode]] = defaultdict(list)
        for node in scope:
            by_wave[waves[node.id]].append(node)
        self.scope_by_wave = [n for w in sorted(by_wave, reverse=True) for n in sorted(by_wave[w], key=_NAME)]
        self.patched: list[PlanNode] = []  # scope nodes patched so far, in wave order
        self.current = 0
        self._needs: dict[tuple[Any, ...], portability.Requirements] = {}
        # Per distinct Requirements (by identity: they live in _needs): the plan's "requires" entry
        # and the start of its "why", shared by every move with those requirements.
        self._described: dict[int, tuple[dict[str, object], str]] = {}
        self._terms: dict[tuple[Any, ...], tuple[portability.Requirements, dict[str, object], str, bool]] = {}
        self._lanes: dict[tuple[int, str], list[_Lane]] = {}
        self.indexes: dict[tuple[str, ...], dict[tuple[str, ...], list[_Lane]]] = {}
        # The scope by cluster and facts now, in scope_by_wave order (and the nodes' positions in it).
        self._later: tuple[_Groups, Callable[[], dict[int, int]]] | None = None

    def requirements(self, workload: PlanWorkload, node: PlanNode) -> portability.Requirements:
        """The workload's requirements on `node`, computed once per distinct (workload kind, node facts)."""
        facts = self.facts_now[node.id]
        key = (workload.cache_key(), id(facts))  # shared facts (see __init__): identity is content
        found = self._needs.get(key)
        if found is None:
            found = self._needs[key] = workload.requirements(facts)
        return found

    def described(self, needed: portability.Requirements) -> tuple[dict[str, object], str]:
        """The plan's `requires` for `needed` and what its checkpoint depends on, in words."""
        found = self._described.get(id(needed))
        if found is None:
            facts = ", ".join(f"{k.replace('_', ' ')} {v or '(none)'}" for k, v in sorted(needed.must.items()))
            depends = f"same {facts}" if facts else "its image needs nothing of the node"
            found = self._described[id(needed)] = (needed.as_dict(), f"{needed.engine} checkpoint: {depends}")
        return found

    def terms(self, workload: PlanWorkload, node: PlanNode) -> tuple[
            portability.Requirements, dict[str, object], str, bool]:
        """The workload's requirements on `node`, their `requires` and words (described), and whether
        its checkpoint stays valid on `node` once patched: one lookup per (workload kind, node facts
        now and after), the facts being shared (see __init__)."""
        node_id = node.id
        key = (workload.checkpoint_engine, workload.gpus > 0, workload.inference_engine, workload.engine_version,
               workload.model_name, workload.model_version, workload.requires,  # workload.cache_key()
               id(self.facts_now[node_id]), id(self.facts_after[node_id]))
        found = self._terms.get(key)
        if found is None:
            needed = self.requirements(workload, node)
            found = self._terms[key] = (needed, *self.described(needed),
                                        portability.compatible(needed, self.facts_after[node_id]))
        return found

    def facts(self, node_id: int) -> dict[str, str]:
        patched = node_id in self.facts_after and self.wave_of[node_id] <= self.current - 2
        return self.facts_after[node_id] if patched else self.facts_now[node_id]

    def _keys(self, facts: tuple[str, ...], nodes: list[PlanNode], patched: bool) -> list[tuple[str, ...]]:
        """Each node's key in the index of `facts`: its cluster and its values of those facts."""
        values = self.facts_after if patched else self.facts_now
        known: dict[tuple[str, int], tuple[str, ...]] = {}  # per cluster and shared facts (see __init__)
        keys = []
        for node in nodes:
            node_values = values[node.id]
            key = known.get((node.cluster, id(node_values)))
            if key is None:
                key = known[(node.cluster, id(node_values))] = (
                    node.cluster, *[node_values.get(f, "") for f in facts])
            keys.append(key)
        return keys

    def _grouped(self, nodes: list[PlanNode], patched: bool) -> _Groups:
        """`nodes` by cluster and shared facts (see __init__), each group's ids in the order given: the
        indexes key on those two only, so each index reads a group once instead of every node."""
        values = self.facts_after if patched else self.facts_now
        groups: _Groups = {}
        for node in nodes:
            node_values = values[node.id]
            group = groups.get((node.cluster, id(node_values)))
            if group is None:
                group = groups[(node.cluster, id(node_values))] = (node.cluster, node_values, [])
            group[2].append(node.id)
        return groups

    def _index(self, facts: tuple[str, ...]) -> dict[tuple[str, ...], list[_Lane]]:
        index = self.indexes.get(facts)
        if index is None:
            index = defaultdict(lambda: [_Lane(), _Lane(), _Lane(), _Lane()])
            receivers = sorted(self.receivers, key=_NAME)
            for node, key in zip(receivers, self._keys(facts, receivers, False), strict=True):
                index[key][EXPOSED if node.exposed_to else CLEAN].ids.append(node.id)
            if self._later is None:
                self._later = (self._grouped(self.scope_by_wave, False), _positions(self.scope_by_wave))
            _add(index, LATER, facts, *self._later)
            _add(index, PATCHED, facts, self._grouped(self.patched, True), _positions(self.patched))
            self.indexes[facts] = index
        return index

    def begin_wave(self, wave: int, nodes_of: dict[int, list[PlanNode]]) -> None:
        """Wave `wave` starts: the nodes of wave - 2 have been patched and may receive as such."""
        self.current = wave
        patched = nodes_of.get(wave - 2, [])
        self.patched += patched
        if self.indexes:
            groups, position = self._grouped(patched, True), _positions(patched)
            for facts, index in self.indexes.items():
                _add(index, PATCHED, facts, groups, position)

    def _fits(self, candidate: int, needed: portability.Requirements, gpus: int, source: PlanNode) -> bool:
        if candidate == source.id or self.free[candidate] < gpus:
            return False
        return not (needed.if_reported and portability.mismatches(needed, self.facts(candidate)))

    def find(self, needed: portability.Requirements, gpus: int, source: PlanNode) -> tuple[PlanNode, int] | None:
        """The preferred receiver for a checkpoint, with the lane it came from."""
        lanes = self._lanes.get((id(needed), source.cluster))
        if lanes is None:
            lanes = self._index(needed.facts).get((source.cluster, *[needed.must[f] for f in needed.facts]))
            if lanes is None:
                return None
            self._lanes[(id(needed), source.cluster)] = lanes  # an index's lanes, once there, stay the same list
        free = self.free
        for lane_no in (CLEAN, PATCHED, EXPOSED):
            lane = lanes[lane_no]
            ids, rotor = lane.ids, lane.rotor
            usable = len(ids)
            while rotor < usable and free[ids[rotor]] <= 0:  # passed as full once and for all (as _scan does)
                rotor += 1
            lane.rotor = rotor
            if rotor >= usable:
                continue
            # Most moves take the lane's first candidate with room: tried here before a scan (which
            # would try it first, too).
            candidate = ids[rotor]
            if (candidate != source.id and free[candidate] >= gpus
                    and not (needed.if_reported and portability.mismatches(needed, self.facts(candidate)))):
                return self.by_id[candidate], lane_no
            found = self._scan(lane, needed, gpus, source, usable=usable, rotate=False)
            if found is not None:
                return found, lane_no
        later = lanes[LATER]
        if len(later.waves) != len(later.ids):
            later.waves = [-self.wave_of[i] for i in later.ids]
        # Far enough ahead: waves after the next (a prefix, the lane being sorted latest first).
        usable = bisect.bisect_left(later.waves, -(self.current + 1))
        if usable:  # the candidate at the rotor first, as in the preference lanes
            index = later.rotor % usable
            candidate = later.ids[index]
            if (0 < free[candidate] and candidate != source.id and free[candidate] >= gpus
                    and not (needed.if_reported and portability.mismatches(needed, self.facts(candidate)))):
                later.rotor = index + 1
                return self.by_id[candidate], LATER
        found = self._scan(later, needed, gpus, source, usable=usable, rotate=True)
        return (found, LATER) if found is not None else None

    def _scan(self, lane: _Lane, needed: portability.Requirements, gpus: int, source: PlanNode, usable: int,
              rotate: bool) -> PlanNode | None:
        """The first candidate with room (from the rotor when `rotate`); full ones are dropped for good.

        A receiver only fills up while it can receive (until its own wave drains it, and then it is
        out of this lane's reach), so a full one never needs looking at again: dropping them keeps
        the planner linear when capacity runs out.
        """
        ids, free = lane.ids, self.free
        dead = 0
        if rotate:
            start = lane.rotor % usable if usable else 0
        else:  # in preference order: the full ones at the front are passed once and for all
            while lane.rotor < usable and free[ids[lane.rotor]] <= 0:
                lane.rotor += 1
            start = lane.rotor
        for offset in range(usable - (0 if rotate else start)):
            index = (start + offset) % usable
            candidate = ids[index]
            if free[candidate] <= 0:
                dead += 1
                continue
            if self._fits(candidate, needed, gpus, source):
                if rotate:
                    lane.rotor = index + 1
                return self.by_id[candidate]
        if dead > 16 and dead * 4 > usable:
            keep = [i for i in ids[:usable] if free[i] > 0]
            lane.ids = keep + ([] if rotate else ids[usable:])  # later waves past reach go too
            lane.waves = [-self.wave_of[i] for i in lane.ids] if rotate else lane.waves
            lane.rotor = 0
        return None


def _restart_text(policy: Policy, cluster: str) -> tuple[str, str]:
    who = policy.restarters.get(cluster, "")
    if who:
        return who, f"restarted from its beginning by {who}"
    return "", "nobody restarts it: its owner must start it again after the patch"


@dataclass
class _Outcome:
    cold_starts: list[dict[str, Any]] = field(default_factory=list)
    finish_first: list[dict[str, Any]] = field(default_factory=list)
    no_capacity: list[dict[str, Any]] = field(default_factory=list)
    exposed_receivers: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Moves by action and nodes by what the summary counts, counted as they are planned.
    migrations: int = 0
    returns_home: int = 0
    livepatch: int = 0  # nodes whose remedy is a livepatch
    packages_in_place: int = 0
    past_deadline: int = 0


# The workload policies as plain strings (read per workload).
_CHECKPOINT, _WAIT, _COLD_RESTART = WorkloadPolicy.CHECKPOINT, WorkloadPolicy.WAIT, WorkloadPolicy.COLD_RESTART


def _place(workload: PlanWorkload, node: PlanNode, capacity: Capacity, policy: Policy,
           outcome: _Outcome, carried: dict[int, list[tuple[PlanWorkload, str]]]) -> tuple[dict[str, Any], str]:
    """Decide one workload's way off `node`; returns its plan entry and the risk it adds ("" for none)."""
    gpus, engine, owner = workload.gpus, workload.checkpoint_engine, workload.owner
    checkpointable = _checkpointable(engine)
    # Its scheduler's words on how it moves, after the plan's own (a zone, stop-first, pinned, unverified).
    notes = "".join(f"; {n}" for n in workload.notes) if workload.notes else ""
    pinned = dict(workload.requires).get(portability.PINNED, "") if workload.requires else ""
    checkpoints = checkpointable and workload.policy == _CHECKPOINT and not pinned
    if checkpoints:
        needed, requires, depends, home_ok = capacity.terms(workload, node)
        found = None if (policy.placement == HOME and home_ok) else capacity.find(needed, gpus, node)
        if found is not None:
            target, lane = found
            target_id = target.id
            free = capacity.free[target_id] = capacity.free[target_id] - gpus
            if lane == CLEAN:
                where = "outside the campaign"
            elif lane == PATCHED:
                where = f"patched in wave {capacity.wave_of[target_id]}"
            elif lane == EXPOSED:
                where = "outside the campaign, itself exposed to this campaign's advisories"
            else:
                where = f"in wave {capacity.wave_of[target_id]}, moved again then"
                if target_id in capacity.facts_after:
                    carried[target_id].append((workload, node.name))
            outcome.migrations += 1
            why = f"{depends}; {free + gpus} GPUs free on {target.name}; {where}{notes}"
            # Built whole (the common entry: one allocation, no growing), the keys in the order of the others.
            entry: dict[str, Any] = (
                {"workload": workload.ref, "name": workload.name, "gpus": gpus, "engine": engine, "owner": owner,
                 "requires": requires, "action": "migrate", "to": target_id, "to_name": target.name, "why": why}
                if owner else
                {"workload": workload.ref, "name": workload.name, "gpus": gpus, "engine": engine,
                 "requires": requires, "action": "migrate", "to": target_id, "to_name": target.name, "why": why})
            if lane == EXPOSED:
                item = outcome.exposed_receivers.setdefault(target.id, {
                    "node": target.id, "name": target.name, "cluster": target.cluster,
                    "advisories": list(target.exposed_to), "workloads": []})
                item["workloads"].append(workload.ref)
            return entry, ""
    entry = {"workload": workload.ref, "name": workload.name, "gpus": gpus, "engine": engine}
    if owner:
        entry["owner"] = owner
    if checkpoints:
        entry["requires"] = requires
        if home_ok:
            outcome.returns_home += 1
            entry.update(action="return_home", to=node.id, to_name=node.name,
                         why=f"{needed.engine} checkpoint stays valid on {node.name} after the patch: restored there "
                             f"after the reboot{notes}")
            return entry, ""
    label = workload.name or workload.ref
    # A workload with a controller other than the one gpusweep copies into is never copied: the plan says whose.
    owned = f"; owned by {workload.owner}, never copied" if workload.owner and not checkpointable else ""
    # A pinned workload is never checkpointed for nothing: waited for, or cold-started where the campaign allows it.
    if workload.policy == _WAIT or (pinned and workload.policy == _CHECKPOINT and not policy.cold_restart_allowed):
        waits = ("policy waits for it to end before the node drains" if workload.policy == _WAIT else
                 "the node waits for it to end before it drains")
        entry.update(action="finish_first", why=f"{waits}{owned}{notes}")
        outcome.finish_first.append({"node": node.id, "node_name": node.name, **entry})
        return entry, f"waits for {label} to finish"
    if workload.policy == _COLD_RESTART or policy.cold_restart_allowed or not checkpointable:
        reason = (f"it cannot be checkpointed ({workload.checkpoint_engine})" if not checkpointable else
                  "it cannot move" if pinned else
                  "no node where its checkpoint is valid has room outside this and the next wave")
        if workload.policy == _COLD_RESTART:
            reason = "its policy is a cold restart"
        restarter, restart = _restart_text(policy, node.cluster)
        if owned:
            restarter, restart = workload.owner, f"started again by its controller, {workload.owner}"
        entry["action"] = "cold_start"
        entry["to"] = node.id
        entry["to_name"] = node.name
        entry["restarted_by"] = restarter
        entry["why"] = f"{reason}{owned}; stopped before the patch, {restart}{notes}"
        outcome.cold_starts.append({"node": node.id, "node_name": node.name, **entry})
        return entry, f"cold start of {label}"
    entry.update(action="blocked", why="no node where its checkpoint is valid has enough free GPUs, and cold "
                                       "restart is not allowed: the node waits for it to end (up to the wait "
                                       f"limit) and fails if it does not{notes}")
    outcome.no_capacity.append({"node": node.id, "node_name": node.name, **entry})
    return entry, f"no capacity for {label}"


def _wave_times(policy: Policy, last_wave: int, soak_after_first: bool) -> dict[
        int, tuple[datetime | None, datetime | None]]:
    calendar = Calendar(policy.windows, policy.blackouts, policy.start)
    duration = timedelta(seconds=policy.node_seconds)
    times: dict[int, tuple[datetime | None, datetime | None]] = {}
    moment: datetime | None = policy.start
    for wave in range(1, last_wave + 1):
        begins = calendar.earliest(moment, duration) if moment else None
        times[wave] = (begins, begins + duration if begins else None)
        moment = begins + duration if begins else None
        if wave == 1 and soak_after_first and moment is not None:
            moment += timedelta(seconds=policy.soak_s)  # the canary soaks before anything else drains
    return times


def _limits(scope: list[PlanNode], receivers: list[PlanNode], policy: Policy) -> tuple[
        dict[str, int], dict[tuple[str, str], int] | None]:
    every = [*scope, *receivers]
    # Counted in C (Counter over attribute getters), in order of first appearance as a loop would.
    cluster_sizes = Counter(map(_CLUSTER, every))
    pool_sizes = Counter(zip(map(_CLUSTER, every), map(_POOL, every), strict=True))
    per_cluster = {c: parse_limit(policy.per_cluster, size, "parallelism_per_cluster")
                   for c, size in cluster_sizes.items()}
    per_pool = ({p: parse_limit(policy.per_pool, size, "parallelism_per_pool") for p, size in pool_sizes.items()}
                if policy.per_pool.strip() else None)
    return per_cluster, per_pool


def plan(scope: list[PlanNode], receivers: list[PlanNode], policy: Policy) -> dict[str, Any]:
    """Plan `scope` (nodes to patch); `receivers` are other nodes that may take moved work."""
    # A plan allocates millions of small objects and frees few until it returns: the cyclic
    # collector would scan them all, over and over (a third of a 100,000-node plan's time).
    # Reference counting still frees what dies; the collector resumes at the end.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _plan(scope, receivers, policy)
    finally:
        if collecting:
            gc.enable()


def _urgency_order(scope: list[PlanNode], default: datetime) -> list[PlanNode]:
    """`scope` sorted by (last, deadline or `default`, cluster, pool, name, id): one stable sort per
    key, the least significant first (the same order as one sort on the tuple, ties in the scope's
    order; each pass compares single values, cheaper than tuples, and ids and names come nearly sorted)."""
    ordered = sorted(scope, key=_ID)
    for key in (_NAME, _POOL, _CLUSTER):
        ordered.sort(key=key)
    ordered.sort(key=lambda n: n.deadline or default)
    ordered.sort(key=_LAST)
    return ordered


_ID, _NAME, _POOL, _CLUSTER, _LAST = (operator.attrgetter(a) for a in ("id", "name", "pool", "cluster", "last"))


def _plan(scope: list[PlanNode], receivers: list[PlanNode], policy: Policy) -> dict[str, Any]:
    ordered = _urgency_order(scope, policy.deadline or FAR)
    per_cluster, per_pool = _limits(scope, receivers, policy)
    canary = canary_nodes([n for n in ordered if not n.last], policy.canary)
    waves = assign_waves(ordered, per_cluster, per_pool, canary, policy.growth, policy.growth_step)
    capacity = Capacity(scope, receivers, waves)
    last_wave = max(waves.values(), default=0)
    wave_times = _wave_times(policy, last_wave, bool(canary))
    nodes_of: dict[int, list[PlanNode]] = defaultdict(list)  # each wave's nodes in urgency order
    for node in ordered:
        nodes_of[waves[node.id]].append(node)
    outcome = _Outcome()
    carried: dict[int, list[tuple[PlanWorkload, str]]] = defaultdict(list)  # arrivals: (workload, from node's name)
    explained: dict[str, dict[str, Any]] = {}
    position = 0
    for wave in range(1, last_wave + 1):
        capacity.begin_wave(wave, nodes_of)
        begins, ends = wave_times[wave]
        times = (begins, ends, _iso(begins), _iso(ends))  # formatted once for the wave's nodes
        for node in nodes_of.get(wave, []):
            position += 1
            explained[str(node.id)] = _plan_node(node, wave, position, times, capacity, policy, outcome, carried)
    result = _result(policy, waves, nodes_of, wave_times, explained, outcome, per_cluster, per_pool, scope)
    canary_end = wave_times.get(1, (None, None))[1] if canary else None
    result["canary"] = {"nodes": canary, "soak_s": policy.soak_s if canary else 0,
                        "soak_until": _iso(canary_end + timedelta(seconds=policy.soak_s)) if canary_end else None}
    result["growth"] = {"kind": policy.growth, "step": policy.growth_step}
    for wave in result["waves"]:
        wave["size"] = len(wave["nodes"])
        wave["canary"] = bool(canary) and wave["wave"] == 1
    return result


# The steps of a node that is drained (not fixed in place).
_DRAINED_STEPS = SweepState.steps_of(None)

# Actions that keep a workload's GPUs on its own node through the patch.
_STAYS = frozenset({"return_home", "cold_start", "finish_first"})


# A wave's start and end, and the two in ISO form.
_Times = tuple[datetime | None, datetime | None, str | None, str | None]


def _plan_node(node: PlanNode, wave: int, position: int, times: _Times, capacity: Capacity, policy: Policy,
               outcome: _Outcome, carried: dict[int, list[tuple[PlanWorkload, str]]]) -> dict[str, Any]:
    if in_place(node.target):
        arrived = [w for w, _from in carried.pop(node.id, [])]  # moved here earlier: they stay too
        return _plan_in_place(node, [*node.workloads, *arrived], wave, position, times, policy, outcome)
    begins, ends, start_iso, end_iso = times
    # The node is drained: its own work leaves, then what moved here earlier (what comes back home
    # is counted again below).
    free = capacity.free
    node_id = node.id
    free[node_id] = node.gpu_count
    risks: list[str] = []
    moves: list[dict[str, Any]] = []
    for workload in node.workloads:
        entry, risk = _place(workload, node, capacity, policy, outcome, carried)
        if entry["action"] in _STAYS:
            free[node_id] -= workload.gpus
        if risk:
            risks.append(risk)
        moves.append(entry)
    arrivals = carried.pop(node_id, None)
    if arrivals:
        for workload, came_from in arrivals:
            entry, risk = _place(workload, node, capacity, policy, outcome, carried)
            entry["arrived_from"] = came_from
            if entry["action"] in _STAYS:
                free[node_id] -= workload.gpus
            if risk:
                risks.append(risk)
            moves.append(entry)
    deadline = node.deadline or policy.deadline
    if begins is None:
        risks.append("no window within the planning horizon")
    elif deadline is not None and ends is not None and ends > deadline:
        risks.append(f"past deadline {_iso(deadline)}")
        outcome.past_deadline += 1
    target, versions = node.target, node.versions
    shown = {}  # the versions now of what the target changes (a loop: cheaper than a comprehension for 1 or 2)
    for component in target:
        shown[component] = versions.get(component, "")
    planned: dict[str, Any] = {
        "name": node.name, "cluster": node.cluster, "pool": node.pool, "wave": wave, "position": position,
        "expected_start": start_iso, "expected_end": end_iso, "deadline": _iso_of(deadline) if deadline else None,
        "target": target, "versions": shown,
        "last_group": node.last, "moves": moves, "risks": risks, "steps": list(_DRAINED_STEPS),
    }
    if node.remedy:
        planned["remedy"] = node.remedy
        outcome.livepatch += node.remedy == "livepatch"
    return planned


def _plan_in_place(node: PlanNode, workloads: list[PlanWorkload], wave: int, position: int, times: _Times,
                   policy: Policy, outcome: _Outcome) -> dict[str, Any]:
    """A node fixed in place (a livepatch, OS packages' update) keeps its work where it is: nothing
    moves, nothing is checkpointed, and it takes no work from others (its GPUs stay busy with its own)."""
    _begins, ends, start_iso, end_iso = times
    deadline = node.deadline or policy.deadline
    risks = [f"past deadline {_iso(deadline)}"] if deadline and ends and ends > deadline else []
    outcome.past_deadline += bool(risks)
    outcome.livepatch += (node.remedy or "livepatch") == "livepatch"
    outcome.packages_in_place += OS_PACKAGES in node.target
    why = []
    if LIVEPATCH in node.target:
        why.append("a livepatch fixes the running kernel")
    if OS_PACKAGES in node.target:
        why.append("a package update in place")
        # What unattended-upgrades leaves as well: running processes keep the old code until they restart.
        risks.append("processes running now keep the packages' old code until they restart")
    return {
        "name": node.name, "cluster": node.cluster, "pool": node.pool, "wave": wave, "position": position,
        "expected_start": start_iso, "expected_end": end_iso, "deadline": _iso(deadline),
        "target": node.target, "versions": {c: node.versions.get(c, "") for c in node.target},
        "last_group": node.last, "moves": [], "risks": risks, "steps": list(SweepState.steps_of(node.target)),
        "remedy": node.remedy or "livepatch", "in_place": True,
        "stays": [{"workload": w.ref, "name": w.name, "gpus": w.gpus,
                   "why": f"{' and '.join(why)}: no drain, no checkpoint, no reboot"}
                  for w in workloads],
    }


def _result(policy: Policy, waves: dict[int, int], nodes_of: dict[int, list[PlanNode]],
            wave_times: dict[int, tuple[datetime | None, datetime | None]], explained: dict[str, dict[str, Any]],
            outcome: _Outcome, per_cluster: dict[str, int], per_pool: dict[tuple[str, str], int] | None,
            scope: list[PlanNode]) -> dict[str, Any]:
    last_wave = max(waves.values(), default=0)
    wave_list = [
        {"wave": w, "start": _iso(wave_times[w][0]), "end": _iso(wave_times[w][1]),
         "nodes": [n.id for n in nodes_of.get(w, [])]}
        for w in range(1, last_wave + 1)
    ]
    exposed = sorted(outcome.exposed_receivers.values(), key=lambda r: r["name"])
    return {
        "generated_at": _iso(policy.start),
        # The limits as numbers, so execution enforces exactly what the approver read.
        "limits": {
            "cluster": per_cluster,
            "pool": {f"{c}/{p}": v for (c, p), v in per_pool.items()} if per_pool is not None else None,
        },
        "waves": wave_list,
        "nodes": explained,
        "cold_starts": outcome.cold_starts,
        "finish_first": outcome.finish_first,
        "no_capacity": outcome.no_capacity,
        # Receivers outside the campaign that stay exposed while they hold moved work.
        "exposed_receivers": exposed,
        "offers": ([{"action": "add_last_group", "nodes": [r["node"] for r in exposed],
                     "why": "these receivers are exposed to the campaign's advisories themselves: sweep them last"}]
                   if exposed else []),
        "summary": {
            "nodes": len(scope), "waves": last_wave,
            "expected_end": wave_list[-1]["end"] if wave_list else None,
            "migrations": outcome.migrations, "returns_home": outcome.returns_home,
            "livepatch_only": outcome.livepatch, "packages_in_place": outcome.packages_in_place,
            "cold_starts": len(outcome.cold_starts), "finish_first": len(outcome.finish_first),
            "no_capacity": len(outcome.no_capacity), "exposed_receivers": len(exposed),
            "past_deadline": outcome.past_deadline,
        },
    }


def compare(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """What changes between two plans, node by node."""
    before, after = old.get("nodes", {}), new.get("nodes", {})
    changed = []
    for key in sorted(set(before) & set(after), key=int):
        a, b = before[key], after[key]
        diff = {}
        for name in ("wave", "target", "expected_start"):
            if a.get(name) != b.get(name):
                diff[name] = [a.get(name), b.get(name)]
        moves_a = {m["workload"]: (m.get("action"), m.get("to")) for m in a.get("moves", [])}
        moves_b = {m["workload"]: (m.get("action"), m.get("to")) for m in b.get("moves", [])}
        if moves_a != moves_b:
            diff["moves"] = [moves_a, moves_b]
        if diff:
            changed.append({"node": int(key), "name": b.get("name"), **diff})
    return {
        "added": sorted(int(k) for k in set(after) - set(before)),
        "removed": sorted(int(k) for k in set(before) - set(after)),
        "changed": changed,
        "summary": [old.get("summary", {}), new.get("summary", {})],
    }
