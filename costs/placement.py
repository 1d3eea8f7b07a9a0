"""Where each task of a trace ran: the trace's own node, else the placement model.

Tasks are taken in order of start; a task that finished frees its share first. `first_fit`
takes the first node in fleet order with enough free GPU share, `best_fit` the one with the
least free share that fits; a task whose `gpu_spec` names GPU models goes only to a node of one of
them (names compared by `inventory.gpumodel`). A task that fits nowhere (the trace's fleet was larger
than this one) is left out and counted; one whose spec names no model of this fleet is left out and
counted by its spec (`Placement.no_model`), so a fleet that lacks a model is told, not guessed at.
The placement is the baseline every strategy is measured against.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from costs.fleet import SimNode
from costs.trace import Task


@dataclass
class Placement:
    by_node: list[list[int]]  # task indexes per node index, in order of start
    node_of: list[int | None]
    unplaced: int = 0  # every task left out, those of `no_model` included
    no_model: dict[str, int] = field(default_factory=dict)  # gpu_spec ("A100|H100") -> tasks no node could run


def place(tasks: list[Task], nodes: list[SimNode], rule: str = "first_fit") -> Placement:
    free = [n.gpus * 1000 for n in nodes]
    by_name = {n.name: n.index for n in nodes}
    releases: list[tuple[float, int, int]] = []  # (end, node, milli)
    node_of: list[int | None] = [None] * len(tasks)
    by_node: list[list[int]] = [[] for _ in nodes]
    unplaced = 0
    no_model: dict[str, int] = {}
    models = [n.gpu_model for n in nodes]
    in_fleet: dict[tuple[str, ...], bool] = {}  # gpu_spec -> does some node of the fleet match it
    for index in sorted(range(len(tasks)), key=lambda i: (tasks[i].start, i)):
        task = tasks[index]
        while releases and releases[0][0] <= task.start:
            _end, node, milli = heapq.heappop(releases)
            free[node] += milli
        chosen = by_name.get(task.node) if task.node else None
        if chosen is None and task.gpu_models:
            if task.gpu_models not in in_fleet:
                in_fleet[task.gpu_models] = any(task.runs_on(m) for m in set(models))
            if not in_fleet[task.gpu_models]:
                spec = "|".join(task.gpu_models)
                no_model[spec] = no_model.get(spec, 0) + 1
                unplaced += 1
                continue
        if chosen is None:
            chosen = _choose(free, task.milli, rule, models, task)
        if chosen is None:
            unplaced += 1
            continue
        free[chosen] -= task.milli
        node_of[index] = chosen
        by_node[chosen].append(index)
        if task.end is not None:
            heapq.heappush(releases, (task.end, chosen, task.milli))
    return Placement(by_node=by_node, node_of=node_of, unplaced=unplaced, no_model=no_model)


def _choose(free: list[int], milli: int, rule: str, models: list[str], task: Task) -> int | None:
    best: int | None = None
    for node, room in enumerate(free):
        if room < milli or not task.runs_on(models[node]):
            continue
        if rule != "best_fit":
            return node
        if best is None or room < free[best]:
            best = node
    return best
