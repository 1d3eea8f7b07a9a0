"""The lists' pagination: limit/offset with bounded numbers, or keyset (cursor) pages on request,
and counts kept per data generation.

Limit/offset (the default, as every client has used it): `?limit=100&offset=200`. A value out of
range is a 400, never a query (DRF's own class passes any integer to the database, where a
20-digit limit fails the query). The database still walks every row before the offset, so a deep
page of a 500,000-row list costs what the rows before it cost.

Keyset (opt-in): `?cursor=` (empty) asks for the first page, and every answer's `next` is a link
with `cursor=<token>` to the page after the last row shown: the next page starts where the index
left off (`WHERE (deadline, id) < (last deadline, last id)`), at the same cost on page 1 and page
5,000, and a row inserted or deleted meanwhile neither repeats nor skips a row. The order is the
list's (`ordering=`, else the model's) with the primary key added where the order is not unique,
so rows tied in the sort key are split by id; NULLs come last going up and first going down (the
PostgreSQL order, so its indexes serve both ways). The token is signed: it carries the order it was
made for (another `ordering` with it is a 400) and the last row's sort values. `previous` is null:
a client walks forward (a ticketing sync) and starts again from `cursor=` for the first page.

Counts: the `count` of a list whose view declares `cache_tables` (gpusweep.responses) is kept
under the data generations (gpusweep.datagen) of those tables, read before the count, in this
process and in the shared cache when there is one: it is counted again after a write of one of
them (the next request sees it), not on every request. Keeping it in one process's memory is safe,
unlike a whole answer: its key holds the generations read from the database on this request.
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import logging
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core import signing
from django.core.cache import cache
from django.db.models import F, Model, OrderBy, Q, QuerySet, UniqueConstraint
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request
from rest_framework.utils.urls import remove_query_param, replace_query_param

from gpusweep import datagen
from gpusweep.bounded import BoundedMap
from gpusweep.responses import flight
from gpusweep.roles import user_roles

MAX_LIMIT = 1000
MAX_OFFSET = 2**31 - 1
CURSOR = "cursor"
_SALT = "gpusweep.pagination.cursor"
# Parameters that change which page, not which rows: the count does not depend on them.
PAGE_PARAMS = frozenset({"limit", "offset", CURSOR, "ordering", "format"})
_KEPT_COUNTS = 4096  # per process; the oldest goes first

log = logging.getLogger(__name__)
_counts: BoundedMap[str, int] = BoundedMap(_KEPT_COUNTS)  # gthread workers: threads share it


def _bounded(request: Request, name: str, low: int, high: int, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError({name: [f"a whole number from {low} to {high}"]}) from None
    if not low <= value <= high:
        raise ValidationError({name: [f"a whole number from {low} to {high}"]})
    return value


def _count_key(request: Request, view: Any, generations: datagen.Generations) -> str:
    params = sorted((k, v) for k in request.query_params if k not in PAGE_PARAMS
                    for v in request.query_params.getlist(k))
    raw = repr((generations.scope, generations.values, type(view).__qualname__, getattr(view, "action", None),
                request.path, sorted(user_roles(request.user)), params))
    return "gpusweep:count:" + hashlib.sha256(raw.encode()).hexdigest()


def list_count(queryset: QuerySet[Any], request: Request, view: Any) -> int:
    """`queryset.count()`, kept under the generations of the view's `cache_tables` (module doc)."""
    tables: Sequence[str] = getattr(view, "cache_tables", ())
    clock: Sequence[str] = getattr(view, "cache_uncacheable_params", ())
    if not tables or any(p in request.query_params for p in clock):
        return int(queryset.count())
    generations = datagen.current(tables)  # before the count reads a row
    if generations is None:  # this transaction has written, or the tables have no generations
        return int(queryset.count())
    key = _count_key(request, view, generations)
    with flight(key):  # the threads of this process that miss it count once
        found = _kept(key)
        shared = datagen.enabled() and settings.GPUSWEEP_RESPONSE_CACHE_S > 0
        if found is None and shared:
            try:
                found = cache.get(key)
            except datagen.CACHE_ERRORS:
                log.warning("cache unreachable: counting %s", request.path, exc_info=True)
        if found is None:
            found = int(queryset.count())
            if shared:
                try:
                    cache.set(key, found, timeout=settings.GPUSWEEP_RESPONSE_CACHE_S)
                except datagen.CACHE_ERRORS:
                    log.warning("cache unreachable: count of %s not kept", request.path, exc_info=True)
        _counts.put(key, found)
    return found


def _kept(key: str) -> int | None:
    return _counts.get(key)


def _ordering(queryset: QuerySet[Any]) -> list[str]:
    """The queryset's order as field names (a leading - for descending), ending in a unique key."""
    given = list(queryset.query.order_by) or list(queryset.model._meta.ordering)
    terms = [t for t in given if isinstance(t, str) and not t.startswith("?")]
    if queryset.query.extra_order_by or len(terms) != len(given):
        raise ValidationError({CURSOR: ["this list's order cannot be paged by cursor; use offset"]})
    names = [t.lstrip("-") for t in terms]
    if not _unique(queryset.model, names):
        terms.append("-pk" if terms and terms[-1].startswith("-") else "pk")
    return terms


def _unique(model: type[Model], names: list[str]) -> bool:
    """Whether these (local) fields include the primary key or a unique constraint of the model."""
    meta = model._meta
    by_column = {f.attname: f.name for f in meta.fields}  # cluster_id -> cluster
    local = {meta.pk.name if n == "pk" else by_column.get(n, n) for n in names if "__" not in n}
    if meta.pk.name in local or any(f.name in local for f in meta.fields if f.unique and not f.null):
        return True
    groups = [set(c.fields) for c in meta.constraints
              if isinstance(c, UniqueConstraint) and c.fields and c.condition is None]
    groups += [set(fields) for fields in meta.unique_together]
    nullable = {f.name for f in meta.fields if f.null}
    return any(group <= local and not group & nullable for group in groups)


def _order_by(term: str) -> OrderBy:
    name = term.lstrip("-")
    return F(name).desc(nulls_first=True) if term.startswith("-") else F(name).asc(nulls_last=True)


def _after(terms: list[str], values: list[Any]) -> Q:
    """Rows after the one with `values` in the order of `terms` (NULLs last up, first down)."""
    after = Q(pk__in=[])
    equal = Q()
    for term, value in zip(terms, values, strict=True):
        name, down = term.lstrip("-"), term.startswith("-")
        if value is None:
            beyond = Q(**{f"{name}__isnull": False}) if down else Q(pk__in=[])
            same = Q(**{f"{name}__isnull": True})
        else:
            beyond = Q(**{f"{name}__lt": value}) if down else (Q(**{f"{name}__gt": value})
                                                               | Q(**{f"{name}__isnull": True}))
            same = Q(**{name: value})
        after |= equal & beyond
        equal &= same
    first, value = terms[0].lstrip("-"), values[0]
    if terms[0].startswith("-") and value is not None:
        # The same rows, with a bound on the first column that an index can start its scan from.
        after &= Q(**{f"{first}__lte": value})
    elif not terms[0].startswith("-") and value is None:
        after &= Q(**{f"{first}__isnull": True})
    return after


def _plain(value: Any) -> Any:
    """A sort value as JSON keeps it (the filter parses it back: times and decimals as text)."""
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, dt.timedelta)):
        return str(value)
    return value


def _sort_values(row: Any, terms: list[str]) -> list[Any]:
    values = []
    for term in terms:
        value = row
        for part in term.lstrip("-").split("__"):
            value = None if value is None else getattr(value, part)
        values.append(_plain(value))
    return values


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """Limit/offset, or keyset pages with `cursor` (module doc); counts kept per generation."""

    max_limit = MAX_LIMIT
    cursor_query_param = CURSOR
    _terms: list[str] | None = None
    _view: Any = None
    _next_values: list[Any] | None = None

    def get_limit(self, request: Request) -> int:
        return _bounded(request, self.limit_query_param, 1, MAX_LIMIT, int(self.default_limit or 100))

    def get_offset(self, request: Request) -> int:
        return _bounded(request, self.offset_query_param, 0, MAX_OFFSET, 0)

    def get_count(self, queryset: Any) -> int:
        if isinstance(queryset, QuerySet) and self._view is not None and self.request is not None:
            return list_count(queryset, self.request, self._view)
        return int(super().get_count(queryset))

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> list[Any] | None:
        self._view, self._terms, self._next_values = view, None, None
        if self.cursor_query_param not in request.query_params:
            return super().paginate_queryset(queryset, request, view)
        if self.offset_query_param in request.query_params:
            raise ValidationError({self.offset_query_param: ["give a cursor or an offset, not both"]})
        self.request = request
        self.limit = self.get_limit(request)
        self.offset = 0
        terms = _ordering(queryset)
        raw = request.query_params.get(self.cursor_query_param, "")
        rows = queryset.order_by(*(_order_by(t) for t in terms))
        if raw:
            try:
                token = signing.loads(raw, salt=_SALT)
            except signing.BadSignature:
                raise ValidationError({self.cursor_query_param: ["not a cursor this list gave"]}) from None
            if token.get("o") != terms:
                raise ValidationError({self.cursor_query_param: ["made for another ordering; start again with "
                                                                 "cursor= (empty)"]})
            rows = rows.filter(_after(terms, token["v"]))
        self.count = self.get_count(queryset)
        page = list(rows[: self.limit + 1])
        if len(page) > self.limit:
            page = page[: self.limit]
            last = page[-1]
            if isinstance(last, Model):
                self._next_values = _sort_values(last, terms)
            else:  # a narrow page (its primary keys): the last row's sort values in one indexed read
                found = queryset.filter(pk=last).prefetch_related(None).values_list(
                    *(t.lstrip("-") for t in terms)).get()
                self._next_values = [_plain(v) for v in found]
        self._terms = terms
        return page

    def get_next_link(self) -> str | None:
        if self._terms is None:
            return super().get_next_link()
        if self._next_values is None:
            return None
        token = signing.dumps({"o": self._terms, "v": self._next_values}, salt=_SALT, compress=True)
        assert self.request is not None  # set by paginate_queryset
        url = remove_query_param(self.request.build_absolute_uri(), self.offset_query_param)
        return replace_query_param(url, self.cursor_query_param, token)

    def get_previous_link(self) -> str | None:
        return None if self._terms is not None else super().get_previous_link()

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        bounds = {self.limit_query_param: (1, MAX_LIMIT), self.offset_query_param: (0, MAX_OFFSET)}
        for parameter in parameters:
            low, high = bounds[parameter["name"]]
            parameter["schema"] = {"type": "integer", "minimum": low, "maximum": high}
        parameters.append({
            "name": self.cursor_query_param, "required": False, "in": "query",
            "description": "keyset paging: empty for the first page, then the token in `next` (instead of offset)",
            "schema": {"type": "string"},
        })
        return parameters
