"""Data generations: one counter per table, raised after every commit that wrote the table.

A cached answer (gpusweep.responses) is stored under the generations of the tables it read, read
before its queries; a write raises them after its commit, so the next request misses and reads
the new rows, while an answer computed from older rows lands under generations no one reads any
more. Writes are seen where every statement passes: an execute wrapper on each database
connection (ORM, `.update()`, bulk inserts, raw SQL, other processes with the same settings:
Celery workers, management commands) classifies each statement and queues the bump with
`on_commit`, so a rolled-back write raises nothing. COPY goes past Django's cursor wrapper, so its
one caller (inventory.bulk) calls `written()` itself. A statement whose target it cannot tell
(DDL, a writable CTE it cannot parse) raises every table at once (`ALL`). Writes from outside the
application (psql) are not seen: they show once the answers expire (GPUSWEEP_RESPONSE_CACHE_S).

The counters live in the configured cache, which must be shared by every process (Redis):
`enabled()` is false on a per-process cache, and then nothing is cached.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

log = logging.getLogger(__name__)

ALL = "*"
SHARED_BACKENDS = ("gpusweep.cache.RedisCache", "django.core.cache.backends.redis.RedisCache",
                   "django.core.cache.backends.memcached.PyMemcacheCache",
                   "django.core.cache.backends.memcached.PyLibMCCache")

# (EXPLAIN is not among them: EXPLAIN ANALYZE runs the statement.)
_READ = re.compile(r"[\s(]*(SELECT|SAVEPOINT|RELEASE|ROLLBACK|BEGIN|COMMIT|SET|SHOW|VALUES)\b", re.I)
_WITH = re.compile(r"\s*WITH\b", re.I)
_TRUNCATE = re.compile(r"\bTRUNCATE\b", re.I)  # a list of tables (a test flush): every one, simply
_TARGET = re.compile(r"\b(?:INSERT\s+(?:OR\s+\w+\s+)?INTO|UPDATE|DELETE\s+FROM|COPY|MERGE\s+INTO)"
                     r"\s+(?:ONLY\s+)?((?:\"[^\"]+\"|\w+)(?:\.(?:\"[^\"]+\"|\w+))?)", re.I)
_HEAD = re.compile(r"\s*(?:INSERT\s+(?:OR\s+\w+\s+)?INTO|UPDATE|DELETE\s+FROM|COPY|MERGE\s+INTO)"
                   r"\s+(?:ONLY\s+)?((?:\"[^\"]+\"|\w+)(?:\.(?:\"[^\"]+\"|\w+))?)", re.I)
# Words that follow UPDATE where it is not a target: ON CONFLICT DO UPDATE SET, FOR UPDATE OF/SKIP/NOWAIT.
_NOT_TABLES = {"set", "of", "skip", "nowait"}


def enabled() -> bool:
    return settings.CACHES["default"]["BACKEND"] in SHARED_BACKENDS


def tables_written(sql: str) -> set[str]:
    """The tables a statement may write: empty for a read, {ALL} when it cannot tell."""
    semicolon = sql.find(";")
    single = semicolon == -1 or not sql[semicolon + 1:].strip()
    if single:
        # The usual case, decided from the statement's first words (a write statement writes only
        # its target: a data-modifying WITH may only come first, and there are no triggers).
        if _READ.match(sql):
            return set()
        head = _HEAD.match(sql)
        if head:
            return _names([head])
    if _TRUNCATE.search(sql):
        return {ALL}
    found = _names(_TARGET.finditer(sql))
    if single and _WITH.match(sql) and not found:
        return set()  # a read with common table expressions
    return found or {ALL}


def _names(matches: Iterable[re.Match[str]]) -> set[str]:
    return {m.group(1).rsplit(".", 1)[-1].strip('"').lower() for m in matches} - _NOT_TABLES


def scope(connection: BaseDatabaseWrapper | None = None) -> str:
    """The database (host, port, name) as part of cache keys, so test databases and a bench's never
    share counters or answers. From the connection itself: Django's temporary ones (creating a
    test database) have no alias to look up."""
    s = (connection or connections[DEFAULT_DB_ALIAS]).settings_dict
    return f"{s.get('HOST') or ''}:{s.get('PORT') or ''}:{s['NAME']}"


def _key(table: str, where: str) -> str:
    return f"gpusweep:gen:{where}:{table}"


def _cache_errors() -> tuple[type[BaseException], ...]:
    try:
        from redis.exceptions import RedisError
    except ImportError:  # pragma: no cover - redis is a dependency
        return (OSError,)
    return (OSError, RedisError)


# What an unreachable cache raises: readers then answer uncached (gpusweep.responses).
CACHE_ERRORS = _cache_errors()


def bump(tables: Iterable[str], where: str | None = None) -> None:
    """Raise the generations of `tables` (after their commit) in the database `where` (a scope())."""
    where = where or scope()
    try:
        for table in set(tables):
            key = _key(table, where)
            try:
                cache.incr(key)
            except ValueError:
                # Missing (first write, or the cache lost it): start from the clock, never from a
                # value an older answer may have been stored under.
                if not cache.add(key, time.time_ns(), timeout=None):
                    cache.incr(key)
    except CACHE_ERRORS:
        # The write has committed; only the cache is away. Answers it still holds may be served
        # until they expire (GPUSWEEP_RESPONSE_CACHE_S), which the log says.
        log.exception("could not raise the data generations of %s", sorted(set(tables)))


def current(tables: Iterable[str], connection: BaseDatabaseWrapper | None = None) -> tuple[int, ...]:
    """The generations of `tables` (and of ALL), in the order given; read before the data."""
    names = [*tables, ALL]
    where = scope(connection)
    keys = [_key(t, where) for t in names]
    found = cache.get_many(keys)
    missing = [k for k in keys if k not in found]
    if missing:
        start = time.time_ns()
        for k in missing:
            cache.add(k, start, timeout=None)
        found = cache.get_many(keys)
    return tuple(int(found.get(k, 0)) for k in keys)


class _Pending:
    """The tables written at one savepoint level of the open transaction, bumped on its commit."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.tables: set[str] = set()

    def __call__(self) -> None:
        bump(self.tables, self.where)


def _alive(connection: BaseDatabaseWrapper, pending: _Pending) -> bool:
    return any(entry[1] is pending for entry in connection.run_on_commit)


def written(tables: Iterable[str], connection: BaseDatabaseWrapper | None = None) -> None:
    """Record a write of `tables` on `connection`: bumped once the transaction commits (now in autocommit)."""
    tables = set(tables)
    if not tables or not enabled():
        return
    connection = connection or connections[DEFAULT_DB_ALIAS]
    if not connection.in_atomic_block:
        # Autocommit: the statement has committed. (Manual transaction management, which nothing
        # here uses, has no commit hook: bumped now, and its reads skip the cache: uncommitted().)
        bump(tables, scope(connection))
        return
    registry: dict[tuple[str, ...], _Pending] = connection.__dict__.setdefault("_gpusweep_pending", {})
    level = tuple(connection.savepoint_ids)
    pending = registry.get(level)
    if pending is None or not _alive(connection, pending):
        # One callback per savepoint level and transaction: a rolled-back savepoint drops its own
        # callback (and only its tables), the others commit with the transaction.
        for stale in [k for k, p in registry.items() if not _alive(connection, p)]:
            del registry[stale]
        pending = registry[level] = _Pending(scope(connection))
        connection.on_commit(pending)
    pending.tables |= tables


def uncommitted(connection: BaseDatabaseWrapper | None = None) -> bool:
    """Whether this connection's open transaction wrote anything: its reads must not use the cache
    (they see rows no other process sees yet)."""
    connection = connection or connections[DEFAULT_DB_ALIAS]
    if not connection.in_atomic_block:
        return not connection.get_autocommit()
    registry: dict[tuple[str, ...], _Pending] = connection.__dict__.get("_gpusweep_pending", {})
    return any(_alive(connection, p) for p in registry.values())


def _wrapper(connection: BaseDatabaseWrapper) -> Callable[..., Any]:
    def watch(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        result = execute(sql, params, many, context)
        if isinstance(sql, str) and enabled():
            written(tables_written(sql), connection)
        return result

    watch.gpusweep_datagen = True  # type: ignore[attr-defined]
    return watch


def watch_connection(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    if not any(getattr(w, "gpusweep_datagen", False) for w in connection.execute_wrappers):
        # First in the list, so the outermost: a wrapper another caller pushes and pops with
        # `connection.execute_wrapper()` around this connect still pops its own.
        connection.execute_wrappers.insert(0, _wrapper(connection))


def install() -> None:
    """Watch every connection (AppConfig.ready); connections made before are watched as well."""
    connection_created.connect(watch_connection, dispatch_uid="gpusweep.datagen.watch")
    for connection in connections.all(initialized_only=True):
        watch_connection(None, connection)
