"""Fleet pages: nodes with their versions and workloads, and what other apps show of a node
(its exposures, its campaigns: gpusweep.registry.node_page)."""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from gpusweep import registry
from gpusweep.pages import paginate
from inventory.choices import ServiceState
from inventory.models import ChangeLog, Cluster, Node, NodeComponent


def node_list(request: HttpRequest) -> HttpResponse:
    nodes = Node.objects.select_related("cluster").prefetch_related(
        Prefetch("components", queryset=NodeComponent.objects.filter(component__in=["driver", "cuda"]))
    )
    filters = {key: request.GET.get(key, "") for key in ("cluster", "state", "gpu_model", "q")}
    if filters["cluster"]:
        nodes = nodes.filter(cluster__name=filters["cluster"])
    if filters["state"]:
        nodes = nodes.filter(service_state=filters["state"])
    else:
        nodes = nodes.exclude(service_state=ServiceState.GONE)
    if filters["gpu_model"]:
        nodes = nodes.filter(gpu_model=filters["gpu_model"])
    if filters["q"]:
        nodes = nodes.filter(Q(name__icontains=filters["q"]) | Q(pool__icontains=filters["q"]))
    return render(request, "inventory/node_list.html", {
        "page": paginate(request, nodes.order_by("cluster__name", "name")),
        "filters": filters,
        "clusters": Cluster.objects.values_list("name", flat=True),
        "states": ServiceState.choices(),
    })


def _text(value: Any) -> str:
    if value in (None, "", [], {}):
        return "—"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in sorted(value.items()))
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def readable_changes(changes: Any) -> list[tuple[str, str, str]]:
    """A ChangeLog's {field: [before, after]} as (what, before, after) rows, without no-op rows; a
    dict field (labels, facts) gives one row per key that changed."""
    rows: list[tuple[str, str, str]] = []
    if not isinstance(changes, dict):
        return rows
    for name, pair in sorted(changes.items()):
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            continue
        before, after = pair
        if before == after:
            continue
        label = name.removeprefix("component:").replace("_", " ")
        if isinstance(before, dict | type(None)) and isinstance(after, dict | type(None)) and (before or after):
            old, new = before or {}, after or {}
            for key in sorted(set(old) | set(new)):
                if old.get(key) != new.get(key):
                    rows.append((f"{label}: {key}", _text(old.get(key)), _text(new.get(key))))
            continue
        rows.append((label, _text(before), _text(after)))
    return rows


def node_detail(request: HttpRequest, pk: int) -> HttpResponse:
    node = get_object_or_404(Node.objects.select_related("cluster"), pk=pk)
    history = []
    for log in ChangeLog.objects.filter(object_type="node", object_id=node.pk).select_related("user")[:100]:
        rows = readable_changes(log.changes)
        if rows:
            history.append((log, rows))
    sections = list(registry.node_page)
    return render(request, "inventory/node_detail.html", {
        **registry.merged(section.context(request, node) for section in sections),
        "node": node,
        "components": node.components.order_by("component"),
        "workloads": node.workloads.filter(gone_at__isnull=True),
        "history": history,
        "sections": sections,
    })
