"""What inventory shows on the overview page (gpusweep.registry): how many nodes are in service."""

from __future__ import annotations

import datetime as dt

from gpusweep.registry import Counts, OverviewSection
from inventory.choices import ServiceState
from inventory.models import Node


def exact_counts(now: dt.datetime) -> Counts:
    return {"nodes": Node.objects.exclude(service_state=ServiceState.GONE).count()}, None


SECTIONS = (
    OverviewSection("nodes", order=10, headline="inventory/_overview_headline.html", counts=exact_counts,
                    reads=(Node,)),
)
