"""Cached API list answers: the rendered bytes of a GET, reused until a table it read is written.

A list of 100 nodes or exposures costs 30 ms of serializer work and, for a filtered exposure
list, 70 ms of COUNT(*) over 480,000 rows; a fleet's dashboards ask the same few pages again
and again. `CachedListMixin` stores the JSON a list rendered under the data generations
(gpusweep.datagen) of the tables the view declares in `cache_tables`, read before its queries,
so an answer is served only while none of those tables has been written since: a write is
visible in the next GET, and a hit is byte for byte the answer the view would render.

Authentication and permissions run first on every request (a revoked token or a role taken away
takes effect at once); the key holds the database's identity, the caller's roles, the scheme and
host (the pagination links name them), the path with its query string as sent, and the
negotiated media type. Only JSON is cached (the browsable API shows the user), only status 200,
and nothing while this connection's own transaction has written (datagen.current says None). A
view whose answer changes with the clock says until when it holds (`cache_valid_until`), and
names the query parameters that make the rows themselves depend on the clock
(`cache_uncacheable_params`).

One thread computes a missing answer: the others of its process asking for the same key wait for
it (`flight`) and then read what it kept. Threaded workers (`gunicorn -k gthread --threads 8`)
otherwise all miss together after every write and compute the same answer at once, each on an
eighth of the interpreter (the GIL): the uncached path taken 24 times over per write, which is
what made gthread collapse under writes (issue 33, docs/scaling.md). A waiter gives up after
FLIGHT_WAIT_S and computes itself.

The database counts every write, whoever makes it (psql included), so an answer is never
served after a write of a table it read; GPUSWEEP_RESPONSE_CACHE_S bounds its life in the cache
(memory, not correctness).

Bounded staleness, opt in (GPUSWEEP_ANSWER_STALE_S = S, 0 by default): a fleet writes its node and
exposure tables several times a second (campaign steps, heartbeat flushes, syncs), and with the
rule above every such write sends the next reader of each list through the uncached path. With S
> 0 an answer whose tables were written since is still served while it is younger than S seconds
(its age counted from the moment its computation began, before it read its generations): a write
shows in every list within S seconds, not at the next request. The first request that finds it
older than S/2 recomputes it (one request for all processes: a marker added to the shared cache)
while the others are served the kept one; past S it is never served. A stale answer carries an
`Age` header (its age in whole seconds). Authentication and roles are untouched by it: a revoked
token or a role taken away count at the next request as before.

GPUSWEEP_RESPONSE_CACHE_S = 0 turns the cache off, and so does a cache that is not shared by
every process (gpusweep.datagen.enabled).
"""

from __future__ import annotations

import builtins
import datetime as dt
import hashlib
import logging
import pickle
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from django.conf import settings
from django.core.cache import cache
from django.http import HttpResponse
from django.utils import timezone
from rest_framework.request import Request
from rest_framework.response import Response

from gpusweep import datagen
from gpusweep.bounded import BoundedMap
from gpusweep.roles import user_roles

# Headers of the rendered answer that a hit repeats (the middleware after the view adds the rest).
KEPT_HEADERS = ("Content-Type", "Vary", "Allow")

T = TypeVar("T")
log = logging.getLogger(__name__)


FLIGHT_WAIT_S = 30.0
_flights: dict[str, list[Any]] = {}  # key -> [lock, threads holding or waiting for it]
_flights_lock = threading.Lock()


def _board(key: str) -> threading.Lock:
    with _flights_lock:
        flight = _flights.setdefault(key, [threading.Lock(), 0])
        flight[1] += 1
        return cast(threading.Lock, flight[0])


def _land(key: str, lock: threading.Lock, held: bool) -> None:
    if held:
        lock.release()
    with _flights_lock:
        flight = _flights.get(key)
        if flight is not None:
            flight[1] -= 1
            if flight[1] == 0:
                del _flights[key]


@contextmanager
def flight(key: str) -> Iterator[None]:
    """Run the block in one thread of this process at a time for `key` (waiting at most
    FLIGHT_WAIT_S), so the threads that miss one cached value compute it once."""
    lock = _board(key)
    held = lock.acquire(timeout=FLIGHT_WAIT_S)
    try:
        yield
    finally:
        _land(key, lock, held)


class _Store:
    def __init__(self, key: str, generations: datagen.Generations, started: dt.datetime,
                 refreshing: bool = False) -> None:
        self.key, self.generations, self.started = key, generations, started
        self.refreshing = refreshing  # this request holds the stale answer's refresh marker


def _clock() -> float:
    """Seconds since the epoch (a function, so tests can move time)."""
    return time.time()


def _stale_servable(key: str, entry: Any) -> bool | None:
    """For a kept answer whose generations are not the current ones: True to serve it, None when
    this request is to recompute it holding the refresh marker, False to compute as on a miss
    (module doc: bounded staleness)."""
    bound = float(settings.GPUSWEEP_ANSWER_STALE_S)
    if bound <= 0 or entry is None or len(entry) < 4:
        return False
    age = _clock() - float(entry[3])
    if age > bound:
        return False
    if age <= bound / 2:
        return True
    try:  # one refresher for every process: the first to add the marker
        mine = cache.add(key + ":refresh", 1, timeout=max(1, int(bound)))
    except datagen.CACHE_ERRORS:
        return False
    return None if mine else True


def _key(request: Request, view_name: str, scope: str) -> str:
    roles = ",".join(sorted(user_roles(request.user)))
    raw = "\n".join((scope, view_name, roles, request.scheme or "", request.get_host(),
                     request.get_full_path(), request.accepted_media_type or ""))
    return "gpusweep:answer:" + hashlib.sha256(raw.encode()).hexdigest()


class CachedListMixin:
    """For a ReadOnlyModelViewSet (or any GenericViewSet with `list`) whose list depends only on
    the rows of `cache_tables` and the caller's roles."""

    cache_tables: Sequence[str] = ()
    cache_uncacheable_params: Sequence[str] = ()
    _cache_store: _Store | None = None
    _cache_page: builtins.list[Any] | None = None
    _cache_flight: tuple[str, threading.Lock, bool] | None = None

    def cache_valid_until(self, rows: builtins.list[Any], started: dt.datetime) -> dt.datetime | None:
        """When the answer built from `rows` at `started` stops being the one the view would render
        (None: not before its tables are written)."""
        return None

    def _cacheable(self, request: Request) -> bool:
        ttl: int = settings.GPUSWEEP_RESPONSE_CACHE_S
        renderer = getattr(request, "accepted_renderer", None)
        return (ttl > 0 and request.method in ("GET", "HEAD") and bool(self.cache_tables) and datagen.enabled()
                and renderer is not None and renderer.format == "json"
                and not any(p in request.query_params for p in self.cache_uncacheable_params))

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        if not self._cacheable(request):
            return super().list(request, *args, **kwargs)  # type: ignore[misc]
        started = timezone.now()
        generations = datagen.current(self.cache_tables)  # before any query of the answer's rows
        if generations is None:
            return super().list(request, *args, **kwargs)  # type: ignore[misc]
        key = _key(request, type(self).__qualname__, generations.scope)
        try:
            entry = cache.get(key)
        except datagen.CACHE_ERRORS:
            log.warning("cache unreachable: answering %s uncached", request.path, exc_info=True)
            return super().list(request, *args, **kwargs)  # type: ignore[misc]
        refreshing = False
        if entry is not None and entry[0] != generations.values:
            servable = _stale_servable(key, entry)
            if servable:
                hit = self._hit(entry)
                hit["Age"] = str(max(0, int(_clock() - float(entry[3]))))
                return cast(Response, hit)
            refreshing = servable is None
        if not refreshing and (entry is None or entry[0] != generations.values):
            # A miss: wait for a thread of this process computing the same answer (released by
            # dispatch, once finalize_response has kept it), then look again.
            lock = _board(key)
            self._cache_flight = (key, lock, lock.acquire(timeout=FLIGHT_WAIT_S))
            try:
                entry = cache.get(key)
            except datagen.CACHE_ERRORS:
                entry = None
        if entry is not None and entry[0] == generations.values:
            return cast(Response, self._hit(entry))  # DRF takes any HttpResponse from a handler (no rendering)
        self._cache_store = _Store(key, generations, started, refreshing)
        return super().list(request, *args, **kwargs)  # type: ignore[misc]

    @staticmethod
    def _hit(entry: Any) -> HttpResponse:
        hit = HttpResponse(entry[1], status=200)
        for name, value in entry[2]:
            hit[name] = value
        return hit

    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().dispatch(request, *args, **kwargs)  # type: ignore[misc]
        finally:
            held, self._cache_flight = self._cache_flight, None
            if held is not None:
                _land(*held)

    def paginate_queryset(self, queryset: Any) -> builtins.list[Any] | None:
        page: builtins.list[Any] | None = super().paginate_queryset(queryset)  # type: ignore[misc]
        self._cache_page = page
        return page

    def finalize_response(self, request: Request, response: Response, *args: Any, **kwargs: Any) -> Response:
        response = super().finalize_response(request, response, *args, **kwargs)  # type: ignore[misc]
        store, self._cache_store = self._cache_store, None
        try:
            return self._keep(request, response, store)
        finally:
            if store is not None and store.refreshing:
                try:  # the next request past S/2 may refresh it again
                    cache.delete(store.key + ":refresh")
                except datagen.CACHE_ERRORS:
                    pass

    def _keep(self, request: Request, response: Response, store: _Store | None) -> Response:
        if store is None or not isinstance(response, Response) or response.status_code != 200:
            return response
        ttl = float(settings.GPUSWEEP_RESPONSE_CACHE_S)
        rows = self._cache_page if self._cache_page is not None else []
        until = self.cache_valid_until(rows, store.started)
        if until is not None:
            ttl = min(ttl, (until - timezone.now()).total_seconds())
        response.render()
        if ttl >= 1:
            headers = [(name, response[name]) for name in KEPT_HEADERS if response.has_header(name)]
            try:
                cache.set(store.key, (store.generations.values, response.content, headers, store.started.timestamp()),
                          timeout=int(ttl))
            except datagen.CACHE_ERRORS:
                log.warning("cache unreachable: %s not kept", request.path, exc_info=True)
        return response


def cached(name: str, tables: Sequence[str], compute: Callable[[], tuple[T, dt.datetime | None]]) -> T:
    """`compute()`'s value, kept under the generations of `tables` (all it reads) until one of them
    is written or the moment `compute` returns with it (None: no such moment) passes: in the shared
    cache, or without one in this process's memory."""
    ttl: int = settings.GPUSWEEP_RESPONSE_CACHE_S
    if ttl <= 0:
        return compute()[0]
    generations = datagen.current(tables)  # before compute() reads anything
    if generations is None:
        return compute()[0]
    key = f"gpusweep:value:{generations.scope}:{name}"
    if not datagen.enabled():  # no shared cache: this process's memory, under the same generations
        return _kept_here(key, generations, compute, ttl)
    try:
        entry = cache.get(key)
    except datagen.CACHE_ERRORS:
        log.warning("cache unreachable: %s computed", name, exc_info=True)
        return compute()[0]
    if entry is not None and entry[0] == generations.values and (entry[2] is None or entry[2] > timezone.now()):
        return cast(T, entry[1])
    with flight(key):
        return _compute_and_keep(key, name, generations, compute, ttl)


# Values kept in this process's memory where there is no shared cache (a token's check, with the
# cache off, issue 33). Pickled, so every caller gets its own copy (a token's user becomes the
# request's user), as from the shared cache; kept under the generations read from the database on
# this request, which every process's writes raise (and psql's): as correct as the shared cache.
_KEPT_HERE = 1024  # values; the oldest goes first
_here: BoundedMap[str, tuple[tuple[int, ...], bytes, dt.datetime | None, float]] = BoundedMap(_KEPT_HERE)


def _here_get(key: str, generations: datagen.Generations) -> tuple[bool, Any]:
    entry = _here.get(key)
    if (entry is None or entry[0] != generations.values or entry[3] <= time.monotonic()
            or (entry[2] is not None and entry[2] <= timezone.now())):
        return False, None
    return True, pickle.loads(entry[1])


def _kept_here(key: str, generations: datagen.Generations, compute: Callable[[], tuple[T, dt.datetime | None]],
               ttl: int) -> T:
    found, value = _here_get(key, generations)
    if found:
        return cast(T, value)
    with flight(key):
        found, value = _here_get(key, generations)  # another thread may have kept it meanwhile
        if found:
            return cast(T, value)
        computed, until = compute()
        life = ttl if until is None else min(ttl, (until - timezone.now()).total_seconds())
        if life >= 1:
            kept = (generations.values, pickle.dumps(computed, pickle.HIGHEST_PROTOCOL), until, time.monotonic() + life)
            _here.put(key, kept)
        return computed


def _compute_and_keep(key: str, name: str, generations: datagen.Generations,
                      compute: Callable[[], tuple[T, dt.datetime | None]], ttl: int) -> T:
    try:  # another thread of this process may have kept it while this one waited
        entry = cache.get(key)
    except datagen.CACHE_ERRORS:
        entry = None
    if entry is not None and entry[0] == generations.values and (entry[2] is None or entry[2] > timezone.now()):
        return cast(T, entry[1])
    value, until = compute()
    life = ttl if until is None else min(ttl, (until - timezone.now()).total_seconds())
    if life >= 1:
        try:
            cache.set(key, (generations.values, value, until), timeout=int(life))
        except datagen.CACHE_ERRORS:
            log.warning("cache unreachable: %s not kept", name, exc_info=True)
    return value
