"""Slurm accounting records (`sacct -P`) as jobs: parsed whole or not at all.

Record the data with (UTC, every user, every run of a requeued job, one line per allocation):

    TZ=UTC sacct --allusers --duplicates --parsable2 --allocations \\
        --starttime 2025-01-01T00:00:00 --endtime 2025-04-01T00:00:00 \\
        --format=JobID,JobIDRaw,JobName,Partition,State,Submit,Eligible,Start,End,ElapsedRaw,TimelimitRaw,ReqTRES,AllocTRES,NNodes,NodeList

- The first line is the header; fields are `|` separated (`--parsable`, with a trailing `|`, is
  read too). Columns may come in any order; JobID, State, Submit, Start, End, TimelimitRaw and
  AllocTRES are required.
- Grouping: steps (`123.batch`, `123.extern`, `123.0`) belong to their job and are not counted
  again (without `--allocations` they are read and folded in); an array task (`123_4`) is a job of
  its own, a pending array record (`123_[5-10%2]`) stands for each task it names; the components
  of a heterogeneous job (`123+0`, `123+1`) are one job whose GPUs add up.
- Requeues: without `--duplicates` sacct shows only a requeued job's last run, with Submit reset to
  the requeue. With it, each run is its own record: the runs of one job are kept apart (each held
  its own allocation) and the job counts as submitted once, at its first Submit.
- GPUs: the `gres/gpu` entry of AllocTRES (or `gres/gpu:<type>` entries summed, when the untyped
  total is absent); ReqTRES for a job that never started. No GPU entry means a CPU-only job.
- Times are read as UTC unless a time zone is given; `Unknown`/`None` mean not (yet) happened.

Any bad line (a missing column, a malformed timestamp, an unknown TRES or state, a step before its
job) raises SacctError naming its line, and nothing of the file is used.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo

FIELDS = ("JobID", "JobIDRaw", "JobName", "Partition", "State", "Submit", "Eligible", "Start", "End",
          "ElapsedRaw", "TimelimitRaw", "ReqTRES", "AllocTRES", "NNodes", "NodeList")
REQUIRED = ("JobID", "State", "Submit", "Start", "End", "TimelimitRaw", "AllocTRES")
COMMAND = ("TZ=UTC sacct --allusers --duplicates --parsable2 --allocations --starttime START --endtime END "
           f"--format={','.join(FIELDS)}")

STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "COMPLETING", "CONFIGURING", "DEADLINE", "FAILED", "NODE_FAIL",
    "OUT_OF_MEMORY", "PENDING", "PREEMPTED", "RESIZING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "REVOKED",
    "RUNNING", "SIGNALING", "SPECIAL_EXIT", "STAGE_OUT", "STOPPED", "SUSPENDED", "TIMEOUT",
})
NOT_A_TIME = frozenset({"", "Unknown", "None", "N/A"})
NO_LIMIT = frozenset({"UNLIMITED", "Partition_Limit", "INVALID"})

_JOB_ID = re.compile(
    r"^(?P<base>\d+)(?:_(?P<task>\d+|\[[0-9,\-%]+\]))?(?:\+(?P<het>\d+))?"
    r"(?:\.(?P<step>[A-Za-z][A-Za-z_\-]*|\d+)(?:\+\d+)?)?$"
)
_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}$")
_GPU_KEY = re.compile(r"^gres/gpu(?::(?P<type>[^=:]+))?$")


class SacctError(ValueError):
    """A line of sacct output that cannot be read; the message names the line."""


@dataclass(frozen=True)
class Run:
    """One allocation of a job: a requeued job recorded with --duplicates has several."""

    line: int
    state: str
    submit: datetime
    eligible: datetime
    start: datetime | None
    end: datetime | None
    elapsed_s: int | None
    limit_s: int | None  # None: no limit (UNLIMITED) or the partition's, unknown here
    gpus: int
    nodes: int = 1
    nodelist: str = ""
    partition: str = ""

    def finished_at(self, as_of: datetime) -> datetime | None:
        """When the allocation ended: End, else Start + ElapsedRaw, else (still running) `as_of`."""
        if self.start is None:
            return None
        if self.end is not None:
            return self.end
        if self.elapsed_s is not None and self.state != "RUNNING":
            return self.start + timedelta(seconds=self.elapsed_s)
        return max(as_of, self.start)


@dataclass
class Job:
    job_id: str
    name: str = ""
    runs: list[Run] = field(default_factory=list)
    # A pending array record ("123_[5-10]") stands for several tasks, each with these runs.
    count: int = 1

    @property
    def submit(self) -> datetime:
        return min(run.submit for run in self.runs)


@dataclass
class Accounting:
    jobs: list[Job]
    # The latest moment the records know of: a running job's allocation lasts until then.
    as_of: datetime
    lines: int = 0
    steps: int = 0


def parse_time(text: str, zone: tzinfo, line: int, column: str) -> datetime | None:
    value = text.strip()
    if value in NOT_A_TIME:
        return None
    if not _TIME.match(value):
        raise SacctError(f"line {line}: {column} {value!r} is not a timestamp like 2025-01-31T23:59:00 "
                         "(record with sacct's default time format: unset SLURM_TIME_FORMAT)")
    try:
        return datetime.fromisoformat(value).replace(tzinfo=zone).astimezone(UTC)
    except ValueError:
        raise SacctError(f"line {line}: {column} {value!r} is not a valid date") from None


def gpus_in_tres(text: str, line: int, column: str) -> int:
    """GPUs in a TRES string such as `billing=8,cpu=8,gres/gpu:a100=4,gres/gpu=4,mem=64G,node=1`."""
    total: int | None = None
    typed = 0
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise SacctError(f"line {line}: {column} entry {item!r} is not a TRES (name=count)")
        match = _GPU_KEY.match(key)
        if match is None:
            if key.startswith("gres/gpu"):
                raise SacctError(f"line {line}: {column} entry {item!r} is an unknown GPU TRES form "
                                 "(expected gres/gpu=N or gres/gpu:TYPE=N)")
            continue
        if not value.isdigit():
            raise SacctError(f"line {line}: {column} entry {item!r}: the GPU count is not a whole number")
        if match.group("type"):
            typed += int(value)
        else:
            total = int(value)
    # Slurm lists the untyped total beside the typed entries: count it alone, never both.
    return total if total is not None else typed


def _int(text: str, line: int, column: str, *, none: frozenset[str] = frozenset()) -> int | None:
    value = text.strip()
    if value == "" or value in none:
        return None
    if not value.isdigit():
        raise SacctError(f"line {line}: {column} {value!r} is not a whole number")
    return int(value)


def _array_count(task: str, line: int) -> int:
    """Tasks named by `[1-3,7%2]` (the `%2` is a throttle, not a task)."""
    count = 0
    for part in task.strip("[]").split("%")[0].split(","):
        low, _sep, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()) or (high and int(high) < int(low)):
            raise SacctError(f"line {line}: array range {task!r} is malformed")
        count += int(high) - int(low) + 1 if high else 1
    return count


def _header(line: str) -> tuple[list[str], bool]:
    names = line.rstrip("\r\n").split("|")
    trailing = len(names) > 1 and names[-1] == ""  # `sacct -p` ends every line with the delimiter
    if trailing:
        names = names[:-1]
    names = [name.strip() for name in names]
    missing = [name for name in REQUIRED if name not in names]
    if missing:
        raise SacctError(f"line 1: the header lacks column(s) {', '.join(missing)}; record with: {COMMAND}")
    dupes = sorted({name for name in names if names.count(name) > 1})
    if dupes:
        raise SacctError(f"line 1: column(s) {', '.join(dupes)} appear twice")
    return names, trailing


def _run(row: dict[str, str], number: int, zone: tzinfo) -> Run:
    state_words = row["State"].split()
    state = state_words[0] if state_words else ""
    if state not in STATES:
        raise SacctError(f"line {number}: State {row['State']!r} is not a Slurm job state")
    submit = parse_time(row["Submit"], zone, number, "Submit")
    if submit is None:
        raise SacctError(f"line {number}: Submit is missing")
    eligible = parse_time(row.get("Eligible", ""), zone, number, "Eligible") or submit
    start = parse_time(row["Start"], zone, number, "Start")
    end = parse_time(row["End"], zone, number, "End")
    if start is not None and end is not None and end < start:
        raise SacctError(f"line {number}: End {row['End']} is before Start {row['Start']}")
    if state == "RUNNING" and start is None:
        raise SacctError(f"line {number}: a RUNNING job without a Start")
    limit_min = _int(row["TimelimitRaw"], number, "TimelimitRaw", none=NO_LIMIT)
    alloc = gpus_in_tres(row["AllocTRES"], number, "AllocTRES")
    requested = gpus_in_tres(row.get("ReqTRES", ""), number, "ReqTRES")
    return Run(
        line=number, state=state, submit=submit, eligible=eligible, start=start, end=end,
        elapsed_s=_int(row.get("ElapsedRaw", ""), number, "ElapsedRaw"),
        limit_s=limit_min * 60 if limit_min is not None else None,
        # A started job holds what it was given; a pending one is known by what it asked for.
        gpus=alloc if start is not None and row["AllocTRES"].strip() else requested,
        nodes=_int(row.get("NNodes", ""), number, "NNodes") or 1,
        nodelist=row.get("NodeList", "").strip(), partition=row.get("Partition", "").strip(),
    )


def _merge_component(first: Run, other: Run) -> Run:
    """Two components of a heterogeneous job: one allocation with the GPUs of both."""
    starts = [s for s in (first.start, other.start) if s is not None]
    ends = [e for e in (first.end, other.end) if e is not None]
    limits = [x for x in (first.limit_s, other.limit_s) if x is not None]
    return Run(
        line=first.line, state=first.state, submit=min(first.submit, other.submit),
        eligible=min(first.eligible, other.eligible), start=min(starts) if starts else None,
        end=max(ends) if ends else None, elapsed_s=max(first.elapsed_s or 0, other.elapsed_s or 0) or None,
        limit_s=max(limits) if limits and len(limits) == 2 else None, gpus=first.gpus + other.gpus,
        nodes=first.nodes + other.nodes, nodelist=",".join(x for x in (first.nodelist, other.nodelist) if x),
        partition=first.partition,
    )


def parse(lines: Iterable[str], zone: tzinfo = UTC) -> Accounting:
    """Read `sacct -P` output; raise SacctError at the first bad line (nothing is returned then)."""
    iterator = iter(lines)
    try:
        header_line = next(iterator)
    except StopIteration:
        raise SacctError("line 1: the file is empty; expected sacct's header line") from None
    names, trailing = _header(header_line.lstrip("\ufeff"))
    jobs: dict[str, Job] = {}
    steps = 0
    number = 1
    for number, raw in enumerate(iterator, start=2):
        text = raw.rstrip("\r\n")
        if not text.strip():
            continue
        cells = text.split("|")
        if trailing and cells and cells[-1] == "":
            cells = cells[:-1]
        if len(cells) != len(names):
            raise SacctError(f"line {number}: {len(cells)} fields, the header has {len(names)} "
                             "(a `|` inside a job name? record with --parsable2)")
        row = dict(zip(names, cells, strict=True))
        match = _JOB_ID.match(row["JobID"].strip())
        if match is None:
            raise SacctError(f"line {number}: JobID {row['JobID']!r} is not a Slurm job id "
                             "(123, 123_4, 123_[1-5], 123+0, 123.batch)")
        task = match.group("task")
        key = match.group("base") + (f"_{task}" if task else "")
        if match.group("step"):
            if key not in jobs:
                raise SacctError(f"line {number}: step {row['JobID']} comes before (or without) its job {key}")
            steps += 1
            continue
        run = _run(row, number, zone)
        job = jobs.get(key)
        het = match.group("het")
        if job is None:
            job = jobs[key] = Job(job_id=key, name=row.get("JobName", "").strip(),
                                  count=_array_count(task, number) if task and task.startswith("[") else 1)
            job.runs.append(run)
        elif het is not None and het != "0":
            job.runs[-1] = _merge_component(job.runs[-1], run)
        else:
            if any(r.start == run.start and r.submit == run.submit for r in job.runs):
                raise SacctError(f"line {number}: job {key} is listed twice with the same Submit and Start "
                                 f"(first on line {job.runs[0].line}); the file was joined twice?")
            job.runs.append(run)  # a requeued job's next run (sacct --duplicates)
    moments = [t for job in jobs.values() for run in job.runs for t in (run.submit, run.start, run.end) if t]
    as_of = max(moments, default=datetime.now(UTC))
    # A running job's ElapsedRaw says how long it had run when sacct was called.
    for job in jobs.values():
        for run in job.runs:
            if run.start is not None and run.end is None and run.elapsed_s is not None:
                as_of = max(as_of, run.start + timedelta(seconds=run.elapsed_s))
    return Accounting(jobs=list(jobs.values()), as_of=as_of, lines=number, steps=steps)
