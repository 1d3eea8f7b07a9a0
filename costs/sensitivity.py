"""Where the sweep wins and where it does not: one parameter at a time around a base.

Each axis (parallelism, window cadence, checkpointable share, wait limit) is varied alone, every
other parameter as given; each point runs every strategy and keeps exposure node-days (and
GPU-hours lost: idle plus recomputed, and the nodes a strategy left unpatched, whose node-days run
to the trace's end: a floor). The best of the three is named per point.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from costs.fleet import SimNode
from costs.model import Params
from costs.simulate import simulate
from costs.trace import Trace

AXES: dict[str, tuple[Any, ...]] = {
    "parallelism": ("1", "1%", "2%", "5%", "10%", "20%"),
    "cadences": ("monthly", "quarterly", "yearly"),
    "checkpointable_share": (0.0, 0.5, 0.8, 1.0),
    "wait_limit_h": (6.0, 24.0, 72.0, 168.0, None),
}
STRATEGIES = ("window", "drain_wait", "sweep")


@dataclass(frozen=True)
class Point:
    axis: str
    value: str
    exposure: dict[str, float]  # strategy -> node-days
    lost_gpu_hours: dict[str, float]  # strategy -> idle + recomputed
    # strategy -> nodes left unpatched (their node-days counted to the trace's end: a floor)
    unpatched: dict[str, int] = field(default_factory=dict)

    @property
    def best(self) -> str:
        return min(self.exposure, key=lambda s: (self.exposure[s], STRATEGIES.index(s)))


def _label(value: Any) -> str:
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def sensitivity(nodes: list[SimNode], trace: Trace, base: Params,
                axes: dict[str, tuple[Any, ...]] | None = None) -> list[Point]:
    """One Point per value of each axis. Windows run at the base's first cadence, drains and sweeps
    at its first parallelism, except along their own axis."""
    points = []
    for axis, values in (axes or AXES).items():
        for value in values:
            changes: dict[str, Any] = {"parallelism": base.parallelism[:1], "cadences": base.cadences[:1]}
            changes[axis] = (value,) if axis in ("parallelism", "cadences") else value
            result = simulate(nodes, trace, base.with_(**changes))
            by = {r.strategy: r for r in result.rows}
            points.append(Point(axis=axis, value=_label(value),
                                exposure={s: by[s].exposure_node_days for s in STRATEGIES},
                                lost_gpu_hours={s: by[s].idle_gpu_hours + by[s].recomputed_gpu_hours
                                                for s in STRATEGIES},
                                unpatched={s: result.nodes - by[s].nodes_patched for s in STRATEGIES}))
    return points


def table(points: list[Point]) -> str:
    header = ["axis", "value", "window node-days", "drain node-days", "sweep node-days", "window GPU-h lost",
              "drain GPU-h lost", "sweep GPU-h lost", "unpatched w/d/s", "best"]
    cells = [[p.axis, p.value, *(f"{p.exposure[s]:,.1f}" for s in STRATEGIES),
              *(f"{p.lost_gpu_hours[s]:,.0f}" for s in STRATEGIES),
              "/".join(str(p.unpatched.get(s, 0)) for s in STRATEGIES), p.best] for p in points]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)
