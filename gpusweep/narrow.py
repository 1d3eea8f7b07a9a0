"""Lists built from narrow reads: the page's primary keys first, then only the columns the answer
shows, joined in the database, turned into the serializer's rows without a model instance or a
DRF field per value.

A DRF ModelSerializer costs about 5 us per field and a model instance (with its prefetched
children) about as much again: 35 to 40 ms of CPU for a page of 100 nodes with their components
or 100 exposures, most of a request. A view with this mixin answers `list` from `narrow_rows(ids)`,
which must give what its serializer gives for those rows (the tests compare the two on every row
of the seeded data); retrieve, writes and the schema keep the serializer.
"""

from __future__ import annotations

import builtins
import datetime as dt
import json
import re
from typing import Any

import orjson
from django.core.exceptions import EmptyResultSet
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import F, Func, Lookup, TextField
from django.db.models.functions import Cast
from django.utils import timezone
from rest_framework.request import Request
from rest_framework.response import Response

# DRF's DateTimeField in UTC, written by PostgreSQL: microseconds always (a zero fraction is dropped
# in Times.write), the year in four digits (a year before 1000 zero-padded, as Python writes it).
_ISO_UTC = """to_char(%(expressions)s AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""
_NO_FRACTION = ".000000Z"
_LONG_DIGITS = re.compile(r"\d{19}")


def json_column(name: str) -> Any:
    """A JSON column read as its text, for `json_value`: Django's JSONField decodes each value with
    the json module through its converters (about 25 us a value, 300 values in a page of nodes)."""
    return Cast(name, TextField())


def json_value(text: str | None) -> Any:
    """The value of a `json_column` (orjson: a tenth of the json module's cost), as Django reads it."""
    if text is None:
        return None
    if _LONG_DIGITS.search(text):  # orjson reads an integer past 64 bits as a float: json keeps it whole
        return json.loads(text)
    return orjson.loads(text)


class Times:
    """Time columns read and written as the API writes them (DRF's DateTimeField: ISO 8601 in the
    current zone, Z for +00:00), the zone looked up once per page. Where the zone is UTC and so is
    the PostgreSQL session's (Django's own with USE_TZ), PostgreSQL writes the column as the API
    does (`to_char`, which it renders for the wire anyway: about 1 us a value there) and Python only
    drops a zero fraction (DRF writes none): parsing it into a datetime and formatting that again
    cost about 12 us a value, rewriting PostgreSQL's own text about 8 us, a third of a page of nodes."""

    def __init__(self, using: str = DEFAULT_DB_ALIAS) -> None:
        connection = connections[using]
        self.zone = timezone.get_current_timezone()
        self.as_text = (connection.vendor == "postgresql" and connection.timezone_name == "UTC"
                        and self.zone.utcoffset(None) == dt.timedelta(0) and str(self.zone) in ("UTC", "Etc/UTC"))

    def column(self, name: str) -> Any:
        """An expression reading the column `name` for `write`."""
        return Func(F(name), template=_ISO_UTC, output_field=TextField()) if self.as_text else F(name)

    def write(self, value: dt.datetime | str | None) -> str | None:
        if value is None:
            return None
        if isinstance(value, str):  # "2026-12-07T06:37:40.123400Z"; DRF writes no zero fraction
            return value[:-8] + "Z" if value.endswith(_NO_FRACTION) else value
        if timezone.is_naive(value):  # DRF makes a naive time aware in the zone
            value = timezone.make_aware(value, self.zone)
        text = value.astimezone(self.zone).isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") else text


class AnyOf(Lookup):
    """`column = ANY(%s)` with the ids as one array parameter (PostgreSQL), where `pk__in=ids` makes
    Django prepare every value and psycopg parse a statement with 100 placeholders that it does not
    keep (about 1 ms of a page's CPU per list); other databases get the IN list. Used as an
    expression: `filter(among("node_id", ids))`."""

    lookup_name = "any_of"
    prepare_rhs = False

    def as_sql(self, compiler: Any, connection: Any) -> Any:
        lhs, lhs_params = self.process_lhs(compiler, connection)
        ids = [int(i) for i in self.rhs]
        if not ids:
            raise EmptyResultSet
        if connection.vendor == "postgresql":
            return f"{lhs} = ANY(%s)", [*lhs_params, ids]
        return f"{lhs} IN ({', '.join(['%s'] * len(ids))})", [*lhs_params, *ids]


def among(column: str, ids: Any) -> AnyOf:
    """The rows whose integer `column` is one of `ids` (AnyOf)."""
    return AnyOf(F(column), list(ids))


class NarrowListMixin:
    """For a GenericViewSet whose `list` is paginated: pages its primary keys, then `narrow_rows`."""

    def narrow_rows(self, ids: builtins.list[int]) -> builtins.list[dict[str, Any]]:
        raise NotImplementedError

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        queryset = self.filter_queryset(self.get_queryset())  # type: ignore[attr-defined]
        ids = self.paginate_queryset(queryset.prefetch_related(None).values_list("pk", flat=True))  # type: ignore[attr-defined]
        if ids is None:  # not paginated
            return super().list(request, *args, **kwargs)  # type: ignore[misc]
        return self.get_paginated_response(self.narrow_rows(list(ids)))  # type: ignore[attr-defined]
