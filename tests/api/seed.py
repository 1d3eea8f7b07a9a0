"""A small but complete database for API-wide tests: every list and detail route has rows to show.

Two clusters (a static one driven by the memory executor, an idle Slurm one), nodes with
components, workloads, the five bundled NVIDIA bulletins and their exposures (one with its risk
accepted, one remediated), a deadline override, change-log rows with and without a user, and
campaigns in draft, planned, approved and completed state with sweeps, moves and evidence.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.authtoken.models import Token

from advisories.choices import ExposureState
from advisories.ingest import ingest_documents
from advisories.models import ClusterDeadlineOverride, Exposure
from advisories.sources import FolderSource
from campaigns import services
from campaigns.models import Campaign
from inventory.choices import ChangeSource, ClusterKind, ServiceState
from inventory.models import Cluster
from inventory.services import ObservedNode, Snapshot, apply_snapshot, set_service_state
from tests.advisories.conftest import FIXTURES
from tests.campaigns.fleet import FIXED, approved_campaign, drive, make_fleet, user


@dataclass
class Seeded:
    admin: User
    token: str
    campaigns: dict[str, int]


def seed() -> Seeded:
    admin = User.objects.create_superuser("schema-admin", password="pw-schema-admin-123456")
    token = Token.objects.create(user=admin).key
    operator, approver = user("olga", "operator"), user("abe", "approver")
    user("vic", "viewer")

    _fleet, local = make_fleet(nodes=3, spares=2)
    hpc = Cluster.objects.create(name="hpc", kind=ClusterKind.SLURM, sync_enabled=False,
                                 connection={"slurm_conf": "/nonexistent/slurm.conf"})
    # A source snapshot writes ChangeLog rows with no user; a campaign's writes name a reference.
    apply_snapshot(hpc, Snapshot(nodes=[ObservedNode(name="cn01", pool="batch", gpu_model="A100", gpu_count=4,
                                                     components={"driver": "535.183.01", "cuda": "12.2"})],
                                 complete=False), ChangeSource.FILE)
    set_service_state([hpc.nodes.get().pk], ServiceState.OFFLINE, ChangeSource.API, user_id=admin.pk)

    ingest_documents(FolderSource(str(FIXTURES)).items())
    exposures = list(Exposure.objects.filter(state=ExposureState.OPEN).order_by("pk")[:2])
    if exposures:
        Exposure.objects.filter(pk=exposures[0].pk).update(
            state=ExposureState.RISK_ACCEPTED, risk_approver=approver, risk_reason="isolated lab node",
            risk_expires_at=timezone.now() + dt.timedelta(days=30))
    ClusterDeadlineOverride.objects.create(cluster=local, severity="high", days=10)

    done = approved_campaign(operator, approver, name="completed sweep")
    services.start(done.pk, operator)
    drive(done.pk)
    draft = Campaign.objects.create(name="draft", requested_by=operator,
                                    target_versions={"driver": {"R570": FIXED}})
    planned = Campaign.objects.create(name="planned", requested_by=operator, node_selector={"sweep": "yes"},
                                      target_versions={"driver": {"R570": FIXED}})
    services.make_plan(planned.pk, operator)
    approved = approved_campaign(operator, approver, name="approved")
    return Seeded(admin=admin, token=token, campaigns={
        "completed": done.pk, "draft": draft.pk, "planned": planned.pk, "approved": approved.pk})
