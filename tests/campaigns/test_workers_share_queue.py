"""Two Celery worker processes, as on two machines (--hostname of their own), drain one queue.

Real parts: Redis as the broker, PostgreSQL, two `celery worker` processes. Each task is run by
exactly one of them, and both take part; their counts come from Celery's remote control (stats).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.db import connection

from conftest import need
from gpusweep.celery import app
from tests.helpers import REPO, clean_env, stop_process_group, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.django_db(transaction=True)]
TASK = "advisories.tasks.refresh_deadlines"  # with a generation never reached: reads one row, changes nothing
TASKS = 40


def test_two_workers_with_their_own_hostnames_drain_one_queue(tmp_path: Path):
    url = os.environ.get("CELERY_BROKER_URL", "")
    need(connection.vendor == "postgresql" and url.startswith("redis"),
         "needs DATABASE_URL=postgres://... and CELERY_BROKER_URL=redis://... shared by the workers")
    from advisories.models import DeadlinePolicy

    DeadlinePolicy.current()
    queue = f"shared-{uuid.uuid4().hex[:12]}"
    db = connection.settings_dict
    env = clean_env(DATABASE_URL=f"postgres://{db['USER'] or 'root'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/"
                                 f"{db['NAME']}", CELERY_BROKER_URL=url, GPUSWEEP_CELERY_QUEUE=queue,
                    GPUSWEEP_ADVISORY_SOURCES="")
    names = [f"{machine}-{queue}@gpusweep" for machine in ("machine-a", "machine-b")]
    workers = []
    log = tmp_path / "workers.log"
    for name in names:
        with log.open("ab") as out:
            workers.append(subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "gpusweep", "worker", "--concurrency", "1", "--queues", queue,
                 "--hostname", name, "--without-mingle", "--without-gossip", "--loglevel", "INFO"],
                env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
    try:
        inspect = app.control.inspect(destination=names, timeout=2)
        assert wait_for(lambda: set(inspect.ping() or {}) == set(names), timeout=60), log.read_text()[-3000:]
        for _ in range(TASKS):
            app.send_task(TASK, args=(10**12,), queue=queue)

        def counts() -> dict[str, int]:
            stats = inspect.stats() or {}
            return {name: stats.get(name, {}).get("total", {}).get(TASK, 0) for name in names}

        assert wait_for(lambda: sum(counts().values()) == TASKS, timeout=60), (counts(), log.read_text()[-3000:])
        done = counts()
        assert all(done[name] > 0 for name in names), done  # both machines took work from the queue
    finally:
        for worker in workers:
            stop_process_group(worker)
