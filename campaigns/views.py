"""Campaign pages: plan, approve and run sweeps, follow their progress, export the evidence."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from advisories.identifiers import resolve_all
from campaigns import board, evidence, services, wizard
from campaigns.models import Campaign, EvidenceEvent
from gpusweep.middleware import accepts_token
from gpusweep.pages import csv_response, installed, paginate
from gpusweep.roles import Role, has_role, user_roles


def campaign_list(request: HttpRequest) -> HttpResponse:
    campaigns = Campaign.objects.select_related("requested_by").order_by("-created_at")
    return render(request, "campaigns/campaign_list.html", {
        "page": paginate(request, campaigns), "can_create": has_role(request.user, Role.OPERATOR),
    })


def _wizard_context(form: wizard.CampaignForm) -> dict[str, Any]:
    chosen = {str(v) for v in (form["advisories"].value() or [])}
    advisories = wizard.advisory_choices()
    return {
        "form": form, "chosen_advisories": chosen,
        # Those affecting the fleet first; the rest behind a toggle, open when one of them is chosen.
        "exposing": [a for a in advisories if a["exposed"]],
        "others": [a for a in advisories if not a["exposed"]],
        "others_chosen": any(a["id"] in chosen for a in advisories if not a["exposed"]),
        "window_rows": [_row(form, "win", i) for i in range(wizard.WINDOW_ROWS)],
        "blackout_rows": [_row(form, "bo", i) for i in range(wizard.BLACKOUT_ROWS)],
        "days": wizard.DAYS, "time_zones": wizard.TIME_ZONES,
    }


def _row(form: wizard.CampaignForm, prefix: str, i: int) -> dict[str, Any]:
    data = form.data
    days = data.getlist(f"{prefix}_days_{i}") if hasattr(data, "getlist") else []
    return {"i": i, "start": data.get(f"{prefix}_start_{i}", ""), "end": data.get(f"{prefix}_end_{i}", ""),
            "tz": data.get(f"{prefix}_tz_{i}", "UTC"), "days": set(days)}


def campaign_create(request: HttpRequest) -> HttpResponse:
    """The campaign wizard: scope, windows, limits and policy; preview the plan; create and plan it."""
    if not has_role(request.user, Role.OPERATOR):
        raise PermissionDenied("operators create campaigns")
    form = wizard.CampaignForm(request.POST or None, initial=wizard.initial_from(request.GET))
    if request.method == "POST" and form.is_valid():
        assert isinstance(request.user, User)
        try:
            campaign = services.create_campaign(request.user, form.definition(), form.advisory_ids())
        except services.DefinitionError as exc:
            for name, message in exc.errors.items():
                form.add_error(None, f"{name}: {message}")
        else:
            if request.POST.get("then") == "plan":
                try:
                    services.make_plan(campaign.pk, request.user)
                except services.CampaignError as exc:
                    messages.error(request, f"Campaign {campaign.name} created, but it could not be planned: {exc}")
                else:
                    messages.success(request, f"Campaign {campaign.name} created and planned; an approver approves "
                                              "it next.")
            else:
                messages.success(request, f"Campaign {campaign.name} created; make a plan next.")
            return redirect("campaigns-ui:campaign-detail", pk=campaign.pk)
    return render(request, "campaigns/campaign_form.html", _wizard_context(form))


def campaign_match(request: HttpRequest) -> HttpResponse:
    """The wizard's live count of the nodes its scope selects (htmx swaps it in as the scope changes)."""
    names = [n.strip() for n in request.GET.get("node_names", "").split(",") if n.strip()]
    advisories, _unknown = resolve_all(request.GET.getlist("advisories"))  # public ids, as the checkboxes send
    found = wizard.matched(request.GET.getlist("clusters"), request.GET.getlist("pools"), names,
                           [a.pk for a in advisories])
    return render(request, "campaigns/_match.html", found)


@require_POST
def campaign_preview(request: HttpRequest) -> HttpResponse:
    """The plan the wizard's current values would get, as a timeline, without keeping anything."""
    if not has_role(request.user, Role.OPERATOR):
        raise PermissionDenied("operators plan campaigns")
    assert isinstance(request.user, User)
    form = wizard.CampaignForm(request.POST)
    context: dict[str, Any] = {"form": form}
    if form.is_valid():
        try:
            content = wizard.preview(request.user, form.definition(), form.advisory_ids())
        except services.CampaignError as exc:
            context["error"] = str(exc)
        else:
            advisories = list(form.cleaned_data.get("advisories") or [])
            context["plan_view"] = board.plan_view(content, form.cleaned_data.get("deadline"), advisories)
    return render(request, "campaigns/_preview.html", context)


def _page_context(request: HttpRequest, campaign: Campaign) -> dict[str, Any]:
    plan = campaign.plans.order_by("-version").first()
    advisories = list(campaign.advisories.all())
    authors = services.authors(campaign, plan) if plan else set()
    return {
        "campaign": campaign,
        "plan": plan,
        "plan_view": board.plan_view(plan.content, campaign.deadline, advisories) if plan else None,
        "approvals": campaign.approvals.select_related("user", "plan").order_by("at"),
        "board": board.board(campaign, plan),
        "events": [(e, board.event_label(e)) for e in
                   campaign.events.select_related("sweep__node").order_by("-at", "-id")[:40]],
        "actions": board.valid_actions(campaign, plan, request.user, authors),
        "labels": board.ACTION_LABELS,
        "can_seal": has_role(request.user, Role.OPERATOR, Role.APPROVER),
        "advisories": advisories,
        "windows": board.windows_text(campaign.windows),
        "reports": [(fmt.upper(), f"/campaigns/{campaign.pk}/report.{fmt}") for fmt in ("pdf", "csv", "json")
                    if installed(f"/campaigns/{campaign.pk}/report.{fmt}")],
    }


def campaign_detail(request: HttpRequest, pk: int) -> HttpResponse:
    campaign = get_object_or_404(Campaign.objects.select_related("requested_by", "approved_plan"), pk=pk)
    return render(request, "campaigns/campaign_detail.html", _page_context(request, campaign))


def campaign_board(request: HttpRequest, pk: int) -> HttpResponse:
    """The live part of the campaign page, which htmx polls while the campaign is not over."""
    campaign = get_object_or_404(Campaign.objects.select_related("requested_by", "approved_plan"), pk=pk)
    return render(request, "campaigns/_board.html", _page_context(request, campaign))


@require_POST
def campaign_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    if action == "seal":  # an explicit, CSRF-protected POST: the only way a page stores a seal
        return _seal(request, pk)
    role = board.ACTION_ROLES.get(action)
    if role is None:
        return HttpResponse(status=404)
    if not has_role(request.user, role):
        raise PermissionDenied(f"{action.replace('_', ' ').capitalize()} needs the {role.value} role; your roles: "
                               f"{', '.join(sorted(r.value for r in user_roles(request.user))) or 'none'}")
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
        messages.success(request, f"{board.ACTION_LABELS[action]}: done.")
    return redirect("campaigns-ui:campaign-detail", pk=pk)


def _seal(request: HttpRequest, pk: int) -> HttpResponse:
    if not has_role(request.user, Role.OPERATOR, Role.APPROVER):
        raise PermissionDenied("sealing needs the operator or approver role")
    get_object_or_404(Campaign, pk=pk)
    services.seal_now(pk, request.user if isinstance(request.user, User) else None)
    messages.success(request, "Evidence sealed: the current heads are signed and kept in the digest store.")
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


@accepts_token
def campaign_evidence(request: HttpRequest, pk: int, fmt: str) -> HttpResponse:
    """The evidence log for auditors: JSON is the signed export `python -m campaigns.verify` checks."""
    campaign = get_object_or_404(Campaign, pk=pk)
    if fmt == "pdf":  # the PDF for auditors is the campaign's report (it carries the verification result)
        return redirect("campaign-report", pk=campaign.pk, fmt="pdf")
    if fmt not in ("csv", "json"):
        raise Http404("evidence is csv or json (the PDF is the report)")
    if fmt == "csv":
        rows = _event_rows(campaign)
        header = ["chain", "seq", "at", "kind", "actor", "node", "data", "prev_hash", "hash"]
        return csv_response(
            f"campaign-{campaign.pk}-evidence.csv", header,
            [[r[h] if h != "data" else json.dumps(r["data"], sort_keys=True) for h in header] for r in rows],
        )
    exported = evidence.export_for_reading(campaign.pk)  # a GET writes nothing (seal: POST .../seal/)
    problems = evidence.verify_campaign(campaign)
    response = JsonResponse({**exported, "verified": not problems, "problems": problems},
                            json_dumps_params={"indent": 2})
    response["Content-Disposition"] = f'attachment; filename="campaign-{campaign.pk}-evidence.json"'
    return response
