"""What a pod/task trace holds, computed from its CSV alone (no model, no placement).

Shown beside the simulator's results so a reader can check them: tasks, GPU tasks, tasks
constrained to GPU models, GPU-hours, and the share of the fleet's GPUs busy over time (a task
holds `num_gpu x gpu_milli / 1000` GPUs from `scheduled_time` until `deletion_time`; one deleted at
the very end of the trace, or never, is running at the end).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

DAY = 86400.0


@dataclass(frozen=True)
class TraceStats:
    rows: int
    gpu_tasks: int  # started, with GPUs
    constrained: int  # GPU tasks with a gpu_spec
    gpu_hours: float  # up to the trace's end
    end_s: float
    samples: tuple[tuple[float, float], ...]  # (seconds, busy GPUs) at each sample

    def utilization(self, fleet_gpus: int) -> list[tuple[float, float]]:
        """(day, share of the fleet's GPUs busy) at each sample."""
        return [(round(t / DAY, 3), busy / fleet_gpus if fleet_gpus else 0.0) for t, busy in self.samples]


def _spans(text: str) -> tuple[int, list[tuple[float, float, float, bool]], float]:
    """(rows, [(start, end or inf, GPUs, constrained)] of started GPU tasks, trace end)."""
    reader = csv.DictReader(io.StringIO(text.lstrip("\ufeff"), newline=""))
    rows = 0
    raw: list[tuple[float, str, float, bool]] = []
    end = 0.0
    for record in reader:
        rows += 1
        deleted = (record.get("deletion_time") or "").strip()
        if deleted:
            end = max(end, float(deleted))
        scheduled = (record.get("scheduled_time") or "").strip()
        milli = (record.get("gpu_milli") or "").strip()
        gpus = float(record.get("num_gpu") or 0) * (float(milli) if milli else 1000.0) / 1000
        if scheduled and gpus > 0:
            raw.append((float(scheduled), deleted, gpus, bool((record.get("gpu_spec") or "").strip())))
    spans = [(s, float(d) if d and float(d) < end else float("inf"), g, c) for s, d, g, c in raw]
    return rows, spans, end


def busy_at(text: str, seconds: float) -> float:
    """GPUs busy at `seconds` on the trace's clock."""
    _rows, spans, _end = _spans(text)
    return sum(g for s, e, g, _c in spans if s <= seconds < e)


def trace_stats(text: str, extra: tuple[float, ...] = (), every_s: float = DAY) -> TraceStats:
    """Stats of an openb-format CSV, sampled every `every_s` and at the moments in `extra`."""
    rows, spans, end = _spans(text)
    moments = sorted({*(k * every_s for k in range(int(end // every_s) + 1)), *extra})
    samples = tuple((t, sum(g for s, e, g, _c in spans if s <= t < e)) for t in moments)
    hours = sum(g * (min(e, end) - s) / 3600 for s, e, g, _c in spans if s < end)
    return TraceStats(rows=rows, gpu_tasks=len(spans), constrained=sum(1 for *_x, c in spans if c),
                      gpu_hours=hours, end_s=end, samples=samples)
