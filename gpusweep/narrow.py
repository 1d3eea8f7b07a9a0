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
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import F, Lookup, TextField
from django.db.models.functions import Cast
from django.utils import timezone
from rest_framework.request import Request
from rest_framework.response import Response


class Times:
    """Time columns read and written as the API writes them (DRF's DateTimeField: ISO 8601 in the
    current zone, Z for +00:00), the zone looked up once per page. Where the zone is UTC and so is
    the PostgreSQL session's (Django's own with USE_TZ), a column is read as PostgreSQL's text of
    it, which it renders for the wire anyway, and only its punctuation is changed: parsing it into a
    datetime and formatting that again cost about 12 us a value, a third of a page of nodes."""

    def __init__(self, using: str = DEFAULT_DB_ALIAS) -> None:
        connection = connections[using]
        self.zone = timezone.get_current_timezone()
        self.as_text = (connection.vendor == "postgresql" and connection.timezone_name == "UTC"
                        and self.zone.utcoffset(None) == dt.timedelta(0) and str(self.zone) in ("UTC", "Etc/UTC"))

    def column(self, name: str) -> Any:
        """An expression reading the column `name` for `write`."""
        return Cast(name, TextField()) if self.as_text else F(name)

    def write(self, value: dt.datetime | str | None) -> str | None:
        if value is None:
            return None
        if isinstance(value, str):  # "2026-12-07 06:37:40.1234+00" -> "2026-12-07T06:37:40.123400Z"
            day, _, clock = value.partition(" ")
            if clock.endswith("+00") and len(day) == 10:
                clock = clock[:-3]
                if "." in clock:
                    whole, fraction = clock.split(".")
                    clock = f"{whole}.{fraction:0<6}"
                return f"{day}T{clock}Z"
            value = dt.datetime.fromisoformat(value)  # not the usual shape (a year before 1000): parsed
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
