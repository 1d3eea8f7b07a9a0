"""Fleet pages: nodes with their versions, workloads and exposures."""

from __future__ import annotations

from django.db.models import Prefetch, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from advisories.models import Exposure
from campaigns.models import NodeSweep
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


def node_detail(request: HttpRequest, pk: int) -> HttpResponse:
    node = get_object_or_404(Node.objects.select_related("cluster"), pk=pk)
    return render(request, "inventory/node_detail.html", {
        "node": node,
        "components": node.components.all(),
        "workloads": node.workloads.filter(gone_at__isnull=True),
        "exposures": Exposure.objects.filter(node=node).select_related("advisory").order_by("state", "deadline")[:200],
        "sweeps": NodeSweep.objects.filter(node=node).select_related("campaign").order_by("-id")[:20],
        "changes": ChangeLog.objects.filter(object_type="node", object_id=node.pk)[:50],
    })
