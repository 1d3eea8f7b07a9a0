from __future__ import annotations

from datetime import timedelta

from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from advisories.choices import ExposureState, ReviewState
from advisories.models import Advisory, Exposure, ReviewItem
from campaigns.choices import CampaignStatus
from campaigns.models import Campaign
from gpusweep.roles import user_roles
from inventory.choices import ServiceState
from inventory.models import Node


def home(request: HttpRequest) -> HttpResponse:
    """The landing page: how exposed the fleet is, what is overdue, and what is being done about it."""
    now = timezone.now()
    open_exposures = Exposure.objects.filter(state=ExposureState.OPEN)
    by_severity = dict(
        open_exposures.values_list("severity").annotate(n=Count("id")).values_list("severity", "n")
    )
    summary = open_exposures.aggregate(
        overdue=Count("id", filter=Q(deadline__lt=now)),
        due_7d=Count("id", filter=Q(deadline__gte=now, deadline__lt=now + timedelta(days=7))),
        nodes=Count("node", distinct=True),
    )
    return render(request, "home.html", {
        "roles": sorted(user_roles(request.user)),
        "nodes": Node.objects.exclude(service_state=ServiceState.GONE).count(),
        "advisories": Advisory.objects.count(),
        "mismatches": Advisory.objects.filter(integrity="mismatch").count(),
        # "We could not tell" is shown, never folded into "not exposed".
        "needs_review": ReviewItem.objects.filter(state=ReviewState.OPEN).values("advisory").distinct().count(),
        "presumed_nodes": Exposure.objects.filter(state=ExposureState.PRESUMED).values("node").distinct().count(),
        "summary": summary,
        "by_severity": by_severity,
        "active_campaigns": Campaign.objects.filter(status__in=CampaignStatus.ACTIVE).order_by("-started_at")[:10],
    })
