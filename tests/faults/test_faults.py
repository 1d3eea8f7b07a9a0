"""The fault suite: what a security team loses sleep over, injected into a running campaign.

Real parts throughout: PostgreSQL (DATABASE_URL), a Redis server of this test's own on a free port
(so restarting it disturbs nobody else), real Celery worker and beat processes, real node agents
checkpointing real counter processes with CRIU, and, for the full disk, a 24 MiB tmpfs mounted as
the checkpoint folder. Each case ends with the same checks: no node was patched while work was on
it, every workload runs exactly once and counted on from where it stopped, and the campaign is
finished or resumable (a halted one is resumed and must then finish). Each prints what it injected
and what it found.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from campaigns import services
from campaigns.choices import CampaignStatus, MoveState, SweepState
from campaigns.models import Campaign, NodeSweep, WorkloadMove
from conftest import need
from inventory.models import Cluster, Node, NodeComponent, Workload
from inventory.versions import parse_version
from tests.campaigns.fleet import FIXED, user
from tests.helpers import REPO, clean_env, free_port, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.criu, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
SWEPT = ("gpu00", "gpu01")
NODES = (*SWEPT, "spare00")


def _agents() -> Any:
    sys.path.insert(0, str(REPO / "agent" / "tests"))
    import agent_helpers

    return agent_helpers


def _preconditions() -> None:
    helpers = _agents()
    need(os.environ.get("DATABASE_URL", "").startswith("postgres"),
         "set DATABASE_URL=postgres://root@127.0.0.1:5432/<db> (as .ci/run does) for the fault suite")
    need(shutil.which("redis-server") is not None, "the fault suite starts its own Redis: apt install redis-server")
    need(helpers.criu_usable(), helpers.CRIU_HINT)


@contextlib.contextmanager
def _redis(port: int) -> Iterator[Callable[[], None]]:
    """A private Redis server; yields a function that restarts it (a broker outage of ~2 s)."""
    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                                        check=False).stdout.strip() == b"PONG", timeout=20, interval=0.1)
        return proc

    current = [start()]

    def restart() -> None:
        current[0].send_signal(signal.SIGKILL)
        current[0].wait(10)
        time.sleep(2)
        current[0] = start()

    try:
        yield restart
    finally:
        current[0].kill()
        current[0].wait(10)


def _celery(kind: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    args = ["worker", "--concurrency", "2", "--loglevel", "INFO", "--without-heartbeat", "--without-mingle",
            "--without-gossip"] if kind == "worker" else ["beat", "--loglevel", "INFO"]
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "celery", "-A", "gpusweep", *args], env=env, cwd=REPO,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


class Supervised:
    """A Celery process kept running the way systemd (Restart=always) or Kubernetes keep a worker:
    started again when it exits. A worker that loses its broker in the middle of a task may exit
    ("Unrecoverable error" from kombu's Redis transport); production restarts it, and so does this."""

    def __init__(self, kind: str, env: dict[str, str], log: Path) -> None:
        self.kind, self.env, self.log = kind, env, log
        self.proc = _celery(kind, env, log)
        self.restarts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            if self.proc.poll() is not None:
                self.restarts += 1
                self.proc = _celery(self.kind, self.env, self.log)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        _kill_group(self.proc)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _operation_running(agent: Any, kind: str) -> bool:
    for path in (agent.state / "operations").glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(path.read_text())
            if record.get("kind") == kind and record.get("state") == "running":
                return True
    return False


class Fleet:
    """Three real agents (two nodes to patch, one spare), a CRIU counter on each node to patch."""

    def __init__(self, root: Path, artifacts: Path, megabytes: int) -> None:
        helpers = _agents()
        self.helpers = helpers
        simulate = {"reboot_command": "simulate", "patch_methods": '{"package": {"simulate": true}}',
                    **helpers.NO_SCHEDULER}
        self.agents = {name: helpers.AgentProcess(root, name, artifacts, **simulate).start() for name in NODES}
        self.counters = {name: root / f"counter-{name}.log" for name in SWEPT}
        self.procs = [helpers.start_workload(self.agents[name], f"wl-{name}", self.counters[name],
                                             megabytes=megabytes, engine="criu") for name in SWEPT]
        cluster = Cluster.objects.create(name=helpers.CLUSTER, kind="static", connection={"executor": "local"})
        for name, agent in self.agents.items():
            node = Node.objects.create(cluster=cluster, name=name, gpu_model=helpers.FACTS["gpu_model"], gpu_count=8,
                                       agent_endpoint=f"http://127.0.0.1:{agent.port}",
                                       labels={"sweep": "yes" if name in SWEPT else "no"})
            for component, version in helpers.FACTS["components"].items():
                parsed = parse_version(component, version)
                NodeComponent.objects.create(node=node, component=component, version=version,
                                             version_key=parsed.key, branch=parsed.branch)
            if name in SWEPT:
                Workload.objects.create(cluster=cluster, node=node, kind="process", scheduler_id=f"wl-{name}",
                                        name=f"counter-{name}", gpus=0, checkpoint_engine="criu")
        # Reap the counters CRIU stops: on one host a restored process needs its old pid free.
        self._done = threading.Event()
        self._reaper = threading.Thread(target=self._reap, daemon=True)
        self._reaper.start()
        for log in self.counters.values():
            helpers.wait_steps(log, 3)

    def _reap(self) -> None:
        while not self._done.wait(0.05):
            for proc in self.procs:
                proc.poll()

    def running(self) -> dict[str, list[str]]:
        """workload id -> the agents it runs on."""
        placed: dict[str, list[str]] = {}
        for name, agent in self.agents.items():
            with contextlib.suppress(Exception):
                for item in agent.client.request("GET", "/v1/workloads")[1]["workloads"]:
                    if item["state"] in ("running", "restored"):
                        placed.setdefault(item["id"], []).append(name)
        return placed

    def stop(self) -> None:
        self._done.set()
        for agent in self.agents.values():
            agent.stop()
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for pidfile in (Path(str(a.state)) for a in self.agents.values()):
            for registry in pidfile.glob("workloads.json"):
                with contextlib.suppress(OSError, ValueError):
                    for entry in json.loads(registry.read_text()).values():
                        self.helpers.kill_pid(int(entry.get("pid") or 0))


def _drop_database_connections(stop: threading.Event, dropped: list[int]) -> None:
    """Terminate every other backend of the test database, over and over (a database restart as
    the workers see it: their connections die mid-task and must be made again)."""
    import psycopg

    settings_db = connection.settings_dict
    dsn = (f"postgresql://{settings_db['USER'] or 'root'}@{settings_db['HOST'] or '127.0.0.1'}:"
           f"{settings_db['PORT'] or 5432}/postgres")
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                                "AND pid <> pg_backend_pid() AND application_name LIKE 'celery%%'",
                                [settings_db["NAME"]]).fetchall()
            dropped.append(len(rows))
            stop.wait(1.5)


CASES = ("database connections dropped", "broker restarted", "agent killed during a checkpoint",
         "agent killed during a restore", "checkpoint disk full")


@pytest.mark.parametrize("case", CASES)
def test_a_campaign_survives(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             settings: Any) -> None:
    _preconditions()
    helpers = _agents()
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    full_disk = case == "checkpoint disk full"
    if full_disk:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(artifacts)], check=True)
    # Planning (in this process) reads each agent's state: sign with the agents' fleet secret.
    settings.GPUSWEEP_AGENT_FLEET_SECRET = helpers.FLEET_SECRET
    queue = f"faults-{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("GPUSWEEP_CELERY_QUEUE", queue)
    settings.CELERY_TASK_DEFAULT_QUEUE = queue
    port = free_port()
    broker = f"redis://127.0.0.1:{port}/0"
    from campaigns import queue as campaign_queue
    from gpusweep.celery import app

    def enqueue(task: str, object_id: int, countdown: float) -> None:
        # This process sends to the private broker too (the app's default connection is elsewhere).
        with app.connection_for_write(broker) as conn:
            app.send_task(campaign_queue.TASKS[task], args=(object_id,), queue=queue, countdown=countdown or None,
                          connection=conn)

    campaign_queue.ENQUEUE.insert(0, enqueue)
    settings_db = connection.settings_dict
    env = clean_env(
        DATABASE_URL=f"postgres://{settings_db['USER'] or 'root'}@{settings_db['HOST'] or '127.0.0.1'}:"
                     f"{settings_db['PORT'] or 5432}/{settings_db['NAME']}",
        CELERY_BROKER_URL=broker, GPUSWEEP_CELERY_QUEUE=queue,
        GPUSWEEP_CAMPAIGN_REDRIVE_EVERY_S="1", GPUSWEEP_ADVISORY_SOURCES="",
        GPUSWEEP_AGENT_FLEET_SECRET=helpers.FLEET_SECRET, PGAPPNAME="celery-fault-suite")
    log = tmp_path / "celery.log"
    fleet = worker = beat = None
    injected: list[str] = []
    try:
        with _redis(port) as restart_broker:
            fleet = Fleet(tmp_path, artifacts, megabytes=64 if full_disk else 8)
            before = {name: len(helpers.steps(path)) for name, path in fleet.counters.items()}
            rita, alan = user("rita", "operator"), user("alan", "approver")
            campaign = services.create_campaign(rita, {
                "name": case[:100], "node_selector": {"sweep": "yes"}, "target_versions": {"driver": FIXED},
                "parallelism_per_cluster": "1", "step_timeout_s": 10, "error_budget": "1", "canary": "0"})
            services.make_plan(campaign.pk, rita)
            services.approve(campaign.pk, alan)
            beat, worker = Supervised("beat", env, log), Supervised("worker", env, log)
            services.start(campaign.pk, rita)
            injected = _inject(case, campaign, fleet, restart_broker)
            finished = wait_for(lambda: Campaign.objects.get(pk=campaign.pk).status in (
                CampaignStatus.TERMINAL | {CampaignStatus.HALTED}), timeout=240, interval=0.5)
            campaign.refresh_from_db()
            assert finished, f"campaign {campaign.status} after {case}; log:\n{log.read_text()[-4000:]}"
            if campaign.status == CampaignStatus.HALTED:
                injected.append("then an operator resumed the halted campaign")
                services.resume(campaign.pk, rita)
                wait_for(lambda: Campaign.objects.get(pk=campaign.pk).status in CampaignStatus.TERMINAL,
                         timeout=240, interval=0.5)
                campaign.refresh_from_db()
            if worker.restarts or beat.restarts:
                injected.append(f"the worker exited {worker.restarts} time(s) and beat {beat.restarts} time(s); "
                                "their supervisor started them again")
            found = _check(campaign, fleet, before, case)
            print(f"\nfault: {case}\n  injected: {'; '.join(injected)}\n  found: {found}")
    finally:
        campaign_queue.ENQUEUE.remove(enqueue)
        for supervised in (worker, beat):
            if supervised is not None:
                supervised.stop()
        if fleet is not None:
            fleet.stop()
        if full_disk:
            subprocess.run(["umount", "-l", str(artifacts)], check=False)


def _inject(case: str, campaign: Campaign, fleet: Fleet, restart_broker: Callable[[], None]) -> list[str]:
    first = NodeSweep.objects.filter(campaign=campaign).order_by("wave", "position")

    def reaches(*states: str) -> bool:
        return bool(wait_for(lambda: first.filter(state__in=states).exists(), timeout=120, interval=0.02))

    if case == "database connections dropped":
        stop, dropped = threading.Event(), list[int]()
        thread = threading.Thread(target=_drop_database_connections, args=(stop, dropped), daemon=True)
        thread.start()
        wait_for(lambda: Campaign.objects.get(pk=campaign.pk).status != CampaignStatus.RUNNING
                 or len(dropped) >= 12, timeout=120, interval=0.5)
        stop.set()
        thread.join(10)
        return [f"every worker and beat database connection terminated {len(dropped)} times, 1.5 s apart "
                f"({sum(dropped)} connections in all)"]
    if case == "broker restarted":
        assert reaches(SweepState.CHECKPOINTING, SweepState.MIGRATING), "no node reached the checkpoint"
        restart_broker()
        return ["Redis killed (SIGKILL, nothing persisted: queued tasks lost) while a node was checkpointing, "
                "back 2 s later"]
    if case in ("agent killed during a checkpoint", "agent killed during a restore"):
        kind = "checkpoint" if "checkpoint" in case else "restore"
        name = "gpu00" if kind == "checkpoint" else "spare00"
        agent = fleet.agents[name]
        assert wait_for(lambda: _operation_running(agent, kind), timeout=120, interval=0.005), f"no {kind} seen"
        agent.kill()
        time.sleep(1)
        agent.start()
        return [f"agent {name} SIGKILLed while its {kind} operation ran, restarted 1 s later"]
    assert case == "checkpoint disk full"
    return ["the checkpoint folder is a 24 MiB tmpfs; each workload holds 64 MiB"]


def _check(campaign: Campaign, fleet: Fleet, before: dict[str, int], case: str) -> str:
    helpers = fleet.helpers
    sweeps = list(NodeSweep.objects.filter(campaign=campaign).select_related("node"))
    states = {s.node.name: s.state for s in sweeps}
    assert campaign.status == CampaignStatus.COMPLETED, (campaign.status, campaign.status_reason, states)
    # A node may fail safely where the fault hit it (within the error budget); none fails otherwise.
    may_fail = {"checkpoint disk full": set(SWEPT)}.get(case, set())
    for sweep in sweeps:
        moves = list(WorkloadMove.objects.filter(sweep=sweep))
        if sweep.patched_at is not None:
            # Patched only with every workload gone from the node first.
            assert sweep.state == SweepState.DONE and moves and all(
                m.state == MoveState.RESTORED for m in moves), (sweep.node.name, sweep.state, moves)
        else:
            assert sweep.node.name in may_fail and sweep.state == SweepState.FAILED, (sweep.node.name, sweep.state,
                                                                                      sweep.error)
    if case == "checkpoint disk full":
        assert all(s.state == SweepState.FAILED and s.patched_at is None for s in sweeps), states
    placed = fleet.running()
    assert sorted(placed) == sorted(f"wl-{name}" for name in SWEPT), placed
    assert all(len(where) == 1 for where in placed.values()), f"a workload runs twice: {placed}"
    for name, path in fleet.counters.items():
        counted = helpers.wait_steps(path, before[name] + 3)
        assert counted == list(range(1, len(counted) + 1)), f"{name}'s counter restarted or skipped"
    failed = {s.node.name: s.error[:120] for s in sweeps if s.state == SweepState.FAILED}
    return (f"campaign {campaign.status}; nodes {states}; failed safely: {failed or 'none'}; workloads on "
            f"{placed}; every counter continuous; no node patched with work on it")
