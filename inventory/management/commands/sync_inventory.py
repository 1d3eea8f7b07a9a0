"""`manage.py sync_inventory [--cluster NAME]`: sync Slurm/Kubernetes clusters now."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from inventory.models import Cluster
from inventory.sync import SyncError, sync_cluster, syncable_clusters


class Command(BaseCommand):
    help = "Sync clusters from their schedulers (all enabled Slurm and Kubernetes clusters, or --cluster NAME)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--cluster", action="append", default=[], help="cluster name (repeatable)")
        parser.add_argument("--no-progress", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        names: list[str] = options["cluster"]
        if names:
            clusters = list(Cluster.objects.filter(name__in=names))
            unknown = sorted(set(names) - {c.name for c in clusters})
            if unknown:
                raise CommandError(f"sync_inventory: no cluster named {', '.join(unknown)}")
        else:
            clusters = syncable_clusters()
        totals = {"added": 0, "changed": 0, "removed": 0, "errors": 0}
        errors: list[str] = []
        for cluster in tqdm(clusters, desc="syncing", unit=" cluster", disable=options["no_progress"],
                            file=self.stderr):
            try:
                result = sync_cluster(cluster)
            except SyncError as exc:
                errors.append(str(exc))
                self.stdout.write(f"cluster {cluster.name}: ERROR {exc}")
                continue
            for key in ("added", "changed", "removed"):
                totals[key] += getattr(result, key)
            state = "no changes" if result.no_changes else result.summary()
            self.stdout.write(f"cluster {cluster.name}: {state}")
        totals["errors"] = len(errors)
        self.stdout.write(
            f"summary: {len(clusters)} clusters; {totals['added']} added, {totals['changed']} changed, "
            f"{totals['removed']} removed, {totals['errors']} errors"
        )
        if errors:
            raise CommandError("sync_inventory: " + "; ".join(errors))
