"""python manage.py exposures [--advisory ID] [--state open] [--format table|csv|json|csaf-vex] [--recompute]

`csaf-vex` prints one CSAF 2.0 VEX document: the fleet's status for the bulletin (or, without
--advisory, for every bulletin that has exposures)."""

from __future__ import annotations

import csv
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from advisories.choices import ExposureState
from advisories.exposure import recompute
from advisories.models import Advisory, Exposure
from advisories.vex import vex_document

COLUMNS = ["cluster", "node", "advisory", "component", "detected_version", "fixed_version", "severity", "state",
           "first_seen", "deadline", "fixed_by_version", "remediated_at", "cves"]


class Command(BaseCommand):
    help = "List exposures of the fleet to advisories (and recompute them in full on demand)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--advisory", help="publisher id, e.g. 5703")
        parser.add_argument("--state", choices=ExposureState.values(), help="only this state")
        parser.add_argument("--format", choices=["table", "csv", "json", "csaf-vex"], default="table")
        parser.add_argument("--recompute", action="store_true", help="recompute every exposure first")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["recompute"]:
            result = recompute()
            self.stderr.write(f"recomputed: opened {result.opened}, reopened {result.reopened}, "
                              f"remediated {result.remediated}")
        rows = Exposure.objects.select_related("node__cluster", "advisory", "affected_range").prefetch_related(
            "affected_range__cves").order_by("deadline", "node__cluster__name", "node__name")
        if options["advisory"]:
            if not Advisory.objects.filter(publisher_id=options["advisory"]).exists():
                raise CommandError(f"no advisory {options['advisory']!r}")
            rows = rows.filter(advisory__publisher_id=options["advisory"])
        if options["state"]:
            rows = rows.filter(state=options["state"])
        if options["format"] == "csaf-vex":
            advisories = Advisory.objects.filter(id__in=rows.values("advisory_id"))
            if options["advisory"]:
                advisories = Advisory.objects.filter(publisher_id=options["advisory"])
            # A state filter shows those exposures only, not the rest of the inventory.
            self.stdout.write(json.dumps(vex_document(advisories.order_by("publisher_id"), rows,
                                                      inventory=not options["state"]), indent=2))
            return
        records = [self.record(e) for e in rows]
        if options["format"] == "json":
            self.stdout.write(json.dumps(records, indent=2))
        elif options["format"] == "csv":
            writer = csv.DictWriter(self.stdout, fieldnames=COLUMNS, lineterminator="\n")
            writer.writeheader()
            writer.writerows(records)
        else:
            self.table(records, **options)

    @staticmethod
    def record(e: Exposure) -> dict[str, Any]:
        return {
            "cluster": e.node.cluster.name, "node": e.node.name, "advisory": str(e.advisory),
            "component": e.component, "detected_version": e.detected_version,
            "fixed_version": e.affected_range.fixed_version, "severity": e.severity, "state": e.state,
            "first_seen": e.first_seen.isoformat(), "deadline": e.deadline.isoformat() if e.deadline else "",
            "fixed_by_version": e.fixed_by_version,
            "remediated_at": e.remediated_at.isoformat() if e.remediated_at else "",
            "cves": " ".join(sorted(c.cve_id for c in e.affected_range.cves.all())),
        }

    def table(self, records: list[dict[str, Any]], **options: Any) -> None:
        shown = ["cluster", "node", "advisory", "component", "detected_version", "fixed_version", "severity",
                 "state", "deadline"]
        cells = [[str(r[c])[:25] if c != "deadline" else str(r[c])[:10] for c in shown] for r in records]
        widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(shown)]
        self.stdout.write("  ".join(c.ljust(w) for c, w in zip(shown, widths, strict=True)))
        for row in cells:
            self.stdout.write("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
        self.stdout.write(f"{len(records)} exposure(s)")
        presumed = sum(r["state"] == ExposureState.PRESUMED for r in records)
        if presumed:
            self.stdout.write(f"{presumed} of them presumed: the bulletin does not tell (a row not decoded, a "
                              "driver branch it skips); an approver can set them not affected")
        advisory = Advisory.objects.filter(publisher_id=options["advisory"]).first() if options["advisory"] else None
        if advisory is not None and advisory.ranges_unknown:
            self.stdout.write(f"warning: {advisory} is known only from an index: its affected ranges are unknown, "
                              "so 0 exposures does not mean the fleet is safe")
        if advisory is not None and (items := advisory.review_items.filter(state="open").count()):
            self.stdout.write(f"warning: {advisory} needs review: {items} item(s) were not decoded or mapped "
                              "(see the advisory); exposures may be incomplete")
