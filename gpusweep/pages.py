"""Small helpers shared by the server-rendered pages."""

from __future__ import annotations

import csv
import io
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from django.core.cache import cache
from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import Resolver404, resolve

T = TypeVar("T")


def paginate(request: HttpRequest, queryset: QuerySet[Any] | Sequence[Any], per_page: int = 100) -> Page[Any]:
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


_refreshing: dict[str, threading.Lock] = {}
_guard = threading.Lock()


def cached_figures(key: str, compute: Callable[[], T], max_age_s: float) -> tuple[T, float]:
    """`compute()`'s result, at most `max_age_s` old, and when it was computed (epoch seconds).

    Fleet-wide figures take a second or two on 100,000 nodes; pages show them from the cache.
    A stale value is served while one thread of the process recomputes it (the others do not wait);
    only the very first computation is waited for.
    """
    entry = cache.get(key)
    now = time.time()
    if entry is not None and now - entry[0] <= max_age_s:
        return entry[1], entry[0]
    with _guard:
        lock = _refreshing.setdefault(key, threading.Lock())
    if entry is not None and not lock.acquire(blocking=False):
        return entry[1], entry[0]  # another thread is recomputing it
    if entry is None:
        lock.acquire()
        entry = cache.get(key)
        if entry is not None and time.time() - entry[0] <= max_age_s:
            lock.release()
            return entry[1], entry[0]
    try:
        started = time.time()
        value = compute()
        cache.set(key, (started, value), timeout=max(600, 10 * max_age_s))
        return value, started
    finally:
        lock.release()
