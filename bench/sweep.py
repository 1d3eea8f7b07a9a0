"""Sweep benchmark: makespan against its lower bound, and planner speed.

    .venv/bin/python bench/sweep.py [--nodes 1000] [--parallelism 50] [--step 1.0] [--plan-nodes 10000]

1. Planner: plans --plan-nodes synthetic nodes (4 clusters, 20 pools, 2 workloads each, a
   night window) and prints the time; the target is at most 10 s for 10,000.
2. Sweep: --nodes nodes (one 1-GPU workload each, plus receivers outside the campaign) run
   through the real engine (campaigns.engine: conditional updates, evidence, dispatch) against
   the memory executor whose every agent operation takes --step seconds. Celery is replaced by
   a pool of threads fed by the same enqueue hook (the broker is not what is measured). The time
   of one node is measured in the same run (a one-node campaign); the lower bound is
   ceil(N / k) x that time; the target is makespan / bound <= 1.15.

The database is a fresh SQLite file in a temporary folder, or with --database-url
postgres://user@host:port/name a fresh database NAME_bench created and dropped by the script.
"""

from __future__ import annotations

import argparse
import math
import os
import queue
import random
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def bench_planner(count: int) -> float:
    from campaigns.planner import PlanNode, PlanWorkload, Policy, parse_windows, plan

    rng = random.Random(7)
    start = datetime(2026, 12, 1, tzinfo=UTC)
    nodes = [
        PlanNode(
            id=i, name=f"n{i:05d}", cluster=f"c{i % 4}", pool=f"p{i % 20}", gpu_model="H100", gpu_count=8,
            versions={"driver": "570.86.15" if i % 3 else "535.183.01", "cuda": "12.8"},
            workloads=tuple(PlanWorkload(ref=f"w{i}-{j}", gpus=2) for j in range(2)),
            target={"driver": "570.195.03" if i % 3 else "535.247.01"},
            deadline=start + timedelta(days=rng.randint(5, 60)),
        )
        for i in range(count)
    ]
    receivers = [PlanNode(id=count + i, name=f"r{i}", cluster=f"c{i % 4}", pool="spare", gpu_model="H100",
                          gpu_count=8, versions={"driver": "570.86.15", "cuda": "12.8"}) for i in range(count // 20)]
    policy = Policy(start=start, per_cluster="5%", per_pool="20%", cold_restart_allowed=True,
                    windows=parse_windows([{"days": [0, 1, 2, 3, 4], "start": "22:00", "end": "06:00",
                                            "tz": "Europe/Berlin"}]))
    began = time.perf_counter()
    result = plan(nodes, receivers, policy)
    elapsed = time.perf_counter() - began
    print(f"planner: {count} nodes in {elapsed:.2f} s ({result['summary']['waves']} waves, "
          f"{result['summary']['migrations']} migrations, {result['summary']['cold_starts']} cold starts) "
          f"target <= 10 s: {'PASS' if elapsed <= 10 else 'FAIL'}")
    return elapsed


def _setup_django(database_url: str | None, tmp: str) -> str | None:
    """Point Django at a fresh database; return the PostgreSQL database to drop afterwards."""
    dropped = None
    if database_url and database_url.startswith("postgres"):
        import psycopg

        base, _, name = database_url.rpartition("/")
        bench_name = f"{name}_bench"
        with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{bench_name}"')
            conn.execute(f'CREATE DATABASE "{bench_name}"')
        os.environ["DATABASE_URL"] = f"{base}/{bench_name}"
        dropped = f"{base}/postgres|{bench_name}"
    else:
        os.environ.pop("DATABASE_URL", None)
        os.environ["GPUSWEEP_VAR_DIR"] = tmp
    os.environ["CELERY_BROKER_URL"] = "memory://"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpusweep.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return dropped


class Pool:
    """Stands in for Celery workers: threads that run the engine's tasks from an in-process queue."""

    def __init__(self, threads: int) -> None:
        self.tasks: queue.Queue[tuple[str, int] | None] = queue.Queue()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for thread in self.threads:
            thread.start()

    def enqueue(self, task: str, object_id: int, countdown: float) -> None:
        if countdown:
            threading.Timer(countdown, self.tasks.put, args=((task, object_id),)).start()
        else:
            self.tasks.put((task, object_id))

    def _run(self) -> None:
        from django.db import connection

        from campaigns import engine

        while True:
            item = self.tasks.get()
            if item is None:
                break
            task, object_id = item
            try:
                engine.advance(object_id) if task == "advance" else engine.dispatch(object_id)
            except Exception as exc:  # noqa: BLE001 - a benchmark reports and carries on, like a worker
                print(f"task {task}({object_id}) failed: {exc!r}", file=sys.stderr)
        connection.close()

    def stop(self) -> None:
        for _ in self.threads:
            self.tasks.put(None)
        for thread in self.threads:
            thread.join(timeout=30)


def _build_fleet(nodes: int, step: float) -> Any:
    from executors.memory import Fleet
    from inventory.models import Cluster, Node, NodeComponent, Workload
    from inventory.versions import parse_version

    fleet = Fleet()
    fleet.reset()
    cluster = Cluster.objects.create(name="bench", kind="static",
                                     connection={"executor": "memory", "executor_options": {"step_seconds": step}})
    versions = {"driver": "570.86.15", "cuda": "12.8"}
    spares = math.ceil(nodes / 7) + 2
    names = [f"gpu{i:05d}" for i in range(nodes)] + [f"spare{i:04d}" for i in range(spares)]
    Node.objects.bulk_create([Node(cluster=cluster, name=name, gpu_model="H100", gpu_count=8,
                                   labels={"sweep": "yes" if name.startswith("gpu") else "no"}) for name in names])
    by_name = {n.name: n for n in Node.objects.filter(cluster=cluster)}
    NodeComponent.objects.bulk_create([
        NodeComponent(node=node, component=c, version=v, version_key=parse_version(c, v).key,
                      branch=parse_version(c, v).branch)
        for node in by_name.values() for c, v in versions.items()
    ])
    Workload.objects.bulk_create([
        Workload(cluster=cluster, node=by_name[name], kind="process", scheduler_id=f"{name}-w", name=f"job-{name}",
                 gpus=1, checkpoint_engine="criu")
        for name in names if name.startswith("gpu")
    ])
    for name in names:
        fleet.add_node("bench", name, gpu_model="H100", gpu_count=8, versions=versions)
        if name.startswith("gpu"):
            fleet.add_workload("bench", name, f"{name}-w", name=f"job-{name}", gpus=1)
    return fleet


def _run_campaign(names: list[str] | None, parallelism: int, pool: Pool) -> tuple[float, Any]:
    from django.contrib.auth.models import User

    from campaigns import services
    from campaigns.choices import CampaignStatus
    from campaigns.models import Campaign

    requester, _ = User.objects.get_or_create(username="bench-requester")
    approver, _ = User.objects.get_or_create(username="bench-approver")
    selector: dict[str, Any] = {"sweep": "yes"}
    if names is not None:
        selector = {"names": names}
    campaign = Campaign.objects.create(
        name=f"bench {len(names) if names else 'all'}", requested_by=requester, node_selector=selector,
        target_versions={"driver": "570.195.03"}, parallelism_per_cluster=str(parallelism), step_timeout_s=3600,
        error_budget="0",
    )
    services.make_plan(campaign.pk, requester)
    services.approve(campaign.pk, approver)
    began = time.perf_counter()
    services.start(campaign.pk, requester)
    while Campaign.objects.filter(pk=campaign.pk).values_list("status", flat=True).get() not in (
            CampaignStatus.TERMINAL | {CampaignStatus.HALTED}):
        time.sleep(0.05)
    elapsed = time.perf_counter() - began
    return elapsed, Campaign.objects.get(pk=campaign.pk)


def bench_sweep(nodes: int, parallelism: int, step: float, database_url: str | None) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        dropped = _setup_django(database_url, tmp)
        try:
            from campaigns import queue
            from campaigns.models import NodeSweep

            fleet = _build_fleet(nodes, step)
            pool = Pool(parallelism + 4)
            queue.ENQUEUE.insert(0, pool.enqueue)
            try:
                one, first = _run_campaign(["gpu00000"], 1, pool)
                makespan, campaign = _run_campaign(None, parallelism, pool)
            finally:
                queue.ENQUEUE.pop(0)
                pool.stop()
            states = dict.fromkeys(NodeSweep.objects.filter(campaign=campaign).values_list("state", flat=True), 0)
            for state in NodeSweep.objects.filter(campaign=campaign).values_list("state", flat=True):
                states[state] += 1
            patched = sum(1 for n in fleet.snapshot()["nodes"].values() if n["patches"])
            swept = nodes - 1  # gpu00000 went first, alone, to measure one node
            bound = math.ceil(swept / parallelism) * one
            ratio = makespan / bound
            print(f"sweep: {swept} nodes, parallelism {parallelism}, agent step {step:.3f} s, "
                  f"database {'postgresql' if dropped else 'sqlite'}")
            print(f"  one node alone: {one:.2f} s ({first.status}); makespan: {makespan:.2f} s ({campaign.status}, "
                  f"{states}); nodes patched: {patched}")
            print(f"  lower bound ceil(N/k) x one node = {bound:.2f} s; makespan / bound = {ratio:.3f} "
                  f"target <= 1.15: {'PASS' if ratio <= 1.15 else 'FAIL'}")
            return ratio
        finally:
            from django.db import connections

            connections.close_all()
            if dropped:
                import psycopg

                server, name = dropped.split("|")
                with psycopg.connect(server, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--parallelism", type=int, default=50)
    parser.add_argument("--step", type=float, default=1.0, help="seconds per agent operation (T)")
    parser.add_argument("--plan-nodes", type=int, default=10_000)
    parser.add_argument("--database-url", default=None, help="postgres://... (a NAME_bench database is made)")
    args = parser.parse_args()
    planned = bench_planner(args.plan_nodes)
    ratio = bench_sweep(args.nodes + 1, args.parallelism, args.step, args.database_url)
    return 0 if planned <= 10 and ratio <= 1.15 else 1


if __name__ == "__main__":
    raise SystemExit(main())
