"""`manage.py import_nodes FILE [--cluster NAME] [--mapping MAPPING] [--partial]`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from inventory.importers import Mapping, import_file
from inventory.services import InventoryError


class Command(BaseCommand):
    help = (
        "Import a node list (CSV or JSON) as one static cluster, in one transaction: a bad row stops the "
        "import with its line and nothing is written. Nodes of the cluster missing from the file are "
        "marked gone unless --partial."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path)
        parser.add_argument("--cluster", help="cluster name (default: the file name)")
        parser.add_argument(
            "--mapping", help="mapping JSON file, or the name of a shipped one (e.g. alibaba-openb-2023)"
        )
        parser.add_argument("--partial", action="store_true", help="the file is not the whole cluster")
        parser.add_argument("--no-progress", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["file"]
        bar = tqdm(desc=f"reading {path.name}", unit=" nodes", disable=options["no_progress"], file=self.stderr)
        try:
            mapping = Mapping.load(options["mapping"])
            cluster, result = import_file(
                path, options["cluster"], mapping, partial=options["partial"], progress=bar.update
            )
        except InventoryError as exc:
            raise CommandError(f"import_nodes: nothing imported: {exc}") from None
        finally:
            bar.close()
        self.stdout.write(f"cluster {cluster.name}: {result.summary()}")
