"""python manage.py ingest_advisories [SOURCE ...]

SOURCE is a CSAF file, a folder, a URL (a .json document, otherwise a feed), "<kind>:<location>"
(file, folder, url, feed, github, index) or a configured source name; default: every source in
GPUSWEEP_ADVISORY_SOURCES.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from advisories.csaf import DocumentError
from advisories.ingest import IngestSummary, ingest_documents
from advisories.sources import resolve


def _ticker(bar: tqdm) -> Callable[[str], None]:
    def tick(_name: str) -> None:
        bar.update()

    return tick


class Command(BaseCommand):
    help = "Ingest security advisories (CSAF files, folders, URLs, feeds, NVIDIA's index) and update exposures."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("sources", nargs="*", help="file, folder, URL, kind:location or configured name")
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")

    def handle(self, *args: Any, **options: Any) -> None:
        specs: list[str] = options["sources"] or sorted(settings.GPUSWEEP_ADVISORY_SOURCES)
        if not specs:
            raise CommandError("no SOURCE given and GPUSWEEP_ADVISORY_SOURCES is empty")
        total = IngestSummary()
        for spec in specs:
            try:
                source = resolve(spec)
            except DocumentError as exc:
                raise CommandError(str(exc)) from None
            bar = tqdm(desc=str(spec)[-40:], unit="doc", disable=options["no_progress"],
                       file=self.stderr._out)
            summary = ingest_documents(source.items(), progress=_ticker(bar))
            bar.close()
            self.stdout.write(f"{spec}: {summary.line()}")
            if options["verbosity"] > 0:
                for line in summary.document_lines():
                    self.stdout.write(f"  {line}")
            for error in summary.errors:
                self.stderr.write(f"  rejected: {error}")
            total.merge(summary)
        if len(specs) > 1:
            self.stdout.write(f"total: {total.line()}")
        if total.integrity.get("mismatch"):
            self.stdout.write(self.style.WARNING(
                f"{total.integrity['mismatch']} document(s) do not match their published SHA-256 (see the advisory)"))
        if total.review:
            self.stdout.write(self.style.WARNING(
                f"{total.review} item(s) need review: rows not decoded, products no component maps to, "
                "skipped driver branches (see each advisory)"))
        if total.errors:
            raise CommandError(f"{len(total.errors)} document(s) rejected; the others were ingested")
