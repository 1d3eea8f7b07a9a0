"""python manage.py simulate (--fleet FILE [--mapping NAME] | --cluster NAME) --trace FILE
[--severity high | --advisory ID] [--release DAYS|DATETIME] [--campaign ID] [--<parameter> VALUE ...]
[--format table|csv|json] [--sensitivity]"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from costs import fleet, report
from costs.inputs import SEVERITIES, InputError, is_sacct, parse_moment, prepare, tunable, zone_of
from costs.model import ModelError
from costs.sacct import SacctError
from costs.sensitivity import sensitivity, table
from costs.simulate import simulate
from costs.trace import DEFAULT_ORIGIN, TraceError
from costs.tracestats import trace_stats


class Command(BaseCommand):
    help = ("Compare maintenance windows, rolling drain-and-wait and checkpoint-migrate sweeps on a fleet and "
            "a job trace (sacct -P output, or a pod/task CSV such as Alibaba's openb_pod_list_default.csv).")

    def add_arguments(self, parser: CommandParser) -> None:
        where = parser.add_mutually_exclusive_group(required=True)
        where.add_argument("--fleet", type=Path, help="a node file (what import_nodes reads)")
        where.add_argument("--cluster", help="a cluster of the inventory")
        parser.add_argument("--mapping", help="mapping for the node file (alibaba-openb-2023 is detected)")
        parser.add_argument("--trace", type=Path, required=True, help="sacct -P output or a pod/task CSV")
        what = parser.add_mutually_exclusive_group()
        what.add_argument("--severity", choices=SEVERITIES, help="the advisory's severity (default high)")
        what.add_argument("--advisory", help="an advisory in the database, by publisher id (e.g. 5703)")
        parser.add_argument("--release", default="",
                            help="days after the trace's start, or a moment (default: the middle of the trace)")
        parser.add_argument("--trace-start", default=DEFAULT_ORIGIN.isoformat(),
                            help="the moment a pod/task file's clock starts at (its times are seconds from it)")
        parser.add_argument("--campaign", type=int,
                            help="simulate with this campaign's policy (parallelism, canary, soak, workload policy, "
                                 "wait limit, node estimate); --<parameter> options still win")
        parser.add_argument("--tz", default="UTC", help="time zone of sacct times and of naive moments")
        for name, text, default in tunable():
            parser.add_argument(f"--{name.replace('_', '-')}", dest=f"p_{name}", default=None,
                                help=f"{text} (default {default or 'unset'})".replace("%", "%%"))
        parser.add_argument("--format", choices=["table", "csv", "json"], default="table")
        parser.add_argument("--sensitivity", action="store_true",
                            help="also vary parallelism, window cadence, checkpointable share and wait limit one at "
                                 "a time and print where each strategy wins (costs.sensitivity)")

    def handle(self, *args: Any, **options: Any) -> None:
        values = {k[2:]: v for k, v in options.items() if k.startswith("p_") and v is not None}
        try:
            zone = zone_of(options["tz"])
            nodes = (fleet.from_file(options["fleet"], options["mapping"]) if options["fleet"]
                     else fleet.from_cluster(options["cluster"]))
            try:
                text = options["trace"].read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise CommandError(f"{options['trace']}: {exc}") from None
            tr, params, _label = prepare(
                text, values, severity=options["severity"] or "", advisory_id=options["advisory"] or "",
                release=options["release"], origin=parse_moment(options["trace_start"], zone, "--trace-start"),
                zone=zone, source=options["trace"].name, campaign_id=options["campaign"])
            result = simulate(nodes, tr, params)
            if not is_sacct(text):
                result.stats = trace_stats(text, (result.release,))
            points = sensitivity(nodes, tr, params) if options["sensitivity"] else []
        except SacctError as exc:
            raise CommandError(f"{options['trace']}: {exc}", returncode=2) from None
        except (fleet.FleetError, TraceError, ModelError, InputError) as exc:
            raise CommandError(str(exc), returncode=2) from None
        rendered = {"json": report.sim_json, "csv": report.sim_csv, "table": report.sim_table}
        self.stdout.write(rendered[options["format"]](result))
        if points:
            self.stdout.write("\nsensitivity (one parameter at a time, the others as above):\n" + table(points))
