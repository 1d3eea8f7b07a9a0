"""Text, CSV and JSON forms of the drain cost and the simulation, for the commands and the pages."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from costs.drain import WindowCost
from costs.simulate import Result, Row

DRAIN_COLUMNS = ["window", "baseline_start", "baseline_end", "baseline_submissions_per_day",
                 "baseline_gpu_hours_per_day", "drain_gpu_hours_net", "days_above_baseline", "held_jobs",
                 "held_requested_gpu_hours", "held_without_limit", "running_jobs", "recompute_gpu_hours_ceiling"]
SIM_COLUMNS = ["strategy", "cadence", "days_to_patched", "nodes_patched", "exposure_node_days", "idle_gpu_hours",
               "recomputed_gpu_hours", "cold_starts", "deadline_met"]


def _csv(columns: list[str], rows: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def drain_csv(costs: list[WindowCost]) -> str:
    return _csv(DRAIN_COLUMNS, [c.summary() for c in costs])


def drain_json(costs: list[WindowCost]) -> str:
    return json.dumps({"windows": [c.as_dict() for c in costs]}, indent=2)


def drain_table(costs: list[WindowCost]) -> str:
    out: list[str] = []
    for cost in costs:
        s = cost.summary()
        out.append(f"Window opening {s['window']} (records up to {cost.as_of:%Y-%m-%dT%H:%M:%SZ})")
        out.append(f"  1. baseline {s['baseline_start']} to {s['baseline_end']}: "
                   f"{s['baseline_submissions_per_day']:g} submissions/day, "
                   f"{s['baseline_gpu_hours_per_day']:g} GPU-hours/day")
        out.append("  2. the drain, day by day before the window:")
        out.append(f"     {'day':>4}  {'from':<20} {'submissions':>11} {'GPU-hours':>10} {'short of baseline':>18}")
        for day in cost.days:
            short = cost.baseline_gpu_hours_per_day - day.gpu_hours  # negative: above the baseline
            out.append(f"     {day.offset:>4}  {day.start:%Y-%m-%dT%H:%M:%SZ} {day.submissions:>11} "
                       f"{day.gpu_hours:>10.2f} {short:>18.2f}")
        above = ", ".join(str(d) for d in cost.days_above) or "none"
        out.append(f"     drain (net, days above the baseline count against it): {s['drain_gpu_hours_net']:g} "
                   f"GPU-hours; days above the baseline: {above}")
        out.append(f"  3. held back: {s['held_jobs']} job(s) pending when the window opened, "
                   f"{s['held_requested_gpu_hours']:g} requested GPU-hours"
                   + (f" ({s['held_without_limit']} without a time limit, not in the hours)"
                      if s["held_without_limit"] else ""))
        for job in cost.held:
            limit = f"{job.limit_h:g} h" if job.limit_h is not None else "no limit"
            tasks = f" x{job.tasks}" if job.tasks > 1 else ""
            out.append(f"     {job.job_id}{tasks} {job.name}: {job.gpus} GPU(s), limit {limit}")
        out.append(f"  4. running when the window opened: {s['running_jobs']} job(s); the last save is unknown, so")
        out.append(f"  5. the work computed again is at most {s['recompute_gpu_hours_ceiling']:g} GPU-hours (elapsed)")
        for running in cost.running:
            out.append(f"     {running.job_id} {running.name}: {running.gpus} GPU(s) x {running.elapsed_h:.2f} h = "
                       f"{running.gpu_hours:.2f} GPU-hours, then {running.state}")
        out.extend(f"  note: {note}" for note in cost.notes)
        out.append("")
    return "\n".join(out)


def _cell(row: Row, column: str) -> str:
    value = row.as_dict()[column]
    if column == "days_to_patched":
        return "not all" if value is None else f"{value:.2f}"
    if column == "deadline_met":
        return "yes" if value else "no"
    if column == "strategy":
        return row.label
    return f"{value:,.1f}" if isinstance(value, float) else str(value)


def sim_table(result: Result) -> str:
    facts = result.facts()
    header = ["strategy", "cadence", "days to patched", "nodes patched", "exposure node-days", "idle GPU-h",
              "recomputed GPU-h", "cold starts", "deadline met"]
    cells = [[_cell(r, c) for c in SIM_COLUMNS] for r in result.rows]
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(header)]
    lines = [
        f"fleet: {facts['nodes']} nodes, {facts['gpus']} GPUs; trace: {facts['tasks']} GPU tasks over "
        f"{facts['trace_days']} days ({unplaced_text(facts)}; left out: {facts['skipped'] or 'none'})",
        f"advisory: {facts['severity']}, deadline {facts['deadline_days']:g} days, released at day "
        f"{facts['release_day']} ({facts['release']}); GPUs busy then: {facts['utilization_at_release']:.2%}",
        "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    for row in result.rows:
        lines.extend(f"  {row.label} {row.cadence}: {note}" for note in row.notes)
    lines.extend(holds_lines(result))
    lines.extend(stats_lines(result))
    return "\n".join(lines)


def unplaced_text(facts: dict[str, Any]) -> str:
    """`12 not placed, 5 of them constrained to GPU models this fleet lacks (A100: 5)`."""
    text = f"{facts['unplaced']} not placed"
    lacking = facts.get("unplaced_no_model") or {}
    if lacking:
        specs = ", ".join(f"{spec}: {n}" for spec, n in sorted(lacking.items()))
        text += f", {sum(lacking.values())} of them constrained to GPU models this fleet lacks ({specs})"
    return text


def holds_lines(result: Result, most: int = 5) -> list[str]:
    """Per run, the workloads that held nodes longest (the node waited for them)."""
    lines = []
    for row in result.rows:
        if not row.holds:
            continue
        held = ", ".join(f"{h.task} on {h.node} {h.hours:.1f} h ({f'{h.why}; ' if h.why else ''}{h.ended})"
                         for h in row.holds[:most])
        more = f" and {len(row.holds) - most} more" if len(row.holds) > most else ""
        lines.append(f"  held nodes, {row.label} {row.cadence}: {held}{more}")
    return lines


def stats_lines(result: Result) -> list[str]:
    """The trace as its file says (not the model): to check the results against."""
    stats = result.stats
    if stats is None:
        return []
    points = stats.utilization(result.gpus)
    peak = max(points, key=lambda p: p[1], default=(0.0, 0.0))
    mean = sum(u for _d, u in points) / len(points) if points else 0.0
    return [
        f"trace file: {stats.rows} rows, {stats.gpu_tasks} started GPU tasks ({stats.constrained} constrained "
        f"to GPU models), {stats.gpu_hours:,.0f} GPU-hours over {stats.end_s / 86400:.1f} days",
        f"  GPUs busy (of {result.gpus}), daily: mean {mean:.2%}, peak {peak[1]:.2%} on day {peak[0]:g}; "
        f"at the release {busy_share(result):.2%}",
    ]


def busy_share(result: Result) -> float:
    stats = result.stats
    if stats is None or not result.gpus:
        return 0.0
    busy = dict(stats.samples)
    return busy.get(result.release, 0.0) / result.gpus


def sim_csv(result: Result) -> str:
    return _csv(SIM_COLUMNS, [r.as_dict() for r in result.rows])


def sim_json(result: Result) -> str:
    return json.dumps(result.as_dict(), indent=2)
