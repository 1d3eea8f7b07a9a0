"""Write a campaign's signed evidence export, and the public key an auditor checks it with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from campaigns import evidence, signing
from campaigns.models import Campaign


class Command(BaseCommand):
    help = ("Export a campaign's evidence (sealed and signed now) as JSON; check it anywhere with "
            "`python -m campaigns.verify EXPORT --public-key KEY`.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("campaign", type=int)
        parser.add_argument("--output", "-o", type=Path, help="file to write (default: standard output)")
        parser.add_argument("--public-key", type=Path, help="also write the service's public key (PEM) here")

    def handle(self, *args: Any, campaign: int, output: Path | None = None, public_key: Path | None = None,
               **options: Any) -> None:
        if not Campaign.objects.filter(pk=campaign).exists():
            raise CommandError(f"campaign {campaign} does not exist")
        text = json.dumps(evidence.export(campaign, "cli:export_evidence"), indent=2, sort_keys=True)
        if output is None:
            self.stdout.write(text)
        else:
            output.write_text(text + "\n", encoding="utf-8")
            self.stderr.write(f"wrote {output}")
        if public_key is not None:
            public_key.write_text(signing.public_key_pem(), encoding="utf-8")
            self.stderr.write(f"wrote {public_key}")
