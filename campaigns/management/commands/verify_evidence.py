"""Check every campaign's evidence chain (or one): exits 1 naming each broken event."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from campaigns.evidence import verify_campaign
from campaigns.models import Campaign


class Command(BaseCommand):
    help = "Verify the evidence: edited, removed, reordered or inserted events and rewritten chains."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--campaign", type=int, help="only this campaign id")

    def handle(self, *args: Any, campaign: int | None = None, **options: Any) -> None:
        campaigns = Campaign.objects.order_by("pk")
        if campaign is not None:
            campaigns = campaigns.filter(pk=campaign)
            if not campaigns.exists():
                raise CommandError(f"campaign {campaign} does not exist")
        problems: list[str] = []
        checked = 0
        for item in campaigns:
            checked += 1
            found = verify_campaign(item)
            problems.extend(f"campaign {item.pk}: {problem}" for problem in found)
            if not found:
                self.stdout.write(f"campaign {item.pk}: {item.events.count()} events, every chain intact and signed")
        for problem in problems:
            self.stderr.write(str(problem))
        if problems:
            raise CommandError(f"evidence verification failed: {len(problems)} problem(s) in {checked} campaign(s)")
        self.stdout.write(f"evidence intact for {checked} campaign(s)")
