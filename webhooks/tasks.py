"""Celery tasks: thin, taking ids (webhooks.services and webhooks.events do the work)."""

from __future__ import annotations

from celery import shared_task

from webhooks import events, services


@shared_task(name="webhooks.deliver")
def deliver(subscription_id: int) -> str:
    return services.deliver(subscription_id)


@shared_task(name="webhooks.scan")
def scan() -> dict[str, int]:
    """The beat's safety net and deadline scan: due deliveries re-enqueued, overdue/due-soon emitted."""
    return {"redriven": services.redrive(), "emitted": events.scan_deadlines()}
