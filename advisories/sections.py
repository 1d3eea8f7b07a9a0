"""What advisories shows on pages the console and inventory render (gpusweep.registry): the
deadline policy on the settings page, where admins edit it, and a node's exposures on its page."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils import timezone

from advisories import services
from advisories.forms import DeadlinePolicyForm
from advisories.models import ClusterDeadlineOverride, DeadlinePolicy, Exposure
from gpusweep.registry import PageSection
from gpusweep.roles import Role, has_role


def deadline_policy(request: HttpRequest) -> dict[str, Any] | HttpResponse:
    """The deadline policy (admins edit it; every deadline follows) and its per-cluster overrides."""
    is_admin = has_role(request.user, Role.ADMIN)
    form = DeadlinePolicyForm(request.POST or None, instance=DeadlinePolicy.current())
    if request.method == "POST":
        if not is_admin:
            raise PermissionDenied("admins change the deadline policy")
        if form.is_valid():
            values = {k: form.cleaned_data[k] for k in services.POLICY_FIELDS}
            try:
                services.set_deadline_policy(request.user, values)
            except services.DecisionError as exc:
                messages.error(request, str(exc))
            else:
                messages.success(request, "Deadline policy saved; every open deadline follows it.")
                return redirect("settings")
    overrides = ClusterDeadlineOverride.objects.select_related("cluster").order_by("cluster__name", "severity")
    return {"form": form, "is_admin": is_admin, "overrides": overrides}


def node_exposures(request: HttpRequest, node: Any) -> dict[str, Any]:
    return {"exposures": list(Exposure.objects.filter(node=node).select_related("advisory", "affected_range")
                              .order_by("state", "deadline")[:200]),
            "now": timezone.now()}


SETTINGS = (PageSection("deadline-policy", order=10, template="advisories/_settings_policy.html",
                        context=deadline_policy),)
NODE = (PageSection("exposures", order=10, template="advisories/_node_exposures.html", context=node_exposures),)
