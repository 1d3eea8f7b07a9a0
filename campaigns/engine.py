"""Execution: the per-node state machine, admission of nodes, and re-driving stuck steps.

A step runs in three parts. (1) Claim: a conditional UPDATE takes the step's lease (state as
expected and no live lease) and sets its deadline. (2) Work: the executor operations, outside
any transaction, each with an operation id derived from the campaign, sweep and step, so doing
it again after a crash does nothing twice. (3) Transition: one conditional UPDATE moves the state
on only if this worker still holds the lease, writing the node chain's new head, with the
evidence event and the inventory changes (through inventory.services) in the same transaction.
A worker then goes straight on with the node's next step under the same lease, so a node costs
one task, not one per step.

A worker killed anywhere leaves a step whose deadline passes; ``redrive`` (periodic) enqueues it
again and the next worker repeats the idempotent operations. Nothing is half-recorded: either
the transition and its event are committed together, or neither is.

Failure is final: a permanent error (or a temporary one past MAX_ATTEMPTS) fails the node once.
A node not yet patched is first put back as it was (maintenance off, its checkpoints restored on
it); an error during that unwind is recorded too, the node stays as the evidence says (drained),
and the step is never run again. A node whose patch or health gate failed is reverted instead
(``_revert``: the back end reinstalls what it recorded before the patch, reboots, the old versions
are verified), then stays out of service or returns per ``Campaign.after_rollback``. Each failed
node is charged to the campaign's error budget.
No step takes the campaign row lock; only campaign-level work does (admission, halting, sealing).
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import Count, Min, Model, Q
from django.utils import timezone

from campaigns import evidence, policy
from campaigns.choices import AfterRollback, CampaignStatus, EvidenceKind, MoveState, SweepState
from campaigns.models import Campaign, EvidenceEvent, EvidenceSeal, NodeSweep, Plan, WorkloadMove
from campaigns.planner import Calendar, parse_blackouts, parse_windows
from campaigns.queue import enqueue, enqueue_now
from executors import portability
from executors.base import (
    CheckpointResult,
    Executor,
    ExecutorError,
    HealthGates,
    HealthResult,
    InterruptedOperation,
    NodeRef,
    PermanentExecutorError,
    TemporaryExecutorError,
    WorkloadInfo,
    get_executor,
)
from inventory import services as inventory
from inventory.bulk import insert_sql, loader, marks, prepared_cursor, select_instances, select_rows
from inventory.choices import ChangeSource, CheckpointEngine, ServiceState, WorkloadPolicy
from inventory.models import Cluster, Node, NodeComponent, Workload

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 5
RETRY_BACKOFF_S = 2.0


class NotPatched(PermanentExecutorError):
    """The patch step refused before anything changed on the node: there is nothing to revert."""


class HealthGateFailed(PermanentExecutorError):
    """The node's health gates failed after its reboot (the checks' outputs are in the evidence)."""


class WaitMore(Exception):
    """The step is not done yet and not failing (a workload we wait for is still running)."""

    def __init__(self, seconds: float, reason: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.seconds = seconds
        self.detail = detail or {}


def node_ref(node: Node, versions: dict[str, str] | None = None) -> NodeRef:
    return NodeRef(
        cluster=node.cluster.name, name=node.name, node_id=node.pk, endpoint=node.agent_endpoint,
        gpu_model=node.gpu_model, gpu_count=node.gpu_count, versions=versions or {}, pool=node.pool,
        labels=dict(node.labels or {}),
    )


def op_id(sweep: NodeSweep, name: str) -> str:
    # The agent accepts [A-Za-z0-9._:-], at most 128 characters.
    safe = "".join(ch if ch.isalnum() or ch in "._:-" else "_" for ch in name)
    return f"gs-{sweep.campaign_id}-{sweep.pk}-{safe}"[:128]


def move_op(sweep: NodeSweep, move: WorkloadMove, step: str) -> str:
    """The operation id of a move's checkpoint ("ck") or restore ("restore"), renamed after each
    interruption the back end reported (a new id for a run that left nothing behind)."""
    tries = int((move.detail.get("tries") or {}).get(step, 0))
    base = f"ck-{move.workload_ref}" if step == "ck" else f"restore-{move.pk}"
    return op_id(sweep, f"{base}.{tries}" if tries else base)


def _renamed(move: WorkloadMove, step: str, exc: InterruptedOperation) -> TemporaryExecutorError:
    """Record that the move's `step` runs again under a new operation id; the step is retried."""
    tries = dict(move.detail.get("tries") or {})
    tries[step] = int(tries.get(step, 0)) + 1
    move.detail = {**move.detail, "tries": tries}
    WorkloadMove.objects.filter(pk=move.pk).update(detail=move.detail)
    return TemporaryExecutorError(f"{exc}; it runs again under a new operation id")


def reference(sweep: NodeSweep) -> str:
    """How inventory changes and remediated exposures name the campaign step that made them."""
    return f"campaign {sweep.campaign_id}, sweep {sweep.pk}"


def _actor(worker: str) -> str:
    return f"worker:{worker}"


@functools.cache
def _load_sql() -> tuple[str, tuple[Any, ...]]:
    parts = (loader(NodeSweep, "s", ("versions_before", "versions_after")), loader(Campaign, "c", ("name",)),
             loader(Node, "n"), loader(Cluster, "k"))
    q = connection.ops.quote_name
    sql = (f"SELECT {', '.join(part.select for part in parts)} FROM {q(NodeSweep._meta.db_table)} s "
           f"JOIN {q(Campaign._meta.db_table)} c ON c.id = s.campaign_id JOIN {q(Node._meta.db_table)} n "
           f"ON n.id = s.node_id JOIN {q(Cluster._meta.db_table)} k ON k.id = n.cluster_id WHERE s.id = %s")
    return sql, parts


def _load(sweep_id: int) -> NodeSweep | None:
    """The sweep with its campaign, node and cluster, as select_related gives them: one plain statement
    (compiling the join through the ORM cost more CPU than running it)."""
    sql, parts = _load_sql()
    with prepared_cursor() as cursor:
        cursor.execute(sql, [sweep_id])
        row = cursor.fetchone()
    if row is None:
        return None
    at, objects = 0, []
    for part in parts:
        objects.append(part.build(row[at:at + part.width]))
        at += part.width
    sweep, campaign, node, cluster = objects
    node.cluster, sweep.node, sweep.campaign = cluster, node, campaign
    return cast(NodeSweep, sweep)


# -- admission ---------------------------------------------------------------------------
def dispatch(campaign_id: int) -> list[int]:
    """Admit pending nodes within the window, the parallelism limits and the wave order."""
    now = timezone.now()
    sync_reservations(campaign_id)  # a wave that ended (or an abort) gives its reservation back first
    admitted = _dispatch(campaign_id, now)
    if admitted:
        sync_reservations(campaign_id)  # the waves admitted now get theirs
    return admitted


def _dispatch(campaign_id: int, now: Any) -> list[int]:
    with transaction.atomic():
        campaign = evidence.lock_campaign(campaign_id)
        sweeps = NodeSweep.objects.filter(campaign=campaign)
        if campaign.status == CampaignStatus.ABORTED:
            _seal_when_at_rest(campaign, sweeps, "aborted")
            return []
        if campaign.status not in (CampaignStatus.RUNNING, CampaignStatus.WAITING):
            return []
        # Aggregates only: a dispatch costs the same for 10 nodes or 10,000.
        lowest = sweeps.filter(state__in=SweepState.ACTIVE).aggregate(w=Min("wave"))["w"]
        if lowest is None:
            _complete(campaign, sweeps, now)
            return []
        if not _window_open(campaign, now):
            return []
        upto = _canary_gate(campaign, sweeps, now)
        if upto == 0:
            return []
        admitted = _admit(campaign, sweeps, lowest, now, upto)
        for sweep_id in admitted:
            enqueue("advance", sweep_id)
        return admitted


# -- maintenance reservations per wave --------------------------------------------------------
def sync_reservations(campaign_id: int) -> None:
    """Each wave's maintenance reservation, per cluster whose back end holds one (``wave_reservation``):
    created once the wave has a working sweep, for the wave's nodes on that cluster and the plan's time
    for it; deleted once none of its sweeps is working any more, or the campaign is aborted.

    The back end's calls run outside any transaction and are idempotent; each creation and deletion is
    recorded once in the campaign's chain. A call that fails is logged and tried again by the next
    dispatch (the periodic re-drive dispatches every running campaign); the wave goes on meanwhile.
    """
    row = Campaign.objects.filter(pk=campaign_id).values_list("status", "limits").first()
    if row is None:
        return
    status, limits = row
    if (limits or {}).get("reservations") is False:
        return  # the approved plan lists none: nothing to create, so nothing to delete
    created: dict[tuple[int, int], dict[str, Any]] = {}
    deleted: set[tuple[int, int]] = set()
    for kind, data in EvidenceEvent.objects.filter(
            campaign_id=campaign_id, sweep__isnull=True,
            kind__in=[EvidenceKind.RESERVATION_CREATED, EvidenceKind.RESERVATION_DELETED]).values_list("kind", "data"):
        key = (int(data["cluster_id"]), int(data["wave"]))
        if kind == EvidenceKind.RESERVATION_CREATED:
            created[key] = data
        else:
            deleted.add(key)
    active = set(NodeSweep.objects.filter(campaign_id=campaign_id, state__in=SweepState.WORKING).order_by()
                 .values_list("node__cluster_id", "wave").distinct())
    aborted = status == CampaignStatus.ABORTED
    ending = [key for key in created if key not in deleted and (aborted or key not in active)]
    starting = [] if status not in (CampaignStatus.RUNNING, CampaignStatus.WAITING) else sorted(
        key for key in active if key not in created)
    if not ending and not starting:
        return
    clusters = Cluster.objects.in_bulk({key[0] for key in [*ending, *starting]})
    for cluster_id, wave in ending:
        data = created[(cluster_id, wave)]
        try:
            get_executor(clusters[cluster_id]).release_wave(data["name"])
        except ExecutorError as exc:
            log.warning("campaign %s: deleting reservation %s failed: %s", campaign_id, data["name"], exc)
            continue
        _record_reservation(campaign_id, EvidenceKind.RESERVATION_DELETED, {
            "cluster_id": cluster_id, "cluster": data.get("cluster"), "wave": wave, "name": data["name"],
            "why": "campaign aborted" if aborted else "the wave ended"})
    for cluster_id, wave in starting:
        _reserve_wave(campaign_id, clusters[cluster_id], wave)


def _reserve_wave(campaign_id: int, cluster: Cluster, wave: int) -> None:
    try:
        ex = get_executor(cluster)
        name = ex.wave_reservation(campaign_id, wave)
        if not name:
            return  # this back end holds none (the default)
        nodes = [node_ref(s.node) for s in NodeSweep.objects.filter(
            campaign_id=campaign_id, wave=wave, node__cluster=cluster).exclude(state=SweepState.SKIPPED)
            .select_related("node__cluster").order_by("node__name")]
        start, end = planned_wave_times(campaign_id, wave)
        now = timezone.now()
        minutes = policy.reservation_minutes(start, end, now)
        ex.reserve_wave(name, nodes, minutes)
    except ExecutorError as exc:
        log.warning("campaign %s: reserving wave %s on %s failed: %s", campaign_id, wave, cluster.name, exc)
        return
    _record_reservation(campaign_id, EvidenceKind.RESERVATION_CREATED, {
        "cluster_id": cluster.pk, "cluster": cluster.name, "wave": wave, "name": name,
        "nodes": [n.name for n in nodes], "minutes": minutes, "start": now.isoformat(),
        "end": (now + timedelta(minutes=minutes)).isoformat()})


def planned_wave_times(campaign_id: int, wave: int) -> tuple[Any, Any]:
    """The approved plan's start and end of `wave` (None, None when it has none)."""
    from django.utils.dateparse import parse_datetime

    plan_id = Campaign.objects.filter(pk=campaign_id).values_list("approved_plan_id", flat=True).first()
    waves = Plan.objects.filter(pk=plan_id).values_list("content__waves", flat=True).first() if plan_id else None
    entry: dict[str, Any] = next((w for w in waves or [] if w.get("wave") == wave), {})
    start, end = entry.get("start"), entry.get("end")
    return (parse_datetime(start) if start else None, parse_datetime(end) if end else None)


def _record_reservation(campaign_id: int, kind: str, data: dict[str, Any]) -> None:
    """The event, once: a dispatch running at the same time may have recorded it already."""
    with transaction.atomic():
        campaign = evidence.lock_campaign(campaign_id)
        if not EvidenceEvent.objects.filter(campaign_id=campaign_id, sweep__isnull=True, kind=kind,
                                            data__cluster_id=data["cluster_id"], data__wave=data["wave"]).exists():
            evidence.campaign_event(campaign, kind, "system", data)


def _complete(campaign: Campaign, sweeps: Any, now: Any) -> None:
    counts = dict(sweeps.values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.COMPLETED, finished_at=now)
    campaign.status = CampaignStatus.COMPLETED
    heads = list(sweeps.order_by("pk").values_list("pk", "evidence_seq", "evidence_head"))
    from campaigns.verify import merkle_root

    # The campaign's head now commits to every node chain's head; the seal signs both.
    evidence.campaign_event(campaign, EvidenceKind.COMPLETED, "system",
                            {"states": counts, "node_heads_root": merkle_root(heads), "nodes": len(heads)})
    evidence.seal(campaign, "completed")


def _seal_when_at_rest(campaign: Campaign, sweeps: Any, reason: str) -> None:
    if sweeps.filter(state__in=SweepState.WORKING).exists():
        return
    if not EvidenceSeal.objects.filter(campaign=campaign, reason=reason).exists():
        evidence.seal(campaign, reason)


def _window_open(campaign: Campaign, now: Any) -> bool:
    calendar = Calendar(parse_windows(campaign.windows or []), parse_blackouts(campaign.blackouts or []),
                        now, horizon_days=9)
    if not calendar.is_open(now):
        opens = calendar.earliest(now, timedelta(0))
        if campaign.status == CampaignStatus.RUNNING:
            Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.WAITING)
            campaign.status = CampaignStatus.WAITING
            evidence.campaign_event(campaign, EvidenceKind.WAITING_FOR_WINDOW, "system",
                                    {"next_window": opens.isoformat() if opens else None})
        if opens is not None:
            enqueue("dispatch", campaign.pk, min(300.0, max(1.0, (opens - now).total_seconds())))
        return False
    if campaign.status == CampaignStatus.WAITING:
        Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.RUNNING)
        campaign.status = CampaignStatus.RUNNING
        evidence.campaign_event(campaign, EvidenceKind.WINDOW_OPENED, "system", {})
    return True


def _canary_gate(campaign: Campaign, sweeps: Any, now: Any) -> int | None:
    """The highest wave that may start now because of the canary: 1 while it runs, 0 while it soaks
    (or failed, which halts the campaign), None once it soaked or when the plan has none."""
    limits = campaign.limits or {}
    if not limits.get("canary") or limits.get("soaked"):
        return None
    canary = sweeps.filter(wave=1)
    if canary.filter(state__in=SweepState.ACTIVE).exists():
        return 1
    soak = timedelta(seconds=int(limits.get("soak_s") or 0))
    if campaign.soak_started_at is None:
        campaign.soak_started_at = now
        failed = list(canary.filter(state__in=[SweepState.FAILED, SweepState.ROLLED_BACK]).values_list(
            "node__name", flat=True))
        Campaign.objects.filter(pk=campaign.pk).update(soak_started_at=now)
        if failed:
            # Nothing else has been drained: stop here for a human to look.
            reason = f"the canary failed on {', '.join(sorted(failed))}; no other node was drained"
            Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.HALTED, status_reason=reason)
            campaign.status = CampaignStatus.HALTED
            evidence.campaign_event(campaign, EvidenceKind.CANARY_FAILED, "system", {"failed": failed,
                                                                                     "reason": reason})
            return 0
        evidence.campaign_event(campaign, EvidenceKind.SOAKING, "system", {
            "canary": list(canary.values_list("node__name", flat=True)), "soak_s": soak.total_seconds(),
            "until": (now + soak).isoformat()})
    remaining = (campaign.soak_started_at + soak - now).total_seconds()
    if remaining > 0:
        enqueue("dispatch", campaign.pk, min(300.0, remaining + 0.5))
        return 0
    Campaign.objects.filter(pk=campaign.pk).update(limits={**limits, "soaked": True})
    campaign.limits = {**limits, "soaked": True}
    evidence.campaign_event(campaign, EvidenceKind.SOAKED, "system", {
        "soaked_s": (now - campaign.soak_started_at).total_seconds(),
        "canary": dict(canary.values_list("node__name", "state"))})
    return None


def _admit(campaign: Campaign, sweeps: Any, lowest: int, now: Any, upto: int | None = None) -> list[int]:
    limits = campaign.limits or {}
    cluster_limit: dict[str, int] = limits.get("cluster") or {}
    pool_limit: dict[str, int] | None = limits.get("pool")
    in_cluster: Counter[str] = Counter()
    in_pool: Counter[str] = Counter()
    for cluster, pool, count in sweeps.filter(state__in=SweepState.WORKING).values_list(
            "node__cluster__name", "node__pool").annotate(n=Count("id")).values_list(
            "node__cluster__name", "node__pool", "n"):
        in_cluster[cluster] += count
        in_pool[f"{cluster}/{pool}"] += count
    admitted: list[int] = []
    for row in _pending(sweeps, min(lowest + 1, upto or lowest + 1), cluster_limit, in_cluster):
        cluster, pool = row["node__cluster__name"], f"{row['node__cluster__name']}/{row['node__pool']}"
        if not policy.admits(row["wave"], lowest, in_cluster[cluster], cluster_limit.get(cluster, 1), in_pool[pool],
                             pool_limit.get(pool, 1) if pool_limit is not None else None):
            continue
        event = evidence.prepare_node_event(campaign.pk, row["id"], row["evidence_seq"], row["evidence_head"],
                                            EvidenceKind.ADMITTED, "system", {"wave": row["wave"]})
        moved = _update_sweep(row["id"], {
            "state": SweepState.DRAINING, "lease_owner": "", "attempt": 0, "step_started_at": now,
            "step_deadline": policy.step_deadline(campaign.step_timeout_s, now),
            "evidence_seq": event.node_seq, "evidence_head": event.hash,
        }, Guard(f" AND {_column(_SWEEPS, 'state')} = %s", (SweepState.PENDING,)))
        if moved:
            _insert_events([event])
            in_cluster[cluster] += 1
            in_pool[pool] += 1
            admitted.append(row["id"])
    return admitted


ADMIT_PAGE = 200


def _pending(sweeps: Any, upto: int, cluster_limit: dict[str, int],
             in_cluster: Counter[str]) -> Iterator[dict[str, Any]]:
    """Pending sweeps of waves up to `upto` in plan order, a page at a time, leaving out clusters
    already at their limit (re-read after each page, as admission fills them): a dispatch reads
    about as many rows as it may admit, not every pending row of two waves (10,000 nodes, issue 20)."""
    after: tuple[int, int, int] | None = None
    while True:
        full = [c for c, limit in cluster_limit.items() if in_cluster[c] >= limit]
        rows = sweeps.filter(state=SweepState.PENDING, wave__lte=upto).exclude(node__cluster__name__in=full)
        if after is not None:
            wave, position, pk = after
            rows = rows.filter(Q(wave__gt=wave) | Q(wave=wave, position__gt=position)
                               | Q(wave=wave, position=position, pk__gt=pk))
        page = list(rows.order_by("wave", "position", "pk").values(
            "id", "wave", "position", "node__cluster__name", "node__pool", "evidence_seq", "evidence_head")
            [:ADMIT_PAGE])
        yield from page
        if len(page) < ADMIT_PAGE:
            return
        after = (page[-1]["wave"], page[-1]["position"], page[-1]["id"])


# -- the lease and transitions -------------------------------------------------------------
# The statements of every step (claim, transition, evidence) are plain SQL: the ORM spent more CPU
# compiling them than the database spends running them (issue 11). Values go through each field's
# own get_db_prep_save, so what is stored is exactly what the ORM would store (JSON, times).
_SWEEPS = NodeSweep._meta
_EVENTS = EvidenceEvent._meta
_MOVES = WorkloadMove._meta
_EVENT_FIELDS = ("campaign_id", "sweep_id", "seq", "node_seq", "kind", "actor", "at", "data", "prev_hash", "hash")


@functools.cache
def _column(meta: Any, name: str) -> str:
    """The quoted column of field `name` (or, given the table's name, the quoted table)."""
    return connection.ops.quote_name(meta.get_field(name).column if name != meta.db_table else name)


def _value(meta: Any, name: str, value: Any) -> Any:
    return meta.get_field(name).get_db_prep_save(value, connection)


@dataclass(frozen=True)
class Guard:
    """The condition of a sweep's conditional UPDATE, as SQL after ``WHERE id = %s``."""

    sql: str
    params: tuple[Any, ...] = ()


def _update_sql(meta: Any, pk: int, fields: dict[str, Any], guard: Guard, also: str) -> tuple[str, list[Any]]:
    table = _column(meta, meta.db_table)
    sets = ", ".join([*(f"{_column(meta, name)} = %s" for name in fields), *([also] if also else [])])
    # A related row stands for its primary key, as in QuerySet.update().
    values = [_value(meta, name, value.pk if isinstance(value, Model) else value) for name, value in fields.items()]
    return f"UPDATE {table} SET {sets} WHERE {_column(meta, 'id')} = %s{guard.sql}", [*values, pk, *guard.params]


def _update_row(meta: Any, pk: int, fields: dict[str, Any], guard: Guard, also: str = "") -> int:
    """UPDATE the row `pk` of `meta`'s table where `guard` holds (with `also`, more SQL assignments);
    the number of rows changed (0 or 1)."""
    with prepared_cursor() as cursor:
        cursor.execute(*_update_sql(meta, pk, fields, guard, also))
        return int(cursor.rowcount)


def _update_sweep(sweep_id: int, fields: dict[str, Any], guard: Guard, also: str = "") -> int:
    return _update_row(_SWEEPS, sweep_id, fields, guard, also)


def _update_sweep_reading_status(sweep_id: int, fields: dict[str, Any], guard: Guard) -> str | None:
    """_update_sweep that also reads its campaign's status in the same statement (RETURNING):
    None when no row changed."""
    campaigns, sweeps = _column(Campaign._meta, Campaign._meta.db_table), _column(_SWEEPS, _SWEEPS.db_table)
    status = (f"(SELECT {campaigns}.{_column(Campaign._meta, 'status')} FROM {campaigns} WHERE {campaigns}."
              f"{_column(Campaign._meta, 'id')} = {sweeps}.{_column(_SWEEPS, 'campaign_id')})")
    sql, params = _update_sql(_SWEEPS, sweep_id, fields, guard, "")
    with prepared_cursor() as cursor:
        cursor.execute(f"{sql} RETURNING {status}", params)
        row = cursor.fetchone()
    return None if row is None else str(row[0])


def _insert(meta: Any, names: tuple[str, ...], rows: list[Any], suffix: str = "") -> None:
    """INSERT `rows` (model instances) in one statement, each field's value as the ORM saves it
    (auto_now and auto_now_add filled in)."""
    fields = [meta.get_field(name) for name in names]
    values = [f.get_db_prep_save(f.pre_save(row, True), connection) for row in rows for f in fields]
    with prepared_cursor() as cursor:
        cursor.execute(insert_sql(meta.model, names, len(rows), suffix), values)


def _insert_events(events: list[EvidenceEvent]) -> None:
    """INSERT node events in one statement (append-only: nothing else writes these rows)."""
    _insert(_EVENTS, _EVENT_FIELDS, events)


_MOVE_FIELDS = tuple(f.attname for f in _MOVES.concrete_fields if not f.primary_key)


def _moves(sweep: NodeSweep, *states: str) -> list[WorkloadMove]:
    """The sweep's workload moves in `states`, in their order (read by every step: plain SQL)."""
    return select_instances(WorkloadMove, f"sweep_id = %s AND state IN ({marks(states)}) "
                            "ORDER BY id", [sweep.pk, *states], prepared=True)


def _claim(sweep: NodeSweep, worker: str) -> bool:
    """Take the step's lease: one conditional UPDATE (the lease holder is the step's only writer)."""
    now = timezone.now()
    attempt = _column(_SWEEPS, "attempt")
    guard = Guard(f" AND {_column(_SWEEPS, 'state')} = %s AND ({_column(_SWEEPS, 'lease_owner')} = %s"
                  f" OR {_column(_SWEEPS, 'step_deadline')} < %s)",
                  (sweep.state, "", _value(_SWEEPS, "step_deadline", now)))
    fields = {"lease_owner": worker, "step_started_at": now,
              "step_deadline": policy.step_deadline(sweep.campaign.step_timeout_s, now)}
    if not _update_sweep(sweep.pk, fields, guard, also=f"{attempt} = {attempt} + 1"):
        return False
    sweep.attempt += 1
    sweep.lease_owner, sweep.step_started_at = worker, now
    return True


def _guarded(sweep: NodeSweep, worker: str) -> Guard:
    """The sweep's row, only while `worker` holds the lease of its current step."""
    return Guard(f" AND {_column(_SWEEPS, 'state')} = %s AND {_column(_SWEEPS, 'lease_owner')} = %s",
                 (sweep.state, worker))


def _write(sweep: NodeSweep, worker: str, kind: str, data: dict[str, Any], guard: Guard | None = None,
           then: tuple[str, dict[str, Any]] | None = None, sign: bool = False, read_status: bool = False,
           **fields: Any) -> bool:
    """One conditional UPDATE of the sweep (with its chain's new head) and its event (and a second,
    `then`), in the caller's transaction; with `sign` the new head is signed in the same UPDATE, with
    `read_status` the campaign's status is read into ``sweep.campaign`` by it too."""
    events = [evidence.prepare_node_event(sweep.campaign_id, sweep.pk, sweep.evidence_seq, sweep.evidence_head, kind,
                                          _actor(worker), data)]
    if then is not None:
        events.append(evidence.prepare_node_event(sweep.campaign_id, sweep.pk, events[0].node_seq or 0,
                                                  events[0].hash, then[0], _actor(worker), then[1]))
    head = events[-1]
    if sign:
        fields.update(signed_seq=head.node_seq, head_signature=evidence.head_signature(
            sweep.campaign_id, sweep.pk, head.node_seq or 0, head.hash))
    fields = {"evidence_seq": head.node_seq, "evidence_head": head.hash, **fields}
    guard = guard if guard is not None else _guarded(sweep, worker)
    if read_status and connection.features.can_return_columns_from_insert:
        status = _update_sweep_reading_status(sweep.pk, fields, guard)
        if status is None:
            return False
        sweep.campaign.status = status
    elif not _update_sweep(sweep.pk, fields, guard):
        return False
    elif read_status:
        sweep.campaign.status = Campaign.objects.values_list("status", flat=True).get(pk=sweep.campaign_id)
    _insert_events(events)
    sweep.evidence_seq, sweep.evidence_head = head.node_seq or 0, head.hash
    return True


def _release(sweep: NodeSweep, worker: str, countdown: float, kind: str, data: dict[str, Any]) -> None:
    """Give the step back to run again in `countdown` seconds (a retry, or a wait)."""
    with transaction.atomic():
        if _write(sweep, worker, kind, {"step": sweep.state, **data}, lease_owner="",
                  step_deadline=timezone.now() + timedelta(seconds=countdown + 1)):
            enqueue("advance", sweep.pk, countdown)


SERVICE_STATE_AFTER = {
    SweepState.DRAINING: ServiceState.DRAINING,
    SweepState.MIGRATING: ServiceState.PATCHING,  # the step after migrating is the patch
    SweepState.RETURNING: ServiceState.IN_SERVICE,
}


def _finish(sweep: NodeSweep, worker: str, result: StepResult) -> str | None:
    """Move to the next step (keeping the lease, so this worker goes on with it) or to done."""
    now = timezone.now()
    current, following = sweep.state, SweepState.next(sweep.state)
    chain = following != SweepState.DONE
    guard = _guarded(sweep, worker)
    if following == SweepState.PATCHING:
        # Aborted meanwhile: no patch; the next step unwinds instead.
        campaigns = _column(Campaign._meta, Campaign._meta.db_table)
        guard = Guard(f"{guard.sql} AND NOT EXISTS (SELECT 1 FROM {campaigns} WHERE {campaigns}."
                      f"{_column(Campaign._meta, 'id')} = %s AND {campaigns}.{_column(Campaign._meta, 'status')} = %s)",
                      (*guard.params, sweep.campaign_id, CampaignStatus.ABORTED))
    with transaction.atomic():
        fields: dict[str, Any] = {
            "state": following, "attempt": 1 if chain else 0, "lease_owner": worker if chain else "",
            "step_started_at": now,
            "step_deadline": policy.step_deadline(sweep.campaign.step_timeout_s, now) if chain else None,
            **result.fields,
        }
        data = {"step": current, "next": following, "started_at": sweep.step_started_at, "attempt": sweep.attempt,
                **result.data}
        done = None if chain else (EvidenceKind.DONE, {"versions_after": result.fields.get("versions_after")
                                                       or sweep.versions_after})
        # Going on before the patch, the step needs the campaign's status (an abort unwinds instead).
        if not _write(sweep, worker, EvidenceKind.STEP_DONE, data, guard=guard, then=done, sign=not chain,
                      read_status=following in SweepState.BEFORE_PATCH, **fields):
            if following == SweepState.PATCHING:
                # Lost to an abort (or the lease expired): hand the step over to the unwind.
                NodeSweep.objects.filter(pk=sweep.pk, lease_owner=worker).update(lease_owner="", step_deadline=now)
                enqueue("advance", sweep.pk)
            return None
        if result.after is not None:
            result.after()
        if current in SERVICE_STATE_AFTER:
            inventory.set_service_state([sweep.node_id], result.service_state or SERVICE_STATE_AFTER[current],
                                        ChangeSource.CAMPAIGN, reference(sweep))
        sweep.state, sweep.attempt, sweep.step_started_at = following, 1, now
        for name, value in result.fields.items():
            setattr(sweep, name, value)
        return following


def _end(sweep: NodeSweep, worker: str, final: str, data: dict[str, Any], in_service: bool) -> bool:
    """The sweep's last transition (failed or rolled back), its signed head, and the error budget."""
    with transaction.atomic():
        if not _write(sweep, worker, final, {"from": sweep.state, **data}, state=final, lease_owner="",
                      step_deadline=None, error=str(data.get("error", ""))[:4000], sign=True):
            return False
        if in_service:
            inventory.set_service_state([sweep.node_id], ServiceState.IN_SERVICE, ChangeSource.CAMPAIGN,
                                        reference(sweep))
        if final == SweepState.FAILED:
            _check_budget(sweep.campaign_id)
        sweep.state = final
        return True


def _check_budget(campaign_id: int) -> None:
    counts = Counter(NodeSweep.objects.filter(campaign_id=campaign_id).values_list("state", flat=True))
    failed, total = counts[SweepState.FAILED], sum(counts.values())
    allowed = policy.allowed_failures(Campaign.objects.values_list("error_budget", flat=True).get(pk=campaign_id),
                                      total)
    if failed <= allowed:
        return
    campaign = evidence.lock_campaign(campaign_id)
    if campaign.status in (CampaignStatus.RUNNING, CampaignStatus.WAITING, CampaignStatus.PAUSED):
        reason = f"{failed} failed nodes exceed the error budget of {allowed}"
        Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.HALTED, status_reason=reason)
        campaign.status = CampaignStatus.HALTED
        evidence.campaign_event(campaign, EvidenceKind.HALTED, "system", {"reason": reason, "failed": failed})


# -- running a step ----------------------------------------------------------------------
@dataclass
class StepResult:
    data: dict[str, Any] = field(default_factory=dict)
    fields: dict[str, Any] = field(default_factory=dict)
    # Inventory changes that must commit with the transition (run inside its transaction).
    after: Callable[[], None] | None = None
    # The node's service state after this step, where it is not the usual one.
    service_state: str | None = None


def advance(sweep_id: int, worker: str | None = None, max_steps: int | None = None) -> str | None:
    """Run the sweep's steps from the current one while they succeed (at most `max_steps`, and then
    the lease is given back); return the state it rests in."""
    worker = worker or uuid.uuid4().hex[:16]
    sweep = _load(sweep_id)
    if sweep is None or sweep.state not in SweepState.WORKING or not _claim(sweep, worker):
        return None
    state: str | None = sweep.state
    taken = 0
    while True:
        state, go_on = _step(sweep, worker)
        taken += 1
        if go_on and max_steps is not None and taken >= max_steps:
            # Stop here, leaving the next step for whoever advances it (tests step one at a time).
            NodeSweep.objects.filter(pk=sweep_id, lease_owner=worker).update(lease_owner="", attempt=0)
            return state
        if not go_on:
            if state in SweepState.TERMINAL:
                _dispatch_after(sweep.campaign_id)
            return state
        # The sweep in hand is current (this worker wrote it); only an abort can have come meanwhile,
        # and it matters only before the patch: the transition read the campaign's status then (and
        # the move into patching checks it in its UPDATE).


def _dispatch_after(campaign_id: int) -> None:
    """This worker ended a sweep, so its slot is free: admit the next nodes here and now rather than
    through a dispatch task (one task less per node). Should it fail, a task does it after all;
    should the worker die first, the periodic re-drive dispatches every running campaign."""
    try:
        dispatch(campaign_id)
    except DatabaseError:
        log.exception("campaign %s: dispatch after a finished node failed; enqueued instead", campaign_id)
        enqueue_now("dispatch", campaign_id)


class _Unpinned:
    """An executor whose every call first gives this thread's database connection back to the pool.

    A step waits on its node for seconds to minutes; k nodes in flight must not hold k database
    connections meanwhile (GPUSWEEP_DB_POOL_SIZE). Inside a transaction nothing is given back.
    """

    def __init__(self, executor: Executor) -> None:
        self._executor = executor

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._executor, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            if not connection.in_atomic_block:
                connection.close()
            return value(*args, **kwargs)

        return call


def executor_for(sweep: NodeSweep) -> Executor:
    ex = get_executor(sweep.node.cluster)
    if (connection.settings_dict.get("OPTIONS") or {}).get("pool"):
        return cast(Executor, _Unpinned(ex))
    return ex


def _step(sweep: NodeSweep, worker: str) -> tuple[str | None, bool]:
    """One step under the lease; (state now, whether this worker goes on with the next one)."""
    ex = executor_for(sweep)
    try:
        if sweep.state in SweepState.BEFORE_PATCH and sweep.campaign.status == CampaignStatus.ABORTED:
            return _unwind(sweep, worker, ex, SweepState.ROLLED_BACK, ""), False
        result = STEPS[sweep.state](sweep, ex, node_ref(sweep.node))
    except WaitMore as wait:
        _release(sweep, worker, wait.seconds, EvidenceKind.WAITING, {"reason": str(wait), **wait.detail})
        return sweep.state, False
    except TemporaryExecutorError as exc:
        if sweep.attempt < MAX_ATTEMPTS:
            _release(sweep, worker, RETRY_BACKOFF_S * sweep.attempt, EvidenceKind.RETRY,
                     {"error": str(exc), "attempt": sweep.attempt})
            return sweep.state, False
        return _fail(sweep, worker, ex, f"gave up after {sweep.attempt} attempts: {exc}"), False
    except PermanentExecutorError as exc:
        return _fail(sweep, worker, ex, str(exc), revert=not isinstance(exc, NotPatched)), False
    except IntegrityError:
        return None, False  # another worker wrote this node's chain: the lease was lost
    following = _finish(sweep, worker, result)
    return following, following in SweepState.WORKING


def _fail(sweep: NodeSweep, worker: str, ex: Executor, error: str, revert: bool = True) -> str | None:
    """Fail the node once: unwind it if it was not patched, revert a failed patch or health gate,
    record every error, never run it again."""
    with transaction.atomic():
        _write(sweep, worker, EvidenceKind.STEP_FAILED, {"step": sweep.state, "error": error[:4000]},
               error=error[:4000])
    if sweep.state in SweepState.BEFORE_PATCH:
        return _unwind(sweep, worker, ex, SweepState.FAILED, error)
    if revert and sweep.state in (SweepState.PATCHING, SweepState.VERIFYING):
        return _revert(sweep, worker, ex, error)
    # Patched (or partly): the node stays out of service for a human to look at.
    data = {"error": error, "left": "out of service after its patch", "parked_checkpoints": _parked(sweep)}
    return SweepState.FAILED if _end(sweep, worker, SweepState.FAILED, data, in_service=False) else None


def _unwind(sweep: NodeSweep, worker: str, ex: Executor, final: str, error: str) -> str | None:
    """Put a node that was not patched back as it was: maintenance off, its workloads restored on it.

    Tried once. An error here is recorded beside the one that caused the unwind and ends the
    sweep too: the node is left as the evidence says, for an operator, and never retried.
    """
    ref = node_ref(sweep.node)
    returned: list[dict[str, Any]] = []
    try:
        if sweep.state != SweepState.PENDING:
            # Leave maintenance first: a node in maintenance admits no work, so its own workloads
            # could not come home. Repeating it (same operation id) after a crash is harmless.
            ex.undo(ref, op_id(sweep, "undo"))
        for move in WorkloadMove.objects.filter(sweep=sweep, state__in=[MoveState.CHECKPOINTED, MoveState.PARKED]
                                                ).select_related("target_node__cluster"):
            returned.append(_bring_back(sweep, worker, ex, ref, move))
    except ExecutorError as exc:
        if final == SweepState.ROLLED_BACK and isinstance(exc, TemporaryExecutorError) and (
                sweep.attempt < MAX_ATTEMPTS):
            _release(sweep, worker, RETRY_BACKOFF_S * sweep.attempt, EvidenceKind.RETRY,
                     {"error": f"rollback: {exc}", "attempt": sweep.attempt})
            return sweep.state
        state = "drained" if sweep.state != SweepState.PENDING else "untouched"
        failed: dict[str, Any] = {"error": error or f"rollback failed: {exc}", "unwind_error": str(exc),
                                  "left": state, "workloads_returned": returned}
        return SweepState.FAILED if _end(sweep, worker, SweepState.FAILED, failed, in_service=False) else None
    data: dict[str, Any] = {"workloads_returned": returned, **({"error": error} if error else {})}
    kept = _foreign_hold(sweep, ex, ref)
    if kept:
        data["foreign_hold_kept"] = kept
    return final if _end(sweep, worker, final, data, in_service=not kept) else None


def _parked(sweep: NodeSweep) -> list[dict[str, str]]:
    """Checkpoints parked for this node's return that a failed sweep leaves for an operator."""
    return [{"workload": w, "checkpoint_id": c} for w, c in WorkloadMove.objects.filter(
        sweep=sweep, state=MoveState.PARKED).values_list("workload_ref", "checkpoint_id")]


def _record(sweep: NodeSweep, worker: str, kind: str, data: dict[str, Any]) -> None:
    with transaction.atomic():
        _write(sweep, worker, kind, data)


def _revert(sweep: NodeSweep, worker: str, ex: Executor, error: str) -> str | None:
    """Put a node whose patch or health gate failed back on the versions it had: the back end
    reinstalls what it recorded before the patch, the node reboots, the old versions are verified.
    Then it stays out of service, or (``after_rollback`` "return") returns once its health gates
    pass on the old versions. Tried once, every step in the evidence; the sweep fails either way
    (charged to the budget)."""
    ref = node_ref(sweep.node)
    campaign = sweep.campaign
    data: dict[str, Any] = {"error": error, "parked_checkpoints": _parked(sweep)}
    in_service = False
    try:
        result = ex.rollback(ref, op_id(sweep, "revert"))
        _record(sweep, worker, EvidenceKind.REVERTED, {"components": result.components,
                                                       "reinstalled": result.reinstalled,
                                                       "output": result.output[:2000]})
        if not result.components:
            # Nothing was reinstalled (e.g. the GPU Operator's node keeps its skip label): it stays out.
            data["left"] = f"out of service: nothing reinstalled ({result.output[:500]})"
            return SweepState.FAILED if _end(sweep, worker, SweepState.FAILED, data, in_service=False) else None
        if result.reboot_required:
            ex.reboot(ref, op_id(sweep, "revert-reboot"))
        facts = ex.facts(ref)
        wrong = {c: {"want": v, "got": facts.get(c)} for c, v in result.components.items() if facts.get(c) != v}
        if wrong:
            raise PermanentExecutorError(f"after the revert the node does not report its previous versions: {wrong}")
        back = {c: facts[c] for c in result.components}
        _record(sweep, worker, EvidenceKind.REVERT_VERIFIED, {"versions": back, "rebooted": result.reboot_required})
        data["reverted_to"] = back
        if campaign.after_rollback == AfterRollback.RETURN:
            gate = _gate(sweep, worker, ex, ref, back, "revert-health")
            if gate.passed:
                ex.return_to_service(ref, op_id(sweep, "revert-return"))
                kept = _foreign_hold(sweep, ex, ref)
                in_service = not kept
                if kept:
                    data["foreign_hold_kept"] = kept
        data["left"] = ("in service on its previous versions" if in_service
                        else "out of service on its previous versions")
    except ExecutorError as exc:
        _record(sweep, worker, EvidenceKind.REVERT_FAILED, {"error": str(exc)[:4000]})
        data.update(revert_error=str(exc)[:4000], left="out of service: the revert failed")
    return SweepState.FAILED if _end(sweep, worker, SweepState.FAILED, data, in_service=in_service) else None


def gates_of(campaign: Campaign) -> HealthGates:
    return HealthGates(dcgm_level=int(campaign.dcgm_level), site_checks=tuple(campaign.site_checks or ()) or None)


def _gate(sweep: NodeSweep, worker: str, ex: Executor, ref: NodeRef, expected: dict[str, str],
          step: str) -> HealthResult:
    """Run the node's health gates and keep every check with its output in the evidence."""
    result = ex.health(ref, expected, gates_of(sweep.campaign), op_id(sweep, step))
    _record(sweep, worker, EvidenceKind.HEALTH_CHECKED, {"expected": expected, **result.as_dict()})
    return result


def _bring_back(sweep: NodeSweep, worker: str, ex: Executor, ref: NodeRef, move: WorkloadMove) -> dict[str, Any]:
    """One checkpointed workload of an unwinding node: finish a restore under way, else restore it home."""
    name = move.workload_name or move.workload_ref
    if move.target_node is not None and move.target_node_id != sweep.node_id:
        # A restore was under way: finish it where it went (same operation id) rather than
        # starting a second copy here; only a restore that failed comes home.
        try:
            away = ex.restore(node_ref(move.target_node), move.checkpoint_id, move_op(sweep, move, "restore"))
        except (PermanentExecutorError, InterruptedOperation):
            pass
        else:
            entry = {"workload": name, "from": sweep.node.name, "to": move.target_node.name,
                     "checkpoint_id": move.checkpoint_id, "new_id": away.workload_id, "resumed": True}
            _move(sweep, worker, move, EvidenceKind.RESTORED, entry, state=MoveState.RESTORED,
                  new_workload_ref=away.workload_id, steps_after=away.steps, inventory_to=move.target_node)
            return entry
    result = ex.restore(ref, move.checkpoint_id, op_id(sweep, f"return-{move.pk}"))
    entry = {"workload": name, "checkpoint_id": move.checkpoint_id, "returned_to": sweep.node.name,
             "new_id": result.workload_id, "steps_before": move.steps_before, "steps_after": result.steps}
    _move(sweep, worker, move, EvidenceKind.RETURNED, entry, state=MoveState.RETURNED,
          new_workload_ref=result.workload_id, steps_after=result.steps, target_node=sweep.node,
          inventory_to=sweep.node)
    return entry


def _move(sweep: NodeSweep, worker: str, move: WorkloadMove, kind: str, data: dict[str, Any],
          inventory_to: Node | None = None, **fields: Any) -> bool:
    """A workload move's conditional state change, its evidence and its inventory placement, together."""
    with transaction.atomic():
        if not _update_row(_MOVES, move.pk, fields, Guard(f" AND {_column(_MOVES, 'state')} = %s", (move.state,))):
            return False
        event = evidence.prepare_node_event(sweep.campaign_id, sweep.pk, sweep.evidence_seq, sweep.evidence_head,
                                            kind, _actor(worker), data)
        if not _update_sweep(sweep.pk, {"evidence_seq": event.node_seq, "evidence_head": event.hash},
                             Guard(f" AND {_column(_SWEEPS, 'lease_owner')} = %s", (worker,))):
            raise TemporaryExecutorError(f"node sweep {sweep.pk}: the lease was lost while recording {kind}")
        _insert_events([event])
        sweep.evidence_seq, sweep.evidence_head = event.node_seq or 0, event.hash
        if inventory_to is not None and move.workload_id is not None and fields.get("new_workload_ref"):
            inventory.move_workload(move.workload_id, inventory_to.pk, str(fields["new_workload_ref"]),
                                    ChangeSource.CAMPAIGN, reference(sweep))
        move.state = str(fields.get("state", move.state))
        return True


# -- the steps ---------------------------------------------------------------------------
def _drain(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> StepResult:
    before = ex.facts(ref)
    ex.drain(ref, op_id(sweep, "drain"))
    return StepResult({"versions_before": before}, {"versions_before": before})


def _planned_moves(sweep: NodeSweep) -> dict[str, dict[str, Any]]:
    planned = sweep.planned or {}  # loaded with the sweep: it is copied at start and never changes
    return {m["workload"]: m for m in planned.get("moves", []) if "arrived_from" not in m}


def _requirements(info: WorkloadInfo | None, row: Workload | None, engine: str,
                  facts: dict[str, str]) -> portability.Requirements:
    """What this workload's checkpoint will need of its target (the one portability rule)."""
    reported = info.fingerprint if info is not None else {}

    def pick(name: str, own: str) -> str:
        return str(reported.get(name) or own or "")

    return portability.requirements(
        engine, facts, gpus=(info.gpus if info is not None and info.gpus else (row.gpus if row else 0)),
        inference_engine=pick("engine", row.engine if row else ""),
        engine_version=pick("engine_version", row.engine_version if row else ""),
        model_name=pick("model_name", row.model_name if row else ""),
        model_version=pick("model_version", row.model_version if row else ""),
        requires={**(row.requires if row else {}), **(info.requires if info is not None else {})},
    )


def _source_facts(sweep: NodeSweep) -> dict[str, str]:
    versions = dict(select_rows(NodeComponent, ("component", "version"), "node_id = %s ORDER BY component",
                                [sweep.node_id], prepared=True))
    return portability.node_facts(sweep.node.gpu_model, versions)


def _prepare_moves(sweep: NodeSweep, running: dict[str, WorkloadInfo]) -> None:
    """One WorkloadMove per workload running on the node, with its policy and its image's needs."""
    campaign = sweep.campaign
    # Plain statements: this runs for every node, and compiling the ORM's cost more than running them.
    have = {ref for ref, in select_rows(WorkloadMove, ("workload_ref",), "sweep_id = %s", [sweep.pk], prepared=True)}
    missing = [ref for ref in running if ref not in have]
    if not missing:
        return
    known = {w.scheduler_id: w for w in select_instances(
        Workload, f"cluster_id = %s AND scheduler_id IN ({marks(missing)}) AND gone_at IS NULL "
        "ORDER BY kind", [sweep.node.cluster_id, *missing], prepared=True)}  # the ORM's order: the last kind wins
    planned = _planned_moves(sweep)
    facts = _source_facts(sweep)
    moves = []
    for ref in missing:
        info, row = running[ref], known.get(ref)
        engine = (row.checkpoint_engine if row else info.checkpoint_engine) or CheckpointEngine.NONE
        needed = _requirements(info, row, engine, facts)
        gpus = info.gpus or (row.gpus if row else 0)
        moves.append(WorkloadMove(
            sweep=sweep, workload=row, workload_ref=ref, workload_name=info.name, gpus=gpus,
            policy=policy.workload_policy(campaign, ref, info.name, row.policy if row else ""),
            detail={"engine": engine, "requires": needed.as_dict(),
                    "planned": (planned.get(ref) or {}).get("action", ""),
                    **({"origin": info.origin} if info.origin else {})}))
    # ON CONFLICT DO NOTHING (PostgreSQL, SQLite 3.24+): a repeat of this step leaves the moves it made.
    _insert(_MOVES, _MOVE_FIELDS, moves, " ON CONFLICT DO NOTHING")


def _checkpoint(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> StepResult:
    campaign = sweep.campaign
    running = {w.id: w for w in ex.list_workloads(ref)}
    _prepare_moves(sweep, running)
    done = []
    for move in _moves(sweep, MoveState.PLANNED):
        engine = str(move.detail.get("engine") or CheckpointEngine.NONE)
        checkpoint = move.policy == WorkloadPolicy.CHECKPOINT and portability.rule(engine).checkpointable
        if move.workload_ref not in running:
            # Either it ended by itself, or a worker died after the agent checkpointed (or stopped)
            # it and before this was recorded. Asking again with the same operation id tells which:
            # the agent answers with the first result, or fails because nothing was ever started.
            entry = _recover_move(sweep, ex, ref, move, engine, checkpoint)
            if entry is not None:
                done.append(entry)
            continue
        if move.policy == WorkloadPolicy.WAIT:
            waited = timezone.now() - move.created_at
            if campaign.wait_limit is None or waited < campaign.wait_limit:
                raise WaitMore(policy.WAIT_POLL_S, f"waiting for {move.workload_name or move.workload_ref} to finish",
                               _origin(move))
            if not campaign.cold_restart_allowed:
                raise PermanentExecutorError(
                    f"workload {move.workload_name or move.workload_ref} still runs after the wait limit "
                    "and cold restart is not allowed")
        if checkpoint:
            try:
                result = ex.checkpoint(ref, move.workload_ref, engine, move_op(sweep, move, "ck"),
                                       requires=move.detail.get("requires"))
            except InterruptedOperation as exc:
                raise _renamed(move, "ck", exc) from exc
            done.append(_checkpointed(sweep, move, engine, result))
        else:
            if move.policy != WorkloadPolicy.COLD_RESTART and not campaign.cold_restart_allowed:
                raise PermanentExecutorError(
                    f"workload {move.workload_name or move.workload_ref} cannot be checkpointed ({engine}) "
                    "and cold restart is not allowed")
            ex.stop(ref, move.workload_ref, op_id(sweep, f"stop-{move.workload_ref}"))
            done.append(_stopped(sweep, ex, move))
    return StepResult({"workloads": done})


def _origin(move: WorkloadMove) -> dict[str, str]:
    """For the evidence: {"origin": "undeclared-found-by-agent"} when no scheduler declared the workload's
    GPUs and the node's agent found it holding some (WorkloadInfo.origin); {} for a declared one."""
    origin = move.detail.get("origin")
    return {"origin": str(origin)} if origin else {}


def _stopped(sweep: NodeSweep, ex: Executor, move: WorkloadMove) -> dict[str, Any]:
    who = ex.restarted_by(move.workload_ref)
    entry = {"workload": move.workload_name or move.workload_ref, "action": "stopped for a cold restart",
             "restarted_by": who or "nobody: its owner must start it again", **_origin(move)}
    _move(sweep, sweep.lease_owner, move, EvidenceKind.STOPPED, entry, state=MoveState.STOPPED)
    return entry


def _checkpointed(sweep: NodeSweep, move: WorkloadMove, engine: str, result: CheckpointResult) -> dict[str, Any]:
    entry = {"workload": move.workload_name or move.workload_ref, "checkpoint_id": result.checkpoint_id,
             "sha256": result.sha256, "bytes": result.total_bytes, "steps": result.steps, "engine": engine,
             "requires": move.detail.get("requires"), **_origin(move)}
    home = move.detail.get("planned") == "return_home"
    fields: dict[str, Any] = {"checkpoint_id": result.checkpoint_id, "checkpoint_sha256": result.sha256,
                              "steps_before": result.steps}
    if home:  # planned to come back here after the reboot (the image stays valid on this node)
        fields.update(state=MoveState.PARKED, target_node_id=sweep.node_id)
        _move(sweep, sweep.lease_owner, move, EvidenceKind.PARKED,
              {**entry, "restore": "on this node after its reboot"}, **fields)
    else:
        _move(sweep, sweep.lease_owner, move, EvidenceKind.CHECKPOINTED, entry, state=MoveState.CHECKPOINTED,
              **fields)
    return entry


def _recover_move(sweep: NodeSweep, ex: Executor, ref: NodeRef, move: WorkloadMove, engine: str,
                  checkpoint: bool) -> dict[str, Any] | None:
    """A planned move whose workload no longer runs: checkpointed before a crash, or finished."""
    name = move.workload_name or move.workload_ref
    if checkpoint:
        try:
            result = ex.checkpoint(ref, move.workload_ref, engine, move_op(sweep, move, "ck"),
                                   requires=move.detail.get("requires"))
        except InterruptedOperation as exc:
            raise _renamed(move, "ck", exc) from exc
        except PermanentExecutorError:
            result = None
        if result is not None:
            return _checkpointed(sweep, move, engine, result)
    elif move.policy != WorkloadPolicy.WAIT:
        try:
            ex.stop(ref, move.workload_ref, op_id(sweep, f"stop-{move.workload_ref}"))
        except PermanentExecutorError:
            pass
        else:
            return _stopped(sweep, ex, move)
    _move(sweep, sweep.lease_owner, move, EvidenceKind.FINISHED,
          {"workload": name, "action": "ended by itself before it was moved", **_origin(move)},
          state=MoveState.FINISHED)
    return None


def choose_target(sweep: NodeSweep, move: WorkloadMove, planned: int | None) -> Node | None:
    """A node where the checkpoint is valid (executors.portability), with room, not being drained soon.

    The facts the image needs and free GPUs are matched in SQL: the planned target if it still
    qualifies, else the emptiest. Written as SQL: compiling it through the ORM cost more CPU per
    node than running it.
    """
    source = sweep.node
    needed = portability.from_dict(move.detail.get("requires") or {})
    q = connection.ops.quote_name
    nodes, components = q(Node._meta.db_table), q(NodeComponent._meta.db_table)
    sweeps, workloads = q(NodeSweep._meta.db_table), q(Workload._meta.db_table)
    where = ["n.cluster_id = %s", "n.service_state = %s", "n.gone_at IS NULL", "n.id <> %s"]
    params: list[Any] = [source.cluster_id, ServiceState.IN_SERVICE, source.pk]
    for fact, value in needed.must.items():
        if fact == portability.GPU_MODEL:
            where.append("n.gpu_model = %s")
            params.append(value)
        elif value:
            where.append(f"n.id IN (SELECT node_id FROM {components} WHERE component = %s AND version = %s)")
            params += [fact, value]
        else:
            where.append(f"n.id NOT IN (SELECT node_id FROM {components} WHERE component = %s)")
            params.append(fact)
    for fact, value in needed.if_reported.items():
        where.append(f"n.id NOT IN (SELECT node_id FROM {components} WHERE component = %s AND version <> %s)")
        params += [fact, value]
    # Nodes being swept now, and nodes of this campaign in this or the next wave (drained before
    # the workload settles), do not receive work.
    working = sorted(SweepState.WORKING)
    where.append(f"n.id NOT IN (SELECT node_id FROM {sweeps} WHERE state IN ({marks(working)}))")
    params += working
    where.append(f"n.id NOT IN (SELECT node_id FROM {sweeps} WHERE campaign_id = %s AND state = %s AND wave <= %s)")
    params += [sweep.campaign_id, SweepState.PENDING, sweep.wave + 1]
    free = (f"n.gpu_count - COALESCE((SELECT SUM(w.gpus) FROM {workloads} w WHERE w.node_id = n.id"
            " AND w.gone_at IS NULL), 0)")
    where.append(f"{free} >= %s")
    params.append(move.gpus)
    sql = f"SELECT n.*, {free} AS free FROM {nodes} n WHERE {' AND '.join(where)}"
    # The planned target alone first (it usually still fits): the emptiest node is a search of the
    # whole cluster, each candidate's free GPUs summed, which at 10,000 nodes is the costly part.
    target = next(iter(Node.objects.raw(f"{sql} AND n.id = %s", [*params, planned])), None) if planned else None
    if target is None:
        target = next(iter(Node.objects.raw(f"{sql} ORDER BY free DESC, n.name LIMIT 1", params)), None)
    if target is not None:
        target.cluster = source.cluster  # the same cluster, already loaded
    return target


def _resumed(ex: Executor, ref: NodeRef, workload_id: str) -> WorkloadInfo | None:
    return next((w for w in ex.list_workloads(ref) if w.id == workload_id), None)


def _migrate(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> StepResult:
    planned = _planned_moves(sweep)
    done = []
    for move in _moves(sweep, MoveState.CHECKPOINTED):  # a target chosen before a retry loads when used
        plan_entry = planned.get(move.workload_ref, {})
        if move.target_node_id is None:
            target = choose_target(sweep, move, plan_entry.get("to"))
            if target is None:
                done.append(_park_or_fail(sweep, move))
                continue
            # Recorded before the restore: a retry after a crash goes to the same node with the same
            # operation id, so the workload is restored once, never on two nodes.
            _update_row(_MOVES, move.pk, {"target_node": target},
                        Guard(f" AND {_column(_MOVES, 'target_node')} IS NULL"))
            move.target_node, move.target_node_id = target, target.pk
        assert move.target_node is not None
        target = move.target_node
        try:
            result = ex.restore(node_ref(target), move.checkpoint_id, move_op(sweep, move, "restore"))
        except InterruptedOperation as exc:
            raise _renamed(move, "restore", exc) from exc
        seen = _resumed(ex, node_ref(target), result.workload_id)
        if seen is None:
            raise TemporaryExecutorError(f"restored workload {result.workload_id} is not running on {target.name} yet")
        as_planned = plan_entry.get("to") == target.pk
        entry = {"workload": move.workload_name or move.workload_ref, "from": sweep.node.name, "to": target.name,
                 "checkpoint_id": move.checkpoint_id, "new_id": result.workload_id, "resumed": True,
                 "steps_before": move.steps_before, "steps_after": seen.steps, "as_planned": as_planned}
        _move(sweep, sweep.lease_owner, move, EvidenceKind.RESTORED, entry, state=MoveState.RESTORED,
              new_workload_ref=result.workload_id, steps_after=seen.steps, inventory_to=target,
              detail={**move.detail, "planned_target": plan_entry.get("to"), "as_planned": as_planned})
        done.append(entry)
    return StepResult({"workloads": done})


def _park_or_fail(sweep: NodeSweep, move: WorkloadMove) -> dict[str, Any]:
    """No receiver is free now: keep the checkpoint for this node's return if it stays valid here."""
    name = move.workload_name or move.workload_ref
    needed = portability.from_dict(move.detail.get("requires") or {})
    after = portability.node_facts(sweep.node.gpu_model, {**_source_facts(sweep), **sweep.target})
    if not portability.compatible(needed, after):
        raise PermanentExecutorError(f"no node where the checkpoint of {name} is valid has {move.gpus} free GPUs, "
                                     f"and it would not be valid on {sweep.node.name} after the patch")
    entry = {"workload": name, "checkpoint_id": move.checkpoint_id, "restore": "on this node after its reboot",
             "why": "no compatible node with room; the checkpoint stays valid here after the patch"}
    _move(sweep, sweep.lease_owner, move, EvidenceKind.PARKED, entry, state=MoveState.PARKED,
          target_node_id=sweep.node_id)
    return entry


def _patch(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> StepResult:
    # A failed or unfinished checkpoint never leads to a patch.
    left = len(_moves(sweep, MoveState.PLANNED, MoveState.CHECKPOINTED))
    if left:
        raise NotPatched(f"refusing to patch: {left} workload(s) not moved off the node")
    results = [ex.patch(ref, component, version, op_id(sweep, f"patch-{component}-{version}"))
               for component, version in sorted(sweep.target.items())]
    patches = [{"component": r.component, "before": r.before, "after": r.after, "output": r.output[:1000]}
               for r in results]
    return StepResult({"patches": patches}, {"patched_at": timezone.now()})


def _reboot(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> StepResult:
    ex.reboot(ref, op_id(sweep, "reboot"))
    return StepResult()


def _verify(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> StepResult:
    result = ex.verify(ref)
    wrong = {c: {"want": v, "got": result.versions.get(c)} for c, v in sweep.target.items()
             if result.versions.get(c) != v}
    if wrong or not result.healthy:
        raise PermanentExecutorError(f"verification failed: healthy={result.healthy} versions={wrong}")
    verified = {c: result.versions[c] for c in sweep.target}
    # The health gates, before the node may return to service: a failing one keeps it out.
    gate = _gate(sweep, sweep.lease_owner, ex, ref, dict(sweep.target), "health")
    if not gate.passed:
        summaries = "; ".join(f"{c.name}: {c.summary}" for c in gate.checks if c.status == "failed")
        raise HealthGateFailed(f"health gate failed: {summaries}"[:4000])

    def record() -> None:
        # The inventory learns the new versions from the campaign, and the node's exposures are
        # remediated with this sweep as their evidence (node_versions_changed, on commit).
        inventory.record_versions(sweep.node_id, verified, ChangeSource.CAMPAIGN, reference(sweep))

    data = {"versions_after": result.versions, "healthy": result.healthy, "output": result.output[:2000],
            "health_gates": {c.name: c.status for c in gate.checks}}
    return StepResult(data, {"versions_after": result.versions}, after=record)


def _foreign_hold(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> dict[str, Any]:
    """For a node swept while someone else held it: that hold, still there (it is theirs to lift)."""
    planned = sweep.planned or {}
    if not planned.get("held_by"):
        return {}
    return {"held_before": planned["held_by"].get("hold"), "held_now": ex.maintenance_hold(ref)}


def _return(sweep: NodeSweep, ex: Executor, ref: NodeRef) -> StepResult:
    ex.return_to_service(ref, op_id(sweep, "return"))
    kept = _foreign_hold(sweep, ex, ref)
    # Checkpoints parked for this node come back now that it admits work again.
    restored = []
    for move in _moves(sweep, MoveState.PARKED):
        result = ex.restore(ref, move.checkpoint_id, op_id(sweep, f"home-{move.pk}"))
        entry = {"workload": move.workload_name or move.workload_ref, "checkpoint_id": move.checkpoint_id,
                 "to": sweep.node.name, "new_id": result.workload_id, "steps_before": move.steps_before,
                 "steps_after": result.steps, "after_reboot": True}
        _move(sweep, sweep.lease_owner, move, EvidenceKind.RESTORED, entry, state=MoveState.RESTORED,
              new_workload_ref=result.workload_id, steps_after=result.steps, inventory_to=sweep.node)
        restored.append(entry)
    data: dict[str, Any] = {"workloads": restored} if restored else {}
    if kept:
        data["foreign_hold_kept"] = kept
    return StepResult(data, service_state=ServiceState.OFFLINE if kept else None)


STEPS: dict[str, Callable[[NodeSweep, Executor, NodeRef], StepResult]] = {
    SweepState.DRAINING: _drain,
    SweepState.CHECKPOINTING: _checkpoint,
    SweepState.MIGRATING: _migrate,
    SweepState.PATCHING: _patch,
    SweepState.REBOOTING: _reboot,
    SweepState.VERIFYING: _verify,
    SweepState.RETURNING: _return,
}


# -- periodic ----------------------------------------------------------------------------
def redrive() -> dict[str, int]:
    """Enqueue every step whose deadline passed (its worker died or its message was lost)."""
    now = timezone.now()
    stale = list(NodeSweep.objects.filter(state__in=SweepState.WORKING, step_deadline__lt=now)
                 .values_list("pk", flat=True))
    for sweep_id in stale:
        enqueue_now("advance", sweep_id, 0)
    running = list(Campaign.objects.filter(status__in=[CampaignStatus.RUNNING, CampaignStatus.WAITING])
                   .values_list("pk", flat=True))
    for campaign_id in running:
        enqueue_now("dispatch", campaign_id, 0)
    return {"steps": len(stale), "campaigns": len(running)}
