"""Print the coverage line of every CSAF document in a folder (or of the files named): its rows
decoded, presumed and under review, and any row in none of them (which must not happen).

A folder is read as the ingest reads it (every .json file below it, flat or NVIDIA's
YEAR/ID/ID.json), each file's kind told by the ingest's own rule (`advisories.sources.json_kind`):
JSON of another kind (a CVE record, an OSV record, an index) is named and skipped. A document that
does not parse, or one with a silent row, ends the command non-zero, after every line is printed.

Each line is the coverage the product shows once the document is ingested (`advisories.coverage`,
one definition for both), less the node counts: those need the inventory matched against the
stored ranges, which only the ingest does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from advisories import coverage, sources
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
            found = (f for f in p.rglob("*") if f.suffix.lower() == ".json" and not f.is_dir()) if p.is_dir() else [p]
            for f in found:
                in_folder[f] = in_folder.get(f, True) and p.is_dir()
        totals = coverage.Coverage()
        broken: list[str] = []
        silent = read = 0
        for path in sorted(in_folder):
            try:
                content = path.read_bytes()
                kind = sources.json_kind(content) if in_folder[path] else sources.CSAF
                if kind != sources.CSAF:
                    why = sources.SKIPPED.get(kind) or f"{sources.KIND_NAMES[kind]}, which the ingest reads as such"
                    self.stdout.write(f"{path.name}: skipped, not a CSAF document: {why}")
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
