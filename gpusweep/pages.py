"""Small helpers shared by the server-rendered pages."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from typing import Any

from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import Resolver404, resolve


def paginate(request: HttpRequest, queryset: QuerySet[Any], per_page: int = 100) -> Page[Any]:
    return Paginator(queryset, per_page).get_page(request.GET.get("page"))


def csv_response(filename: str, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> HttpResponse:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    response = HttpResponse(buffer.getvalue(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def installed(path: str) -> bool:
    """Whether a page of another part of the console is installed (reports, webhooks, tokens), so a
    link is shown only where it leads somewhere."""
    try:
        resolve(path)
    except Resolver404:
        return False
    return True
