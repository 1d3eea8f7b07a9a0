"""Counters and histograms derived from the campaign evidence log, folded in at scrape time.

Every step a worker runs is already in the evidence (campaigns.EvidenceEvent), written in the
same transaction as the step's state change, by whichever worker process on whichever machine ran
it. So workers need no metrics endpoint of their own: a scrape of any web process folds the events
written since the last fold into `EvidenceTotal` rows and exposes those. A fold reads by primary
key only (the events after the cursor, at most GPUSWEEP_METRICS_FOLD_BATCH of them, the rest at the
next scrape, and the few ids it missed), so a scrape stays cheap however long the log grows.

What each event gives:
- ``step_done``: one step's duration, ``at - data.started_at`` (the last attempt's start: a retried
  step is claimed afresh), by step and executor;
- ``retry`` (temporary error, retried), ``step_failed`` (permanent, or retries exhausted) and a
  ``failed`` carrying ``unwind_error`` (putting the node back failed): executor errors by kind;
- ``checkpointed`` and ``parked``: the checkpoint's bytes, and its seconds measured from the node's
  previous event when that one was written by the same uninterrupted run (a step done or the
  previous workload's checkpoint), so a retry's back-off is never counted as checkpoint time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from campaigns.choices import EvidenceKind
from campaigns.models import EvidenceEvent, NodeSweep
from executors.base import executor_name
from inventory.models import Cluster
from metrics.models import EvidenceCursor, EvidenceTotal

# A transaction open this long after a later id committed is taken to have rolled back.
GAP_TTL_S = 600
MAX_GAPS = 10_000
# The engine's message for a temporary error that ran out of attempts (campaigns.engine.runner._step).
GAVE_UP = "gave up after"


@dataclass(frozen=True)
class Family:
    name: str
    help: str
    label_names: tuple[str, ...]
    bounds: tuple[float, ...] | None = None  # bucket upper bounds; None for a counter


STEP_SECONDS = Family("gpusweep_step_duration_seconds", "Duration of a node sweep's step, from the evidence",
                      ("step", "executor"),
                      (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200))
EXECUTOR_ERRORS = Family("gpusweep_executor_errors", "Executor errors recorded in the evidence, by kind "
                         "(temporary: retried; permanent / gave_up: the node failed; unwind: putting it back failed)",
                         ("kind", "step", "executor"))
_MIB = 1024.0 * 1024
CHECKPOINT_BYTES = Family("gpusweep_checkpoint_bytes", "Size of a workload checkpoint", ("engine", "executor"),
                          tuple(_MIB * m for m in (1, 16, 128, 1024, 4096, 16384, 65536, 262144, 1048576)))
CHECKPOINT_SECONDS = Family("gpusweep_checkpoint_seconds", "Time to checkpoint one workload", ("engine", "executor"),
                            (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800))
FAMILIES = (STEP_SECONDS, EXECUTOR_ERRORS, CHECKPOINT_BYTES, CHECKPOINT_SECONDS)

# Events written by one run of the engine right before a checkpoint: the time between is the checkpoint's.
_SAME_RUN = frozenset({EvidenceKind.STEP_DONE, EvidenceKind.CHECKPOINTED, EvidenceKind.PARKED,
                       EvidenceKind.STOPPED, EvidenceKind.FINISHED})
_CHECKPOINTS = frozenset({EvidenceKind.CHECKPOINTED, EvidenceKind.PARKED})


@dataclass(frozen=True)
class Seen:
    """An evidence event as a fold reads it."""

    id: int
    sweep_id: int | None
    node_seq: int | None
    kind: str
    at: datetime
    data: dict[str, Any]


Observation = tuple[Family, dict[str, str], float]


def observe(event: Seen, executor: str, previous: Seen | None) -> list[Observation]:
    """What one node event adds to the totals (pure: the fold supplies the executor and the node's
    previous event)."""
    data = event.data if isinstance(event.data, dict) else {}
    if event.kind == EvidenceKind.STEP_DONE:
        started = parse_datetime(str(data.get("started_at") or ""))
        if started is None:
            return []
        seconds = max(0.0, (event.at - started).total_seconds())
        return [(STEP_SECONDS, {"step": str(data.get("step", "")), "executor": executor}, seconds)]
    if event.kind in (EvidenceKind.RETRY, EvidenceKind.STEP_FAILED) or (
            event.kind == EvidenceKind.FAILED and data.get("unwind_error")):
        if event.kind == EvidenceKind.RETRY:
            kind = "temporary"
        elif event.kind == EvidenceKind.FAILED:
            kind = "unwind"
        else:
            kind = "gave_up" if str(data.get("error", "")).startswith(GAVE_UP) else "permanent"
        step = str(data.get("step") or data.get("from") or "")
        return [(EXECUTOR_ERRORS, {"kind": kind, "step": step, "executor": executor}, 1.0)]
    if event.kind in _CHECKPOINTS:
        labels = {"engine": str(data.get("engine", "")), "executor": executor}
        found: list[Observation] = [(CHECKPOINT_BYTES, labels, float(data.get("bytes") or 0))]
        if previous is not None and previous.kind in _SAME_RUN:
            found.append((CHECKPOINT_SECONDS, labels, max(0.0, (event.at - previous.at).total_seconds())))
        return found
    return []


def series_key(family: Family, labels: dict[str, str]) -> str:
    return json.dumps({name: labels.get(name, "") for name in family.label_names}, sort_keys=True)


def bucket_of(bounds: tuple[float, ...], value: float) -> str:
    """The key of the lowest bucket `value` falls in ("+Inf" above every bound)."""
    for bound in bounds:
        if value <= bound:
            return repr(float(bound))
    return "+Inf"


def _seen(rows: Iterable[dict[str, Any]]) -> list[Seen]:
    return [Seen(r["id"], r["sweep_id"], r["node_seq"], r["kind"], r["at"], r["data"]) for r in rows]


_FIELDS = ("id", "sweep_id", "node_seq", "kind", "at", "data")


def _previous_events(events: list[Seen]) -> dict[tuple[int, int], Seen]:
    """The event before each checkpoint in its node's chain: from the batch, else one query."""
    known = {(e.sweep_id, e.node_seq): e for e in events if e.sweep_id is not None and e.node_seq is not None}
    wanted = {(e.sweep_id, e.node_seq - 1) for e in events
              if e.kind in _CHECKPOINTS and e.sweep_id is not None and e.node_seq}
    missing = [key for key in wanted if key not in known]
    for start in range(0, len(missing), 200):
        chunk = Q()
        for sweep_id, seq in missing[start:start + 200]:
            chunk |= Q(sweep_id=sweep_id, node_seq=seq)
        for event in _seen(EvidenceEvent.objects.filter(chunk).values(*_FIELDS)):
            if event.sweep_id is not None and event.node_seq is not None:
                known[(event.sweep_id, event.node_seq)] = event
    return known


def _executors(events: list[Seen]) -> dict[int, str]:
    """Each sweep's executor name, from its node's cluster."""
    sweeps = dict(NodeSweep.objects.filter(pk__in={e.sweep_id for e in events if e.sweep_id}).values_list(
        "pk", "node__cluster_id"))
    clusters = {c.pk: executor_name(c) for c in Cluster.objects.filter(pk__in=set(sweeps.values()))}
    return {sweep_id: clusters[cluster_id] for sweep_id, cluster_id in sweeps.items()}


def _add(observations: list[Observation]) -> None:
    """Add observations to their series (the caller holds the cursor's lock: no other writer)."""
    if not observations:
        return
    by_labels: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[Family, float]]] = {}
    for family, labels, value in observations:
        by_labels.setdefault((family.name, tuple(sorted(labels.items()))), []).append((family, value))
    # One series key per series, not per observation (the JSON dump is most of a big fold's time).
    grouped = {(name, series_key(values[0][0], dict(labels))): values for (name, labels), values in by_labels.items()}
    rows = {(t.family, t.labels): t for t in EvidenceTotal.objects.filter(
        family__in={name for name, _ in grouped}, labels__in={key for _, key in grouped})}
    new, changed = [], []
    for (name, key), values in grouped.items():
        row = rows.get((name, key))
        if row is None:
            row = EvidenceTotal(family=name, labels=key, count=0, sum=0.0, buckets={})
            new.append(row)
        else:
            changed.append(row)
        for family, value in values:
            row.count += 1
            row.sum += value
            if family.bounds is not None:
                key = bucket_of(family.bounds, value)
                row.buckets[key] = int(row.buckets.get(key, 0)) + 1
    EvidenceTotal.objects.bulk_create(new)
    EvidenceTotal.objects.bulk_update(changed, ["count", "sum", "buckets"])


def _gaps_below(last_id: int, fresh: list[Seen], now_s: float) -> dict[int, float]:
    """Ids skipped between the cursor and the newest event read (bounded to the newest MAX_GAPS)."""
    if not fresh:
        return {}
    top = fresh[-1].id
    start = max(last_id + 1, top - MAX_GAPS - len(fresh))
    present = {e.id for e in fresh}
    return {i: now_s for i in range(start, top) if i not in present}


def fold(batch: int | None = None) -> int:
    """Fold the evidence written since the last fold; returns how many events it read.

    Two scrapes at once: one folds, the other finds the cursor locked and serves the totals as they
    are (PostgreSQL; SQLite's write lock orders them instead).
    """
    batch = batch or settings.GPUSWEEP_METRICS_FOLD_BATCH
    EvidenceCursor.objects.get_or_create(pk=1)
    skip = connection.features.has_select_for_update_skip_locked
    with transaction.atomic():
        cursor = EvidenceCursor.objects.select_for_update(skip_locked=skip).filter(pk=1).first()
        if cursor is None:
            return 0
        now_s = time.time()
        gaps = {int(i): float(t) for i, t in cursor.gaps if now_s - float(t) < GAP_TTL_S}
        fresh = _seen(EvidenceEvent.objects.filter(id__gt=cursor.last_id).order_by("id").values(*_FIELDS)[:batch])
        late = _seen(EvidenceEvent.objects.filter(id__in=list(gaps)).values(*_FIELDS)) if gaps else []
        for event in late:
            gaps.pop(event.id, None)
        gaps.update(_gaps_below(cursor.last_id, fresh, now_s))
        events = [e for e in late + fresh if e.sweep_id is not None]
        executors = _executors(events)
        previous = _previous_events(events)
        observations: list[Observation] = []
        for event in events:
            before = previous.get((event.sweep_id or 0, (event.node_seq or 0) - 1))
            observations.extend(observe(event, executors.get(event.sweep_id or 0, ""), before))
        _add(observations)
        if fresh:
            cursor.last_id = fresh[-1].id
        cursor.gaps = sorted([i, t] for i, t in gaps.items())[-MAX_GAPS:]
        cursor.folded_at = timezone.now()
        cursor.save(update_fields=["last_id", "gaps", "folded_at"])
        return len(late) + len(fresh)


def totals() -> dict[str, list[EvidenceTotal]]:
    """Every series by family name, for the exposition."""
    found: dict[str, list[EvidenceTotal]] = {family.name: [] for family in FAMILIES}
    for row in EvidenceTotal.objects.filter(family__in=list(found)):
        found[row.family].append(row)
    return found
