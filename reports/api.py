"""REST API under /api/v1/reports/: the auditors' reports (reports.views), as a PDF, CSV or JSON file.

``campaigns/{id}/report.{fmt}``, ``advisories/{id}/report.{fmt}``, ``pending.{fmt}`` (``?cluster=``).
Any role reads. The answer is the file itself whatever the Accept header says; errors are JSON.
"""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpResponse
from django.urls import URLPattern, re_path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.request import Request
from rest_framework.views import APIView

from gpusweep.filters import refuse_unknown_params
from reports import render
from reports.views import respond

FILE = {(200, "application/pdf"): OpenApiTypes.BINARY, (200, "text/csv"): OpenApiTypes.STR,
        (200, "application/json"): OpenApiTypes.OBJECT}
FMT = OpenApiParameter("fmt", str, OpenApiParameter.PATH, enum=list(render.FORMATS), description="pdf, csv or json")
ID = OpenApiParameter("id", int, OpenApiParameter.PATH)
ADVISORY_ID = OpenApiParameter("id", str, OpenApiParameter.PATH,
                               description="the advisory's public id, e.g. nvidia-5703")


class FirstRenderer(BaseContentNegotiation):
    """The report is a file in the format its URL names: the Accept header does not pick (no 406)."""

    def select_parser(self, request: Request, parsers: Any) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Request, renderers: Any, format_suffix: str | None = None) -> Any:
        return renderers[0], renderers[0].media_type


class ReportView(APIView):
    content_negotiation_class = FirstRenderer
    kind = ""
    params: set[str] = set()

    def _answer(self, request: Request, pk: int | str | None, fmt: str) -> HttpResponse:
        refuse_unknown_params(request, self.params)
        try:
            return respond(self.kind, pk, fmt, request.user, request.query_params.get("cluster") or None)
        except Http404 as exc:
            raise NotFound(str(exc)) from None


class CampaignReport(ReportView):
    kind = "campaign"

    @extend_schema(parameters=[ID, FMT], responses=FILE, operation_id="reports_campaign")
    def get(self, request: Request, id: int, fmt: str) -> HttpResponse:
        """A campaign's report: scope, advisories and CVEs, plan and approvals, every node's versions and
        timings, workloads moved, exceptions, and the evidence verification with the signed head."""
        return self._answer(request, id, fmt)


class AdvisoryReport(ReportView):
    kind = "advisory"

    @extend_schema(parameters=[ADVISORY_ID, FMT], responses=FILE, operation_id="reports_advisory")
    def get(self, request: Request, id: str, fmt: str) -> HttpResponse:
        """Every node ever exposed to the advisory and its outcome."""
        return self._answer(request, id, fmt)


class PendingReport(ReportView):
    kind = "pending"
    params = {"cluster"}

    @extend_schema(parameters=[FMT, OpenApiParameter("cluster", str, description="only this cluster's nodes")],
                   responses=FILE, operation_id="reports_pending")
    def get(self, request: Request, fmt: str) -> HttpResponse:
        """Every open or presumed exposure with its deadline and the date of the campaign scheduled for it."""
        return self._answer(request, None, fmt)


class Router:
    """The URL list gpusweep.api includes (``router.urls``), as the apps' DRF routers give it."""

    @property
    def urls(self) -> list[URLPattern]:
        return [
            re_path(r"^campaigns/(?P<id>[0-9]{1,18})/report\.(?P<fmt>pdf|csv|json)$", CampaignReport.as_view(),
                    name="campaign-report"),
            re_path(r"^advisories/(?P<id>[a-z0-9]+-[^/]{1,60})/report\.(?P<fmt>pdf|csv|json)$",
                    AdvisoryReport.as_view(), name="advisory-report"),
            re_path(r"^pending\.(?P<fmt>pdf|csv|json)$", PendingReport.as_view(), name="pending-report"),
        ]


router = Router()
