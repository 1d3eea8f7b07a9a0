"""A small fleet in the inventory and in the memory executor, and a synchronous campaign driver."""

from __future__ import annotations

import time
from typing import Any

from django.contrib.auth.models import Group, User

from campaigns import engine, services
from campaigns.choices import CampaignStatus, SweepState
from campaigns.models import Campaign, NodeSweep
from executors.memory import Fleet
from inventory.models import Cluster, Node, NodeComponent, Workload
from inventory.versions import parse_version

OLD, FIXED = "570.86.15", "570.195.03"


def add_node(fleet: Fleet, cluster: Cluster, name: str, *, driver: str = OLD, pool: str = "a", gpus: int = 8,
             workloads: int = 1, labels: dict[str, str] | None = None, engine: str = "criu",
             gpu_model: str = "H100") -> Node:
    node = Node.objects.create(cluster=cluster, name=name, pool=pool, gpu_model=gpu_model, gpu_count=gpus,
                               labels=labels or {})
    versions = {"driver": driver, "cuda": "12.8"}
    for component, version in versions.items():
        parsed = parse_version(component, version)
        NodeComponent.objects.create(node=node, component=component, version=version, version_key=parsed.key,
                                     branch=parsed.branch)
    fleet.add_node(cluster.name, name, gpu_model=gpu_model, gpu_count=gpus, versions=versions)
    for index in range(workloads):
        ref = f"{name}-w{index}"
        Workload.objects.create(cluster=cluster, node=node, kind="process", scheduler_id=ref, name=f"job-{ref}",
                                gpus=2, checkpoint_engine=engine)
        fleet.add_workload(cluster.name, name, ref, name=f"job-{ref}", gpus=2, engine=engine, rate=1000)
    return node


def make_fleet(nodes: int = 4, spares: int = 2, **kwargs: Any) -> tuple[Fleet, Cluster]:
    fleet = Fleet()
    fleet.reset()
    cluster = Cluster.objects.create(name="local", kind="static", connection={"executor": "memory"})
    for index in range(nodes):
        add_node(fleet, cluster, f"gpu{index:02d}", labels={"sweep": "yes"}, **kwargs)
    for index in range(spares):
        add_node(fleet, cluster, f"spare{index:02d}", labels={"sweep": "no"}, workloads=0)
    return fleet, cluster


def user(name: str, *roles: str) -> User:
    person = User.objects.create_user(name, password=f"pw-{name}-123456")
    for role in roles:
        person.groups.add(Group.objects.get(name=role))
    return person


def approved_campaign(requester: User, approver: User, **fields: Any) -> Campaign:
    # No canary unless a test asks: most tests are about something else than the soak.
    defaults: dict[str, Any] = {"name": "sweep", "requested_by": requester, "node_selector": {"sweep": "yes"},
                                "canary": "0",
                                "target_versions": {"driver": {"R570": FIXED}}, "parallelism_per_cluster": "2"}
    campaign = Campaign.objects.create(**{**defaults, **fields})
    services.make_plan(campaign.pk, requester)
    services.approve(campaign.pk, approver)
    campaign.refresh_from_db()
    return campaign


def drive(campaign_id: int, rounds: int = 200) -> Campaign:
    """Run dispatch and every working step until the campaign rests (what Celery does, in order)."""
    for _ in range(rounds):
        engine.dispatch(campaign_id)
        working = list(NodeSweep.objects.filter(campaign_id=campaign_id, state__in=SweepState.WORKING)
                       .values_list("pk", flat=True))
        for sweep_id in working:
            engine.advance(sweep_id)
        campaign = Campaign.objects.get(pk=campaign_id)
        if not working and campaign.status != CampaignStatus.RUNNING:
            return campaign
        if not working and not NodeSweep.objects.filter(campaign_id=campaign_id, state=SweepState.PENDING).exists():
            engine.dispatch(campaign_id)
            return Campaign.objects.get(pk=campaign_id)
    return Campaign.objects.get(pk=campaign_id)


def drive_until_rest(campaign_id: int, timeout: float = 120) -> Any:
    """drive() again while the engine waits (retry backoff, a workload it waits for) until the campaign rests."""
    deadline = time.monotonic() + timeout
    while True:
        done = drive(campaign_id)
        busy = NodeSweep.objects.filter(campaign_id=campaign_id, state__in=SweepState.ACTIVE).exists()
        if (not busy and done.status != CampaignStatus.RUNNING) or time.monotonic() > deadline:
            return done
        time.sleep(0.5)


def completed_campaign(capture_on_commit: Any) -> Campaign:
    """A two-node campaign on the memory fleet driven to completion, its on-commit work run (digests,
    exposures): `capture_on_commit` is pytest-django's django_capture_on_commit_callbacks."""
    make_fleet(nodes=2, spares=2)
    requester, approver = user("rita", "operator"), user("alan", "approver")
    with capture_on_commit(execute=True):
        planned = approved_campaign(requester, approver)
        services.start(planned.pk, requester)
        done = drive(planned.pk)
    assert done.status == CampaignStatus.COMPLETED
    return done


def driver_advisory(nodes: list[Node], publisher_id: str = "9999") -> Any:
    """An advisory whose R570 range holds every node below FIXED, and their open exposures."""
    from advisories.exposure import recompute
    from advisories.models import Advisory, AffectedRange
    from inventory.versions import parse_version

    advisory = Advisory.objects.create(publisher_id=publisher_id, title="GPU Display Driver", source_kind="file",
                                       source=f"{publisher_id}.json", severity="high")
    AffectedRange.objects.create(advisory=advisory, product_id="linuxr570", component="driver", branch="R570",
                                 os_family="linux", product_line="tesla", raw=f"all versions prior to {FIXED}",
                                 upper_version=FIXED, upper_key=parse_version("driver", FIXED).key,
                                 fixed_version=FIXED, severity="high")
    recompute(node_ids=[n.pk for n in nodes])
    return advisory
