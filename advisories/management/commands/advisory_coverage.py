"""Print the coverage line of every CSAF document in a folder (or of the files named): its rows
decoded, presumed and under review, and any row in none of them (which must not happen)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from advisories import coverage
from advisories.csaf import DocumentError, parse


class Command(BaseCommand):
    help = "Coverage of CSAF documents: rows decoded / presumed / under review, per bulletin"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("paths", nargs="+", help="CSAF JSON files or folders of them")
        parser.add_argument("--silent-only", action="store_true", help="print only bulletins with silent rows")

    def handle(self, *args: Any, **options: Any) -> None:
        files = sorted({f for p in map(Path, options["paths"]) for f in (
            p.glob("*.json") if p.is_dir() else [p])})
        if not files:
            raise CommandError("no CSAF file found")
        totals = coverage.Coverage()
        silent = errors = 0
        for path in files:
            try:
                parsed = parse(path.read_bytes(), path.name)
            except (DocumentError, OSError) as exc:
                self.stdout.write(f"{path.name}: not a CSAF document ({exc})")
                errors += 1
                continue
            result = coverage.of_parsed(parsed)
            for name, count in result.rows.items():
                totals.rows[name] += count
            totals.silent += result.silent
            silent += bool(result.silent)
            if not options["silent_only"] or result.silent:
                self.stdout.write(f"{parsed.publisher} {parsed.publisher_id} ({path.name}): {result.line()}")
                for row in result.silent:
                    self.stdout.write(f"  silent: {row}")
        self.stdout.write(f"total ({len(files) - errors} bulletins): {totals.line()}")
        if errors:
            self.stdout.write(f"{errors} file(s) not read")
