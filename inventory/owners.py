"""Who owns each node fact, and what happens when two sources disagree.

Several sources report the same node: its agent measures it (NVML, the driver's files), a scheduler
declares it (Slurm's GRES and features, Kubernetes' GPU feature discovery labels), a file states it.
Each owned fact (``OWNED_FACTS``) keeps the source that set it (``Node.fact_sources``), and a report
is weighed against it:

- an empty value (``""``, ``0``) says nothing: it never overwrites a known one (an untyped GRES
  ``gpu:4`` has no model);
- a source of higher or equal precedence (``PRECEDENCE``: measured before declared) sets the fact;
- two sources that disagree on a non-empty value make a conflict (``Node.fact_conflicts``:
  {fact: {source: value}}): the value of the higher one stays, the node page and API show both, and
  the change log says so once, when the conflict opens or closes, not at every report. It closes
  when the sources agree again.

Component versions follow the same precedence through ``NodeComponent.source`` (``OUTRANKED_BY``
in services). A sweep's portability requirements are read from these facts (campaigns.engine.targets),
so they are the agent's measured ones wherever the node has an agent.
"""

from __future__ import annotations

from typing import Any

from inventory.choices import ChangeSource
from inventory.gpumodel import same_model

OWNED_FACTS = ("gpu_model", "gpu_count")
# Highest first: a person's word, then what the node's agent measured, then what a scheduler or a file declares.
PRECEDENCE = (
    ChangeSource.ADMIN,
    ChangeSource.API,
    ChangeSource.CAMPAIGN,
    ChangeSource.AGENT,
    ChangeSource.SLURM,
    ChangeSource.KUBERNETES,
    ChangeSource.FILE,
)


# A component version set by the key's source is not overwritten by these: the agent reads the node
# itself, while Slurm features and Kubernetes labels are published about it (and may lag or spell
# versions differently, e.g. the OS). Their differing value is a conflict (weigh).
OUTRANKED_BY: dict[str, frozenset[str]] = {
    ChangeSource.AGENT: frozenset({ChangeSource.SLURM, ChangeSource.KUBERNETES}),
}
COMPONENT = "component:"  # the key of a component's conflict in Node.fact_conflicts


def rank(source: str) -> int:
    """Larger is stronger; a source not listed (or none recorded) is the weakest."""
    return len(PRECEDENCE) - PRECEDENCE.index(source) if source in PRECEDENCE else 0


def empty(value: Any) -> bool:
    return value in (None, "", 0)


def agree(fact: str, a: Any, b: Any) -> bool:
    """Whether two reports of `fact` name the same thing. GPU models are named differently by each
    source (GRES type ``h100``, GFD ``NVIDIA-H100-80GB-HBM3``, NVML ``NVIDIA H100 80GB HBM3``): they
    agree when they name the same model (inventory.gpumodel: same model number, and the same memory
    where both give one)."""
    if fact == "gpu_model":
        return bool(str(a or "").strip() and str(b or "").strip()) and same_model(str(a), str(b))
    return bool(a == b)


def weigh(
    row: dict[str, Any],
    values: dict[str, Any],
    source: str,
    now: str,
    components: dict[str, str] | None = None,
    current: dict[str, tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """`values` (a node's reported fields) less the owned facts `source` may not set on `row` (the
    node's current fields, with ``fact_sources`` and ``fact_conflicts``), plus those two columns when
    they change. `components` (reported) against `current` ({component: (version, source)}) open or close
    the components' conflicts; which version is kept is services' (OUTRANKED_BY)."""
    owners = dict(row.get("fact_sources") or {})
    conflicts = {fact: dict(seen) for fact, seen in (row.get("fact_conflicts") or {}).items()}
    for component, version in (components or {}).items():
        kept, set_by = (current or {}).get(component, ("", ""))
        # Which version is kept is services' (OUTRANKED_BY); a kept one differing from an outranked one is shown.
        _weigh_one(
            conflicts,
            f"{COMPONENT}{component}",
            version,
            kept,
            set_by,
            source,
            now,
            shown=source in OUTRANKED_BY.get(set_by, ()),
        )
    for fact in OWNED_FACTS:
        reported = values.pop(fact, None)
        if empty(reported):
            continue  # says nothing
        stored, owner = row.get(fact), str(owners.get(fact, ""))
        _weigh_one(conflicts, fact, reported, stored, owner, source, now, shown=bool(owner) and source != owner)
        if empty(stored) or source == owner or not owner:  # unknown, its own, or set before owners were kept
            values[fact], owners[fact] = reported, source
        elif agree(fact, reported, stored):
            if rank(source) > rank(owner):
                owners[fact] = source  # the same fact from a stronger source, which owns it from now on
        elif rank(source) >= rank(owner):  # two sources disagree: the stronger one's value is kept
            values[fact], owners[fact] = reported, source
    if owners != (row.get("fact_sources") or {}):
        values["fact_sources"] = owners
    if conflicts != (row.get("fact_conflicts") or {}):
        values["fact_conflicts"] = conflicts
    return values


def first_owners(values: dict[str, Any], source: str) -> dict[str, str]:
    """The owners of a new node's facts: `source` for each it reported."""
    return {fact: source for fact in OWNED_FACTS if not empty(values.get(fact))}


def _weigh_one(
    conflicts: dict[str, dict[str, Any]],
    key: str,
    reported: Any,
    stored: Any,
    owner: str,
    source: str,
    now: str,
    shown: bool,
) -> None:
    """Open, keep or close the conflict `key` (a fact, or ``component:<name>``) after `source` reported
    `reported`, the node holding `stored` from `owner`; `shown`: a differing report is a disagreement."""
    fact = key.removeprefix(COMPONENT)
    if source in conflicts.get(key, {}):
        conflicts[key][source] = reported
        words = [v for k, v in conflicts[key].items() if k != "since"]
        if all(agree(fact, words[0], other) for other in words[1:]):
            del conflicts[key]  # the sources agree again
    if shown and not empty(stored) and not agree(fact, reported, stored):
        seen = {owner: stored, source: reported}
        if {k: v for k, v in conflicts.get(key, {}).items() if k != "since"} != seen:
            conflicts[key] = {**seen, "since": now}
