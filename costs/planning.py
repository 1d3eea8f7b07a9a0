"""The one place where the simulator meets the campaign planner (`campaigns.planner.plan`).

Strategy 3 is planned by the planner itself, so the waves, the receivers of moved work and the
workloads that cold-start or finish first are the ones a campaign on this fleet would get. Only
this module builds the planner's inputs and reads its output: a change to the planner's contract
is adapted here, in `plan_sweep`, and nowhere else.

GPU shares: the planner counts whole GPUs, the trace shares them; node capacity and workload
sizes are given to it in thousandths of a GPU, which keeps its arithmetic (free = capacity - used)
exact for shared GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from campaigns.planner import PlanNode, PlanWorkload, Policy, plan
from costs.fleet import SimNode
from executors.portability import GPU_MODEL
from inventory.choices import WorkloadPolicy

MIGRATE, RETURN_HOME, COLD_START = "migrate", "return_home", "cold_start"
FINISH_FIRST, BLOCKED = "finish_first", "blocked"


@dataclass(frozen=True)
class Resident:
    task: int  # index into the trace's tasks
    name: str
    milli: int
    checkpointable: bool
    # Constrained to GPU models (the trace's gpu_spec): it may move only to a node of the model it
    # runs on (within its spec, as placement put it there; the planner's requirements are exact).
    constrained: bool = False


@dataclass(frozen=True)
class Fate:
    # MIGRATE, RETURN_HOME (restored on its own node after the patch), COLD_START, FINISH_FIRST or
    # BLOCKED (no node can receive it and cold restart is not allowed: the engine waits for it to end,
    # up to the wait limit, and fails its node if it still runs then)
    action: str
    to: int | None = None  # node index that receives it (MIGRATE)


@dataclass
class SweepPlan:
    waves: list[list[int]]  # node indexes, wave by wave
    limits: dict[str, int]  # nodes at a time per cluster, as the plan fixes them for execution
    # (node index, task index) -> what happens to that task when the node is swept; a moved task
    # appears again under the node that received it.
    fates: dict[tuple[int, int], Fate] = field(default_factory=dict)
    summary: dict[str, object] = field(default_factory=dict)
    expected_end: str | None = None
    # The first wave is a canary that soaks this long before any other node drains.
    canary: bool = False
    soak_s: float = 0.0


def plan_sweep(nodes: Sequence[SimNode], residents: Mapping[int, Sequence[Resident]], *, start: datetime,
               parallelism: str, node_seconds: int, target: Mapping[str, str], last_group_cold_restart: bool,
               not_checkpointable_waits: bool, deadline: datetime | None, checkpoint_engine: str,
               canary: str = "0", soak_s: int = 0, growth: str = "fixed", growth_step: int = 2) -> SweepPlan:
    """Plan a sweep of every node in `nodes`, with `residents` (node index -> its tasks) running."""
    scope = []
    for node in nodes:
        otherwise = WorkloadPolicy.WAIT if not_checkpointable_waits else WorkloadPolicy.COLD_RESTART
        workloads = tuple(
            PlanWorkload(ref=str(r.task), name=r.name, gpus=r.milli,
                         checkpoint_engine=checkpoint_engine if r.checkpointable else "none",
                         policy=WorkloadPolicy.CHECKPOINT if r.checkpointable else otherwise,
                         requires=((GPU_MODEL, node.gpu_model),) if r.constrained else ())
            for r in residents.get(node.index, ())
        )
        scope.append(PlanNode(id=node.index + 1, name=node.name, cluster=node.cluster, pool=node.pool,
                              gpu_model=node.gpu_model, gpu_count=node.gpus * 1000,
                              versions=dict(node.versions), workloads=workloads,
                              target=dict(target), deadline=deadline))
    content = plan(scope, [], Policy(start=start, per_cluster=parallelism, node_seconds=node_seconds,
                                     cold_restart_allowed=last_group_cold_restart, deadline=deadline,
                                     canary=canary, soak_s=soak_s, growth=growth, growth_step=growth_step))
    result = SweepPlan(waves=[[node_id - 1 for node_id in wave["nodes"]] for wave in content["waves"]],
                       limits=dict(content["limits"]["cluster"]),
                       summary=dict(content["summary"]), expected_end=content["summary"].get("expected_end"),
                       canary=bool(content["canary"]["nodes"]), soak_s=float(content["canary"]["soak_s"]))
    for node_id, entry in content["nodes"].items():
        for move in entry["moves"]:
            action = move.get("action", BLOCKED)
            to = move.get("to") if action == MIGRATE else None
            result.fates[(int(node_id) - 1, int(move["workload"]))] = Fate(
                action=action if action in (MIGRATE, RETURN_HOME, COLD_START, FINISH_FIRST) else BLOCKED,
                to=int(to) - 1 if to is not None else None)
    return result
