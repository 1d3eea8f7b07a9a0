"""Enqueueing a subscription's deliveries: by task name, on commit, through a hook tests can replace
(the campaigns.queue pattern: no module that enqueues imports the tasks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import transaction

TASK = "webhooks.deliver"


def _celery_enqueue(subscription_id: int, countdown: float = 0) -> None:
    from gpusweep.celery import app

    options: dict[str, Any] = {"queue": settings.CELERY_TASK_DEFAULT_QUEUE}
    if countdown > 0:
        options["countdown"] = countdown
    app.send_task(TASK, args=(subscription_id,), **options)


ENQUEUE: list[Callable[[int, float], None]] = [_celery_enqueue]


def enqueue(subscription_id: int, countdown: float = 0) -> None:
    """Deliver the subscription's waiting deliveries once the transaction commits (now, outside one)."""
    transaction.on_commit(lambda: ENQUEUE[0](subscription_id, countdown))
