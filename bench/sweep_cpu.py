"""CPU per node of the campaign engine: a campaign run in this process with no agent sleep.

    .venv/bin/python bench/sweep_cpu.py [--nodes 100] [--parallelism 10] [--database-url postgres://...]
        [--profile out.prof]

Every node of the campaign moves one workload to a receiver outside the campaign (as in
bench/sweep.py); the engine's tasks run one after another in this process against the memory
executor with zero step time, so what is measured is the engine's own work: process CPU (user +
system) per node and per step, and SQL statements per step (the database server's own CPU is not
in the figure; the statements stand for it). Load on the machine barely changes CPU time, unlike a
makespan.
"""

from __future__ import annotations

import argparse
import cProfile
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--parallelism", type=int, default=10)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--profile", default="", help="write a cProfile of the steps here")
    args = parser.parse_args()

    import math

    from bench.sweep import _setup_django

    with tempfile.TemporaryDirectory() as tmp:
        dropped, _ = _setup_django(args.database_url, None, tmp)
        try:
            return _run(args, math.ceil(args.nodes / 8) + 2)
        finally:
            from django.db import connections

            connections.close_all()
            if dropped:
                import psycopg

                server, name = dropped.split("|")
                with psycopg.connect(server, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _run(args: argparse.Namespace, spares: int) -> int:
    from django.contrib.auth.models import User
    from django.db import connection

    from bench.sweep import _build_fleet
    from campaigns import engine, services
    from campaigns import queue as campaign_queue
    from campaigns.choices import EvidenceKind, SweepState
    from campaigns.evidence import verify_campaign
    from campaigns.models import Campaign, EvidenceEvent, NodeSweep
    from executors.memory import Fleet

    Fleet().reset()
    _build_fleet(args.nodes, 0.0, spares=spares)
    work: list[tuple[str, int]] = []
    counts: Counter[str] = Counter()
    current = ["setup"]

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        counts[current[0]] += 1
        return execute(sql, params, many, context)

    campaign_queue.ENQUEUE.insert(0, lambda task, object_id, countdown: work.append((task, object_id)))
    requester, _ = User.objects.get_or_create(username="cpu-requester")
    approver, _ = User.objects.get_or_create(username="cpu-approver")
    campaign = services.create_campaign(requester, {
        "name": "cpu", "node_selector": {"sweep": "bench"}, "target_versions": {"driver": "570.195.03"},
        "parallelism_per_cluster": str(args.parallelism), "canary": "0", "error_budget": "0"})
    services.make_plan(campaign.pk, requester)
    services.approve(campaign.pk, approver)
    services.start(campaign.pk, requester)
    cpu = {"advance": 0.0, "dispatch": 0.0}
    dispatch = engine.dispatch

    def admission(campaign_id: int) -> list[int]:
        # A worker that ends a sweep admits the next nodes itself: counted as admission, not as a step.
        was, current[0] = current[0], "dispatch"
        start = time.process_time()
        try:
            return dispatch(campaign_id)
        finally:
            current[0] = was
            spent = time.process_time() - start
            cpu["dispatch"] += spent
            cpu["advance"] -= spent if was == "advance" else 0.0

    # The dispatch a worker runs after ending a sweep is the one the runner imported.
    engine.dispatch = engine.runner.dispatch = admission
    server_before = _server_cpu()
    profiler = cProfile.Profile(time.process_time) if args.profile else None  # CPU, not wall
    began = time.perf_counter()
    with connection.execute_wrapper(count):
        while work:
            task, object_id = work.pop(0)
            current[0] = task
            start = time.process_time()
            if profiler is not None:
                profiler.enable()
            engine.advance(object_id) if task == "advance" else dispatch(object_id)
            if profiler is not None:
                profiler.disable()
            cpu[task] += time.process_time() - start
    engine.dispatch = engine.runner.dispatch = dispatch
    wall = time.perf_counter() - began
    server = _server_cpu() - server_before
    campaign_queue.ENQUEUE.pop(0)
    if profiler is not None:
        profiler.dump_stats(args.profile)
    status = Campaign.objects.values_list("status", flat=True).get(pk=campaign.pk)
    states = Counter(NodeSweep.objects.filter(campaign=campaign).values_list("state", flat=True))
    steps = EvidenceEvent.objects.filter(campaign=campaign, kind=EvidenceKind.STEP_DONE).count()
    problems = verify_campaign(Campaign.objects.get(pk=campaign.pk))
    nodes = states[SweepState.DONE] or 1
    print(f"database {connection.vendor}; {args.nodes} nodes, parallelism {args.parallelism}: {status} {dict(states)}; "
          f"evidence verifies: {not problems} {problems[:3]}")
    print(f"  steps: {cpu['advance'] * 1000 / nodes:.1f} ms CPU per node ({cpu['advance'] * 1000 / max(1, steps):.2f} "
          f"per step), {counts['advance'] / max(1, steps):.1f} statements per step; admission "
          f"{cpu['dispatch'] * 1000 / nodes:.1f} ms CPU per node, {counts['dispatch'] / nodes:.1f} statements "
          f"per node; wall {wall:.1f} s")
    if connection.vendor == "postgresql":
        print(f"  database server: {server * 1000 / nodes:.1f} ms CPU per node (its backends for this database, "
              "steps and admission together)")
    return 0 if status == "completed" and not problems else 1


def _server_cpu() -> float:
    """CPU seconds of the local PostgreSQL backends serving this database (0 where none is local)."""
    import os

    from django.db import connection

    if connection.vendor != "postgresql":
        return 0.0
    name = f" {connection.settings_dict['NAME']} "
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if name not in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode() + " ":
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


if __name__ == "__main__":
    raise SystemExit(main())
