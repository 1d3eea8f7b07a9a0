"""Data generations: one counter per table, kept by the database itself.

A cached answer (gpusweep.responses) is stored under the generations of the tables it read, read
before its queries; every committed write of a table raises its generation, so the next request
misses and reads the new rows, while an answer computed from older rows lands under generations
no one reads any more.

The database raises them: `ensure()` (after every `migrate`, and after a test flush) puts a
trigger on every table, so a write counts whoever makes it (the ORM, raw SQL, COPY, a process
configured without the cache, psql) and commits or rolls back with the rows it wrote; nothing
parses SQL, and statements that write no rows of a table (ANALYZE, VACUUM, SET, RESET) raise
nothing. On PostgreSQL the trigger fires once per statement and raises the row of its own
backend (`pg_backend_pid()`): two transactions writing one table never wait for each other, and a
table's generation is the sum of its rows, which every commit raises and no rollback does; the
first write of a backend folds the rows of backends gone into its own (the sum unchanged). SQLite
has one writer at a time and row triggers only: one row per table.

A part (`part()`) is the writes of some columns of a table, with a generation of its own: any
INSERT, DELETE or TRUNCATE of the table, and an UPDATE naming one of those columns, raise it with
the table's; an UPDATE of other columns only (a heartbeat flush's last_seen, heartbeat_at and
counter, a campaign step's service_state) leaves it where it was. A list that reads only those
columns of the table declares the part instead of the table (the exposure list reads a node's id,
name and cluster: `inventory.models.NODE_IDENTITY`), and a fleet's heartbeats and campaign steps
no longer invalidate it. The database still does the counting (a second trigger, `UPDATE OF`
those columns), so it holds for psql too; an UPDATE naming a column counts even when it leaves
the value as it was (as for whole tables). Those triggers name columns, which a migration must
be free to alter or drop: they are dropped before every migrate and made again after it (ALL is
raised after it, so nothing computed during the migration outlives it).

Reading the generations and the answer's rows in two statements is safe in this order: a write
committing between them lands in the rows but not in the generations read, so the answer is
kept under generations that its own write has already left behind. A transaction that has
written reads uncached (its generations count its own uncommitted rows): `current()` says None.

The scope of the keys is the database's own identity: a random number written into it at its
first `ensure()`, and on PostgreSQL its oid (a copy restored into another database gets another),
never the connection's settings, so every way to reach one database shares its answers.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.signals import request_finished, request_started
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.signals import post_migrate, pre_migrate

log = logging.getLogger(__name__)

TABLE = "gpusweep_generation"
# The generation table's key column: its own table, no model's, named once here like TABLE (the
# word is also models' column, which SQL must not type: tests/foundation/test_sql_names.py).
NAME = "name"
ALL = "*"  # raised by every migrate and flush: every answer depends on the schema
_IDENTITY = ""  # the row holding the database's identity (no table has an empty name)
SHARED_BACKENDS = ("gpusweep.cache.RedisCache", "django.core.cache.backends.redis.RedisCache",
                   "django.core.cache.backends.memcached.PyMemcacheCache",
                   "django.core.cache.backends.memcached.PyLibMCCache")


@dataclass(frozen=True)
class Part:
    table: str
    columns: frozenset[str]  # the columns whose UPDATE raises it (INSERT, DELETE, TRUNCATE always do)
    tag: str  # names its trigger (and its per-transaction mark on PostgreSQL)


_PARTS: dict[str, Part] = {}


def part(table: str, name: str, columns: Iterable[str]) -> str:
    """Declare the part `name` of `table`: its rows coming and going, and the writes of `columns`
    (module doc); returns the generation's name, `table:name`, for a view's `cache_tables`. Declare
    it at import time of a models module, so that every migrate (which loads them all) makes its
    trigger."""
    full = f"{table}:{name}"
    declared = Part(table, frozenset(columns), name)
    if _PARTS.setdefault(full, declared) != declared or not name.isidentifier() or not declared.columns:
        raise ValueError(f"part {full}: declared twice differently, no columns, or a name that is no identifier")
    return full


def table_of(name: str) -> str:
    """The table a generation's name counts the writes of (a part's table, or the name itself)."""
    found = _PARTS.get(name)
    return found.table if found is not None else name


def columns_of(name: str) -> frozenset[str] | None:
    """The columns a part counts the writes of (None for a whole table: all of them)."""
    found = _PARTS.get(name)
    return found.columns if found is not None else None


def enabled() -> bool:
    """Whether answers may be cached: only in a cache every process shares (a per-process cache
    would keep answers that another process's write does not reach)."""
    return settings.CACHES["default"]["BACKEND"] in SHARED_BACKENDS


@dataclass(frozen=True)
class Generations:
    scope: str  # the database's identity
    values: tuple[int, ...]  # of the tables asked for, in their order, then of ALL


def _cache_errors() -> tuple[type[BaseException], ...]:
    try:
        from redis.exceptions import RedisError
    except ImportError:  # pragma: no cover - redis is a dependency
        return (OSError,)
    return (OSError, RedisError)


# What an unreachable cache raises: readers then answer uncached (gpusweep.responses).
CACHE_ERRORS = _cache_errors()


def _connection(connection: BaseDatabaseWrapper | None) -> BaseDatabaseWrapper:
    return connection or connections[DEFAULT_DB_ALIAS]


def _rows(connection: BaseDatabaseWrapper, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    """One statement on the DB-API cursor: these run before every cached answer, where Django's
    cursor wrapper would double their cost. `sql` uses %s (turned into SQLite's ?)."""
    if connection.vendor != "postgresql":
        sql = sql.replace("%s", "?")
    connection.ensure_connection()
    with connection.wrap_database_errors:
        cursor = connection.connection.cursor()
        try:
            cursor.execute(sql, params)
            return list(cursor.fetchall())
        finally:
            cursor.close()


def _read(connection: BaseDatabaseWrapper, names: list[str]) -> dict[str, int]:
    """name -> generation (the sum of its rows; one row each on SQLite), in one indexed lookup."""
    q = connection.ops.quote_name(TABLE)
    # IN (...), not = ANY(%s): psycopg's client-side binding quotes a list at half the cost.
    rows = _rows(connection, f"SELECT {NAME}, n FROM {q} WHERE {NAME} IN ({', '.join(['%s'] * len(names))})", names)
    found: dict[str, int] = {}
    for name, n in rows:
        found[name] = found.get(name, 0) + int(n)
    return found


def _scope(connection: BaseDatabaseWrapper) -> str | None:
    """The identity of the database this connection reaches, read once per DB-API connection."""
    connection.ensure_connection()
    kept = connection.__dict__.get("_gpusweep_scope")
    if kept is not None and kept[0] is connection.connection:
        return str(kept[1])
    q = connection.ops.quote_name(TABLE)
    oid = ("(SELECT oid FROM pg_database WHERE datname = current_database())"
           if connection.vendor == "postgresql" else "''")
    row = _rows(connection, f"SELECT (SELECT n FROM {q} WHERE {NAME} = %s AND backend = 0), {oid}", [_IDENTITY])[0]
    if row[0] is None:
        return None
    found = f"{row[0]}:{row[1]}"
    connection.__dict__["_gpusweep_scope"] = (connection.connection, found)
    return found


def _wrote(connection: BaseDatabaseWrapper) -> bool:
    """Whether the open transaction (if any) has written: its generations count its own rows."""
    if connection.get_autocommit():
        return False  # each statement its own transaction: nothing open
    if connection.vendor != "postgresql":
        return True  # SQLite cannot say: as if it had
    return bool(_rows(connection, "SELECT pg_current_xact_id_if_assigned() IS NOT NULL", [])[0][0])


# The generations a request has read (request_started to request_finished, per thread and
# database): its later cached lookups use them. Reading earlier than needed is safe (an answer is
# at worst kept under older generations than its rows), and every start empties the memo, so a
# lookup always uses generations read after its own request began: a write committed before a
# request is seen by it (its own writes, after its first lookup, by the next). Every name this
# process has looked up is read at once, so the token check and the list share one statement.
_request = threading.local()
_asked: set[str] = {ALL}


def _begin_request(**kwargs: Any) -> None:
    _request.read = {}


def _end_request(**kwargs: Any) -> None:
    _request.read = None


def current(tables: Iterable[str], connection: BaseDatabaseWrapper | None = None) -> Generations | None:
    """The generations of `tables` (and of ALL), read before the data; None when answers must not
    be cached here: this transaction has written (or, on SQLite, is open), or a table has no
    generation (the database not migrated since)."""
    connection = _connection(connection)
    names = [*tables, ALL]
    try:
        if _wrote(connection):
            return None
        scope = _scope(connection)
        memo: dict[str, dict[str, int]] | None = getattr(_request, "read", None)
        found = memo.get(connection.alias, {}) if memo is not None else {}
        if scope is not None and any(name not in found for name in names):
            _asked.update(names)
            found = _read(connection, sorted(_asked) if memo is not None else names)
            if memo is not None:
                memo[connection.alias] = found
    except DatabaseError:
        log.warning("no data generations in %s: run migrate; answering uncached", connection.alias, exc_info=True)
        return None
    if scope is None or any(name not in found for name in names):
        return None
    return Generations(scope, tuple(found[name] for name in names))


def scope(connection: BaseDatabaseWrapper | None = None) -> str:
    """The database's identity, for keys of values kept per database (read once per connection)."""
    connection = _connection(connection)
    try:
        found = _scope(connection)
    except DatabaseError:
        found = None
    return found if found is not None else f"unknown:{connection.alias}"


def install() -> None:
    """Keep the generation triggers on every table after each migrate and flush, and the
    generations a request reads for the rest of it (AppConfig.ready)."""
    pre_migrate.connect(_before_migrate, dispatch_uid="gpusweep.datagen.parts")
    post_migrate.connect(_after_migrate, dispatch_uid="gpusweep.datagen.ensure")
    request_started.connect(_begin_request, dispatch_uid="gpusweep.datagen.begin")
    request_finished.connect(_end_request, dispatch_uid="gpusweep.datagen.end")


def _after_migrate(sender: Any, using: str = DEFAULT_DB_ALIAS, **kwargs: Any) -> None:
    if getattr(sender, "name", None) == "gpusweep":  # once per migrate, after every app's tables exist
        ensure(connections[using])


def _before_migrate(sender: Any, using: str = DEFAULT_DB_ALIAS, **kwargs: Any) -> None:
    if getattr(sender, "name", None) == "gpusweep":  # once per migrate, before any app's migration
        drop_parts(connections[using])


def drop_parts(connection: BaseDatabaseWrapper) -> None:
    """Drop the parts' triggers (they name columns a migration may alter); ensure() makes them again."""
    tables = set(connection.introspection.table_names(include_views=False))
    q = connection.ops.quote_name
    with connection.cursor() as cursor:
        for found in _PARTS.values():
            if found.table not in tables:
                continue
            if connection.vendor == "postgresql":
                cursor.execute(f"DROP TRIGGER IF EXISTS {q(_part_trigger(found))} ON {q(found.table)}")
            else:
                for event in _EVENTS:
                    cursor.execute(f"DROP TRIGGER IF EXISTS {q(_part_trigger(found, event))}")


def _part_trigger(found: Part, event: str = "") -> str:
    return f"{TABLE}_{found.tag}_{event.lower()}_{found.table}" if event else f"{TABLE}_{found.tag}"


def ensure(connection: BaseDatabaseWrapper) -> None:
    """Create the generation table, the identity and a trigger on every table that lacks one; raise
    ALL (a migration may have changed what any answer holds). Idempotent."""
    q = connection.ops.quote_name(TABLE)
    tables = [t for t in connection.introspection.table_names(include_views=False)
              if t != TABLE and not t.startswith("sqlite_")]  # SQLite's own (ANALYZE's statistics)
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {q} ({NAME} varchar(200) NOT NULL, backend integer NOT NULL, "
                       f"n bigint NOT NULL, PRIMARY KEY ({NAME}, backend))")
        # Counters start from the clock, never below a value an older answer may be stored under
        # (should the table ever be emptied); the identity is random.
        start = time.time_ns()
        parts = {name: found for name, found in _PARTS.items() if found.table in tables}
        cursor.executemany(f"INSERT INTO {q} ({NAME}, backend, n) VALUES (%s, 0, %s) ON CONFLICT DO NOTHING",
                           [(_IDENTITY, secrets.randbits(62)), (ALL, start)] + [(t, start) for t in [*tables, *parts]])
        _triggers(connection, cursor, tables)
        _part_triggers(connection, cursor, parts)
        cursor.execute(f"UPDATE {q} SET n = n + 1 WHERE {NAME} = %s AND backend = 0", [ALL])


# PostgreSQL: once per statement, and once per transaction and table (a transaction-local
# setting marks it), raise this backend's row; a backend's first write to a table folds the rows
# of backends no longer running into its own, skipping rows another fold holds.
_PG_FUNCTION = """
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    gen text := COALESCE(TG_ARGV[0], TG_TABLE_NAME);  -- a part's triggers name it, with its tag
    mark text := 'gpusweep.wrote_' || TG_RELID || COALESCE('_' || TG_ARGV[1], '');
    me integer := pg_backend_pid();
    fresh boolean;
BEGIN
    IF current_setting(mark, true) = '1' THEN
        RETURN NULL;
    END IF;
    PERFORM set_config(mark, '1', true);
    INSERT INTO {table} AS g ({name_column}, backend, n) VALUES (gen, me, 1)
        ON CONFLICT ({name_column}, backend) DO UPDATE SET n = g.n + 1
        RETURNING xmax = 0 INTO fresh;
    IF fresh THEN
        WITH gone AS (
            DELETE FROM {table} WHERE ctid IN (
                SELECT ctid FROM {table} WHERE {name_column} = gen AND backend NOT IN (0, me)
                    AND backend NOT IN (SELECT a.pid FROM pg_stat_activity a)
                FOR UPDATE SKIP LOCKED)
            RETURNING n)
        UPDATE {table} SET n = n + (SELECT COALESCE(SUM(gone.n), 0) FROM gone)
            WHERE {name_column} = gen AND backend = me;
    END IF;
    RETURN NULL;
END $$"""
_EVENTS = ("INSERT", "UPDATE", "DELETE")


def _triggers(connection: BaseDatabaseWrapper, cursor: Any, tables: list[str]) -> None:
    """A generation trigger on each of `tables` that has none (named after TABLE)."""
    q = connection.ops.quote_name
    if connection.vendor == "postgresql":
        function = f"{TABLE}_bump"
        cursor.execute(_PG_FUNCTION.format(function=q(function), table=q(TABLE), name_column=q(NAME)))
        cursor.execute("SELECT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                       "WHERE t.tgname = %s AND c.relname = ANY(%s)", [TABLE, tables])
        having = {row[0] for row in cursor.fetchall()}
        for table in (t for t in tables if t not in having):
            cursor.execute(f"CREATE TRIGGER {q(TABLE)} AFTER {' OR '.join(_EVENTS)} OR TRUNCATE ON {q(table)} "
                           f"FOR EACH STATEMENT EXECUTE FUNCTION {q(function)}()")
        return
    # SQLite: row triggers only (one writer at a time, so one row per table).
    for table in tables:
        literal = table.replace("'", "''")
        for event in _EVENTS:
            cursor.execute(f"CREATE TRIGGER IF NOT EXISTS {q(f'{TABLE}_{event.lower()}_{table}')} AFTER {event} "
                           f"ON {q(table)} BEGIN UPDATE {q(TABLE)} SET n = n + 1 "
                           f"WHERE {q(NAME)} = '{literal}' AND backend = 0; END")


def _part_triggers(connection: BaseDatabaseWrapper, cursor: Any, parts: dict[str, Part]) -> None:
    """Each part's triggers, made afresh (drop_parts)."""
    q = connection.ops.quote_name
    for name, found in parts.items():
        columns = ", ".join(q(c) for c in sorted(found.columns))
        if connection.vendor == "postgresql":
            trigger = q(_part_trigger(found))
            cursor.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {q(found.table)}")
            cursor.execute(f"CREATE TRIGGER {trigger} AFTER INSERT OR DELETE OR TRUNCATE OR UPDATE OF {columns} "
                           f"ON {q(found.table)} FOR EACH STATEMENT "
                           f"EXECUTE FUNCTION {q(f'{TABLE}_bump')}({_literal(name)}, {_literal(found.tag)})")
            continue
        literal = name.replace("'", "''")
        for event in _EVENTS:
            on = f"UPDATE OF {columns}" if event == "UPDATE" else event
            trigger = q(_part_trigger(found, event))
            cursor.execute(f"DROP TRIGGER IF EXISTS {trigger}")
            cursor.execute(f"CREATE TRIGGER {trigger} AFTER {on} ON {q(found.table)} BEGIN UPDATE {q(TABLE)} "
                           f"SET n = n + 1 WHERE {q(NAME)} = '{literal}' AND backend = 0; END")


def _literal(text: str) -> str:
    """A trigger's argument: a string literal (CREATE TRIGGER takes no parameters)."""
    return "'" + text.replace("'", "''") + "'"
