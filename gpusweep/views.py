from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Min, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone

from advisories import services as advisory_services
from advisories.choices import ExposureState
from advisories.models import Advisory, ClusterDeadlineOverride, DeadlinePolicy, Exposure
from campaigns import board
from campaigns.choices import CampaignStatus
from campaigns.models import Campaign
from gpusweep import datagen, overview
from gpusweep.pages import cached_figures, installed
from gpusweep.responses import cached
from gpusweep.roles import Role, has_role, user_roles
from inventory.choices import ServiceState
from inventory.models import Cluster, Node


def home(request: HttpRequest) -> HttpResponse:
    """The landing page: how exposed the fleet is, what is overdue, and what is being done about it."""
    # The fleet-wide figures take a second or two on 100,000 nodes: served from the cache, at most
    # GPUSWEEP_CONSOLE_FIGURES_S old (the page says as of when).
    figures, computed_at = cached_figures("console:overview", lambda: overview.figures(timezone.now()),
                                          settings.GPUSWEEP_CONSOLE_FIGURES_S)
    listed = cached("overview-counts", OVERVIEW_COUNT_TABLES, overview_counts)
    counts, active = listed["counts"], listed["active"]
    roles = sorted(user_roles(request.user))
    # The page's sections but the campaigns (live, with their ETAs) are rendered once per figures,
    # counts and roles: the key holds them all, so a cached section is the one this render makes.
    fragment_key = hashlib.sha256(repr((datagen.scope(), computed_at, counts, roles)).encode()).hexdigest()
    return render(request, "home.html", {
        **figures,
        **counts,
        "as_of": dt.datetime.fromtimestamp(computed_at, tz=dt.UTC),
        "roles": roles,
        "campaigns": [(c, board.board(c, c.plans.order_by("-version").first())) for c in active],
        "fragment_key": fragment_key,
        "fragment_s": max(600, 10 * settings.GPUSWEEP_CONSOLE_FIGURES_S) if settings.GPUSWEEP_CONSOLE_FIGURES_S else 0,
    })


OVERVIEW_COUNT_TABLES = ("inventory_node", "advisories_advisory", "advisories_exposure", "campaigns_campaign")
EXPIRING_DAYS = 7


def overview_counts() -> tuple[dict[str, Any], dt.datetime | None]:
    """The overview's exact counts and its active campaigns (read on every visit, so kept until
    their tables are written: gpusweep.responses.cached; each campaign's board is made per visit),
    and when `expiring` next changes by itself: when the first risk ending later than a week from
    now comes within the week."""
    now = timezone.now()
    soon = now + dt.timedelta(days=EXPIRING_DAYS)
    accepted = Exposure.objects.filter(state=ExposureState.RISK_ACCEPTED)
    later = accepted.filter(risk_expires_at__gte=soon).aggregate(first=Min("risk_expires_at"))["first"]
    active = list(Campaign.objects.filter(status__in=CampaignStatus.ACTIVE | {CampaignStatus.APPROVED})
                  .order_by("-started_at", "-id")[:10])
    return {"counts": {
        "nodes": Node.objects.exclude(service_state=ServiceState.GONE).count(),
        "advisories": Advisory.objects.count(),
        "mismatches": Advisory.objects.filter(integrity="mismatch").count(),
        "accepted": accepted.aggregate(n=Count("id"), expiring=Count("id", filter=Q(risk_expires_at__lt=soon))),
    }, "active": active}, later - dt.timedelta(days=EXPIRING_DAYS) if later is not None else None


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
