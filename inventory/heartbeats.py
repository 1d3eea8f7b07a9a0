"""Heartbeat bookkeeping for fleets: counters in Redis, last_seen written in batches.

A short heartbeat (docs/agent-wire-format.md: only the digest, content unchanged) costs one
indexed read of its node and one Redis call here; nothing is written to the database per
heartbeat. The Redis call (one Lua script, so atomic across every web process):

- refuses a counter not above the newest accepted for the node (kept in the ``counters`` hash,
  and the database's ``Node.heartbeat_counter``, whichever is larger): the replay protection of
  inventory/agent.py holds between flushes;
- records the accepted counter and time in the ``pending`` hash;
- says whether a flush is due (a key that expires after ``GPUSWEEP_HEARTBEAT_FLUSH_S``).

The process that is told a flush is due (or the ``inventory.tasks.flush_heartbeats`` beat task,
for when no heartbeat arrives) moves ``pending`` aside and writes it with one set-based UPDATE per
2,000 nodes: ``last_seen``, ``heartbeat_at`` and ``heartbeat_counter``, each only moving forward.
Nothing waits in a web process's memory, so a killed worker loses nothing: the next flush by any
other process writes what it accepted. Resolution: a heartbeat reaches the database within
``GPUSWEEP_HEARTBEAT_FLUSH_S`` while heartbeats arrive, within twice that from the beat task alone.
A flusher killed mid-way leaves its batch under ``flushing``; the next flush writes it first.

Without Redis (``GPUSWEEP_HEARTBEAT_REDIS_URL`` empty: the embedded default with the filesystem
broker) a short heartbeat is one conditional UPDATE of counter, last_seen and heartbeat_at instead:
the same guarantees, one write per heartbeat, which a small fleet affords. A web process that
cannot reach its Redis does the same until it can again.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
from typing import Any

import redis
from django.conf import settings
from django.db import connection, transaction

from gpusweep.db.bulk import db_datetime
from inventory import queries
from inventory.models import Node

log = logging.getLogger(__name__)
BATCH = 2000
WIDTH = 20  # counters are compared as zero-padded strings in Lua (its numbers are doubles)

# KEYS: counters, pending, flush-due. ARGV: node id, counter, database counter (both padded),
# seen (microseconds, "" for a full heartbeat: it writes the database itself), flush period (ms).
# Answers {1, due} when the counter is taken, {0, newest} when it is not above the newest.
_ACCEPT = """
local have = redis.call('HGET', KEYS[1], ARGV[1])
if have and have >= ARGV[2] then return {0, have} end
if ARGV[3] >= ARGV[2] then return {0, ARGV[3]} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local due = 0
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2] .. ' ' .. ARGV[4])
  if redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[5]) then due = 1 end
end
return {1, due}
"""


class Stale(Exception):
    """The heartbeat's counter is not above the newest accepted for its node."""

    def __init__(self, newest: int) -> None:
        super().__init__(newest)
        self.newest = newest


@functools.cache
def _client(url: str) -> Any:
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


@functools.cache
def _script(client: Any) -> Any:
    return client.register_script(_ACCEPT)  # EVALSHA: the script is sent once


def _redis() -> Any | None:
    url = settings.GPUSWEEP_HEARTBEAT_REDIS_URL
    return _client(url) if url else None


def _keys() -> tuple[str, str, str, str, str]:
    # Per database, so test databases and several deployments can share one Redis.
    prefix = f"gpusweep:hb:{connection.settings_dict['NAME']}:"
    return (prefix + "counters", prefix + "pending", prefix + "flush-due", prefix + "flushing",
            prefix + "flush-lock")


def _pad(counter: int) -> str:
    return str(counter).zfill(WIDTH)


def _epoch_us(when: dt.datetime) -> int:
    return int(when.timestamp() * 1_000_000)


def _accept(node_id: int, counter: int, db_counter: int, seen: dt.datetime | None) -> bool:
    client = _redis()
    assert client is not None
    counters, pending, due, _flushing, _lock = _keys()
    flush_ms = max(1, int(settings.GPUSWEEP_HEARTBEAT_FLUSH_S * 1000))
    taken, extra = _script(client)(keys=[counters, pending, due], args=[
        str(node_id), _pad(counter), _pad(db_counter), str(_epoch_us(seen)) if seen else "", flush_ms])
    if not int(taken):
        raise Stale(int(extra))
    return bool(int(extra))


def record_short(node_id: int, counter: int, db_counter: int, now: dt.datetime) -> None:
    """Take an unchanged heartbeat's counter and note that the node was heard at `now`.

    Raises Stale when the counter is not above the newest accepted. May flush (see module doc).
    """
    if _redis() is None:
        _write_one(node_id, counter, now)
        return
    if counter <= db_counter:
        raise Stale(db_counter)
    try:
        due = _accept(node_id, counter, db_counter, now)
    except (OSError, redis.RedisError) as exc:
        # Redis unreachable: the heartbeat writes its row as without Redis (the database's counter
        # keeps refusing replays); Redis's own check resumes with it, against the database's counter.
        log.warning("heartbeat counters: Redis unavailable (%s); writing the node row", exc)
        _write_one(node_id, counter, now)
        return
    if due:
        try:
            flush()
        except Exception:  # the heartbeat is accepted; the next flush retries the batch
            log.exception("heartbeat flush failed")


def _write_one(node_id: int, counter: int, now: dt.datetime) -> None:
    taken = Node.objects.filter(pk=node_id, heartbeat_counter__lt=counter).update(
        heartbeat_counter=counter, last_seen=now, heartbeat_at=now)
    if not taken:
        raise Stale(Node.objects.values_list("heartbeat_counter", flat=True).get(pk=node_id))


def take_full(node_id: int, counter: int, db_counter: int) -> None:
    """A full heartbeat's counter, checked against Redis too (called under the node's row lock).

    Without Redis the database's counter alone decides: a full heartbeat writes it."""
    if _redis() is not None:
        try:
            _accept(node_id, counter, db_counter, None)
        except (OSError, redis.RedisError) as exc:
            log.warning("heartbeat counters: Redis unavailable (%s); the database's counter decides", exc)


def newest(node_id: int) -> int:
    """The newest counter Redis accepted for the node (0 without Redis or before any)."""
    client = _redis()
    if client is None:
        return 0
    value = client.hget(_keys()[0], str(node_id))
    return int(value) if value else 0


def flush() -> int:
    """Write pending heartbeats to the database; return how many nodes were written.

    Safe to call from anywhere at any time: a lock lets one process flush at a time.
    """
    client = _redis()
    if client is None:
        return 0
    _counters, pending, _due, flushing, lock = _keys()
    if not client.set(lock, "1", nx=True, ex=60):
        return 0
    written = 0
    try:
        for _ in range(2):  # a batch left by a killed flusher, then the current one
            if not client.exists(flushing):
                try:
                    client.rename(pending, flushing)
                except Exception as exc:  # redis.ResponseError: nothing pending
                    if "no such key" not in str(exc).lower():
                        raise
                    break
            entries = client.hgetall(flushing)
            rows = []
            for node_id, value in entries.items():
                counter, seen = value.split(b" ")
                rows.append((int(node_id), int(counter), dt.datetime.fromtimestamp(int(seen) / 1e6, dt.UTC)))
            _write(rows)
            client.delete(flushing)
            written += len(rows)
    finally:
        client.delete(lock)
    return written


def _write(rows: list[tuple[int, int, dt.datetime]]) -> None:
    rows.sort()  # one lock order for every flusher and full heartbeat
    with transaction.atomic(), connection.cursor() as cursor:
        for start in range(0, len(rows), BATCH):
            chunk = rows[start:start + BATCH]
            if connection.vendor == "postgresql":
                params = [value for row in chunk for value in row]
                cursor.execute(queries.flush_nodes(len(chunk)), params)
                # The node's own processes were seen with it (a full heartbeat stamps them too).
                cursor.execute(queries.flush_processes(len(chunk)), params)
            else:
                stamped = [(counter, db_datetime(seen), node_id) for node_id, counter, seen in chunk]
                cursor.executemany(queries.FLUSH_NODE, [(c, s, s, i) for c, s, i in stamped])
                cursor.executemany(queries.FLUSH_PROCESSES, [(s, i, s) for _c, s, i in stamped])
