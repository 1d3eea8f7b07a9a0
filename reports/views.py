"""The Reports page (/reports/: every report, with filters) and the auditors' reports as downloads:
/campaigns/<pk>/report.<fmt>, /advisories/<public id>/report.<fmt> and /advisories/pending.<fmt>
(fmt: pdf, csv or json). Any role reads them; a script may send an API
token instead of a session (``accepts_token``). reports.api serves the same under /api/v1/reports/."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render as render_page

from advisories.identifiers import resolve
from campaigns.models import Campaign
from gpusweep.middleware import accepts_token
from gpusweep.roles import user_roles
from reports import collect, listing, render

CONTENT_TYPES = {"pdf": "application/pdf", "csv": "text/csv; charset=utf-8", "json": "application/json"}


def actor_of(user: Any) -> str:
    return f"user:{user.get_username()}" if getattr(user, "is_authenticated", False) else "system"


def build(kind: str, pk: int | str | None, actor: str, cluster: str | None = None) -> tuple[str, dict[str, Any],
                                                                                        list[render.Section]]:
    """(file name without extension, data, sections) of one report; Http404 for an unknown object."""
    if kind == "campaign":
        if pk is None or not Campaign.objects.filter(pk=pk).exists():
            raise Http404("no such campaign")
        data = collect.campaign_report(int(pk), actor)
        return f"campaign-{pk}-report", data, render.campaign_sections(data)
    if kind == "advisory":  # by public id (nvidia-5703)
        advisory = resolve(str(pk or ""))
        if advisory is None:
            raise Http404("no such advisory")
        data = collect.advisory_report(advisory.pk, actor)
        return f"advisory-{advisory.public_id}-report", data, render.advisory_sections(data)
    data = collect.pending_report(actor, cluster)
    return "pending-patches" + (f"-{cluster}" if cluster else ""), data, render.pending_sections(data)


def respond(kind: str, pk: int | str | None, fmt: str, user: Any, cluster: str | None = None) -> HttpResponse:
    if fmt not in render.FORMATS:
        raise Http404("a report is pdf, csv or json")
    name, data, sections = build(kind, pk, actor_of(user), cluster)
    renderers: dict[str, Callable[[], bytes]] = {
        "json": lambda: render.to_json(data), "csv": lambda: render.to_csv(sections),
        "pdf": lambda: render.to_pdf(data["report"]["title"], sections)}
    response = HttpResponse(renderers[fmt](), content_type=CONTENT_TYPES[fmt])
    response["Content-Disposition"] = f'attachment; filename="{name}.{fmt}"'
    return response


def _reader(request: HttpRequest) -> None:
    if not user_roles(request.user):
        raise PermissionDenied("reports need a role (viewer or above)")


@accepts_token
def campaign_report(request: HttpRequest, pk: int, fmt: str) -> HttpResponse:
    _reader(request)
    return respond("campaign", pk, fmt, request.user)


@accepts_token
def advisory_report(request: HttpRequest, public_id: str, fmt: str) -> HttpResponse:
    _reader(request)
    return respond("advisory", public_id, fmt, request.user)


@accepts_token
def pending_report(request: HttpRequest, fmt: str) -> HttpResponse:
    _reader(request)
    return respond("pending", None, fmt, request.user, request.GET.get("cluster") or None)


def report_list(request: HttpRequest) -> HttpResponse:
    """The Reports page: every report (pending patches, advisories, campaigns and their evidence), filtered."""
    _reader(request)
    return render_page(request, "reports/report_list.html", listing.context(request))
