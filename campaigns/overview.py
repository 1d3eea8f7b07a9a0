"""What campaigns shows on the overview page (gpusweep.registry): the active campaigns, each with
its progress and ETA made on every visit (its board)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from campaigns import board
from campaigns.choices import CampaignStatus
from campaigns.models import Campaign
from gpusweep.registry import Counts, OverviewSection


def active(now: dt.datetime) -> Counts:
    """The ten latest campaigns running or about to (kept until the campaigns table is written)."""
    return {"active": list(Campaign.objects.filter(status__in=CampaignStatus.ACTIVE | {CampaignStatus.APPROVED})
                           .order_by("-started_at", "-id")[:10])}, None


def boards(counts: Mapping[str, Any]) -> dict[str, Any]:
    return {"campaigns": [(c, board.board(c, c.plans.order_by("-version").first())) for c in counts["active"]]}


SECTIONS = (
    OverviewSection("campaigns", order=50, template="campaigns/_overview_active.html", counts=active,
                    reads=(Campaign,), live=boards, half=True),
)

