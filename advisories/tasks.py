"""Celery tasks: thin wrappers that take ids or names and call the services."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from advisories.exposure import expire_acceptances, recompute
from advisories.exposure import refresh_deadlines as refresh
from advisories.ingest import ingest_documents
from advisories.sources import resolve

log = logging.getLogger(__name__)


@shared_task(name="advisories.tasks.ingest_configured_sources")
def ingest_configured_sources(names: list[str] | None = None) -> str:
    """Scheduled ingestion of the sources configured in GPUSWEEP_ADVISORY_SOURCES."""
    lines = []
    for name in names or sorted(settings.GPUSWEEP_ADVISORY_SOURCES):
        summary = ingest_documents(resolve(name).items())
        lines.append(f"{name}: {summary.line()}")
        for error in summary.errors:
            log.warning("advisory source %s: %s", name, error)
    expire_acceptances()
    return "; ".join(lines)


@shared_task(name="advisories.tasks.recompute_exposures")
def recompute_exposures(node_ids: list[int] | None = None, advisory_ids: list[int] | None = None) -> None:
    recompute(node_ids=node_ids, advisory_ids=advisory_ids)


@shared_task(name="advisories.tasks.refresh_deadlines", ignore_result=True)
def refresh_deadlines(generation: int) -> int | None:
    """Every active deadline after a policy or override change (advisories.services.deadlines_changed)."""
    return refresh(generation)
