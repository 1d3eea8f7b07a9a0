"""Print the public key that checks this service's evidence signatures (give it to auditors)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from campaigns import signing


class Command(BaseCommand):
    help = "Print the Ed25519 public key (PEM) of the evidence signing key, and its id."

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(signing.public_key_pem().rstrip())
        self.stderr.write(f"key id {signing.key_id()}")
