"""Print the coverage line of every CSAF document in a folder (or of the files named): its rows
decoded, presumed and under review, and any row in none of them (which must not happen).

A folder is read as the ingest reads it (every *.json below it, flat or NVIDIA's YEAR/ID/ID.json);
JSON that is plainly something else (a CVE record, an index) is named and skipped. A document that
does not parse, or one with a silent row, ends the command non-zero, after every line is printed.
"""

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
        named = [Path(p) for p in options["paths"]]
        missing = [str(p) for p in named if not p.exists()]
        if missing:
            raise CommandError(f"no such file or folder: {', '.join(missing)}")
        # A file named on the command line is meant as a bulletin; only a folder's other JSON is skipped.
        in_folder: dict[Path, bool] = {}
        for p in named:
            for f in p.rglob("*.json") if p.is_dir() else [p]:
                in_folder[f] = in_folder.get(f, True) and p.is_dir()
        totals = coverage.Coverage()
        broken: list[str] = []
        silent = read = 0
        for path in sorted(in_folder):
            try:
                content = path.read_bytes()
                if in_folder[path] and coverage.other_json(content):
                    self.stdout.write(f"{path.name}: skipped, not a CSAF document")
                    continue
                parsed = parse(content, path.name)
            except (DocumentError, OSError) as exc:
                problem = exc.problem if isinstance(exc, DocumentError) else exc.strerror
                self.stdout.write(f"{path.name}: BROKEN, does not parse as CSAF 2.0 ({problem})")
                broken.append(f"{path} ({problem})")
                continue
            read += 1
            result = coverage.of_parsed(parsed)
            for name, count in result.rows.items():
                totals.rows[name] += count
            totals.silent += result.silent
            silent += bool(result.silent)
            if not options["silent_only"] or result.silent:
                self.stdout.write(f"{parsed.publisher} {parsed.publisher_id} ({path.name}): {result.line()}")
                for row in result.silent:
                    self.stdout.write(f"  silent: {row}")
        self.stdout.write(f"total ({read} bulletin{'s' * (read != 1)}): {totals.line()}")
        failures = [f"{len(broken)} file(s) do not parse as CSAF 2.0: {'; '.join(broken)}"] if broken else []
        if silent:
            failures.append(f"{silent} bulletin(s) have rows that end in nothing (silent)")
        if not read and not broken:
            failures.append(f"no CSAF document in {', '.join(map(str, named))}")
        if failures:
            raise CommandError(". ".join(failures))
