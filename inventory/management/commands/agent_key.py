"""`manage.py agent_key CLUSTER NODE`: print the key a node's agent signs with."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from inventory.agent import node_key
from inventory.models import Cluster


class Command(BaseCommand):
    help = (
        "Print the node key derived from GPUSWEEP_AGENT_FLEET_SECRET for CLUSTER/NODE. Give it to the node once "
        "(its agent config); the service stores nothing and derives it again on each request."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("cluster")
        parser.add_argument("node")

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.GPUSWEEP_AGENT_FLEET_SECRET:
            raise CommandError("agent_key: GPUSWEEP_AGENT_FLEET_SECRET is not set in the environment")
        if not Cluster.objects.filter(name=options["cluster"]).exists():
            raise CommandError(f"agent_key: no cluster named {options['cluster']!r} (create it first)")
        self.stdout.write(node_key(options["cluster"], options["node"]))
