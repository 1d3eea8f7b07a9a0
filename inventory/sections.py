"""What inventory shows on the console's settings page (gpusweep.registry): the clusters."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q
from django.http import HttpRequest

from gpusweep.registry import PageSection
from inventory.choices import ServiceState
from inventory.models import Cluster


def clusters(request: HttpRequest) -> dict[str, Any]:
    return {"clusters": Cluster.objects.annotate(
        n=Count("nodes", filter=~Q(nodes__service_state=ServiceState.GONE))).order_by("name")}


SETTINGS = (PageSection("clusters", order=20, template="inventory/_settings_clusters.html", context=clusters),)
