"""How the engine names what it acts on: a node to its back end, an operation (so a repeat after a
crash does nothing twice), and a campaign step to the inventory and the evidence."""

from __future__ import annotations

from campaigns.models import NodeSweep, WorkloadMove
from executors.base import NodeRef
from inventory.models import Node


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


def reference(sweep: NodeSweep) -> str:
    """How inventory changes and remediated exposures name the campaign step that made them."""
    return f"campaign {sweep.campaign_id}, sweep {sweep.pk}"


def actor(worker: str) -> str:
    """The evidence's actor of what a worker did."""
    return f"worker:{worker}"
