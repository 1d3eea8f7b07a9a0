"""gunicorn settings for bench/heartbeat.py: count the SQL statements each worker runs.

Every worker appends a wrapper to its database connection that counts statements (transaction
control is not a statement here), and after each request writes its count into a small file
of its own under $BENCH_SQL_DIR, which the bench sums between phases.
"""

from __future__ import annotations

import os
from typing import Any

_count = [0]
_fd: list[int] = []


def _counting(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
    _count[0] += 1
    return execute(sql, params, many, context)


def post_worker_init(worker: Any) -> None:
    from django.db import connections

    connections["default"].execute_wrappers.append(_counting)
    path = os.path.join(os.environ["BENCH_SQL_DIR"], str(os.getpid()))
    _fd.append(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))


def post_request(worker: Any, req: Any, environ: Any, resp: Any) -> None:
    if _fd:
        os.pwrite(_fd[0], f"{_count[0]:20d}".encode(), 0)
