"""Sync one cluster from its scheduler: the entry point of the Celery task and sync_inventory."""

from __future__ import annotations

import logging

from django.db import transaction

from inventory.choices import ChangeSource, ClusterKind
from inventory.models import Cluster
from inventory.services import InventoryError, SyncResult, apply_snapshot

logger = logging.getLogger(__name__)


class SyncError(RuntimeError):
    """The source could not be read; recorded on the cluster, nothing changed."""


def sync_cluster(cluster: Cluster) -> SyncResult:
    """Read the cluster's source and apply it. Errors are stored on the cluster and re-raised."""
    try:
        if cluster.kind == ClusterKind.SLURM:
            from inventory.sources.slurm import CliSlurmClient, SlurmError, snapshot_from_slurm

            try:
                snapshot = snapshot_from_slurm(CliSlurmClient(cluster.connection), cluster.connection)
            except SlurmError as exc:
                raise SyncError(str(exc)) from None
            source = ChangeSource.SLURM
        elif cluster.kind == ClusterKind.KUBERNETES:
            from inventory.sources.kubernetes import KubernetesError, client_for, snapshot_from_kubernetes

            try:
                snapshot = snapshot_from_kubernetes(client_for(cluster), cluster.connection)
            except KubernetesError as exc:
                raise SyncError(str(exc)) from None
            source = ChangeSource.KUBERNETES
        else:
            raise SyncError(f"cluster {cluster.name} is {cluster.kind}: it is fed by files (manage.py import_nodes)")
        return apply_snapshot(cluster, snapshot, source)
    except (SyncError, InventoryError) as exc:
        message = f"{cluster.name}: {exc}"
        logger.warning("inventory sync failed: %s", message)
        with transaction.atomic():
            Cluster.objects.filter(pk=cluster.pk).update(last_sync_error=message[:2000])
        raise SyncError(message) from None


def syncable_clusters() -> list[Cluster]:
    return list(Cluster.objects.filter(sync_enabled=True, kind__in=[ClusterKind.SLURM, ClusterKind.KUBERNETES]))
