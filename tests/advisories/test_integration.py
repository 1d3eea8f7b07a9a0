"""Advisories wired to the rest: inventory syncs, the beat task, KEV over HTTP."""

from __future__ import annotations

import io
import json

import pytest
from django.conf import settings
from django.test import override_settings

from advisories.models import Advisory, Exposure, KevEntry
from advisories.tasks import ingest_configured_sources
from inventory.models import Cluster
from inventory.services import ObservedNode, Snapshot, apply_snapshot
from tests.advisories.conftest import FIXTURES

pytestmark = pytest.mark.django_db


def test_an_inventory_sync_upgrading_a_node_remediates_it(django_capture_on_commit_callbacks):
    """The real inventory service sends node_versions_changed on commit; exposures follow."""
    with override_settings(GPUSWEEP_ADVISORY_SOURCES={"five": str(FIXTURES / "5703.json")}):
        assert "five: new 1" in ingest_configured_sources.run(["five"])
    cluster = Cluster.objects.create(name="slurm-a", kind="static")
    with django_capture_on_commit_callbacks(execute=True):
        apply_snapshot(cluster, Snapshot(nodes=[ObservedNode("gpu01", components={"driver": "570.172.08"}),
                                                ObservedNode("gpu02", components={"driver": "580.95.05"})]),
                       "file")
    exposure = Exposure.objects.get()
    assert (exposure.node.name, exposure.state, exposure.detected_version) == ("gpu01", "open", "570.172.08")
    with django_capture_on_commit_callbacks(execute=True):
        apply_snapshot(cluster, Snapshot(nodes=[ObservedNode("gpu01", components={"driver": "570.195.03"}),
                                                ObservedNode("gpu02", components={"driver": "580.95.05"})]),
                       "file")
    exposure.refresh_from_db()
    assert (exposure.state, exposure.fixed_by_version) == ("remediated", "570.195.03")


def test_the_beat_schedule_runs_the_configured_sources():
    assert settings.CELERY_BEAT_SCHEDULE["advisories-ingest"]["task"] == "advisories.tasks.ingest_configured_sources"
    with override_settings(GPUSWEEP_ADVISORY_SOURCES={"mirror": str(FIXTURES)}):
        first = ingest_configured_sources.run()
        second = ingest_configured_sources.run()
    assert first.startswith("mirror: new 6, updated 0, unchanged 0")
    assert second.startswith("mirror: new 0, updated 0, unchanged 6")
    assert Advisory.objects.count() == 6


def test_the_kev_catalogue_imports_from_a_url(http_server):
    from django.core.management import call_command

    base, handler = http_server
    handler.routes["/kev.json"] = (200, "application/json", json.dumps({"vulnerabilities": [
        {"cveID": "CVE-2024-0132", "dateAdded": "2024-10-01", "dueDate": "2024-10-22"}]}).encode())
    call_command("import_kev", f"{base}/kev.json", stdout=io.StringIO())
    assert KevEntry.objects.get().cve_id == "CVE-2024-0132"
