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
from django.db import connections
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
    """`compute()`'s result and when it was computed (epoch seconds), from the cache.

    Fleet-wide figures take a second or more on 100,000 nodes. Only the first request of a process
    waits for them; afterwards a value older than `max_age_s` is still served while one background
    thread of the process computes the next. `max_age_s` 0 computes every time (no cache).
    """
    if max_age_s <= 0:
        return compute(), time.time()
    entry = cache.get(key)
    if entry is not None and time.time() - entry[0] <= max_age_s:
        return entry[1], entry[0]
    with _guard:
        lock = _refreshing.setdefault(key, threading.Lock())
    if entry is not None:
        # One refresh per process, and with a cache all processes share, one for all of them
        # (the claim expires by itself should its process die mid-way).
        if lock.acquire(blocking=False):
            if cache.add(key + ":refreshing", 1, timeout=max(60, 10 * max_age_s)):
                threading.Thread(target=_refresh, args=(key, compute, max_age_s, lock), daemon=True).start()
            else:
                lock.release()
        return entry[1], entry[0]
    with lock:  # the first computation of this process: the others wait for it rather than repeat it
        entry = cache.get(key)
        if entry is None:
            entry = _store(key, compute, max_age_s)
    return entry[1], entry[0]


def _store(key: str, compute: Callable[[], T], max_age_s: float) -> tuple[float, T]:
    started = time.time()
    entry = (started, compute())
    cache.set(key, entry, timeout=max(600, 10 * max_age_s))
    return entry


def _refresh(key: str, compute: Callable[[], Any], max_age_s: float, lock: threading.Lock) -> None:
    try:
        _store(key, compute, max_age_s)
    finally:
        cache.delete(key + ":refreshing")
        lock.release()
        connections.close_all()  # this thread's own database connection
