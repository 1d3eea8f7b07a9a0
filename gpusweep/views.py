from __future__ import annotations

import datetime as dt

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone

from advisories import services as advisory_services
from advisories.choices import ExposureState
from advisories.models import Advisory, ClusterDeadlineOverride, DeadlinePolicy, Exposure
from campaigns import board
from campaigns.choices import CampaignStatus
from campaigns.models import Campaign
from gpusweep import overview
from gpusweep.pages import cached_figures, installed
from gpusweep.roles import Role, has_role, user_roles
from inventory.choices import ServiceState
from inventory.models import Cluster, Node


def home(request: HttpRequest) -> HttpResponse:
    """The landing page: how exposed the fleet is, what is overdue, and what is being done about it."""
    now = timezone.now()
    active = list(Campaign.objects.filter(status__in=CampaignStatus.ACTIVE | {CampaignStatus.APPROVED})
                  .order_by("-started_at", "-id")[:10])
    # The fleet-wide figures take a second or two on 100,000 nodes: served from the cache, at most
    # GPUSWEEP_CONSOLE_FIGURES_S old (the page says as of when).
    figures, computed_at = cached_figures("console:overview", lambda: overview.figures(timezone.now()),
                                          settings.GPUSWEEP_CONSOLE_FIGURES_S)
    return render(request, "home.html", {
        **figures,
        "as_of": dt.datetime.fromtimestamp(computed_at, tz=dt.UTC),
        "roles": sorted(user_roles(request.user)),
        "nodes": Node.objects.exclude(service_state=ServiceState.GONE).count(),
        "advisories": Advisory.objects.count(),
        "mismatches": Advisory.objects.filter(integrity="mismatch").count(),
        "accepted": Exposure.objects.filter(state=ExposureState.RISK_ACCEPTED).aggregate(
            n=Count("id"), expiring=Count("id", filter=Q(risk_expires_at__lt=now + dt.timedelta(days=7)))),
        "campaigns": [(c, board.board(c, c.plans.order_by("-version").first())) for c in active],
    })


class DeadlinePolicyForm(forms.ModelForm):
    class Meta:
        model = DeadlinePolicy
        fields = list(advisory_services.POLICY_FIELDS)


def settings_page(request: HttpRequest) -> HttpResponse:
    """The deadline policy (admins edit it; every deadline follows) and the clusters."""
    is_admin = has_role(request.user, Role.ADMIN)
    policy = DeadlinePolicy.current()
    form = DeadlinePolicyForm(request.POST or None, instance=policy)
    if request.method == "POST":
        if not is_admin:
            raise PermissionDenied("admins change the deadline policy")
        if form.is_valid():
            values = {k: form.cleaned_data[k] for k in advisory_services.POLICY_FIELDS}
            try:
                advisory_services.set_deadline_policy(request.user, values)
            except advisory_services.DecisionError as exc:
                messages.error(request, str(exc))
            else:
                messages.success(request, "Deadline policy saved; every open deadline follows it.")
                return redirect("settings")
    clusters = Cluster.objects.annotate(
        n=Count("nodes", filter=~Q(nodes__service_state=ServiceState.GONE))).order_by("name")
    return render(request, "settings.html", {
        "form": form, "is_admin": is_admin, "clusters": clusters,
        "overrides": ClusterDeadlineOverride.objects.select_related("cluster").order_by("cluster__name", "severity"),
        "more": [(label, path) for label, path in (("Webhooks", "/settings/webhooks/"),
                                                  ("API tokens", "/settings/tokens/")) if installed(path)],
    })
