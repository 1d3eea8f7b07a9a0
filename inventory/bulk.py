"""Fast multi-row inserts for fleet-sized syncs, and plain reads for hot paths.

The ORM's bulk_create builds a model instance and compiles every value through the field
machinery: about 10 µs per value, a minute for a 100,000-node fleet with its components. Here
rows are plain tuples already in database form: PostgreSQL receives them through COPY, other
engines through one prepared statement executed many times. Callers run inside the sync's
transaction, so the rows commit or roll back with everything else.

`select_rows` reads columns as the ORM's values_list would (JSON decoded, times aware) without
compiling a query: a changed heartbeat runs a dozen small statements, and compiling them through
the ORM cost more CPU than running them.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.db import connection, models

from gpusweep import datagen


def db_datetime(value: dt.datetime | None) -> Any:
    """A timezone-aware datetime in the form the current engine stores."""
    if value is None:
        return None
    if connection.vendor == "postgresql":
        return value
    return connection.ops.adapt_datetimefield_value(value)


def db_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def read_datetime(value: Any) -> Any:
    """A DateTimeField from a raw cursor, aware as the ORM's: SQLite gives a naive datetime in UTC
    (Django's converter for the declared type) or, for an expression, its text."""
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value


def read_date(value: Any) -> Any:
    return dt.date.fromisoformat(value) if isinstance(value, str) else value


def read_json(value: Any) -> Any:
    # Both engines hand raw cursors JSON as text (Django loads PostgreSQL's jsonb as text too).
    return json.loads(value) if isinstance(value, str) else value


def _read_duration(value: Any) -> Any:
    return dt.timedelta(microseconds=value) if isinstance(value, int) else value  # SQLite: microseconds


def _read_bool(value: Any) -> Any:
    return value if value is None else bool(value)


def _reader(field: Any) -> Callable[[Any], Any] | None:
    """How a raw cursor's value of `field` becomes what the ORM returns (None: as it is)."""
    if isinstance(field, models.JSONField):
        return read_json
    if isinstance(field, models.DateTimeField):
        return read_datetime
    if isinstance(field, models.DateField):
        return read_date
    if isinstance(field, models.DurationField):
        return _read_duration
    if isinstance(field, models.BooleanField):
        return _read_bool
    return None


@functools.cache
def _select(model: type[models.Model], columns: tuple[str, ...]) -> tuple[str, tuple[Any, ...]]:
    table = connection.ops.quote_name(model._meta.db_table)
    names = ", ".join(connection.ops.quote_name(_column(model, c)) for c in columns)
    return f"SELECT {names} FROM {table}", tuple(_reader(model._meta.get_field(c)) for c in columns)


def select_rows(model: type[models.Model], columns: Sequence[str], where: str = "",
                params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """`model`'s rows matching `where` (plain SQL on its table's column names) as tuples of
    `columns`, converted as the ORM's values_list converts them."""
    sql, readers = _select(model, tuple(columns))
    with connection.cursor() as cursor:
        cursor.execute(f"{sql} WHERE {where}" if where else sql, list(params))
        rows = cursor.fetchall()
    if not any(readers):
        return rows
    return [tuple(value if read is None else read(value) for read, value in zip(readers, row, strict=True))
            for row in rows]


def marks(values: Sequence[Any]) -> str:
    """`%s, %s, ...` for an IN list of `values`."""
    return ", ".join(["%s"] * len(values))


def _column(model: type[models.Model], name: str) -> str:
    field = model._meta.get_field(name)
    if not isinstance(field, models.Field) or not field.column:
        raise ValueError(f"{model.__name__}.{name} is not a concrete column")
    return field.column


def insert_rows(model: type[models.Model], columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
    """Insert `rows` (tuples in `columns` order, database values) into `model`'s table."""
    table = connection.ops.quote_name(model._meta.db_table)
    names = ", ".join(connection.ops.quote_name(_column(model, c)) for c in columns)
    count = 0
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            raw = cursor.cursor  # the psycopg cursor under Django's wrapper
            with raw.copy(f"COPY {table} ({names}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
                    count += 1
            datagen.written({model._meta.db_table})  # COPY passes by Django's execute wrappers
            return count
        marks = ", ".join(["%s"] * len(columns))
        batch: list[Sequence[Any]] = []
        for row in rows:
            batch.append(row)
            if len(batch) >= 5000:
                cursor.executemany(f"INSERT INTO {table} ({names}) VALUES ({marks})", batch)
                count += len(batch)
                batch = []
        if batch:
            cursor.executemany(f"INSERT INTO {table} ({names}) VALUES ({marks})", batch)
            count += len(batch)
    return count
