"""Celery tasks: thin, by id, idempotent (a sync applied twice changes nothing)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from inventory import heartbeats
from inventory.models import Cluster
from inventory.sync import SyncError, sync_cluster, syncable_clusters


@shared_task(name="inventory.tasks.sync_cluster", ignore_result=True)
def sync_cluster_task(cluster_id: int) -> dict[str, Any]:
    cluster = Cluster.objects.filter(pk=cluster_id, sync_enabled=True).first()
    if cluster is None:
        return {"skipped": "cluster missing or sync disabled"}
    try:
        return sync_cluster(cluster).as_dict()
    except SyncError as exc:
        # Stored on the cluster (last_sync_error); the next scheduled run tries again.
        return {"error": str(exc)}


@shared_task(name="inventory.tasks.sync_all_clusters", ignore_result=True)
def sync_all_clusters() -> int:
    clusters = syncable_clusters()
    for cluster in clusters:
        sync_cluster_task.delay(cluster.pk)
    return len(clusters)


@shared_task(name="inventory.tasks.flush_heartbeats", ignore_result=True)
def flush_heartbeats() -> int:
    return heartbeats.flush()
