from __future__ import annotations

import datetime as dt

from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from advisories.choices import ExposureState
from advisories.models import Advisory, Exposure
from campaigns import board
from campaigns.choices import CampaignStatus
from campaigns.models import Campaign
from gpusweep import overview
from gpusweep.roles import user_roles
from inventory.choices import ServiceState
from inventory.models import Node


def home(request: HttpRequest) -> HttpResponse:
    """The landing page: how exposed the fleet is, what is overdue, and what is being done about it."""
    now = timezone.now()
    active = list(Campaign.objects.filter(status__in=CampaignStatus.ACTIVE | {CampaignStatus.APPROVED})
                  .order_by("-started_at", "-id")[:10])
    return render(request, "home.html", {
        "roles": sorted(user_roles(request.user)),
        "nodes": Node.objects.exclude(service_state=ServiceState.GONE).count(),
        "advisories": Advisory.objects.count(),
        "mismatches": Advisory.objects.filter(integrity="mismatch").count(),
        "presumed_nodes": Exposure.objects.filter(state=ExposureState.PRESUMED).values("node").distinct().count(),
        "accepted": Exposure.objects.filter(state=ExposureState.RISK_ACCEPTED).aggregate(
            n=Count("id"), expiring=Count("id", filter=Q(risk_expires_at__lt=now + dt.timedelta(days=7)))),
        "by_severity": overview.exposed_by_severity(),
        "summary": overview.deadlines(now),
        "compliance": overview.compliance_by_cluster(),
        "charts": overview.charts(now),
        "campaigns": [(c, board.board(c, c.plans.order_by("-version").first())) for c in active],
        "review": overview.needing_review(),
    })
