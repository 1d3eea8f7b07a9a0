"""Apply what a source observed to the inventory: set-based, idempotent, one transaction.

Every source (file, Slurm, Kubernetes, node agent) turns what it sees into a `Snapshot` and
hands it to `apply_snapshot`. The function loads the cluster's current state with a few
queries, diffs it in memory, and writes only the differences with bulk statements, plus one
ChangeLog row per changed object, all in the same transaction. Applying the same snapshot twice
changes nothing and writes no ChangeLog rows.

Rules that keep sources from fighting each other:
- A field a source does not know is None in its snapshot and is left alone.
- Components are merged (a Slurm feature reporting only the driver keeps the agent's CUDA)
  unless the snapshot says `replace_components` (files and agent heartbeats report the whole set).
- A node a campaign put in `patching` keeps that state; sources report, campaigns decide.
- With `complete=True` (the snapshot is the whole cluster) nodes not in it are marked gone.

Only nodes whose component versions changed are handed on (`node_versions_changed`, on commit).
"""

from __future__ import annotations

import datetime as dt
import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.db.backends.base.operations import BaseDatabaseOperations
from django.utils import timezone

from gpusweep.db.bulk import db_datetime, db_json, insert_rows
from gpusweep.db.reads import prepared_cursor, select_rows
from inventory import identity, owners, queries
from inventory.choices import ChangeAction, ChangeSource, CheckpointEngine, ServiceState, WorkloadKind, WorkloadPolicy
from inventory.models import ChangeLog, Cluster, Node, NodeComponent, Workload
from inventory.signals import node_moved, node_versions_changed
from inventory.versions import ParsedVersion, VersionError, normalize_component, normalize_fact, parse_version

BATCH = 2000

# The key in Node.facts of the versions a node's agent reported while a campaign patches it: the
# campaign takes them into the inventory (and credits the remediation) once the node's health gates
# pass; until then they are only "pending verification" (a failing gate reverts the node).
PENDING_VERIFICATION = "pending_verification"

# Node fields a snapshot may set; None in the snapshot means "not reported by this source".
NODE_FIELDS = (
    "pool",
    "labels",
    "gpu_model",
    "gpu_count",
    "product_line",
    "os_family",
    "cpu_milli",
    "memory_mib",
    "scheduler_state",
    "service_state",
    "agent_endpoint",
    "facts",
)
# Who set each owned fact, and the conflicts between sources (inventory.owners): written by apply_snapshot alone.
OWNER_FIELDS = ("fact_sources", "fact_conflicts")
# Node fields advisories match on: a change re-matches the node's exposures like a version change.
MATCHED_FIELDS = frozenset({"gpu_model", "product_line", "os_family", "facts"})
WORKLOAD_FIELDS = (
    "node_id",
    "name",
    "user",
    "state",
    "gpus",
    "started_at",
    "time_limit",
    "checkpoint_engine",
    "owner",
    "engine",
    "engine_version",
    "model_name",
    "model_version",
    "requires",
    "uid",
    "placement",
)


class InventoryError(ValueError):
    """Bad input from a source; the message names the row, document or node."""


@dataclass
class ObservedNode:
    name: str
    components: dict[str, str] = field(default_factory=dict)
    pool: str | None = None
    labels: dict[str, str] | None = None
    gpu_model: str | None = None
    gpu_count: int | None = None
    product_line: str | None = None
    os_family: str | None = None
    cpu_milli: int | None = None
    memory_mib: int | None = None
    scheduler_state: str | None = None
    service_state: str | None = None
    agent_endpoint: str | None = None
    # Facts (inventory.versions.KNOWN_FACTS) this source observed; merged into the node's, so a
    # source reporting one fact keeps the others.
    facts: dict[str, str] | None = None
    # Where this node came from, for error messages ("row 12", "sinfo node gpu03").
    origin: str = ""


@dataclass
class ObservedWorkload:
    kind: str
    scheduler_id: str
    node: str | None = None
    name: str = ""
    user: str = ""
    state: str = ""
    gpus: int = 0
    started_at: dt.datetime | None = None
    time_limit: dt.timedelta | None = None
    checkpoint_engine: str = CheckpointEngine.NONE
    engine: str = ""
    engine_version: str = ""
    model_name: str = ""
    model_version: str = ""
    requires: dict[str, str] = field(default_factory=dict)
    # How its volumes let it move, as its scheduler reads them (Workload.placement).
    placement: dict[str, Any] = field(default_factory=dict)
    # The controller that would start it again (Workload.owner), and the policy that controller's semantics
    # imply, given to a new row only: a policy set later by the workload's owner is never overwritten.
    owner: str = ""
    default_policy: str = ""
    # All nodes held (multi-node jobs); empty means just `node`.
    nodes: list[str] = field(default_factory=list)
    # The scheduler's unique id where scheduler_id is a name (a pod's UID); "" for others.
    uid: str = ""
    # The fields this observation speaks for on a row that exists (None: all of them). A gpusweep-run
    # registration joined to its scheduler's workload owns only its own (inventory.identity): it
    # creates the row when it reports first, and never revives one its scheduler ended.
    owns: frozenset[str] | None = None


@dataclass
class Snapshot:
    nodes: list[ObservedNode]
    # None: this source does not report workloads (leave them alone).
    workloads: list[ObservedWorkload] | None = None
    # The whole cluster: nodes (and workloads of `workload_kinds`) missing from it are gone.
    complete: bool = True
    replace_components: bool = False
    # Kinds of workload this source is authoritative for (vanished detection is limited to them).
    workload_kinds: frozenset[str] = frozenset(WorkloadKind.values())


class _Log(NamedTuple):
    """A ChangeLog row to insert (plain tuple: building model instances costs more than the insert)."""

    source: str
    action: str
    object_type: str
    object_id: int | None
    object_repr: str
    changes: dict[str, Any]
    user_id: int | None
    reference: str = ""


@dataclass
class SyncResult:
    added: int = 0
    changed: int = 0
    removed: int = 0
    unchanged: int = 0
    workloads_added: int = 0
    workloads_changed: int = 0
    workloads_removed: int = 0
    errors: list[str] = field(default_factory=list)
    versions_changed: set[int] = field(default_factory=set)
    changed_components: dict[str, list[str]] = field(default_factory=dict)
    # node name -> versions its agent reported while a campaign patches it, not yet taken (PENDING_VERIFICATION)
    held_versions: dict[str, dict[str, str]] = field(default_factory=dict)
    # Registrations whose scheduler's workload has ended here (inventory.identity): not stored; the
    # agent's next heartbeat is a full one, so they are joined once the scheduler reports the job again.
    unattached: list[str] = field(default_factory=list)
    # Seconds per phase, for bench/inventory.py and slow-sync investigations.
    timings: dict[str, float] = field(default_factory=dict)

    def lap(self, phase: str, started: float) -> float:
        now = time.perf_counter()
        self.timings[phase] = self.timings.get(phase, 0.0) + now - started
        return now

    @property
    def no_changes(self) -> bool:
        return not (
            self.added or self.changed or self.removed
            or self.workloads_added or self.workloads_changed or self.workloads_removed
        )

    def summary(self) -> str:
        return (
            f"nodes: {self.added} added, {self.changed} changed, {self.removed} removed, "
            f"{self.unchanged} unchanged; workloads: {self.workloads_added} added, "
            f"{self.workloads_changed} changed, {self.workloads_removed} removed; "
            f"{len(self.errors)} errors; {len(self.versions_changed)} nodes with changed versions"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "added": self.added,
            "changed": self.changed,
            "removed": self.removed,
            "unchanged": self.unchanged,
            "workloads_added": self.workloads_added,
            "workloads_changed": self.workloads_changed,
            "workloads_removed": self.workloads_removed,
            "errors": list(self.errors),
            "versions_changed": len(self.versions_changed),
        }


@functools.lru_cache(maxsize=65536)
def _parse(component: str, raw: str) -> tuple[str, ParsedVersion]:
    # Fleets repeat the same few versions; caching keeps 100,000-node syncs cheap.
    name = normalize_component(component)
    if any(ord(ch) < 32 for ch in raw):
        raise VersionError(f"version for {name} contains control characters")
    return name, parse_version(name, raw.strip())


def parse_component(component: str, raw: str, origin: str = "") -> tuple[str, ParsedVersion]:
    try:
        return _parse(component, raw)
    except VersionError as exc:
        where = f"{origin}: " if origin else ""
        raise InventoryError(f"{where}{exc}") from None


# What a node's columns hold, from the model: a value beyond it is the source's error (named with
# its line or node), not a database error. Integer ranges are the portable ones (PostgreSQL's), so
# a file that imports on one engine imports on every engine.
def _node_field(name: str) -> Any:
    return Node._meta.get_field(name)


NODE_TEXT_LIMITS = {name: int(_node_field(name).max_length) for name in (
    "name", "pool", "gpu_model", "product_line", "os_family", "scheduler_state", "agent_endpoint")}
NODE_INT_RANGES = {name: BaseDatabaseOperations.integer_field_ranges[_node_field(name).get_internal_type()]
                   for name in ("gpu_count", "cpu_milli", "memory_mib")}


def _check_node_fields(observed: ObservedNode, where: str) -> None:
    for name, limit in NODE_TEXT_LIMITS.items():
        value = getattr(observed, name)
        if value is not None and len(value) > limit:
            raise InventoryError(f"{where}: {name} is {len(value)} characters, longer than the {limit} allowed")
    for name, (low, high) in NODE_INT_RANGES.items():
        value = getattr(observed, name)
        if value is not None and not low <= value <= high:
            raise InventoryError(f"{where}: {name} {value} is outside {low}..{high}")
    if observed.labels is not None:
        check_labels(observed.labels, where)


MAX_LABEL_LENGTH = 317  # Kubernetes' longest label key: a 253-character prefix, "/", 63 characters


def check_labels(labels: Any, where: str = "labels") -> None:
    """A node's labels are an object of name: text, neither longer than MAX_LABEL_LENGTH."""
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise InventoryError(f"{where}: labels must map names to text")
    long = next((k for k, v in labels.items() if max(len(k), len(v)) > MAX_LABEL_LENGTH), None)
    if long is not None:
        raise InventoryError(f"{where}: label {long[:40]!r}: names and values are at most {MAX_LABEL_LENGTH} "
                             "characters")


def _validate(snapshot: Snapshot) -> dict[str, dict[str, ParsedVersion]]:
    """Check the whole snapshot before writing anything; return parsed components per node."""
    parsed: dict[str, dict[str, ParsedVersion]] = {}
    for observed in snapshot.nodes:
        where = observed.origin or f"node {observed.name!r}"
        if not observed.name or not observed.name.strip():
            raise InventoryError(f"{where}: node name is empty")
        _check_node_fields(observed, where)
        if observed.name in parsed:
            raise InventoryError(f"{where}: duplicate node {observed.name!r}")
        if observed.service_state is not None and observed.service_state not in ServiceState.values():
            raise InventoryError(f"{where}: unknown service state {observed.service_state!r}")
        if observed.gpu_count is not None and observed.gpu_count < 0:
            raise InventoryError(f"{where}: negative GPU count")
        if observed.facts is not None:
            try:
                observed.facts = dict(normalize_fact(k, v) for k, v in observed.facts.items())
            except VersionError as exc:
                raise InventoryError(f"{where}: {exc}") from None
        components: dict[str, ParsedVersion] = {}
        for component, raw in observed.components.items():
            name, version = parse_component(component, raw, where)
            components[name] = version
        parsed[observed.name] = components
    if snapshot.workloads is not None:
        seen: set[tuple[str, str]] = set()
        for workload in snapshot.workloads:
            key = (workload.kind, workload.scheduler_id)
            if workload.kind not in WorkloadKind.values():
                raise InventoryError(f"workload {workload.scheduler_id!r}: unknown kind {workload.kind!r}")
            if not workload.scheduler_id:
                raise InventoryError("workload with an empty scheduler id")
            if key in seen:
                raise InventoryError(f"workload {workload.scheduler_id!r}: reported twice")
            seen.add(key)
    return parsed


def _node_repr(cluster: Cluster, name: str) -> str:
    return f"{cluster.name}/{name}"[:300]


def _jsonable(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return value


def apply_snapshot(
    cluster: Cluster,
    snapshot: Snapshot,
    source: str,
    *,
    user_id: int | None = None,
    now: dt.datetime | None = None,
) -> SyncResult:
    """Make the inventory of `cluster` match `snapshot`; see the module docstring."""
    result = SyncResult()
    started = time.perf_counter()
    parsed = _validate(snapshot)
    started = result.lap("validate", started)
    now = now or timezone.now()
    with transaction.atomic():
        if snapshot.complete:
            # One full sync per cluster at a time (PostgreSQL row lock; SQLite serializes writers
            # anyway). Heartbeats (partial) do not take it: thousands of nodes send them at once.
            Cluster.objects.select_for_update().filter(pk=cluster.pk).first()
        logs: list[_Log] = []
        node_ids = _apply_nodes(cluster, snapshot, parsed, source, user_id, now, result, logs)
        started = time.perf_counter()
        if snapshot.workloads is not None:
            _apply_workloads(cluster, snapshot, node_ids, source, user_id, now, result, logs)
            started = result.lap("workloads", started)
        _write_logs(logs, now)
        started = result.lap("changelog", started)
        # last_seen has a resolution: rewriting every row of a 100,000-node table on each sync
        # would cost more than the sync itself, so rows already seen recently are left alone.
        stale = now - dt.timedelta(seconds=settings.GPUSWEEP_LAST_SEEN_RESOLUTION_S)
        if snapshot.complete:
            Node.objects.filter(cluster=cluster, last_seen__lt=stale).exclude(
                service_state=ServiceState.GONE
            ).update(last_seen=now)
        elif node_ids:
            # An agent's heartbeat is its node's own word: stamped in the same statement, so free.
            heard = source == ChangeSource.AGENT
            stamp = db_datetime(now)
            ids = list(node_ids.values())
            with connection.cursor() as cursor:
                for start in range(0, len(ids), BATCH):
                    batch = ids[start:start + BATCH]
                    cursor.execute(queries.touch_nodes(len(batch), heard), [stamp, *([stamp] if heard else []), *batch])
        started = result.lap("last_seen", started)
        if source != ChangeSource.AGENT and result.versions_changed:
            _forget_digests(sorted(result.versions_changed))
        if snapshot.complete:
            Cluster.objects.filter(pk=cluster.pk).update(last_synced_at=now, last_sync_error="")
        changed_ids = sorted(result.versions_changed)
        if changed_ids:
            transaction.on_commit(lambda: node_versions_changed.send(sender=Node, node_ids=changed_ids,
                                                                     reference=source))
    result.lap("commit", started)
    return result


def _forget_digests(node_ids: Sequence[int]) -> None:
    """Another source changed what these nodes' agents report: their next heartbeat is a full one
    (a short one would otherwise leave the other source's versions in place; inventory/agent.py)."""
    with connection.cursor() as cursor:
        for start in range(0, len(node_ids), BATCH):
            batch = node_ids[start:start + BATCH]
            cursor.execute(queries.forget_digests(len(batch)), batch)


def _apply_nodes(
    cluster: Cluster,
    snapshot: Snapshot,
    parsed: dict[str, dict[str, ParsedVersion]],
    source: str,
    user_id: int | None,
    now: dt.datetime,
    result: SyncResult,
    logs: list[_Log],
) -> dict[str, int]:
    """Create, update and retire nodes and their components; return name -> id of observed nodes."""
    started = time.perf_counter()
    columns = ("id", "name", "gone_at", *NODE_FIELDS, *OWNER_FIELDS)
    observed_names = {node.name for node in snapshot.nodes}
    # Plain statements (inventory/queries.py): compiling ORM queries costs a heartbeat more
    # than running them, and the ORM's per-row work would dominate a 600,000-row read.
    if snapshot.complete:
        rows = select_rows(Node, columns, queries.node_scope(None), [cluster.pk])
    else:  # a partial snapshot needs only its own nodes
        names = sorted(observed_names)
        rows = [row for i in range(0, len(names), BATCH) for row in select_rows(
            Node, columns, queries.node_scope(len(names[i:i + BATCH])), [cluster.pk, *names[i:i + BATCH]])]
    existing: dict[str, dict[str, Any]] = {row[1]: dict(zip(columns, row, strict=True)) for row in rows}
    started = result.lap("load_nodes", started)
    relevant_ids = [row["id"] for name, row in existing.items() if name in observed_names]
    current_components: dict[int, dict[str, tuple[int, str, str]]] = {}
    if relevant_ids:
        if snapshot.complete:
            sql, params = queries.COMPONENTS_OF_CLUSTER, [cluster.pk]
        else:
            sql, params = queries.components_of_nodes(len(relevant_ids)), relevant_ids
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            for comp_id, node_id, component, version, set_by in cursor.fetchall():
                current_components.setdefault(node_id, {})[component] = (comp_id, version, set_by)

    started = result.lap("load_components", started)
    to_create: list[ObservedNode] = []
    to_update: list[Node] = []
    update_fields: set[str] = set()
    facts_after: dict[str, Any] = {}  # name -> the facts written this time
    for observed in snapshot.nodes:
        row = existing.get(observed.name)
        values = {f: getattr(observed, f) for f in NODE_FIELDS if getattr(observed, f) is not None}
        if row is None:
            to_create.append(observed)
            continue
        held_before = (row["facts"] or {}).get(PENDING_VERIFICATION)
        if "facts" in values or (held_before and source == ChangeSource.AGENT):
            values["facts"] = {**(row["facts"] or {}), **values.get("facts", {})}
            if row["service_state"] != ServiceState.PATCHING and source == ChangeSource.AGENT:
                # The campaign gave the node back: its agent's word counts again.
                values["facts"].pop(PENDING_VERIFICATION, None)
            facts_after[observed.name] = values["facts"]
        # Measured facts beat declared ones; disagreements are kept as conflicts (inventory.owners).
        values = owners.weigh(row, values, source, now.isoformat(),
                              {c: v.raw for c, v in parsed[observed.name].items()},
                              {c: (v, by) for c, (_id, v, by) in current_components.get(row["id"], {}).items()})
        if row["service_state"] == ServiceState.PATCHING and "service_state" in values:
            values.pop("service_state")  # a campaign owns this node's state until it hands it back
        if row["service_state"] == ServiceState.GONE and "service_state" not in values:
            values["service_state"] = ServiceState.IN_SERVICE
        diff = {f: [row[f], v] for f, v in values.items() if row[f] != v}
        if row["gone_at"] is not None:
            diff["gone_at"] = [row["gone_at"].isoformat(), None]
        if diff:
            if MATCHED_FIELDS & diff.keys():
                result.versions_changed.add(row["id"])
            node = Node(id=row["id"], cluster=cluster, name=observed.name, updated_at=now)
            for f, (_before, after) in diff.items():
                setattr(node, f, after)
                update_fields.add(f)
            to_update.append(node)
            logs.append(_log(source, ChangeAction.UPDATE, "node", row["id"], _node_repr(cluster, observed.name),
                             {f: [_jsonable(b), _jsonable(a)] for f, (b, a) in diff.items()}, user_id))

    node_ids = {name: row["id"] for name, row in existing.items() if name in observed_names}
    # Nodes a campaign is patching: their agent's versions wait for the campaign's gates.
    held = {name: row for name, row in existing.items() if name in observed_names and source == ChangeSource.AGENT
            and row["service_state"] == ServiceState.PATCHING}
    if to_create:
        _insert_nodes(cluster, to_create, now, source)
        created = dict(Node.objects.filter(cluster=cluster, created_at=now).values_list("name", "id"))
        if len(created) < len(to_create):  # clock granularity: fall back to the names
            created = dict(Node.objects.filter(cluster=cluster).values_list("name", "id"))
        for observed in to_create:
            node_ids[observed.name] = created[observed.name]
            changes: dict[str, Any] = {
                f: [None, getattr(observed, f)] for f in NODE_FIELDS if getattr(observed, f) is not None
            }
            changes.update({f"component:{c}": [None, v.raw] for c, v in parsed[observed.name].items()})
            logs.append(_log(source, ChangeAction.CREATE, "node", created[observed.name],
                             _node_repr(cluster, observed.name), changes, user_id))
    if to_update:
        Node.objects.bulk_update(to_update, sorted(update_fields | {"updated_at"}), batch_size=BATCH)
    started = result.lap("nodes", started)
    _apply_components(cluster, snapshot, parsed, node_ids, current_components, source, user_id, now, result, logs,
                      held=set(held))
    _hold_versions(cluster, held, facts_after, user_id, result, logs)
    started = result.lap("components", started)
    created_ids = {node_ids[observed.name] for observed in to_create}
    result.added = len(to_create)
    result.changed = len({node.pk for node in to_update} | (result.versions_changed - created_ids))
    result.unchanged = len(snapshot.nodes) - result.added - result.changed

    if snapshot.complete:
        gone = [row for name, row in existing.items()
                if name not in observed_names and row["service_state"] != ServiceState.GONE]
        gone_ids = [row["id"] for row in gone]
        for start in range(0, len(gone_ids), BATCH):
            Node.objects.filter(pk__in=gone_ids[start:start + BATCH]).update(
                service_state=ServiceState.GONE, gone_at=now, updated_at=now
            )
        for row in gone:
            logs.append(_log(source, ChangeAction.DELETE, "node", row["id"], _node_repr(cluster, row["name"]),
                             {"service_state": [row["service_state"], ServiceState.GONE]}, user_id))
        result.removed = len(gone)
    result.lap("vanished", started)
    return node_ids


def _apply_components(
    cluster: Cluster,
    snapshot: Snapshot,
    parsed: dict[str, dict[str, ParsedVersion]],
    node_ids: dict[str, int],
    current: dict[int, dict[str, tuple[int, str, str]]],
    source: str,
    user_id: int | None,
    now: dt.datetime,
    result: SyncResult,
    logs: list[_Log],
    held: set[str] | frozenset[str] = frozenset(),
) -> None:
    creates: list[tuple[int, str, ParsedVersion]] = []
    updates: list[tuple[Any, ...]] = []
    deletes: list[int] = []
    stamp = db_datetime(now)
    for name, components in parsed.items():
        node_id = node_ids[name]
        have = current.get(node_id, {})
        if name in held:
            pending = {c: v.raw for c, v in components.items() if c not in have or have[c][1] != v.raw}
            result.held_versions[name] = pending
            continue
        diff: dict[str, list[str | None]] = {}
        for component, version in components.items():
            before = have.get(component)
            if before is None:
                creates.append((node_id, component, version))
                diff[component] = [None, version.raw]
            elif before[1] != version.raw and source not in owners.OUTRANKED_BY.get(before[2], ()):
                updates.append((version.raw, version.key, version.branch, source, stamp, before[0]))
                diff[component] = [before[1], version.raw]
        if snapshot.replace_components:
            for component, (comp_id, version_raw, set_by) in have.items():
                # Its own silence erases what it reported before, never what another source knows.
                if component not in components and set_by in (source, ""):
                    deletes.append(comp_id)
                    diff[component] = [version_raw, None]
        if diff:
            result.versions_changed.add(node_id)
            result.changed_components[name] = sorted(diff)
            if have:  # a new node's components are in its create entry already
                logs.append(_log(source, ChangeAction.UPDATE, "node", node_id, _node_repr(cluster, name),
                                 {f"component:{c}": v for c, v in diff.items()}, user_id))
    insert_rows(NodeComponent, _COMPONENT_INSERT,
                ((node_id, c, v.raw, v.key, v.branch, source, stamp) for node_id, c, v in creates))
    if updates:  # one plain statement, executed per row (pipelined by psycopg): no CASE to compile
        with connection.cursor() as cursor:
            cursor.executemany(queries.UPDATE_COMPONENT, updates)
    for start in range(0, len(deletes), BATCH):
        NodeComponent.objects.filter(pk__in=deletes[start:start + BATCH]).delete()


def _hold_versions(cluster: Cluster, held: dict[str, dict[str, Any]], facts_after: dict[str, Any],
                   user_id: int | None, result: SyncResult, logs: list[_Log]) -> None:
    """Keep what the agents of nodes under a campaign's patch reported as pending verification in the
    node's facts (one change-log row when it changes), and drop it from nodes no longer held."""
    for name, row in held.items():
        pending = result.held_versions.get(name) or {}
        facts = dict(facts_after.get(name, row["facts"]) or {})
        before = facts.get(PENDING_VERIFICATION) or {}
        if before.get("versions") == pending:
            continue
        if pending:
            facts[PENDING_VERIFICATION] = {"versions": pending, "reported_at": timezone.now().isoformat()}
        else:
            facts.pop(PENDING_VERIFICATION, None)
        Node.objects.filter(pk=row["id"]).update(facts=facts)
        logs.append(_log(ChangeSource.AGENT, ChangeAction.UPDATE, "node", row["id"], _node_repr(cluster, name),
                         {f"{PENDING_VERIFICATION}:{c}": [before.get("versions", {}).get(c), v]
                          for c, v in pending.items()} or {PENDING_VERIFICATION: [before.get("versions"), None]},
                         user_id))


def _apply_workloads(
    cluster: Cluster,
    snapshot: Snapshot,
    node_ids: dict[str, int],
    source: str,
    user_id: int | None,
    now: dt.datetime,
    result: SyncResult,
    logs: list[_Log],
) -> None:
    assert snapshot.workloads is not None
    missing_nodes = {n for w in snapshot.workloads for n in [w.node, *w.nodes] if n and n not in node_ids}
    if missing_nodes:
        node_ids = {**node_ids, **dict(
            Node.objects.filter(cluster=cluster, name__in=missing_nodes).values_list("name", "id"))}
    kinds = sorted(snapshot.workload_kinds | {w.kind for w in snapshot.workloads})
    columns = ("id", "kind", "scheduler_id", "gone_at", *WORKLOAD_FIELDS)
    b_params = [cluster.pk, *kinds]

    def load(where: str, params: list[Any]) -> list[dict[str, Any]]:
        return [dict(zip(columns, row, strict=True)) for row in select_rows(Workload, columns, where, params)]

    # Active workloads (in scope), then any finished ones the snapshot reports again; finished
    # history is never loaded wholesale (a cluster ends millions of jobs).
    scope = [] if snapshot.complete else list(node_ids.values())
    active = queries.workload_scope(len(kinds), active=True, nodes=len(scope))
    rows = load(active, [*b_params, *scope]) if snapshot.complete or scope else []  # no node: no workload of one
    existing = {(found["kind"], found["scheduler_id"]): found for found in rows}
    returning = sorted({w.scheduler_id for w in snapshot.workloads if (w.kind, w.scheduler_id) not in existing})
    for start in range(0, len(returning), BATCH):
        batch = returning[start:start + BATCH]
        for found in load(queries.workload_scope(len(kinds), scheduler_ids=len(batch)), [*b_params, *batch]):
            existing.setdefault((found["kind"], found["scheduler_id"]), found)
    creates: list[Workload] = []
    updates: list[Workload] = []
    fields: set[str] = set()
    observed_keys: set[tuple[str, str]] = set()
    placed: list[ObservedWorkload] = []  # those whose nodes this source sets
    for observed in snapshot.workloads:
        key = (observed.kind, observed.scheduler_id)
        row = existing.get(key)
        if observed.owns is not None and row is not None and row["gone_at"] is not None:
            result.unattached.append(observed.scheduler_id)  # its scheduler ended it: not ours to revive
            continue
        observed_keys.add(key)
        values: dict[str, Any] = {f: getattr(observed, f) for f in WORKLOAD_FIELDS if f != "node_id"}
        values["node_id"] = node_ids.get(observed.node) if observed.node else None
        if row is None:
            creates.append(Workload(cluster=cluster, kind=observed.kind, scheduler_id=observed.scheduler_id,
                                    last_seen=now, policy=observed.default_policy or WorkloadPolicy.CHECKPOINT,
                                    **values))
            placed.append(observed)
            continue
        values = _owned_values(values, observed, source)
        if "node_id" in values:
            placed.append(observed)
        diff = {f: [row[f], v] for f, v in values.items() if row[f] != v}
        if row["gone_at"] is not None:
            diff["gone_at"] = [row["gone_at"], None]
        if diff:
            workload = Workload(id=row["id"], cluster=cluster, kind=observed.kind, scheduler_id=observed.scheduler_id)
            for f, (_b, after) in diff.items():
                setattr(workload, f, after)
                fields.add(f)
            updates.append(workload)
            logs.append(_log(source, ChangeAction.UPDATE, "workload", row["id"],
                             f"{cluster.name}/{observed.kind}:{observed.scheduler_id}",
                             {f: [_jsonable(b), _jsonable(a)] for f, (b, a) in diff.items()}, user_id))
    if creates:
        Workload.objects.bulk_create(creates, batch_size=BATCH)
        for workload in creates:
            logs.append(_log(source, ChangeAction.CREATE, "workload", workload.pk,
                             f"{cluster.name}/{workload.kind}:{workload.scheduler_id}",
                             {"node_id": [None, workload.node_id], "gpus": [None, workload.gpus]}, user_id))
    if updates:
        Workload.objects.bulk_update(updates, sorted(fields), batch_size=BATCH)
    # Vanished: only the kinds this source is authoritative for, and only on the nodes it
    # reported when it is not the whole cluster (an agent speaks for its own node only).
    scope_node_ids = None if snapshot.complete else set(node_ids.values())
    gone = [
        row for key, row in existing.items()
        if key not in observed_keys and row["gone_at"] is None and key[0] in snapshot.workload_kinds
        and (scope_node_ids is None or row["node_id"] in scope_node_ids)
    ]
    gone_ids = [row["id"] for row in gone]
    for start in range(0, len(gone_ids), BATCH):
        Workload.objects.filter(pk__in=gone_ids[start:start + BATCH]).update(gone_at=now)
    for row in gone:
        logs.append(_log(source, ChangeAction.DELETE, "workload", row["id"],
                         f"{cluster.name}/{row['kind']}:{row['scheduler_id']}", {"gone_at": [None, now.isoformat()]},
                         user_id))
    seen_ids = [existing[key]["id"] for key in observed_keys if key in existing]
    for start in range(0, len(seen_ids), BATCH):
        Workload.objects.filter(pk__in=seen_ids[start:start + BATCH]).update(last_seen=now)
    ids = {key: row["id"] for key, row in existing.items()}
    ids.update({(w.kind, w.scheduler_id): w.pk for w in creates})
    moved = _apply_workload_nodes(placed, ids, node_ids)
    result.workloads_added = len(creates)
    result.workloads_changed = len({w.pk for w in updates} | (moved - {w.pk for w in creates}))
    result.workloads_removed = len(gone)


def _owned_values(values: dict[str, Any], observed: ObservedWorkload, source: str) -> dict[str, Any]:
    """What `observed` may change on its existing row: the fields it owns (inventory.identity), and of the
    registration's fields never a scheduler's empty value over a known one."""
    if observed.owns is not None:
        values = {f: v for f, v in values.items() if f in observed.owns}
    if source != ChangeSource.AGENT:
        values = {f: v for f, v in values.items() if f not in identity.AGENT_FIELDS or v not in identity.EMPTY_VALUES}
    return values


def _apply_workload_nodes(
    observed: list[ObservedWorkload], ids: dict[tuple[str, str], int], node_ids: dict[str, int]
) -> set[int]:
    """Keep Workload.nodes equal to the nodes each workload holds; return ids whose set changed."""
    through = Workload.nodes.through
    wanted: dict[int, set[int]] = {}
    for workload in observed:
        names = workload.nodes or ([workload.node] if workload.node else [])
        wanted[ids[(workload.kind, workload.scheduler_id)]] = {node_ids[n] for n in names if n in node_ids}
    have: dict[int, dict[int, int]] = {}
    workload_ids = sorted(wanted)
    for start in range(0, len(workload_ids), BATCH):
        for link_id, workload_id, node_id in through.objects.filter(
            workload_id__in=workload_ids[start:start + BATCH]
        ).values_list("id", "workload_id", "node_id"):
            have.setdefault(workload_id, {})[node_id] = link_id
    add: list[Any] = []
    drop: list[int] = []
    changed: set[int] = set()
    for workload_id, node_set in wanted.items():
        current = have.get(workload_id, {})
        if set(current) != node_set:
            changed.add(workload_id)
            add.extend(through(workload_id=workload_id, node_id=n) for n in node_set - set(current))
            drop.extend(link for n, link in current.items() if n not in node_set)
    through.objects.bulk_create(add, batch_size=BATCH)
    for start in range(0, len(drop), BATCH):
        through.objects.filter(pk__in=drop[start:start + BATCH]).delete()
    return changed


# The fields these inserts give (insert_rows fills every other one with its default).
_COMPONENT_INSERT = ("node_id", "component", "version", "version_key", "branch", "source", "updated_at")
_NODE_INSERT = ("cluster_id", "name", *NODE_FIELDS, "fact_sources", "last_seen", "created_at", "updated_at")


def _insert_nodes(cluster: Cluster, nodes: list[ObservedNode], now: dt.datetime, source: str) -> None:
    defaults = {f: Node._meta.get_field(f).get_default() for f in NODE_FIELDS}  # type: ignore[union-attr]
    stamp = db_datetime(now)

    def row(observed: ObservedNode) -> tuple[Any, ...]:
        values = []
        for f in NODE_FIELDS:
            value = getattr(observed, f)
            value = defaults[f] if value is None else value
            values.append(db_json(value) if f in ("labels", "facts") else value)
        facts = {f: getattr(observed, f) for f in owners.OWNED_FACTS}
        return (cluster.pk, observed.name, *values, db_json(owners.first_owners(facts, source)), stamp, stamp, stamp)

    insert_rows(Node, _NODE_INSERT, (row(observed) for observed in nodes))


def _write_logs(logs: list[_Log], now: dt.datetime) -> None:
    stamp = db_datetime(now)
    insert_rows(
        ChangeLog,
        ("time", "source", "action", "object_type", "object_id", "object_repr", "changes", "user", "reference"),
        ((stamp, log.source, log.action, log.object_type, log.object_id, log.object_repr,
          db_json(log.changes), log.user_id, log.reference[:200]) for log in logs),
    )


def _log(
    source: str, action: str, object_type: str, object_id: int | None, object_repr: str, changes: dict[str, Any],
    user_id: int | None,
) -> _Log:
    return _Log(source, action, object_type, object_id, object_repr, changes, user_id)


# -- writes on behalf of a campaign ------------------------------------------------------
# The campaign engine changes inventory rows only through these, so every change has its
# ChangeLog row (source "campaign", with the campaign and sweep as reference) and a version
# change reaches the exposures through node_versions_changed like any other source's.

# These run on every step of every node: plain statements (inventory/queries.py) through the
# prepared cursor, since compiling them through the ORM cost the engine more CPU than running them.


def set_service_state(node_ids: Sequence[int], state: str, source: str, reference: str = "",
                      user_id: int | None = None) -> int:
    """Set service_state of nodes not already in it; one ChangeLog row each, in one transaction."""
    if state not in ServiceState.values():
        raise InventoryError(f"unknown service state {state!r}")
    ids = list(node_ids)
    logs: list[_Log] = []
    with transaction.atomic(savepoint=False):  # part of the caller's transaction when there is one
        now = timezone.now()
        with prepared_cursor() as cursor:
            for start in range(0, len(ids), BATCH):
                batch = ids[start:start + BATCH]
                cursor.execute(queries.service_states(len(batch)), [*batch, state])
                rows = cursor.fetchall()
                if not rows:
                    continue
                changed = [row[0] for row in rows]
                cursor.execute(queries.set_service_state(len(changed)), [state, db_datetime(now), *changed])
                logs += [_Log(source, ChangeAction.UPDATE, "node", node_id, f"{cluster}/{name}"[:300],
                              {"service_state": [before, state]}, user_id, reference)
                         for node_id, name, cluster, before in rows]
        if logs:
            _write_logs(logs, now)
    return len(logs)


def record_versions(node_id: int, versions: dict[str, str], source: str, reference: str = "",
                    user_id: int | None = None) -> list[str]:
    """Record component versions seen on a node (merged with the others); return the changed names.

    The exposures of the node follow on commit (node_versions_changed, with `reference` as the
    remediation evidence).
    """
    parsed = {}
    for component, raw in versions.items():
        name, version = parse_component(component, str(raw), f"node {node_id}")
        parsed[name] = version
    names = sorted(parsed)
    with transaction.atomic(savepoint=False):  # part of the caller's transaction when there is one
        # The node and its current rows of these components, in one read.
        with prepared_cursor() as cursor:
            cursor.execute(queries.node_components(len(names)), [*names, node_id])
            rows = cursor.fetchall()
        if not rows:
            raise Node.DoesNotExist(f"node {node_id} does not exist")
        have = {component: (comp_id, version) for _n, _c, comp_id, component, version in rows if comp_id is not None}
        now = timezone.now()
        stamp = db_datetime(now)
        diff: dict[str, list[str | None]] = {}
        creates: list[tuple[Any, ...]] = []
        updates: list[tuple[Any, ...]] = []
        for name, version in parsed.items():
            row = have.get(name)
            if row is None:
                creates.append((node_id, name, version.raw, version.key, version.branch, source, stamp))
                diff[f"component:{name}"] = [None, version.raw]
            elif row[1] != version.raw:
                updates.append((version.raw, version.key, version.branch, source, stamp, row[0]))
                diff[f"component:{name}"] = [row[1], version.raw]
        if diff:
            insert_rows(NodeComponent, _COMPONENT_INSERT, creates)
            with prepared_cursor() as cursor:
                cursor.executemany(queries.UPDATE_COMPONENT, updates)
            _write_logs([_Log(source, ChangeAction.UPDATE, "node", node_id, f"{rows[0][1]}/{rows[0][0]}"[:300],
                              diff, user_id, reference)], now)
            _forget_digests([node_id])
            transaction.on_commit(lambda: node_versions_changed.send(sender=Node, node_ids=[node_id],
                                                                     reference=reference or source))
        _clear_pending(node_id, parsed)
    return sorted(key.split(":", 1)[1] for key in diff)


def _clear_pending(node_id: int, recorded: dict[str, ParsedVersion]) -> None:
    """The campaign recorded these versions: what the agent reported of them is no longer pending."""
    # Plain SQL: every campaign step that records versions reads this.
    facts = next(iter(select_rows(Node, ("facts",), queries.NODE_BY_ID, [node_id], prepared=True)), (None,))[0] or {}
    pending = dict((facts.get(PENDING_VERIFICATION) or {}).get("versions") or {})
    if not pending:
        return
    left = {c: v for c, v in pending.items() if c not in recorded}
    facts = {**facts, PENDING_VERIFICATION: {**facts[PENDING_VERIFICATION], "versions": left}} if left else {
        k: v for k, v in facts.items() if k != PENDING_VERIFICATION}
    Node.objects.filter(pk=node_id).update(facts=facts)


def move_workload(workload_id: int, node_id: int, scheduler_id: str, source: str, reference: str = "",
                  user_id: int | None = None) -> bool:
    """Record that a workload now runs on `node_id` as `scheduler_id` (an executor's id: a job's
    ``slurm-<jobid>`` is the job's row, inventory.identity); False when it already did."""
    scheduler_id = identity.inventory_id(scheduler_id)
    with transaction.atomic(savepoint=False):  # part of the caller's transaction when there is one
        # The workload, and any row its target's own source already made for it, in one read.
        with prepared_cursor() as cursor:
            cursor.execute(queries.WORKLOAD_AND_TWIN, [workload_id, scheduler_id, workload_id])
            rows = cursor.fetchall()
            row = next((r for r in rows if r[0] == workload_id), None)
            if row is None or (row[1] == node_id and row[3] == scheduler_id):
                return False
            _id, before_node, kind, before_ref, cluster = row
            now = timezone.now()
            stamp = db_datetime(now)
            changes: dict[str, Any] = {"node_id": [before_node, node_id], "scheduler_id": [before_ref, scheduler_id]}
            twin = next((r for r in rows if r[0] != workload_id and r[2] == kind), None)
            if twin is not None:
                # The target's own source (an agent heartbeat) reported the restored workload first:
                # that row is the workload from now on, and this one ends here.
                cursor.execute(queries.WORKLOAD_GONE, [stamp, workload_id])
                cursor.execute(queries.WORKLOAD_BACK, [node_id, stamp, twin[0]])
                changes["superseded_by"] = [None, twin[0]]
                moved_id = twin[0]
            else:
                cursor.execute(queries.WORKLOAD_MOVED, [node_id, scheduler_id, stamp, workload_id])
                moved_id = workload_id
            cursor.execute(queries.UNLINK_WORKLOAD, [moved_id])
        insert_rows(Workload.nodes.through, ("workload", "node"), [(moved_id, node_id)])
        _write_logs([_Log(source, ChangeAction.UPDATE, "workload", workload_id,
                          f"{cluster}/{kind}:{before_ref}"[:300], changes, user_id, reference)], now)
    return True


def move_node(node_id: int, cluster_id: int, user_id: int | None = None) -> Node:
    """Move a node to another cluster (an admin's correction: every source names a node within its
    own cluster). What other apps keep of the node's cluster (its exposures' copy) follows in this
    transaction (node_moved); a node of that name in the target is an InventoryError, nothing moved."""
    with transaction.atomic():
        node = Node.objects.select_for_update().select_related("cluster").get(pk=node_id)
        target = Cluster.objects.filter(pk=cluster_id).first()
        if target is None:
            raise InventoryError(f"no cluster with id {cluster_id}")
        if node.cluster_id == target.pk:
            return node
        if Node.objects.filter(cluster=target, name=node.name).exists():
            raise InventoryError(f"{target.name} has a node named {node.name} already")
        before = node.cluster.name
        node.cluster = target
        node.save(update_fields=["cluster", "updated_at"])
        ChangeLog.objects.create(source=ChangeSource.ADMIN, action=ChangeAction.UPDATE, object_type="node",
                                 object_id=node.pk, object_repr=f"{target.name}/{node.name}",
                                 changes={"cluster": [before, target.name]}, user_id=user_id)
        node_moved.send(sender=Node, node_ids=[node.pk], cluster_id=target.pk)
    return node
