"""Campaign pages: plan, approve and run sweeps, follow their progress, export the evidence."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from campaigns import evidence, services
from campaigns.choices import Placement
from campaigns.models import Campaign, EvidenceEvent
from gpusweep.pages import csv_response, paginate
from gpusweep.roles import Role, has_role

# Which role each button needs; the service functions enforce the state rules themselves.
ACTIONS: dict[str, Role] = {
    "plan": Role.OPERATOR,
    "approve": Role.APPROVER,
    "start": Role.OPERATOR,
    "pause": Role.OPERATOR,
    "resume": Role.OPERATOR,
    "abort": Role.OPERATOR,
    "add_last_group": Role.OPERATOR,
    "rollback_completed": Role.OPERATOR,
}


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


class CampaignForm(forms.ModelForm):
    """The UI's campaign fields; validation and saving are the services' (the same as the API's)."""

    # The scope as comma-separated names; the model keeps lists (empty means all).
    cluster_names = forms.CharField(required=False, label="Clusters", help_text="comma separated; empty for all")
    pool_names = forms.CharField(required=False, label="Pools", help_text="comma separated; empty for all")
    site_check_names = forms.CharField(required=False, label="Site health checks",
                                       help_text="the agents' configured checks, comma separated; empty for all")

    class Meta:
        model = Campaign
        fields = [
            "name", "description", "advisories", "cluster_names", "pool_names",
            "parallelism_per_cluster", "parallelism_per_pool", "error_budget",
            "workload_policy", "workload_placement", "held_nodes", "cold_restart_allowed", "canary", "soak_s",
            "wave_growth", "growth_step", "dcgm_level", "site_check_names", "after_rollback", "approvals_required",
            "deadline",
        ]
        widgets = {"deadline": forms.DateTimeInput(attrs={"type": "datetime-local"})}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Left out of a form post, these take the model's defaults.
        for name in ("workload_placement", "held_nodes", "canary", "soak_s", "wave_growth", "growth_step",
                     "dcgm_level", "after_rollback"):
            self.fields[name].required = False

    def definition(self) -> dict[str, Any]:
        values = {k: v for k, v in self.cleaned_data.items() if k in services.DEFINITION_FIELDS}
        values["workload_placement"] = values.get("workload_placement") or Placement.MOVE
        for name in ("held_nodes", "canary", "soak_s", "wave_growth", "growth_step", "dcgm_level", "after_rollback"):
            if values.get(name) in (None, ""):
                values[name] = Campaign._meta.get_field(name).get_default()  # type: ignore[union-attr]
        values["clusters"] = _names(self.cleaned_data.get("cluster_names", ""))
        values["pools"] = _names(self.cleaned_data.get("pool_names", ""))
        values["site_checks"] = _names(self.cleaned_data.get("site_check_names", ""))
        return values

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if not self.errors:
            for name, message in services.definition_errors(self.definition()).items():
                self.add_error(name if name in self.fields else {"clusters": "cluster_names", "pools": "pool_names",
                                                                 "site_checks": "site_check_names"}.get(name), message)
        return cleaned


def campaign_list(request: HttpRequest) -> HttpResponse:
    campaigns = Campaign.objects.select_related("requested_by").order_by("-created_at")
    return render(request, "campaigns/campaign_list.html", {
        "page": paginate(request, campaigns), "can_create": has_role(request.user, Role.OPERATOR),
    })


def campaign_create(request: HttpRequest) -> HttpResponse:
    if not has_role(request.user, Role.OPERATOR):
        raise PermissionDenied("operators create campaigns")
    form = CampaignForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        assert isinstance(request.user, User)
        advisories = [a.pk for a in form.cleaned_data.get("advisories") or []]
        try:
            campaign = services.create_campaign(request.user, form.definition(), advisories)
        except services.DefinitionError as exc:
            for name, message in exc.errors.items():
                form.add_error(None, f"{name}: {message}")
        else:
            messages.success(request, f"Campaign {campaign.name} created; make a plan next.")
            return redirect("campaigns-ui:campaign-detail", pk=campaign.pk)
    return render(request, "campaigns/campaign_form.html", {"form": form})


def campaign_detail(request: HttpRequest, pk: int) -> HttpResponse:
    campaign = get_object_or_404(Campaign.objects.select_related("requested_by", "approved_plan"), pk=pk)
    plan = campaign.plans.order_by("-version").first()
    sweeps = campaign.sweeps.select_related("node").prefetch_related("moves__target_node").order_by("wave", "position")
    return render(request, "campaigns/campaign_detail.html", {
        "campaign": campaign,
        "plan": plan,
        "plan_nodes": sorted((plan.content.get("nodes") or {}).values(), key=lambda n: (n["wave"], n["position"]))
        if plan else [],
        "approvals": campaign.approvals.select_related("user").order_by("at"),
        "sweeps": sweeps,
        # A plain dict: the template looks up ".items" as a key first, which a Counter answers with 0.
        "progress": dict(Counter(sweeps.values_list("state", flat=True))),
        "events": campaign.events.select_related("sweep__node").order_by("-at", "-id")[:50],
        "allowed": {name for name, role in ACTIONS.items() if has_role(request.user, role)},
        "advisories": campaign.advisories.all(),
    })


@require_POST
def campaign_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    role = ACTIONS.get(action)
    if role is None:
        return HttpResponse(status=404)
    if not has_role(request.user, role):
        raise PermissionDenied(f"{action} needs the {role.value} role")
    user = request.user if isinstance(request.user, User) else None
    try:
        if action == "plan":
            services.make_plan(pk, user)
        elif action == "approve":
            assert user is not None
            services.approve(pk, user, request.POST.get("comment", ""))
        elif action == "abort":
            services.abort(pk, user, request.POST.get("reason", ""))
        elif action == "rollback_completed":
            assert user is not None
            created = services.rollback_completed(pk, user)
            messages.success(request, "Rollback campaign(s) created: " + ", ".join(f"#{c.pk}" for c in created))
            return redirect("campaigns-ui:campaign-detail", pk=created[0].pk)
        elif action == "add_last_group":
            assert user is not None
            newest = Campaign.objects.get(pk=pk).plans.order_by("-version").first()
            receivers = [r["node"] for r in (newest.content.get("exposed_receivers", []) if newest else [])]
            services.add_last_group(pk, user, receivers)
        else:
            getattr(services, action)(pk, user)
    except services.CampaignError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"{action.capitalize()}: done.")
    return redirect("campaigns-ui:campaign-detail", pk=pk)


def _event_rows(campaign: Campaign) -> list[dict[str, Any]]:
    rows = []
    for e in EvidenceEvent.objects.filter(campaign=campaign).select_related("sweep__node").order_by("at", "id"):
        step = e.data.get("step") if isinstance(e.data, dict) else None
        rows.append({
            "chain": "campaign" if e.sweep_id is None else f"sweep {e.sweep_id}",
            "seq": e.seq if e.sweep_id is None else e.node_seq, "at": e.at.isoformat(),
            "kind": f"{e.kind}: {step}" if step else e.kind, "actor": e.actor,
            "node": e.sweep.node.name if e.sweep else "", "data": e.data, "prev_hash": e.prev_hash, "hash": e.hash,
        })
    return rows


def campaign_evidence(request: HttpRequest, pk: int, fmt: str) -> HttpResponse:
    """The evidence log for auditors: JSON is the signed export `python -m campaigns.verify` checks."""
    campaign = get_object_or_404(Campaign, pk=pk)
    if fmt == "csv":
        rows = _event_rows(campaign)
        header = ["chain", "seq", "at", "kind", "actor", "node", "data", "prev_hash", "hash"]
        return csv_response(
            f"campaign-{campaign.pk}-evidence.csv", header,
            [[r[h] if h != "data" else json.dumps(r["data"], sort_keys=True) for h in header] for r in rows],
        )
    user = request.user if isinstance(request.user, User) else None
    exported = evidence.export(campaign.pk, services.actor_of(user))
    problems = evidence.verify_campaign(campaign)
    response = JsonResponse({**exported, "verified": not problems, "problems": problems},
                            json_dumps_params={"indent": 2})
    response["Content-Disposition"] = f'attachment; filename="campaign-{campaign.pk}-evidence.json"'
    return response
