"""Compare the strategies on one fleet and trace: the rows of the comparison table.

`simulate(nodes, trace, params)` places the trace once (the baseline), then replays each
strategy with each of its cadences (windows: the cadences; drain-and-wait and sweeps: the
parallelism values) and measures, per run: the time until the whole fleet is patched, exposure
node-days (each node's days from release to patched), idle and recomputed GPU-hours, cold starts,
and whether the severity's deadline is met. Pure: no database.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from costs.fleet import SimNode
from costs.model import ModelError, Params
from costs.placement import Placement, place
from costs.strategies import DAY, INF, Hold, Outcome, Scenario, drain_wait, sweep, window
from costs.trace import Trace
from costs.tracestats import TraceStats

STRATEGY_NAMES = {
    "window": "maintenance window",
    "drain_wait": "rolling drain and wait",
    "sweep": "checkpoint-migrate sweep",
}


@dataclass(frozen=True)
class Row:
    strategy: str
    cadence: str
    days_to_patched: float | None  # None: not every node was patched
    nodes_patched: int
    exposure_node_days: float
    idle_gpu_hours: float
    recomputed_gpu_hours: float
    cold_starts: int
    deadline_met: bool
    seconds: float
    notes: tuple[str, ...] = ()
    holds: tuple[Hold, ...] = ()  # the workloads that held nodes, longest first

    @property
    def label(self) -> str:
        return STRATEGY_NAMES[self.strategy]

    def as_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy, "cadence": self.cadence,
            "days_to_patched": None if self.days_to_patched is None else round(self.days_to_patched, 3),
            "nodes_patched": self.nodes_patched, "exposure_node_days": round(self.exposure_node_days, 1),
            "idle_gpu_hours": round(self.idle_gpu_hours, 1),
            "recomputed_gpu_hours": round(self.recomputed_gpu_hours, 1),
            "cold_starts": self.cold_starts, "deadline_met": self.deadline_met, "notes": list(self.notes),
            "holds": [{"node": h.node, "task": h.task, "hours": round(h.hours, 2), "ended": h.ended,
                       **({"why": h.why} if h.why else {})} for h in self.holds],
        }


@dataclass
class Result:
    params: Params
    release: float
    trace: Trace
    nodes: int
    gpus: int
    placement: Placement
    rows: list[Row]
    # Per row: (days since release, share of the fleet patched) at each node's patch.
    curves: list[list[tuple[float, float]]] = field(default_factory=list)
    utilization: float = 0.0
    stats: TraceStats | None = None  # from the trace file itself, when it is a pod/task CSV

    def facts(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes, "gpus": self.gpus, "tasks": len(self.trace.tasks),
            "placed": len(self.trace.tasks) - self.placement.unplaced, "unplaced": self.placement.unplaced,
            "unplaced_no_model": dict(self.placement.no_model),
            "skipped": dict(self.trace.skipped), "trace_days": round(self.trace.end / DAY, 2),
            "release": self.trace.at(self.release).isoformat(), "release_day": round(self.release / DAY, 2),
            "deadline_days": self.params.deadline_days, "severity": self.params.severity,
            "utilization_at_release": round(self.utilization, 4),
        }

    def as_dict(self) -> dict[str, Any]:
        out = {"facts": self.facts(), "params": self.params.as_dict(), "rows": [r.as_dict() for r in self.rows]}
        if self.stats is not None:
            out["trace_stats"] = {"rows": self.stats.rows, "gpu_tasks": self.stats.gpu_tasks,
                                  "constrained": self.stats.constrained, "gpu_hours": round(self.stats.gpu_hours, 1),
                                  "utilization": [[d, round(u, 5)] for d, u in self.stats.utilization(self.gpus)]}
        return out


def row_of(outcome: Outcome, scenario: Scenario, seconds: float) -> Row:
    release = scenario.release
    done = [t for t in outcome.patched_at if t < INF]
    horizon = max(scenario.trace.end, max(done, default=release))
    exposure = sum((min(t, horizon) - release) / DAY for t in outcome.patched_at)
    complete = len(done) == len(outcome.patched_at)
    last = max(done, default=release)
    notes = list(outcome.notes)
    if not complete:
        notes.append(f"exposure counted until {scenario.trace.at(horizon):%Y-%m-%d} for unpatched nodes (a floor)")
    return Row(
        strategy=outcome.strategy, cadence=outcome.cadence,
        days_to_patched=(last - release) / DAY if complete else None, nodes_patched=len(done),
        exposure_node_days=exposure, idle_gpu_hours=outcome.idle_gpu_hours,
        recomputed_gpu_hours=outcome.recomputed_gpu_hours, cold_starts=outcome.cold_starts,
        deadline_met=complete and last <= scenario.deadline, seconds=seconds, notes=tuple(notes),
        holds=tuple(outcome.holds),
    )


def _with_order_note(row: Row, scenario: Scenario, cadence: str) -> Row:
    """Where nodes waited under the engine's wave order, what that order cost or saved: the same sweep
    had waiting nodes held the order (`wave_order` "hold", the engine before issue 32) and had they
    given their slots back too ("own_work"); neither is what the engine does."""
    if scenario.params.wave_order != "strict" or not any(h.hours > 0 for h in row.holds):
        return row
    other = {}
    for order in ("hold", "own_work"):
        changed = replace(scenario, params=scenario.params.with_(wave_order=order))
        other[order] = row_of(sweep(changed, cadence), changed, 0.0).exposure_node_days
    waited = len({h.node for h in row.holds if h.hours > 0})
    note = (f"the engine's wave order (campaigns.policy.admits: wave v once every wave up to v-2 is done) lets "
            f"later waves start while a node waits for a receiver alone, its slot kept ({waited} node(s) waited "
            f"here): {row.exposure_node_days:,.1f} node-days; {other['hold']:,.1f} had a waiting node held its "
            f"wave (--wave-order hold, the engine before issue 32), {other['own_work']:,.1f} had it given its "
            "slot back too (--wave-order own_work); neither is what the engine does")
    return replace(row, notes=(*row.notes, note))


def simulate(nodes: list[SimNode], trace: Trace, params: Params,
             strategies: tuple[str, ...] = ("window", "drain_wait", "sweep")) -> Result:
    if not nodes:
        raise ModelError("the fleet has no node")
    if not trace.tasks:
        raise ModelError("the trace has no task that ran on GPUs")
    release = params.release_s if params.release_s is not None else trace.end / 2
    if not 0 <= release <= trace.end:
        raise ModelError(f"release_s={release:g}: outside the trace (0 to {trace.end:g} s)")
    placement = place(trace.tasks, nodes, params.placement)
    scenario = Scenario(nodes=nodes, trace=trace, placement=placement, params=params, release=release)
    gpus = sum(n.gpus for n in nodes)
    busy = sum(t.milli for t in scenario.placed() if t.alive(release)) / 1000
    rows: list[Row] = []
    curves: list[list[tuple[float, float]]] = []
    runs = [(name, cadence) for name in strategies
            for cadence in (params.cadences if name == "window" else params.parallelism)]
    for name, cadence in runs:
        began = time.perf_counter()
        runner = {"window": window, "drain_wait": drain_wait, "sweep": sweep}[name]
        outcome = runner(scenario, cadence)
        row = row_of(outcome, scenario, time.perf_counter() - began)
        rows.append(_with_order_note(row, scenario, cadence) if name == "sweep" else row)
        done = sorted(t for t in outcome.patched_at if t < INF)
        curves.append([(round((t - release) / DAY, 4), round((i + 1) / len(nodes), 4)) for i, t in enumerate(done)])
    return Result(params=params, release=release, trace=trace, nodes=len(nodes), gpus=gpus, placement=placement,
                  rows=rows, curves=curves, utilization=busy / gpus if gpus else 0.0)
