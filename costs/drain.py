"""What a maintenance window cost, from the site's own accounting (BRIEF.md's method).

Per window opening at W, the five steps:

1. The window: W, and the span of the records (`as_of`: the latest moment they know).
2. The drain: submissions and GPU occupancy (GPU-hours of allocations) per day for the
   `lookback_days` days before W (day -1 is [W - 24 h, W)), against the average day of a baseline
   period (default: the week before those days). The drain is the net difference: the baseline's
   GPU-hours over those days less what they had (a day above the baseline counts against it, so
   ordinary noise nets out instead of adding up; the days above are listed). It is not clipped at
   zero: a negative drain says the days before the window were busier than the baseline.
3. Held back: jobs pending when the window opened (eligible before W, not started, not ended): at W
   every such job's time limit crosses the window, so the reservation held it. Their requested
   GPU-hours are GPUs x time limit; a job with no limit is counted apart (no hours can be given).
4. Work computed twice: for each job running when the window opened, the time since its last save
   times its GPUs. Accounting does not know the last save, so:
5. the elapsed GPU-hours at W (GPUs x (W - Start)) are the ceiling of the work computed again.

Every allocation is counted once per window: a requeued job's runs are separate allocations, a
job is submitted once (its first Submit), a pending array record counts each of its tasks.
Jobs without GPUs are left out of every step.

Records from plain `sacct` (without `-D`/`--duplicates`) show a requeued job once, with its Submit
reset to the requeue: a job whose Submit is later than that of a job submitted after it (a higher
job id) is the sign, and `duplicates_missing` names such jobs so the result carries a warning.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from costs.sacct import COMMAND, Accounting

DAY = timedelta(days=1)
HOUR = 3600.0


class DrainError(ValueError):
    """A window or baseline that cannot be measured; the message says which."""


@dataclass(frozen=True)
class Day:
    offset: int  # -1 is the day just before the window
    start: datetime
    submissions: int
    gpu_hours: float


@dataclass(frozen=True)
class HeldJob:
    job_id: str
    name: str
    tasks: int
    gpus: int
    eligible: datetime
    limit_h: float | None
    requested_gpu_hours: float | None  # GPUs x limit x tasks; None without a limit


@dataclass(frozen=True)
class RunningJob:
    job_id: str
    name: str
    gpus: int
    start: datetime
    state: str  # how the allocation ended (REQUEUED, CANCELLED, NODE_FAIL, ... or RUNNING)
    elapsed_h: float
    gpu_hours: float


@dataclass
class WindowCost:
    window: datetime
    as_of: datetime
    baseline_start: datetime
    baseline_end: datetime
    baseline_submissions_per_day: float
    baseline_gpu_hours_per_day: float
    days: list[Day]
    drain_gpu_hours: float
    held: list[HeldJob]
    running: list[RunningJob]
    notes: list[str] = field(default_factory=list)

    @property
    def days_above(self) -> list[int]:
        """Offsets of the days that had more GPU-hours than the baseline's average day."""
        return [d.offset for d in self.days if d.gpu_hours > self.baseline_gpu_hours_per_day]

    @property
    def held_jobs(self) -> int:
        return sum(job.tasks for job in self.held)

    @property
    def held_gpu_hours(self) -> float:
        return sum(job.requested_gpu_hours or 0.0 for job in self.held)

    @property
    def held_without_limit(self) -> int:
        return sum(job.tasks for job in self.held if job.limit_h is None)

    @property
    def recompute_ceiling_gpu_hours(self) -> float:
        return sum(job.gpu_hours for job in self.running)

    def summary(self) -> dict[str, Any]:
        return {
            "window": _iso(self.window), "baseline_start": _iso(self.baseline_start),
            "baseline_end": _iso(self.baseline_end),
            "baseline_submissions_per_day": round(self.baseline_submissions_per_day, 2),
            "baseline_gpu_hours_per_day": round(self.baseline_gpu_hours_per_day, 2),
            "drain_gpu_hours_net": round(self.drain_gpu_hours, 2),
            "days_above_baseline": self.days_above,
            "held_jobs": self.held_jobs, "held_requested_gpu_hours": round(self.held_gpu_hours, 2),
            "held_without_limit": self.held_without_limit, "running_jobs": len(self.running),
            "recompute_gpu_hours_ceiling": round(self.recompute_ceiling_gpu_hours, 2),
        }

    def as_dict(self) -> dict[str, Any]:
        def plain(item: Any) -> dict[str, Any]:
            return {k: _iso(v) if isinstance(v, datetime) else (round(v, 3) if isinstance(v, float) else v)
                    for k, v in asdict(item).items()}

        return {**self.summary(), "as_of": _iso(self.as_of), "days": [plain(d) for d in self.days],
                "held": [plain(j) for j in self.held], "running": [plain(j) for j in self.running],
                "notes": list(self.notes)}


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _overlap_h(a0: datetime, a1: datetime, b0: datetime, b1: datetime) -> float:
    return max(0.0, (min(a1, b1) - max(a0, b0)).total_seconds()) / HOUR


def occupancy(acct: Accounting, start: datetime, end: datetime) -> float:
    """GPU-hours allocated in [start, end)."""
    total = 0.0
    for job in acct.jobs:
        for run in job.runs:
            finished = run.finished_at(acct.as_of)
            if run.start is not None and finished is not None and run.gpus:
                total += run.gpus * _overlap_h(run.start, finished, start, end)
    return total


def submissions(acct: Accounting, start: datetime, end: datetime) -> int:
    return sum(job.count for job in acct.jobs if start <= job.submit < end and any(r.gpus for r in job.runs))


def held_back(acct: Accounting, window: datetime) -> list[HeldJob]:
    held = []
    for job in acct.jobs:
        for run in job.runs:
            if run.eligible >= window or not run.gpus:
                continue
            left_queue = run.start or run.end  # started, or cancelled while pending
            if left_queue is not None and left_queue < window:
                continue
            limit_h = run.limit_s / HOUR if run.limit_s is not None else None
            held.append(HeldJob(
                job_id=job.job_id, name=job.name, tasks=job.count, gpus=run.gpus, eligible=run.eligible,
                limit_h=limit_h, requested_gpu_hours=run.gpus * limit_h * job.count if limit_h is not None else None,
            ))
    return held


def running_at(acct: Accounting, window: datetime) -> list[RunningJob]:
    running = []
    for job in acct.jobs:
        for run in job.runs:
            finished = run.finished_at(acct.as_of)
            if run.start is None or finished is None or not run.gpus or not run.start < window < finished:
                continue
            elapsed_h = (window - run.start).total_seconds() / HOUR
            running.append(RunningJob(job_id=job.job_id, name=job.name, gpus=run.gpus, start=run.start,
                                      state=run.state, elapsed_h=elapsed_h, gpu_hours=run.gpus * elapsed_h))
    return running


def _number(job_id: str) -> int | None:
    digits = re.match(r"\d+", job_id)
    return int(digits.group()) if digits else None


def duplicates_missing(acct: Accounting, slack_s: float = 1.0) -> list[str]:
    """Jobs whose Submit is later than a higher-numbered job's (ids are given at submission): a
    requeue seen without --duplicates. A job with several runs was recorded with it."""
    numbered = sorted((job for job in acct.jobs if _number(job.job_id) is not None),
                      key=lambda job: _number(job.job_id) or 0)
    flagged: list[str] = []
    earliest_after: datetime | None = None
    for job in reversed(numbered):
        if (earliest_after is not None and len(job.runs) == 1
                and (job.submit - earliest_after).total_seconds() > slack_s):
            flagged.append(job.job_id)
        if earliest_after is None or job.submit < earliest_after:
            earliest_after = job.submit
    return sorted(flagged, key=lambda j: (_number(j) or 0, j))


def window_cost(acct: Accounting, window: datetime, baseline: tuple[datetime, datetime] | None = None,
                lookback_days: int = 7) -> WindowCost:
    if lookback_days < 1:
        raise DrainError(f"lookback of {lookback_days} days: give at least 1")
    first_day = window - lookback_days * DAY
    base_start, base_end = baseline or (first_day - 7 * DAY, first_day)
    if base_end <= base_start:
        raise DrainError(f"baseline {_iso(base_start)} to {_iso(base_end)}: the end must come after the start")
    base_days = (base_end - base_start) / DAY
    notes = []
    earliest = min((job.submit for job in acct.jobs), default=window)
    if base_start < earliest:
        notes.append(f"the baseline starts before the first record ({_iso(earliest)}): record from earlier, "
                     "or its average day is too low")
    if base_end > acct.as_of or window > acct.as_of:
        notes.append(f"the records end at {_iso(acct.as_of)}, before the baseline or window ends")
    if base_start < window and first_day < base_end:
        notes.append("the baseline overlaps the days before the window: the drain is measured against itself")
    late = duplicates_missing(acct)
    if late:
        notes.append(f"{len(late)} job(s) were submitted after later job ids ({', '.join(late[:5])}): the "
                     "records look like sacct without -D (--duplicates), which shows a requeued job once with "
                     f"its Submit reset; record again with: {COMMAND}")
    base_subs = submissions(acct, base_start, base_end) / base_days
    base_gpu_h = occupancy(acct, base_start, base_end) / base_days
    days = []
    for offset in range(-lookback_days, 0):
        start = window + offset * DAY
        days.append(Day(offset=offset, start=start, submissions=submissions(acct, start, start + DAY),
                        gpu_hours=occupancy(acct, start, start + DAY)))
    return WindowCost(
        window=window, as_of=acct.as_of, baseline_start=base_start, baseline_end=base_end,
        baseline_submissions_per_day=base_subs, baseline_gpu_hours_per_day=base_gpu_h, days=days,
        drain_gpu_hours=sum(base_gpu_h - day.gpu_hours for day in days),
        held=held_back(acct, window), running=running_at(acct, window), notes=notes,
    )


def drain_cost(acct: Accounting, windows: list[datetime], baseline: tuple[datetime, datetime] | None = None,
               lookback_days: int = 7) -> list[WindowCost]:
    if not windows:
        raise DrainError("give at least one window (--window 2025-03-01T08:00)")
    return [window_cost(acct, w, baseline, lookback_days) for w in sorted(windows)]
