"""Where a checkpoint may be restored: what each checkpoint engine's image depends on.

The one rule for portability, used by the planner (capacity), the engine (``choose_target``) and
every executor (a restore on a node whose facts differ is refused). A checkpoint is valid on a
node when every fact the image depends on is the same there as where it was taken:

- ``cuda``: GPU model, driver and CUDA (the GPU state is tied to them), and the inference engine
  and model versions the workload reports (an engine installed on the node, e.g. component
  ``triton``, must match when the node reports it).
- ``criu``: kernel and CRIU version; plus GPU model and driver when the process holds GPU state.
- ``signal``: nothing on the node (the application saved its own files and reloads them); the
  workload may declare more (``requires``).
- ``none``: not checkpointable: the workload finishes first or cold-starts.

Where a workload's volumes attach is part of the same rule: its scheduler's ``placement``
(inventory.sources.kubernetes.Placement) adds the topology facts its receiver must share (a zone:
nodes report their topology labels as facts), and a workload pinned to its node (a local volume)
requires ``PINNED``, a fact no node has: it never moves, and is waited for or cold-started.

A new engine is one ``EngineRule`` and a ``register`` call. Facts are plain strings keyed by
``gpu_model`` or a component name; a fact the source node lacks must be absent on the target too
(an empty string stands for "absent").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from inventory.choices import CheckpointEngine

GPU_MODEL = "gpu_model"
# Required by a workload that cannot leave its node (its value says why): no node's facts hold it.
PINNED = "pinned"


@dataclass(frozen=True)
class EngineRule:
    name: str
    # Node facts the image always depends on.
    node_facts: tuple[str, ...] = ()
    # Node facts it depends on only when the process holds GPU state (it has GPUs).
    gpu_facts: tuple[str, ...] = ()
    # Whether the workload's own inference engine (a node component named by it) must match.
    inference_engine: bool = False
    checkpointable: bool = True
    label: str = ""


@dataclass(frozen=True)
class Requirements:
    """What a checkpoint needs of its restore target."""

    engine: str
    # fact -> value that must be the same on the target ("" = the target must not have it).
    must: dict[str, str] = field(default_factory=dict)
    # fact -> value that must be the same where the target reports the fact at all.
    if_reported: dict[str, str] = field(default_factory=dict)
    checkpointable: bool = True

    # The facts checked strictly, in a stable order (what an index of receivers keys on).
    facts: tuple[str, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "facts", tuple(sorted(self.must)))

    def as_dict(self) -> dict[str, object]:
        return {"engine": self.engine, "must": dict(self.must), "if_reported": dict(self.if_reported)}


ENGINES: dict[str, EngineRule] = {}


def register(rule: EngineRule) -> EngineRule:
    ENGINES[rule.name] = rule
    CheckpointEngine.register(rule.name, rule.label)  # what a workload's checkpoint_engine may be
    return rule


register(EngineRule("criu", node_facts=("kernel", "criu"), gpu_facts=(GPU_MODEL, "driver"), label="CRIU"))
register(EngineRule("cuda", node_facts=(GPU_MODEL, "driver", "cuda"), inference_engine=True,
                    label="CUDA checkpoint + CRIU"))
register(EngineRule("signal", label="Application signal"))
register(EngineRule("none", checkpointable=False, label="None (cold restart)"))


class UnknownEngine(ValueError):
    pass


def rule(engine: str) -> EngineRule:
    try:
        return ENGINES[engine or "none"]
    except KeyError:
        raise UnknownEngine(f"unknown checkpoint engine {engine!r}; known: {', '.join(sorted(ENGINES))}") from None


def node_facts(gpu_model: str, versions: Mapping[str, str]) -> dict[str, str]:
    """A node's facts as the rule reads them: its GPU model and component versions."""
    return {**{str(k): str(v) for k, v in versions.items()}, GPU_MODEL: gpu_model or ""}


def requirements(engine: str, source: Mapping[str, str], *, gpus: int = 0, inference_engine: str = "",
                 engine_version: str = "", model_name: str = "", model_version: str = "",
                 requires: Mapping[str, str] | None = None) -> Requirements:
    """What a checkpoint taken by `engine` on a node with facts `source` needs of its target."""
    chosen = rule(engine)
    if not chosen.checkpointable:
        return Requirements(engine=chosen.name, checkpointable=False)
    names = list(chosen.node_facts) + (list(chosen.gpu_facts) if gpus > 0 else [])
    must = {name: str(source.get(name, "") or "") for name in names}
    if_reported: dict[str, str] = {}
    if chosen.inference_engine and inference_engine and engine_version:
        if_reported[inference_engine] = engine_version
        if model_name and model_version:
            if_reported[f"model:{model_name}"] = model_version
    for name, value in (requires or {}).items():
        must[str(name)] = str(value)
    return Requirements(engine=chosen.name, must=must, if_reported=if_reported)


def placement_requires(placement: Mapping[str, object] | None) -> dict[str, str]:
    """The facts a workload's ``placement`` (Workload.placement) adds to its requirements: its volumes'
    topology, and ``PINNED`` (why) when it cannot leave its node."""
    placement = placement or {}
    facts = placement.get("requires")
    found = {str(k): str(v) for k, v in facts.items()} if isinstance(facts, dict) else {}
    if placement.get("pinned"):
        found[PINNED] = str(placement["pinned"])
    return found


def mismatches(needed: Requirements, target: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """fact -> (wanted, found) for every fact of the target that makes the checkpoint invalid there."""
    wrong: dict[str, tuple[str, str]] = {}
    for name, wanted in needed.must.items():
        found = str(target.get(name, "") or "")
        if found != wanted:
            wrong[name] = (wanted, found)
    for name, wanted in needed.if_reported.items():
        found = str(target.get(name, "") or "")
        if found and found != wanted:
            wrong[name] = (wanted, found)
    return wrong


def compatible(needed: Requirements, target: Mapping[str, str]) -> bool:
    return needed.checkpointable and not mismatches(needed, target)


def from_dict(data: Mapping[str, object]) -> Requirements:
    """The inverse of ``Requirements.as_dict`` (a checkpoint's recorded requirements)."""
    must = data.get("must") or {}
    if_reported = data.get("if_reported") or {}
    return Requirements(
        engine=str(data.get("engine", "")),
        must={str(k): str(v) for k, v in dict(must).items()} if isinstance(must, dict) else {},
        if_reported={str(k): str(v) for k, v in dict(if_reported).items()} if isinstance(if_reported, dict) else {},
        checkpointable=str(data.get("engine", "")) != "none",
    )
