"""Celery tasks: thin, take ids, idempotent (the engine's conditional updates make repeats harmless)."""

from __future__ import annotations

from celery import shared_task

from campaigns import engine


@shared_task(name="campaigns.advance_sweep")
def advance_sweep(sweep_id: int) -> str | None:
    return engine.advance(sweep_id)


@shared_task(name="campaigns.dispatch_campaign")
def dispatch_campaign(campaign_id: int) -> list[int]:
    return engine.dispatch(campaign_id)


@shared_task(name="campaigns.redrive")
def redrive() -> dict[str, int]:
    return engine.redrive()
