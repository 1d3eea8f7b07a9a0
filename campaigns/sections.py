"""What campaigns shows on a node's page, which inventory renders (gpusweep.registry): its campaigns."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from campaigns.models import NodeSweep
from gpusweep.registry import PageSection


def node_sweeps(request: HttpRequest, node: Any) -> dict[str, Any]:
    return {"sweeps": NodeSweep.objects.filter(node=node).select_related("campaign").order_by("-id")[:20]}


NODE = (PageSection("campaigns", order=20, template="campaigns/_node_sweeps.html", context=node_sweeps),)
