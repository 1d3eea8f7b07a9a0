"""End to end on PostgreSQL, Redis and real Celery worker and beat processes, with SIGKILL faults.

The nodes are the memory executor's (a test double shared by the processes through a state
file): the node agent in agent/ did not yet serve its HTTP API when this test was written, so
the local executor cannot drive real agents here. Everything else is real: the database, the
broker, the worker processes that are killed with SIGKILL, beat's re-drive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from campaigns import services
from campaigns.choices import CampaignStatus, MoveState, SweepState
from campaigns.models import Campaign, EvidenceEvent, NodeSweep, WorkloadMove
from conftest import need
from executors.memory import Fleet
from tests.campaigns.fleet import FIXED, add_node, user
from tests.helpers import REPO, clean_env, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STEP_S = 0.3


def _env(state: Path) -> dict[str, str]:
    settings_db = connection.settings_dict
    db = f"postgres://{settings_db['USER'] or 'root'}@{settings_db['HOST'] or '127.0.0.1'}:" \
         f"{settings_db['PORT'] or 5432}/{settings_db['NAME']}"
    return clean_env(
        DATABASE_URL=db, CELERY_BROKER_URL=os.environ["CELERY_BROKER_URL"],
        GPUSWEEP_MEMORY_EXECUTOR_STATE=str(state), GPUSWEEP_MEMORY_EXECUTOR_STEP_S=str(STEP_S),
        GPUSWEEP_CAMPAIGN_REDRIVE_EVERY_S="1", GPUSWEEP_ADVISORY_SOURCES="",
    )


def _start(kind: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    args = ["worker", "--concurrency", "2", "--loglevel", "INFO", "--without-heartbeat", "--without-mingle",
            "--without-gossip"] if kind == "worker" else ["beat", "--loglevel", "INFO"]
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "celery", "-A", "gpusweep", *args], env=env, cwd=REPO,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _kill(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def test_it_completes_a_six_node_campaign_while_the_worker_is_killed_in_every_state(tmp_path: Path):
    need(os.environ.get("DATABASE_URL", "").startswith("postgres")
         and os.environ.get("CELERY_BROKER_URL", "").startswith("redis"),
         "set DATABASE_URL=postgres://root@127.0.0.1:5432/<db> and CELERY_BROKER_URL=redis://127.0.0.1:6379/<n> "
         "(as .ci/run does) to run the campaign end to end on PostgreSQL, Redis and Celery workers")
    from inventory.models import Cluster

    state = tmp_path / "fleet.json"
    env = _env(state)
    subprocess.run([sys.executable, "-m", "celery", "-A", "gpusweep", "purge", "-f"], env=env, cwd=REPO,
                   check=True, capture_output=True, timeout=60)
    fleet = Fleet(str(state))
    cluster = Cluster.objects.create(name="local", kind="static", connection={"executor": "memory"})
    for index in range(6):
        add_node(fleet, cluster, f"gpu{index:02d}", labels={"sweep": "yes"})
    for index in range(2):
        add_node(fleet, cluster, f"spare{index:02d}", labels={"sweep": "no"}, workloads=0)
    before = {w["name"]: w["steps"] for n in fleet.snapshot()["nodes"].values() for w in n["workloads"].values()}

    rita, alan = user("rita", "operator"), user("alan", "approver")
    campaign = Campaign.objects.create(name="e2e", requested_by=rita, node_selector={"sweep": "yes"},
                                       target_versions={"driver": {"R570": FIXED}}, parallelism_per_cluster="1",
                                       step_timeout_s=4, error_budget="0")
    services.make_plan(campaign.pk, rita)
    services.approve(campaign.pk, alan)

    log = tmp_path / "celery.log"
    beat = _start("beat", env, log)
    worker = _start("worker", env, log)
    kills: list[str] = []
    try:
        services.start(campaign.pk, rita)
        # SIGKILL the worker once in each node state, while it is executing that state's step.
        for wanted in [s for s in SweepState.STEPS if s in SweepState.WORKING]:
            busy = wait_for(lambda wanted=wanted: NodeSweep.objects.filter(
                campaign=campaign, state=wanted).exclude(lease_owner="").exists(), timeout=120, interval=0.05)
            assert busy, f"no node reached {wanted}; log:\n{log.read_text()[-3000:]}"
            time.sleep(STEP_S / 3)
            _kill(worker)
            kills.append(wanted)
            worker = _start("worker", env, log)
        done = wait_for(lambda: Campaign.objects.get(pk=campaign.pk).status in CampaignStatus.TERMINAL,
                        timeout=240, interval=0.5)
        assert done, f"campaign did not finish; log:\n{log.read_text()[-4000:]}"
    finally:
        _kill(worker)
        _kill(beat)

    assert kills == ["draining", "checkpointing", "migrating", "patching", "rebooting", "verifying", "returning"]
    campaign.refresh_from_db()
    assert campaign.status == CampaignStatus.COMPLETED, campaign.status_reason
    assert set(NodeSweep.objects.filter(campaign=campaign).values_list("state", flat=True)) == {SweepState.DONE}
    snapshot = fleet.snapshot()
    for index in range(6):
        node = snapshot["nodes"][f"local/gpu{index:02d}"]
        assert node["versions"]["driver"] == FIXED, node
        assert node["patches"] == {"driver": 1}, "a node was patched twice"
        assert node["reboots"] == 1
    assert not any(n["maintenance"] for n in snapshot["nodes"].values()), "a node was left drained"
    # No workload lost or duplicated; each continued from its checkpoint.
    running = [w for n in snapshot["nodes"].values() for w in n["workloads"].values() if w["state"] == "running"]
    assert sorted(w["name"] for w in running) == sorted(before)
    for workload in running:
        assert workload["steps"] > before[workload["name"]]
    moves = list(WorkloadMove.objects.filter(sweep__campaign=campaign))
    assert len(moves) == 6 and all(m.state == MoveState.RESTORED for m in moves)
    assert all(m.steps_after >= m.steps_before > 0 for m in moves)

    call_command("verify_evidence", campaign=campaign.pk)
    event = EvidenceEvent.objects.filter(campaign=campaign, kind="restored").first()
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {EvidenceEvent._meta.db_table} SET data = %s WHERE id = %s",
                       ['{"workload": "forged"}', event.pk])
    with pytest.raises(CommandError, match="evidence verification failed"):
        call_command("verify_evidence", campaign=campaign.pk)
