"""Restore a campaign's stranded workloads (checkpoints a failed sweep could restore nowhere)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from campaigns.engine.recovery import recover_stranded
from campaigns.models import Campaign


class Command(BaseCommand):
    help = ("Restore the workloads a failed sweep left stranded (their checkpoints kept) on their own node, once "
            "it is back in service, or on any node where the checkpoint is valid and has room. Exits 1 while any "
            "is still stranded, saying why.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("campaign", type=int, help="the campaign id (the alert and the campaign page name it)")
        parser.add_argument("--actor", default="operator", help="who recovers them, for the evidence")

    def handle(self, *args: Any, campaign: int, actor: str, **options: Any) -> None:
        if not Campaign.objects.filter(pk=campaign).exists():
            raise CommandError(f"campaign {campaign} does not exist")
        outcome = recover_stranded(campaign, f"user:{actor}")
        if not outcome:
            self.stdout.write(f"campaign {campaign}: no stranded workload")
            return
        for entry in outcome:
            if entry["state"] == "restored":
                self.stdout.write(f"{entry['workload']}: restored on {entry['to']} as {entry['new_id']}")
            else:
                self.stderr.write(f"{entry['workload']}: still stranded ({entry['why']}); checkpoint "
                                  f"{entry['checkpoint_id']} kept")
        left = sum(1 for e in outcome if e["state"] != "restored")
        if left:
            raise CommandError(f"{left} workload(s) still stranded: free a compatible node and run this again")
