"""`manage.py demo_fleet`: real agent processes and counter workloads, registered in the inventory."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from campaigns.management.commands.demo_fleet import Command
from executors.base import NodeRef
from executors.local import LocalExecutor
from inventory.models import Node, Workload

pytestmark = [pytest.mark.slow, pytest.mark.django_db]


def test_it_starts_a_fleet_in_two_branches_with_counting_workloads(tmp_path: Path, settings):
    settings.GPUSWEEP_AGENT_FLEET_SECRET = "demo-fleet-secret-for-tests"
    command = Command()
    try:
        command.handle(nodes=8, base_port=0, service_url="http://127.0.0.1:9", dir=str(tmp_path), once=True)
        nodes = list(Node.objects.filter(cluster__name="demo").prefetch_related("components"))
        assert len(nodes) == 8
        branches = {c.branch for n in nodes for c in n.components.all() if c.component == "driver"}
        assert branches == {"R570", "R580"}
        assert Workload.objects.filter(cluster__name="demo", checkpoint_engine="signal").count() == 8
        executor = LocalExecutor(None)
        deadline = time.monotonic() + 30
        for node in nodes:
            ref = NodeRef(cluster="demo", name=node.name, endpoint=node.agent_endpoint)
            assert executor.verify(ref).healthy
            while not [w for w in executor.list_workloads(ref) if w.id == f"count-{node.name}"]:
                assert time.monotonic() < deadline, f"no counter registered on {node.name}"
                time.sleep(0.2)
        log = tmp_path / "counter-gpu01.log"
        time.sleep(2.5)
        assert len(log.read_text().split()) >= 2, "the demo counter counts"
    finally:
        command._kill_workloads(tmp_path)
        for proc in getattr(command, "processes", []):
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)
