"""Plain reads for hot paths, converted as the ORM converts them, and the prepared cursor.

`select_rows` reads columns as the ORM's values_list would (JSON decoded, times aware) without
compiling a query: a changed heartbeat runs a dozen small statements, and compiling them through
the ORM cost more CPU than running them. `prepared_cursor` is the cursor for statements run on
every step of every node (the campaign engine's, and the inventory writes it makes): PostgreSQL
keeps them parsed and planned once per connection.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from django.db import DEFAULT_DB_ALIAS, connection, connections, models

from gpusweep.db.names import Columns

M = TypeVar("M", bound=models.Model)


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


def prepared_cursor() -> Any:
    """A cursor for hot statements. On PostgreSQL a server-binding one whose statements the server
    keeps prepared (parsed and planned once per connection). Django's own cursors bind on the client,
    so they never prepare (and are unchanged). Execute wrappers apply as to Django's cursors."""
    conn = connections[DEFAULT_DB_ALIAS]  # `connection` looks itself up on every attribute
    if conn.vendor != "postgresql":
        return conn.cursor()
    import psycopg

    conn.ensure_connection()
    raw = conn.connection
    raw.prepare_threshold = 0  # only server-binding cursors (these) prepare at all
    cursor: Any = psycopg.Cursor(raw)  # Django wraps any DB-API cursor (its stubs say only its own)
    return conn.make_debug_cursor(cursor) if conn.queries_logged else conn.make_cursor(cursor)


@functools.cache
def _select(model: type[models.Model], columns: tuple[str, ...]) -> tuple[str, tuple[Any, ...]]:
    names = Columns(model)
    return (f"SELECT {names.list(columns)} FROM {names}",
            tuple(_reader(model._meta.get_field(c)) for c in columns))


def select_rows(model: type[models.Model], columns: Sequence[str], where: str = "",
                params: Sequence[Any] = (), *, prepared: bool = False) -> list[tuple[Any, ...]]:
    """`model`'s rows matching `where` (plain SQL on its table's columns, from names.Columns) as
    tuples of `columns`, converted as the ORM's values_list converts them; `prepared`: through
    prepared_cursor (a statement of fixed shape run on every step)."""
    sql, readers = _select(model, tuple(columns))
    with prepared_cursor() if prepared else connection.cursor() as cursor:
        cursor.execute(f"{sql} WHERE {where}" if where else sql, list(params))
        rows = cursor.fetchall()
    if not any(readers):
        return rows
    return [converted(readers, row) for row in rows]


def converted(readers: Sequence[Callable[[Any], Any] | None], row: Sequence[Any]) -> tuple[Any, ...]:
    """A raw cursor's row as values_list converts it, column by column."""
    return tuple(value if read is None else read(value) for read, value in zip(readers, row, strict=True))


class Loader(NamedTuple):
    """How a slice of a raw row becomes an instance of `model`, as the ORM makes it (values converted,
    `defer`red fields loaded on first access): `select` names the columns under the table's alias."""

    model: type[models.Model]
    select: str
    attnames: tuple[str, ...]
    readers: tuple[Callable[[Any], Any] | None, ...]

    @property
    def width(self) -> int:
        return len(self.attnames)

    def build(self, values: Sequence[Any]) -> Any:
        return self.model.from_db(connection.alias, self.attnames, converted(self.readers, values))


@functools.cache
def loader(model: type[models.Model], alias: str = "", defer: tuple[str, ...] = ()) -> Loader:
    """The Loader of `model`'s concrete columns but `defer` (attribute names), read as `alias`.column."""
    fields = [f for f in model._meta.concrete_fields if f.attname not in defer]
    prefix = f"{alias}." if alias else ""
    return Loader(model, ", ".join(f"{prefix}{connection.ops.quote_name(str(f.column))}" for f in fields),
                  tuple(f.attname for f in fields), tuple(_reader(f) for f in fields))


def select_instances(model: type[M], where: str, params: Sequence[Any] = (), *, prepared: bool = False) -> list[M]:
    """`model`'s rows matching `where` as instances, as the ORM's filter() gives them (without compiling it)."""
    load = loader(model)
    with prepared_cursor() if prepared else connection.cursor() as cursor:
        cursor.execute(f"SELECT {load.select} FROM {Columns(model)} WHERE {where}", list(params))
        return [load.build(row) for row in cursor.fetchall()]


def rowcount(cursor: Any) -> int:
    """Rows the last statement changed. Python's sqlite3 reports -1 for statements that start with
    WITH; SQLite itself knows."""
    if cursor.rowcount >= 0:
        return int(cursor.rowcount)
    cursor.execute("SELECT CHANGES()")
    return int(cursor.fetchone()[0])
