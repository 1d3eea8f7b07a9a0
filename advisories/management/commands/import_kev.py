"""python manage.py import_kev FILE_OR_URL: CISA's KEV catalogue (JSON); its due dates override."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from advisories.csaf import DocumentError
from advisories.kev import import_catalogue, load


class Command(BaseCommand):
    help = "Import CISA's Known Exploited Vulnerabilities catalogue (JSON file or URL)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("location", help="known_exploited_vulnerabilities.json path or URL")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            count = import_catalogue(load(options["location"]), options["location"])
        except DocumentError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"imported {count} KEV entries; deadlines refreshed")
