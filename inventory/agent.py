"""The service side of agent heartbeats (docs/agent-wire-format.md).

POST /api/v1/inventory/agent/heartbeat, signed with the node's key
(agent/src/gpusweep_agent/auth.py). Keys are derived from GPUSWEEP_AGENT_FLEET_SECRET on
demand, so nothing secret is stored. The first heartbeat registers the node in its (existing)
cluster. A heartbeat is a partial snapshot: it speaks for its own node and that node's
process workloads only, and replaces the node's component list with what the agent saw.

Replays: a heartbeat's nonce is a counter its agent raises with every heartbeat. The node row
keeps the newest accepted (``Node.heartbeat_counter``, so every web process sees it), and a
heartbeat whose counter is not larger is refused with 409 and changes nothing: a captured
heartbeat sent again, or an older one (which would roll the node's versions back).

Short heartbeats (agents since digests): while a node's content is unchanged its agent sends only
the digest the service answered for its last full heartbeat. One indexed read finds the node, its
digest and counter; the counter and the time it was heard go through inventory/heartbeats.py
(Redis, flushed to the database in batches). A digest the node does not hold is answered
``409 {"send": "full"}`` and changes nothing; the agent then sends everything.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from gpusweep_agent.auth import HEADER_NONCE, AuthError, Signed, derive_node_key, verify
from gpusweep_agent.heartbeat import content_digest

from gpusweep.errors import error_body, error_response
from gpusweep.parsers import JSONInputError, load_json
from inventory import heartbeats, identity, packages, queries
from inventory.choices import ChangeSource, CheckpointEngine, WorkloadKind, bare_process_ref
from inventory.models import Cluster, Node
from inventory.services import (
    InventoryError,
    ObservedNode,
    ObservedWorkload,
    Snapshot,
    SyncResult,
    apply_snapshot,
)
from inventory.versions import KNOWN_FACTS

SCHEMA = "gpusweep.heartbeat/1"
# Workload kinds an agent reports: its own `process` registry and bare GPU processes are stored
# (as process workloads; a registration inside a Slurm job as that job's row, inventory.identity);
# Slurm steps/jobs and pods are skipped, their scheduler sync owns them.
AGENT_KINDS = frozenset({"process", "gpu_process"})
SCHEDULER_KINDS = frozenset({"slurm_step", "slurm_job", "k8s_pod"})
MAX_BODY = 1024 * 1024
MAX_COUNTER = 2**63 - 1  # Node.heartbeat_counter is a 64-bit column
DIGEST_CHARS = frozenset("0123456789abcdef")


def node_key(cluster: str, node: str) -> str:
    """The key a node signs with (`manage.py agent_key` prints it for provisioning)."""
    return derive_node_key(settings.GPUSWEEP_AGENT_FLEET_SECRET, cluster, node)


class PayloadError(ValueError):
    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__(str(errors))
        self.errors = errors


def _text(data: dict[str, Any], key: str, errors: dict[str, str], where: str, limit: int = 200) -> str:
    value = data.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        errors[f"{where}{key}"] = "must be a string"
        return ""
    if len(value) > limit:
        errors[f"{where}{key}"] = f"longer than {limit} characters"
    return value[:limit]


def _when(value: Any, errors: dict[str, str], field: str) -> dt.datetime | None:
    if value in (None, ""):
        return None
    try:
        parsed = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        errors[field] = "not an ISO 8601 time"
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def parse_heartbeat(payload: Any, cluster_name: str, node_name: str) -> tuple[ObservedNode, list[ObservedWorkload]]:
    """Validate the whole payload (every error at once) into a node and its workloads."""
    errors: dict[str, str] = {}
    if not isinstance(payload, dict):
        raise PayloadError({"body": "expected a JSON object"})
    if payload.get("schema") != SCHEMA:
        errors["schema"] = f"expected {SCHEMA!r}"
    if payload.get("cluster") != cluster_name or payload.get("node") != node_name:
        errors["node"] = "cluster/node in the body differ from the signed identity"
    facts = payload.get("facts")
    if not isinstance(facts, dict):
        raise PayloadError({**errors, "facts": "expected an object"})
    gpu_count = facts.get("gpu_count", 0)
    if not isinstance(gpu_count, int) or isinstance(gpu_count, bool) or gpu_count < 0:
        errors["facts.gpu_count"] = "must be a whole number >= 0"
        gpu_count = 0
    components = facts.get("components", {})
    if not isinstance(components, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in components.items()
    ):
        errors["facts.components"] = "expected an object of component: version strings"
        components = {}
    # Node facts: a "facts" object, or the known facts at the top level of the agent's facts.
    node_facts = facts.get("facts", {})
    if not isinstance(node_facts, dict) or not all(isinstance(v, str) for v in node_facts.values()):
        errors["facts.facts"] = "expected an object of fact: value strings"
        node_facts = {}
    node_facts = {**{k: facts[k] for k in KNOWN_FACTS if isinstance(facts.get(k), str)}, **node_facts}
    node = ObservedNode(
        name=node_name,
        components={k: v for k, v in components.items() if v.strip()},
        facts={k: v for k, v in node_facts.items() if v.strip()} or None,
        gpu_model=_text(facts, "gpu_model", errors, "facts.", 100),
        gpu_count=gpu_count,
        product_line=_text(facts, "product_line", errors, "facts.", 40) or "tesla",
        os_family=_text(facts, "os_family", errors, "facts.", 20) or "linux",
        agent_endpoint=_text(payload, "endpoint", errors, "", 200),
        origin=f"heartbeat from {cluster_name}/{node_name}",
    )
    items = payload.get("workloads", [])
    if not isinstance(items, list):
        errors["workloads"] = "expected a list"
        items = []
    workloads: list[ObservedWorkload] = []
    joined: set[str] = set()
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            errors[f"workloads[{index}]"] = "expected an object"
        elif (workload := _workload(item, node_name, errors, f"workloads[{index}].")) is not None:
            if workload.owns is not None:
                if workload.scheduler_id in joined:
                    continue  # a second wrapper in the same job: the job's row takes the first one's facts
                joined.add(workload.scheduler_id)
            workloads.append(workload)
    if errors:
        raise PayloadError(errors)
    return node, workloads


def _workload(item: dict[str, Any], node_name: str, errors: dict[str, str], where: str) -> ObservedWorkload | None:
    """One of the heartbeat's workloads as the inventory stores it; None for a scheduler's own entry."""
    kind = item.get("kind", WorkloadKind.PROCESS)
    if kind in SCHEDULER_KINDS:
        return None  # the Slurm and Kubernetes syncs own jobs and pods
    if kind not in AGENT_KINDS:
        errors[f"{where}kind"] = f"one of {sorted(AGENT_KINDS | SCHEDULER_KINDS)}"
    engine = item.get("checkpoint_engine", CheckpointEngine.NONE) or CheckpointEngine.NONE
    if engine not in CheckpointEngine.values():
        errors[f"{where}checkpoint_engine"] = f"one of {CheckpointEngine.values()}"
    gpus = item.get("gpus", 0)
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0:
        errors[f"{where}gpus"] = "must be a whole number >= 0"
        gpus = 0
    scheduler_id = _text(item, "scheduler_id", errors, where)
    if not scheduler_id:
        errors[f"{where}scheduler_id"] = "required"
    workload_kind, owns = WorkloadKind.PROCESS, None
    if kind == "gpu_process":
        # A bare GPU process is known by its pid, unique only on its node.
        scheduler_id = bare_process_ref(node_name, scheduler_id)
    elif (joined := identity.registered_in(item.get("owner"), scheduler_id)) is not None:
        # A registration inside a scheduler's job or pod: that row, with the registration's own fields.
        (workload_kind, scheduler_id), owns = joined, identity.AGENT_FIELDS
    return ObservedWorkload(
        kind=workload_kind, scheduler_id=scheduler_id, node=node_name, owns=owns,
        uid=scheduler_id if workload_kind == WorkloadKind.K8S_POD else "",
        name=_text(item, "name", errors, where),
        gpus=gpus, started_at=_when(item.get("started_at"), errors, f"{where}started_at"),
        checkpoint_engine=str(engine), state="running",
        engine=_text(item, "engine", errors, where, 100),
        engine_version=_text(item, "engine_version", errors, where, 100),
        model_name=_text(item, "model_name", errors, where, 200),
        model_version=_text(item, "model_version", errors, where, 100),
        requires=_requires(item.get("requires"), errors, f"{where}requires"),
    )


def _requires(value: Any, errors: dict[str, str], where: str) -> dict[str, str]:
    """What a workload declares its checkpoint needs of a target: a small {fact: value} object."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 20 or not all(
            isinstance(k, str) and isinstance(v, str) and 0 < len(k) <= 63 and len(v) <= 128
            for k, v in value.items()):
        errors[where] = "an object of at most 20 {fact: value} strings"
        return {}
    return dict(value)


def _unauthorized(detail: str) -> JsonResponse:
    return error_response(401, detail)


def _errors(detail: str, errors: dict[str, str]) -> JsonResponse:
    return error_response(400, detail, {field: [message] for field, message in errors.items()})


def heartbeat_counter(signed: Signed) -> int:
    """The heartbeat's place in its node's order: its nonce, a counter the agent raises with every
    heartbeat; an agent older than nonces is ordered by its timestamp (in the same unit)."""
    if not signed.nonce:
        return signed.timestamp * 1_000_000
    if not signed.nonce.isdigit() or len(signed.nonce) > 19 or int(signed.nonce) > MAX_COUNTER:
        raise AuthError(f"a heartbeat's {HEADER_NONCE} is a counter: a whole number up to {MAX_COUNTER}")
    return int(signed.nonce)


StaleHeartbeat = heartbeats.Stale


def _stale(newest: int) -> JsonResponse:
    detail = (f"replayed or out-of-order heartbeat: its {HEADER_NONCE} must be larger than {newest}, "
              "the newest accepted for this node")
    # The agent jumps its counter past it (a clock set back would otherwise lock it out).
    return JsonResponse({**error_body(detail), "newest_counter": newest}, status=409)


def _cluster(name: str) -> Cluster | None:
    """The cluster by name, with only id and name loaded (the rest deferred): one plain statement."""
    with connection.cursor() as cursor:
        cursor.execute(queries.CLUSTER_BY_NAME, [name])
        row = cursor.fetchone()
    return None if row is None else Cluster.from_db(connection.alias, ["id", "name"], row)


def _apply(cluster: Cluster, node: ObservedNode, workloads: list[ObservedWorkload], counter: int,
           digest: str, os_report: packages.OsReport | None = None) -> tuple[SyncResult, int | None]:
    """Apply the heartbeat and take its counter, in one transaction: a heartbeat whose counter is
    not above the node's newest changes nothing (the row lock orders two arriving together). Its os
    report is compared with what the locked row holds (an unchanged one costs no statement)."""
    with transaction.atomic(), connection.cursor() as cursor:
        # Plain statements here and in apply_snapshot: compiling ORM queries cost a changed
        # heartbeat more CPU than running them.
        cursor.execute(queries.LOCK_NODE, [cluster.pk, node.name])
        row = cursor.fetchone()
        if row is not None:
            node_id, newest = row[:2]
            if counter <= newest:
                raise StaleHeartbeat(newest)
            heartbeats.take_full(node_id, counter, newest)  # newer than any short one accepted
        workloads, waiting = identity.resolve_pods(cluster.pk, workloads)
        snapshot = Snapshot(
            nodes=[node], workloads=workloads, complete=False, replace_components=True,
            # Only its own process rows end with the heartbeat; a job's row ends with its scheduler's sync.
            workload_kinds=frozenset({WorkloadKind.PROCESS}),
        )
        result = apply_snapshot(cluster, snapshot, ChangeSource.AGENT)
        # Versions held for a campaign's gates: no digest, so the next heartbeat is a full one (a
        # short one would leave them held after the campaign gives the node back).
        # Nor while a registration waits for its job's row (inventory.identity): the next full one joins it.
        taken = "" if result.held_versions.get(node.name) or result.unattached or waiting else digest
        cursor.execute(queries.TAKE_COUNTER, [counter, taken, cluster.pk, node.name, counter])
        if not cursor.rowcount:  # a concurrent first heartbeat of a new node took a larger counter
            raise StaleHeartbeat(Node.objects.values_list("heartbeat_counter", flat=True).get(
                cluster=cluster, name=node.name))
        if os_report is not None:
            found = row[0] if row is not None else cluster.nodes.values_list("id", flat=True).get(name=node.name)
            packages.apply_os_report(found, os_report, reference="agent",
                                     current=packages.OsState.of(*row[2:5]) if row is not None else None)
        return result, row[0] if row is not None else None


@csrf_exempt
@require_POST
def heartbeat(request: HttpRequest) -> JsonResponse:
    if not settings.GPUSWEEP_AGENT_FLEET_SECRET:
        return _unauthorized("agent heartbeats are disabled: GPUSWEEP_AGENT_FLEET_SECRET is not set")
    body = request.body
    if len(body) > MAX_BODY:
        return error_response(413, f"Request body too large: {len(body)} bytes, a heartbeat's limit is {MAX_BODY}")
    identity = request.headers.get("X-Gpusweep-Node", "")
    cluster_name, _, node_name = identity.partition("/")
    if not cluster_name or not node_name:
        return _unauthorized("missing or malformed X-Gpusweep-Node (expected cluster/node)")
    try:
        signed = verify(node_key(cluster_name, node_name), dict(request.headers), "POST", request.get_full_path(),
                        body, legacy=True)
        counter = heartbeat_counter(signed)
    except AuthError as exc:
        return _unauthorized(str(exc))
    try:
        payload = load_json(body)
    except JSONInputError as exc:
        return _errors("the heartbeat is not accepted JSON", {"body": str(exc)})
    if isinstance(payload, dict) and "facts" not in payload and "digest" in payload:
        return _short(payload, cluster_name, node_name, counter)
    cluster = _cluster(cluster_name)
    if cluster is None:
        return _errors("unknown cluster", {"cluster": f"no cluster named {cluster_name!r}"})
    try:
        node, workloads = parse_heartbeat(payload, cluster_name, node_name)
        os_report = packages.parse_os_report(payload)
        digest = content_digest(payload)
        result, node_id = _apply(cluster, node, workloads, counter, digest, os_report)
    except PayloadError as exc:
        return _errors("invalid heartbeat", exc.errors)
    except packages.OsReportError as exc:
        return _errors("invalid heartbeat", exc.errors)
    except InventoryError as exc:
        return _errors("invalid heartbeat", {"facts": str(exc)})
    except StaleHeartbeat as exc:
        return _stale(exc.newest)
    if node_id is None:  # registered by this heartbeat
        node_id = cluster.nodes.values_list("id", flat=True).get(name=node_name)
    return JsonResponse({
        "node_id": node_id,
        "changed": result.changed_components.get(node_name, []),
        "next_heartbeat_s": settings.GPUSWEEP_AGENT_HEARTBEAT_S,
        "digest": digest,
    })


def _short(payload: dict[str, Any], cluster_name: str, node_name: str, counter: int) -> JsonResponse:
    """A heartbeat of the digest alone: one indexed read, then the counter through heartbeats."""
    errors: dict[str, str] = {}
    if payload.get("schema") != SCHEMA:
        errors["schema"] = f"expected {SCHEMA!r}"
    if payload.get("cluster") != cluster_name or payload.get("node") != node_name:
        errors["node"] = "cluster/node in the body differ from the signed identity"
    digest = payload.get("digest")
    if not isinstance(digest, str) or len(digest) != 64 or not DIGEST_CHARS.issuperset(digest):
        errors["digest"] = "expected 64 lowercase hex digits (SHA-256)"
    if errors:
        return _errors("invalid heartbeat", errors)
    with connection.cursor() as cursor:  # a plain statement: the ORM's compiling would cost more than it
        cursor.execute(queries.SHORT_READ, [cluster_name, node_name])
        row = cursor.fetchone()
    if row is None or row[1] != digest or row[3] is not None:
        # Unknown node, other content, or a node marked gone: the full heartbeat decides.
        why = "unknown node" if row is None else "node marked gone" if row[3] is not None else "digest differs"
        return JsonResponse({**error_body(f"send the full heartbeat: {why}"), "send": "full"}, status=409)
    node_id, _digest, db_counter, _gone = row
    try:
        heartbeats.record_short(node_id, counter, db_counter, timezone.now())
    except StaleHeartbeat as exc:
        return _stale(exc.newest)
    return JsonResponse({"node_id": node_id, "changed": [], "next_heartbeat_s": settings.GPUSWEEP_AGENT_HEARTBEAT_S,
                         "digest": digest})
