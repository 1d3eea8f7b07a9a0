"""End to end on PostgreSQL, Redis and real Celery worker and beat processes, with SIGKILL faults.

Two fleets. The first test drives real node agents (agent/: one process per node, simulated
patch and reboot as the agent offers them) through the local executor, with counter workloads
checkpointed by signal; the worker is killed in every node state. The second uses the memory
executor (a test double shared by the processes through a state file) to kill the worker in every
state with a short, fixed step time and check counts an agent cannot report (reboots).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from campaigns import services
from campaigns.choices import CampaignStatus, MoveState, SweepState
from campaigns.models import Campaign, EvidenceEvent, NodeSweep, WorkloadMove
from conftest import need
from executors.memory import Fleet
from inventory.models import Cluster, Node, NodeComponent, Workload
from inventory.versions import parse_version
from tests.campaigns.fleet import FIXED, add_node, user
from tests.helpers import REPO, clean_env, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

STEP_S = 0.3


@pytest.fixture(autouse=True)
def private_queue(monkeypatch: pytest.MonkeyPatch, settings) -> str:  # type: ignore[no-untyped-def]
    """A queue of this test's own, so that no other worker on the shared broker takes its tasks."""
    queue = f"e2e-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("GPUSWEEP_CELERY_QUEUE", queue)  # the workers and beat this test starts
    settings.CELERY_TASK_DEFAULT_QUEUE = queue  # what this process enqueues
    return queue


def _need_services() -> None:
    need(os.environ.get("DATABASE_URL", "").startswith("postgres")
         and os.environ.get("CELERY_BROKER_URL", "").startswith("redis"),
         "set DATABASE_URL=postgres://root@127.0.0.1:5432/<db> and CELERY_BROKER_URL=redis://127.0.0.1:6379/<n> "
         "(as .ci/run does) to run the campaign end to end on PostgreSQL, Redis and Celery workers")


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


def _at_rest(campaign: Campaign) -> bool:
    """Finished, or halted by its error budget (waiting on an operator): either way nothing moves."""
    return Campaign.objects.get(pk=campaign.pk).status in CampaignStatus.TERMINAL | {CampaignStatus.HALTED}


def _state(campaign: Campaign) -> object:
    row = Campaign.objects.get(pk=campaign.pk)
    return (row.status, row.status_reason,
            list(NodeSweep.objects.filter(campaign=campaign).values_list("node__name", "state", "error")))


def _kill_in_every_state(campaign: Campaign, worker: subprocess.Popen[bytes], env: dict[str, str], log: Path,
                         pause: float) -> tuple[subprocess.Popen[bytes], list[str]]:
    """SIGKILL the worker once in each node state, while it executes that state's step; restart it.

    On any failure the worker of the moment is killed too, so no worker outlives this test and
    takes the next test's tasks from the shared broker.
    """
    kills = []
    try:
        for wanted in [s for s in SweepState.STEPS if s in SweepState.WORKING]:
            # A node in the state: with a lease its step is executing; without one its step is queued
            # (a fast step such as returning may be over before a poll sees the lease). Either way
            # the worker dies with that state's step in hand or in its queue.
            in_state = NodeSweep.objects.filter(campaign=campaign, state=wanted)
            busy = wait_for(in_state.exists, timeout=180, interval=0.01)
            if not busy:
                campaign.refresh_from_db()
                states = list(NodeSweep.objects.filter(campaign=campaign).values_list("node__name", "state", "error"))
                raise AssertionError(f"no node reached {wanted}; campaign {campaign.status} "
                                     f"{campaign.status_reason!r}; sweeps {states}; log:\n{log.read_text()[-3000:]}")
            if in_state.exclude(lease_owner="").exists():
                time.sleep(pause)
            _kill(worker)
            kills.append(wanted)
            worker = _start("worker", env, log)
    except BaseException:
        _kill(worker)
        raise
    return worker, kills


def _agents_module():
    """The agent package's own test helpers: real `gpusweep-agent` processes and counter workloads."""
    sys.path.insert(0, str(REPO / "agent" / "tests"))
    import agent_helpers

    return agent_helpers


def test_real_agents_sweep_six_nodes_and_every_counter_continues_while_the_worker_dies(tmp_path: Path,
                                                                                      settings: Any) -> None:
    _need_services()
    helpers = _agents_module()
    # Planning (in this process) reads each agent's state: sign with the agents' fleet secret.
    settings.GPUSWEEP_AGENT_FLEET_SECRET = helpers.FLEET_SECRET
    store = tmp_path / "artifacts"
    simulate = {"reboot_command": "simulate", "patch_methods": '{"package": {"simulate": true}}',
                **helpers.NO_SCHEDULER}
    names = [f"gpu{i:02d}" for i in range(6)] + ["spare00", "spare01"]
    agents = {}
    counters: dict[str, Path] = {}
    procs = []
    worker = beat = None
    try:
        for name in names:
            agents[name] = helpers.AgentProcess(tmp_path, name, store, **simulate).start()
        cluster = Cluster.objects.create(name=helpers.CLUSTER, kind="static", connection={"executor": "local"})
        facts = helpers.FACTS
        for name, agent in agents.items():
            node = Node.objects.create(cluster=cluster, name=name, gpu_model=facts["gpu_model"], gpu_count=8,
                                       agent_endpoint=f"http://127.0.0.1:{agent.port}",
                                       labels={"sweep": "no" if name.startswith("spare") else "yes"})
            for component, version in facts["components"].items():
                parsed = parse_version(component, version)
                NodeComponent.objects.create(node=node, component=component, version=version,
                                             version_key=parsed.key, branch=parsed.branch)
            if name.startswith("gpu"):
                counters[name] = tmp_path / f"counter-{name}.log"
                procs.append(helpers.start_workload(agent, f"wl-{name}", counters[name], megabytes=1,
                                                    engine="signal"))
                Workload.objects.create(cluster=cluster, node=node, kind="process", scheduler_id=f"wl-{name}",
                                        name=f"counter-{name}", gpus=1, checkpoint_engine="signal")
        for log_file in counters.values():
            helpers.wait_steps(log_file, 3)

        rita, alan = user("rita", "operator"), user("alan", "approver")
        campaign = Campaign.objects.create(name="agents", requested_by=rita, node_selector={"sweep": "yes"}, canary="0",
                                           target_versions={"driver": {"R570": FIXED}},
                                           parallelism_per_cluster="2", step_timeout_s=8, error_budget="0")
        services.make_plan(campaign.pk, rita)
        services.approve(campaign.pk, alan)
        env = {**_env(tmp_path / "unused.json"), "GPUSWEEP_AGENT_FLEET_SECRET": helpers.FLEET_SECRET}
        log = tmp_path / "celery.log"
        beat = _start("beat", env, log)
        worker = _start("worker", env, log)
        services.start(campaign.pk, rita)
        worker, kills = _kill_in_every_state(campaign, worker, env, log, pause=0.2)
        done = wait_for(lambda: _at_rest(campaign), timeout=300, interval=0.5)
        assert done, f"campaign did not finish: {_state(campaign)}; log:\n{log.read_text()[-4000:]}"
        campaign.refresh_from_db()
        assert campaign.status == CampaignStatus.COMPLETED, (campaign.status_reason, list(
            NodeSweep.objects.filter(campaign=campaign).values_list("state", "error")))
        assert len(kills) == 7
        lengths = {name: len(helpers.steps(path)) for name, path in counters.items()}
        placed: dict[str, list[str]] = {}
        for name, agent in agents.items():
            client = agent.client
            facts_now = client.request("GET", "/v1/facts")[1]
            health = client.request("GET", "/v1/health")[1]
            assert health["maintenance"] is False, f"{name} left drained"
            if name.startswith("gpu"):
                assert facts_now["components"]["driver"] == FIXED
                ops = [json_file for json_file in (agent.state / "operations").glob("*.json")
                       if '"kind": "patch"' in json_file.read_text() or '"kind":"patch"' in json_file.read_text()]
                assert len(ops) == 1, f"{name} patched {len(ops)} times"
            else:
                assert facts_now["components"]["driver"] == facts["components"]["driver"]
            for workload in client.request("GET", "/v1/workloads")[1]["workloads"]:
                if workload["state"] in ("running", "restored"):
                    placed.setdefault(workload["id"], []).append(name)
        assert sorted(placed) == sorted(f"wl-{n}" for n in counters), placed
        assert all(len(where) == 1 and where[0].startswith("spare") for where in placed.values()), placed
        for name, path in counters.items():
            # Counting goes on after the move, from where it stopped: no gap, no restart, no second copy.
            after = helpers.wait_steps(path, lengths[name] + 3)
            assert after == list(range(1, len(after) + 1))
        moves = list(WorkloadMove.objects.filter(sweep__campaign=campaign))
        assert len(moves) == 6 and all(m.state == MoveState.RESTORED and m.checkpoint_sha256 for m in moves)
        call_command("verify_evidence", campaign=campaign.pk)
        event = EvidenceEvent.objects.filter(campaign=campaign, kind="checkpointed").first()
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {EvidenceEvent._meta.db_table} SET actor = 'user:mallory' WHERE id = %s",
                           [event.pk])
        with pytest.raises(CommandError, match="evidence verification failed"):
            call_command("verify_evidence", campaign=campaign.pk)
    finally:
        for proc in (worker, beat):
            if proc is not None:
                _kill(proc)
        for agent in agents.values():
            for workload in agent.client.request("GET", "/v1/workloads")[1].get("workloads", []) \
                    if agent.proc and agent.proc.poll() is None else []:
                if workload.get("pid"):
                    helpers.kill_pid(int(workload["pid"]))
            agent.stop()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()


def test_it_completes_a_six_node_campaign_while_the_worker_is_killed_in_every_state(tmp_path: Path):
    _need_services()

    state = tmp_path / "fleet.json"
    env = _env(state)
    subprocess.run([sys.executable, "-m", "celery", "-A", "gpusweep", "purge", "-f"], env=env, cwd=REPO,
                   check=True, capture_output=True, timeout=60)
    fleet = Fleet(str(state))
    # The fleet's state folder is named on the cluster too: planning (here) asks the executor
    # whether it reaches each node.
    cluster = Cluster.objects.create(name="local", kind="static", connection={
        "executor": "memory", "executor_options": {"state_file": str(state)}})
    for index in range(6):
        add_node(fleet, cluster, f"gpu{index:02d}", labels={"sweep": "yes"})
    for index in range(2):
        add_node(fleet, cluster, f"spare{index:02d}", labels={"sweep": "no"}, workloads=0)
    before = {w["name"]: w["steps"] for n in fleet.snapshot()["nodes"].values() for w in n["workloads"].values()}

    rita, alan = user("rita", "operator"), user("alan", "approver")
    campaign = Campaign.objects.create(name="e2e", requested_by=rita, node_selector={"sweep": "yes"}, canary="0",
                                       target_versions={"driver": {"R570": FIXED}}, parallelism_per_cluster="1",
                                       step_timeout_s=4, error_budget="0")
    services.make_plan(campaign.pk, rita)
    services.approve(campaign.pk, alan)

    log = tmp_path / "celery.log"
    beat = _start("beat", env, log)
    worker = _start("worker", env, log)
    try:
        services.start(campaign.pk, rita)
        worker, kills = _kill_in_every_state(campaign, worker, env, log, pause=STEP_S / 3)
        done = wait_for(lambda: _at_rest(campaign), timeout=240, interval=0.5)
        assert done, f"campaign did not finish: {_state(campaign)}; log:\n{log.read_text()[-4000:]}"
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
