"""Enqueueing campaign work: on commit, by task name, through a hook a benchmark can replace.

Modules that enqueue (services, engine) import this module, never the tasks module, so the
campaign package has no import circle: tasks -> engine -> queue, and the broker resolves the
task by its registered name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import transaction

TASKS = {"advance": "campaigns.advance_sweep", "dispatch": "campaigns.dispatch_campaign"}


def _celery_enqueue(task: str, object_id: int, countdown: float = 0) -> None:
    from gpusweep.celery import app

    # The queue is read at call time, so a deployment (or a test) sharing a broker keeps its own.
    options: dict[str, Any] = {"queue": settings.CELERY_TASK_DEFAULT_QUEUE}
    if countdown:
        options["countdown"] = countdown
    app.send_task(TASKS[task], args=(object_id,), **options)


# The first entry is used; bench/sweep.py and tests put their own in front.
ENQUEUE: list[Callable[[str, int, float], None]] = [_celery_enqueue]


def enqueue(task: str, object_id: int, countdown: float = 0) -> None:
    """Enqueue `task` ("advance" a sweep, "dispatch" a campaign) once the transaction commits."""
    if task not in TASKS:
        raise ValueError(f"unknown campaign task {task!r}")
    transaction.on_commit(lambda: ENQUEUE[0](task, object_id, countdown))


def enqueue_now(task: str, object_id: int, countdown: float = 0) -> None:
    """Enqueue outside any transaction (the periodic re-drive)."""
    ENQUEUE[0](task, object_id, countdown)
