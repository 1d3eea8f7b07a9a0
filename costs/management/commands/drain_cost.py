"""python manage.py drain_cost --sacct FILE --window DATETIME [--window ...] [--baseline START END]
[--days 7] [--tz UTC] [--format table|csv|json]"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from costs import report
from costs.drain import DrainError, drain_cost
from costs.inputs import InputError, parse_moment, read_accounting, zone_of
from costs.sacct import COMMAND, SacctError


class Command(BaseCommand):
    help = f"What maintenance windows cost, from sacct output. Record it with: {COMMAND}"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--sacct", required=True, type=Path, help="sacct -P output (a header line, | separated)")
        parser.add_argument("--window", action="append", required=True, help="when a window opened (repeatable)")
        parser.add_argument("--baseline", nargs=2, metavar=("START", "END"),
                            help="an ordinary period (default: the week before the days measured)")
        parser.add_argument("--days", type=int, default=7, help="days before each window to measure (7)")
        parser.add_argument("--tz", default="UTC", help="time zone of the file and of naive times (UTC)")
        parser.add_argument("--format", choices=["table", "csv", "json"], default="table")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            zone = zone_of(options["tz"])
            windows = [parse_moment(w, zone, "--window") for w in options["window"]]
            baseline = None
            if options["baseline"]:
                baseline = (parse_moment(options["baseline"][0], zone, "--baseline START"),
                            parse_moment(options["baseline"][1], zone, "--baseline END"))
            try:
                text = options["sacct"].read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise CommandError(f"{options['sacct']}: {exc}") from None
            costs = drain_cost(read_accounting(text, zone), windows, baseline, options["days"])
        except SacctError as exc:
            raise CommandError(f"{options['sacct']}: {exc}") from None
        except (InputError, DrainError) as exc:
            raise CommandError(str(exc)) from None
        rendered = {"json": report.drain_json, "csv": report.drain_csv, "table": report.drain_table}
        self.stdout.write(rendered[options["format"]](costs))
