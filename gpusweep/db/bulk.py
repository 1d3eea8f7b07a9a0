"""Fast multi-row inserts for fleet-sized syncs, and values in the form the database stores.

The ORM's bulk_create builds a model instance and compiles every value through the field
machinery: about 10 µs per value, a minute for a 100,000-node fleet with its components. Here
rows are plain tuples already in database form: PostgreSQL receives them through COPY, other
engines through one prepared statement executed many times. Callers run inside the sync's
transaction, so the rows commit or roll back with everything else.

An INSERT lists every concrete column of the model: the caller gives the values of some fields,
the others get their field's default (`auto_now`/`auto_now_add` the time of the insert), so a
field added with a default needs no change here or in any caller.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import json
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connection, models
from django.db.models.fields import NOT_PROVIDED, AutoFieldMixin
from django.utils import timezone

from gpusweep.db.names import Columns
from gpusweep.db.reads import prepared_cursor


def db_datetime(value: dt.datetime | None) -> Any:
    """A timezone-aware datetime in the form the current engine stores."""
    if value is None:
        return None
    if connection.vendor == "postgresql":
        return value
    return connection.ops.adapt_datetimefield_value(value)


def db_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def db_value(field: models.Field[Any, Any], value: Any) -> Any:
    """`value` of `field` as a raw statement (or COPY) passes it: JSON as text, times as db_datetime."""
    if isinstance(field, models.JSONField):
        return db_json(value)
    if isinstance(field, models.DateTimeField):
        return db_datetime(value)
    return field.get_db_prep_save(value, connection)


def marks(values: Sequence[Any]) -> str:
    """`%s, %s, ...` for an IN list of `values`."""
    return ", ".join(["%s"] * len(values))


def _field(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    field = model._meta.get_field(name)
    if not isinstance(field, models.Field) or not field.column:
        raise ValueError(f"{model.__name__}.{name} is not a concrete column")
    return field


@functools.cache
def _defaulted(model: type[models.Model], given: tuple[str, ...]) -> tuple[models.Field[Any, Any], ...]:
    """The concrete fields an INSERT of `given` fills itself: all but those given, the automatic
    primary key and fields with only a database default (the database fills those)."""
    columns = {_field(model, name).column for name in given}
    return tuple(f for f in model._meta.concrete_fields
                 if f.column not in columns and not (f.primary_key and isinstance(f, AutoFieldMixin))
                 and not (f.default is NOT_PROVIDED and f.db_default is not NOT_PROVIDED))


def _varies(field: models.Field[Any, Any]) -> bool:
    """A default computed at each insert: a callable one (a JSONField's dict too), or the time."""
    return callable(field.default) or getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False)


@functools.cache
def _fixed_defaults(model: type[models.Model], given: tuple[str, ...]) -> tuple[Any, ...]:
    # Constant defaults in database form, once (the engine and a heartbeat insert a few rows often).
    return tuple(None if _varies(f) else db_value(f, f.get_default()) for f in _defaulted(model, given))


def default_values(model: type[models.Model], given: Sequence[str]) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """The fields an INSERT of `given` adds and their values now, in database form."""
    key = tuple(given)
    fields = _defaulted(model, key)
    values = _fixed_defaults(model, key)
    if any(map(_varies, fields)):
        now = timezone.now()
        values = tuple(db_value(f, _default(f, now)) if _varies(f) else value
                       for f, value in zip(fields, values, strict=True))
    return tuple(f.attname for f in fields), values


def _default(field: models.Field[Any, Any], now: dt.datetime) -> Any:
    return now if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False) else field.get_default()


def insert_sql(model: type[models.Model], columns: Sequence[str], count: int, suffix: str = "") -> str:
    """One INSERT of `count` rows of `columns` into `model`'s table, placeholders for the values, then
    `suffix` (e.g. ON CONFLICT DO NOTHING)."""
    return _insert_sql(model, tuple(columns), count, suffix)


@functools.lru_cache(maxsize=1024)
def _insert_sql(model: type[models.Model], columns: tuple[str, ...], count: int, suffix: str) -> str:
    table = Columns(model)
    row = f"({marks(columns)})"
    return f"INSERT INTO {table} ({table.list(columns)}) VALUES {', '.join([row] * count)}{suffix}"


FEW = 8  # rows insert_rows writes with one INSERT rather than COPY


def insert_rows(model: type[models.Model], columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
    """Insert `rows` (tuples of the fields `columns` in that order, database values) into `model`'s
    table; every other concrete field gets its default (default_values)."""
    extra, defaults = default_values(model, columns)
    names = (*columns, *extra)
    rest = iter(rows)
    first = [(*row, *defaults) for row in itertools.islice(rest, FEW + 1)]
    if len(first) <= FEW:
        # A few rows (a campaign step's ChangeLog row): one prepared INSERT, a round trip less than COPY.
        if first:
            with prepared_cursor() as cursor:
                cursor.execute(insert_sql(model, names, len(first)), [value for values in first for value in values])
        return len(first)
    full = itertools.chain(first, ((*row, *defaults) for row in rest))
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            return _copy(cursor, model, names, full)
        return _executemany(cursor, insert_sql(model, names, 1), full)


def _copy(cursor: Any, model: type[models.Model], names: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
    table = Columns(model)
    count = 0
    raw = cursor.cursor  # the psycopg cursor under Django's wrapper
    with raw.copy(f"COPY {table} ({table.list(tuple(names))}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)
            count += 1
    return count


def _executemany(cursor: Any, one: str, rows: Iterable[Sequence[Any]]) -> int:
    count = 0
    batch: list[Sequence[Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= 5000:
            cursor.executemany(one, batch)
            count += len(batch)
            batch = []
    if batch:
        cursor.executemany(one, batch)
        count += len(batch)
    return count
