"""Where a checkpointed workload may go: what its image needs (the one portability rule,
executors.portability) and the node chosen to receive it."""

from __future__ import annotations

from dataclasses import replace

from campaigns.engine import rows
from campaigns.models import NodeSweep, WorkloadMove
from executors import portability
from executors.base import WorkloadInfo
from inventory.models import Node, Workload


def choose_target(sweep: NodeSweep, move: WorkloadMove, planned: int | None) -> Node | None:
    """A node where the checkpoint is valid (executors.portability), with room, not being drained soon.

    The facts the image needs and free GPUs are matched in SQL (rows.target_node, queries.candidates): the planned
    target if it still qualifies, else the emptiest. Written as SQL: compiling it through the ORM
    cost more CPU per node than running it.
    """
    needed = portability.from_dict(move.detail.get("requires") or {})
    target = rows.target_node(sweep, needed, move.gpus, planned)
    if target is not None:
        target.cluster = sweep.node.cluster  # the same cluster, already loaded
    return target


def requirements(info: WorkloadInfo | None, row: Workload | None, engine: str,
                 facts: dict[str, str]) -> portability.Requirements:
    """What this workload's checkpoint will need of its target (the one portability rule)."""
    reported = info.fingerprint if info is not None else {}

    def pick(name: str, own: str) -> str:
        return str(reported.get(name) or own or "")

    # Its volumes' placement (the inventory's, and the back end's live view) is declared the same way.
    declared = {**(row.requires if row else {}), **portability.placement_requires(row.placement if row else None),
                **(info.requires if info is not None else {})}
    needed = portability.requirements(
        engine, facts, gpus=(info.gpus if info is not None and info.gpus else (row.gpus if row else 0)),
        inference_engine=pick("engine", row.engine if row else ""),
        engine_version=pick("engine_version", row.engine_version if row else ""),
        model_name=pick("model_name", row.model_name if row else ""),
        model_version=pick("model_version", row.model_version if row else ""),
        requires=declared,
    )
    # A node fact nobody measured is unknown, not absent: no requirement (an empty GPU model would refuse
    # every target, the checkpoint's own node included); the agent checks its own facts at the restore.
    return replace(needed, must={k: v for k, v in needed.must.items() if v or k in declared})


def source_facts(sweep: NodeSweep) -> dict[str, str]:
    """The facts of the node being swept, as portability reads them (its GPU model and versions): the
    inventory's, where what the node's agent measured outranks what a scheduler declares and an empty
    report never erased a known value (inventory.owners)."""
    return portability.node_facts(sweep.node.gpu_model, rows.node_versions(sweep.node_id))
