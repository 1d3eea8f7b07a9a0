"""The fleet a simulation runs on: a cluster of the inventory, or a node file.

A node file is read by the inventory's own importer (`inventory.importers.read_nodes`, with its
mappings), so a file that `import_nodes` accepts is a fleet here too; nothing is written. The
Alibaba node list (`sn,cpu_milli,memory_mib,gpu,model`) is read with its shipped mapping
`alibaba-openb-2023` when no mapping is named. Nodes without GPUs are left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from inventory.importers import Mapping, read_nodes
from inventory.services import InventoryError

OPENB_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
OPENB_MAPPING = "alibaba-openb-2023"


class FleetError(ValueError):
    pass


@dataclass(frozen=True)
class SimNode:
    index: int
    name: str
    gpus: int
    cluster: str = "fleet"
    pool: str = ""
    gpu_model: str = ""
    versions: dict[str, str] = field(default_factory=dict)


def from_file(path: Path, mapping: str | None = None, cluster: str = "fleet") -> list[SimNode]:
    try:
        with path.open(encoding="utf-8-sig") as handle:
            first = handle.readline().strip()
    except OSError as exc:
        raise FleetError(f"{path}: {exc.strerror}") from None
    if mapping is None and first == OPENB_HEADER:
        mapping = OPENB_MAPPING
    try:
        observed = read_nodes(path, Mapping.load(mapping))
    except InventoryError as exc:
        raise FleetError(str(exc)) from None
    nodes = [
        SimNode(index=0, name=o.name, gpus=o.gpu_count or 0, cluster=cluster, pool=o.pool or "",
                gpu_model=o.gpu_model or "", versions=dict(o.components))
        for o in observed if (o.gpu_count or 0) > 0
    ]
    if not nodes:
        raise FleetError(f"{path.name}: no node with GPUs (a gpu_count column, or a mapping that names it)")
    return _indexed(nodes)


def from_cluster(name: str) -> list[SimNode]:
    from inventory.choices import ServiceState
    from inventory.models import Node

    rows = (Node.objects.filter(cluster__name=name, gpu_count__gt=0).exclude(service_state=ServiceState.GONE)
            .prefetch_related("components").order_by("name"))
    nodes = [
        SimNode(index=0, name=n.name, gpus=n.gpu_count, cluster=name, pool=n.pool, gpu_model=n.gpu_model,
                versions={c.component: c.version for c in n.components.all()})
        for n in rows
    ]
    if not nodes:
        raise FleetError(f"cluster {name!r} has no node with GPUs in the inventory")
    return _indexed(nodes)


def _indexed(nodes: list[SimNode]) -> list[SimNode]:
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        dupe = next(n for n in names if names.count(n) > 1)
        raise FleetError(f"node {dupe!r} appears twice in the fleet")
    return [SimNode(index=i, name=n.name, gpus=n.gpus, cluster=n.cluster, pool=n.pool, gpu_model=n.gpu_model,
                    versions=n.versions) for i, n in enumerate(nodes)]
