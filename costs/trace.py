"""Job traces for the simulator: sacct output, or a pod/task file like Alibaba's openb trace.

Both become `Task`s on one clock (seconds from the trace's origin). The openb file
(`name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,
scheduled_time`, seconds from the trace start) has no time limits and no nodes: `costs.model`
says how both are modelled. Tasks that never started (no scheduled_time) and tasks without GPUs are
left out and counted. A task deleted at the very end of the trace is taken as still running.
`gpu_spec` (optional; `V100M16|V100M32`: the GPU models a task may run on, empty: any) is kept on
the task and honoured where it is placed and where it may be moved; its names are compared with
the fleet's (`Tesla V100-SXM2-32GB`) by the one rule of `inventory.gpumodel`.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from costs.model import Params
from costs.sacct import Accounting
from inventory.gpumodel import model_key, same_model

OPENB_COLUMNS = ("name", "num_gpu", "gpu_milli", "qos", "creation_time", "deletion_time", "scheduled_time")
DEFAULT_ORIGIN = datetime(2023, 1, 1, tzinfo=UTC)


class TraceError(ValueError):
    """A line of a trace file that cannot be read; the message names it."""


@dataclass(frozen=True)
class Task:
    name: str
    submit: float
    start: float
    end: float | None  # None: still running when the trace ends
    milli: int  # thousandths of GPUs held
    limit: float | None  # seconds; None: no limit
    service: bool = False
    memory_gib: float = 0.0
    node: str = ""  # where the trace says it ran (sacct); else the placement model decides
    gpu_models: tuple[str, ...] = ()  # the GPU models it may run on (openb gpu_spec); empty: any

    def runs_on(self, gpu_model: str) -> bool:
        """May it run on a GPU of `gpu_model`, however the fleet writes it (inventory.gpumodel)?"""
        return not self.gpu_models or any(same_model(wanted, gpu_model) for wanted in self.gpu_models)

    def ends(self) -> float:
        return self.end if self.end is not None else float("inf")

    def alive(self, moment: float) -> bool:
        return self.start <= moment < self.ends()


@dataclass
class Trace:
    tasks: list[Task]
    origin: datetime
    end: float
    skipped: dict[str, int] = field(default_factory=dict)
    kind: str = ""

    def at(self, seconds: float) -> datetime:
        return self.origin + timedelta(seconds=seconds)

    def clock(self, moment: datetime) -> float:
        return (moment - self.origin).total_seconds()


def _limit(duration: float | None, service: bool, params: Params) -> float | None:
    if service or duration is None:
        return None
    return max(60.0, duration * params.limit_factor)


def from_openb(text: str, params: Params, origin: datetime = DEFAULT_ORIGIN, source: str = "trace") -> Trace:
    reader = csv.reader(io.StringIO(text.lstrip("\ufeff"), newline=""))
    try:
        header = [c.strip() for c in next(reader)]
    except StopIteration:
        raise TraceError(f"{source} line 1: the file is empty") from None
    missing = [c for c in OPENB_COLUMNS if c not in header]
    if missing:
        raise TraceError(f"{source} line 1: missing column(s) {', '.join(missing)}")
    rows: list[tuple[int, dict[str, str]]] = []
    for row in reader:
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise TraceError(f"{source} line {reader.line_num}: {len(row)} values for {len(header)} columns")
        rows.append((reader.line_num, dict(zip(header, (c.strip() for c in row), strict=True))))

    def number(record: dict[str, str], column: str, line: int) -> int | None:
        value = record.get(column, "")
        if value == "":
            return None
        if not re.fullmatch(r"\d+", value):
            raise TraceError(f"{source} line {line}: {column} {value!r} is not a whole number")
        return int(value)

    parsed = []
    for line, record in rows:
        values = {c: number(record, c, line) for c in
                  ("num_gpu", "gpu_milli", "creation_time", "deletion_time", "scheduled_time", "memory_mib")}
        if values["creation_time"] is None:
            raise TraceError(f"{source} line {line}: creation_time is missing")
        start, stop = values["scheduled_time"], values["deletion_time"]
        if start is not None and stop is not None and stop < start:
            raise TraceError(f"{source} line {line}: deletion_time {stop} is before scheduled_time {start}")
        parsed.append((line, record, values))
    trace_end = float(max((v["deletion_time"] or 0 for _l, _r, v in parsed), default=0))
    tasks: list[Task] = []
    skipped = {"never started": 0, "no GPU": 0}
    for _line, record, v in parsed:
        if v["scheduled_time"] is None:
            skipped["never started"] += 1
            continue
        milli = (v["num_gpu"] or 0) * (v["gpu_milli"] if v["gpu_milli"] is not None else 1000)
        if milli <= 0:
            skipped["no GPU"] += 1
            continue
        began = float(v["scheduled_time"])
        ended = float(v["deletion_time"]) if v["deletion_time"] is not None else None
        if ended is not None and ended >= trace_end:
            ended = None  # deleted when the trace was cut: still running
        service = record.get("qos", "") in params.service_qos
        tasks.append(Task(
            name=record["name"], submit=float(v["creation_time"] or 0), start=began, end=ended, milli=milli,
            limit=_limit(ended - began if ended is not None else None, service, params), service=service,
            memory_gib=(v["memory_mib"] or 0) / 1024, gpu_models=gpu_spec(record.get("gpu_spec", "")),
        ))
    return Trace(tasks=tasks, origin=origin, end=trace_end, skipped={k: n for k, n in skipped.items() if n},
                 kind="openb")


def gpu_spec(text: str) -> tuple[str, ...]:
    """`V100M16|Tesla T4` -> ('T4', 'V100M16'): the models' keys (inventory.gpumodel); openb separates them with `|`."""
    return tuple(sorted({model_key(part) for part in re.split(r"[|,;]", text) if part.strip()}))


def expand_hostlist(text: str) -> list[str]:
    """`gpu[01-03,07],cpu1` -> gpu01 gpu02 gpu03 gpu07 cpu1 (Slurm's compressed host lists)."""
    names: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", text):
        if plain:
            if plain not in ("None assigned", "(null)"):
                names.append(plain.strip())
            continue
        for part in ranges.split(","):
            low, _sep, high = part.partition("-")
            if high:
                width = len(low)
                names.extend(f"{prefix}{i:0{width}d}" for i in range(int(low), int(high) + 1))
            else:
                names.append(f"{prefix}{low}")
    return names


def from_sacct(acct: Accounting, params: Params) -> Trace:
    """Each started allocation is a task (a multi-node one, one task per node with its share of GPUs)."""
    origin = min((job.submit for job in acct.jobs), default=acct.as_of)
    tasks: list[Task] = []
    skipped = {"never started": 0, "no GPU": 0}

    def clock(moment: datetime) -> float:
        return (moment - origin).total_seconds()

    for job in acct.jobs:
        for number, run in enumerate(job.runs):
            if run.start is None:
                skipped["never started"] += job.count
                continue
            if run.gpus <= 0:
                skipped["no GPU"] += 1
                continue
            running = run.end is None and run.state == "RUNNING"
            finished = run.finished_at(acct.as_of)
            end = None if running or finished is None else clock(finished)
            nodes = expand_hostlist(run.nodelist) or [""]
            name = job.job_id if len(job.runs) == 1 else f"{job.job_id}#{number + 1}"
            for node in nodes:
                tasks.append(Task(
                    name=name if len(nodes) == 1 else f"{name}@{node}", submit=clock(run.submit),
                    start=clock(run.start), end=end, milli=round(run.gpus * 1000 / len(nodes)),
                    limit=float(run.limit_s) if run.limit_s is not None else None, node=node,
                ))
    return Trace(tasks=tasks, origin=origin, end=clock(acct.as_of),
                 skipped={k: n for k, n in skipped.items() if n}, kind="sacct")
