"""Metrics benchmark: what one /metrics scrape costs on a big database.

    .venv/bin/python bench/metrics.py [--nodes 100000] [--exposures-per-node 5] [--campaigns 10]
        [--campaign-nodes 10000] [--database-url postgres://user@host:port/name]

Builds --nodes nodes with --exposures-per-node open exposures each, and --campaigns finished
campaigns of --campaign-nodes nodes each (10 evidence events per node sweep: a million in the
log by default, half of them written before the first measurement), plus one running campaign.
Then, through Django's test client against GET /metrics:

1. the first scrape, with the whole log not yet folded (it folds GPUSWEEP_METRICS_FOLD_BATCH);
2. the catch-up: folds until the log is folded (what the first scrapes after a deployment do);
3. a steady scrape with nothing new, and one after 1,000 new events (a running campaign's
   events between two scrapes), medians of 5, with the time of each family's query;
4. the evidence families alone after 1,000 new events, with the log at half and at full size,
   against a baseline measured in the same run: counting step_done events by step over the whole
   log in SQL, the cheapest form of deriving the step histogram at every scrape without the fold.

Targets: a steady scrape (3) in at most 1 s; the evidence families (4) at most 1.5x slower when
the log doubles (the fold reads only new events; the baseline reads them all). The rest of a
scrape is mostly the exposure count, one GROUP BY over the open exposures.
The database is a fresh SQLite file, or with --database-url a fresh NAME_bench database, dropped
at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.sweep import _setup_django  # noqa: E402 - after the path is set

TOKEN = "bench-metrics-token-0123456789abcdef0123"
STEPS = ("draining", "checkpointing", "migrating", "patching", "rebooting", "verifying", "returning")


def _timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _events(sweep_ids: list[int], campaign_of: dict[int, int], start: datetime) -> Iterator[tuple[Any, ...]]:
    """Ten node events per sweep, as the engine writes them (hashes are placeholders: nothing verifies here)."""
    from gpusweep.db.bulk import db_datetime, db_json

    for index, sweep_id in enumerate(sweep_ids):
        at = start + timedelta(seconds=index)
        kinds: list[tuple[str, dict[str, Any]]] = [("admitted", {"wave": 0})]
        for step_index, step in enumerate(STEPS):
            started = at + timedelta(seconds=step_index * 30)
            following = STEPS[step_index + 1] if step_index + 1 < len(STEPS) else "done"
            kinds.append(("step_done", {"step": step, "next": following, "attempt": 1,
                                        "started_at": started.isoformat()}))
            if step == "draining":
                kinds.append(("checkpointed", {"workload": f"w{sweep_id}", "bytes": 3 * 2**30, "engine": "cuda"}))
        kinds.append(("done", {"versions_after": {"driver": "570.195.03"}}))
        for seq, (kind, data) in enumerate(kinds, 1):
            yield (campaign_of[sweep_id], sweep_id, None, seq, kind, "worker:bench",
                   db_datetime(at + timedelta(seconds=seq * 30)), db_json(data), "0" * 64, f"{sweep_id:032x}{seq:032x}")


def build_fleet(nodes: int, exposures_per_node: int) -> list[int]:
    """Nodes with their open exposures (deadlines spread over -10..+30 days), and a running campaign."""
    from django.contrib.auth.models import User
    from django.utils import timezone

    from advisories.models import Exposure
    from campaigns.models import Campaign, NodeSweep
    from gpusweep.db.bulk import db_datetime, insert_rows
    from inventory.models import Cluster, Node

    now = timezone.now()
    cluster = Cluster.objects.create(name="bench", kind="static", connection={"executor": "memory"})
    for start in range(0, nodes, 5000):
        Node.objects.bulk_create([Node(cluster=cluster, name=f"gpu{i:06d}", gpu_model="H100", gpu_count=8)
                                  for i in range(start, min(nodes, start + 5000))])
    node_ids = list(Node.objects.order_by("id").values_list("id", flat=True))
    severities = ("critical", "high", "medium", "low", "high")
    insert_rows(Exposure, ["node", "advisory", "affected_range", "component", "detected_version", "severity", "state",
                           "first_seen", "deadline", "deadline_source", "fixed_by_version", "remediated_by",
                           "risk_reason", "updated_at"],
                ((node_id, 1 + r, 1 + r, "driver", "570.86.15", severities[r % 5], "open", db_datetime(now),
                  db_datetime(now + timedelta(days=(node_id + r) % 40 - 10)), "policy", "", "", "", db_datetime(now))
                 for node_id in node_ids for r in range(exposures_per_node)))
    owner = User.objects.create_user("bench")
    campaign = Campaign.objects.create(name="running", requested_by=owner, status="running", started_at=now)
    NodeSweep.objects.bulk_create([NodeSweep(campaign=campaign, node_id=node_id, wave=0)
                                   for node_id in node_ids[:RUNNING_NODES]])
    return node_ids


def add_finished(node_ids: list[int], numbers: range, per_campaign: int) -> int:
    """Finished campaigns with their whole evidence; returns the events written."""
    from django.contrib.auth.models import User
    from django.db import connection
    from django.utils import timezone

    from campaigns.models import Campaign, EvidenceEvent, NodeSweep
    from gpusweep.db.bulk import insert_rows

    now = timezone.now()
    owner = User.objects.get(username="bench")
    total = 0
    for number in numbers:
        campaign = Campaign.objects.create(name=f"bench-{number}", requested_by=owner, status="completed",
                                           started_at=now, finished_at=now - timedelta(days=2))
        first = (number * per_campaign) % len(node_ids)
        chosen = node_ids[first:first + per_campaign]
        for start in range(0, len(chosen), 5000):
            NodeSweep.objects.bulk_create([NodeSweep(campaign=campaign, node_id=node_id, wave=0, state="done")
                                           for node_id in chosen[start:start + 5000]])
        sweeps = list(NodeSweep.objects.filter(campaign=campaign).order_by("id").values_list("id", flat=True))
        total += insert_rows(EvidenceEvent, ["campaign", "sweep", "seq", "node_seq", "kind", "actor", "at", "data",
                                             "prev_hash", "hash"],
                             _events(sweeps, dict.fromkeys(sweeps, campaign.pk), now - timedelta(days=30)))
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")  # what autovacuum does after a bulk load: plans need row counts
    return total


RUNNING_NODES = 5000
PER_SWEEP = 10  # events _events writes per sweep


def _append(count: int) -> None:
    """`count` new events of the running campaign, as between two scrapes."""
    from campaigns.models import Campaign, EvidenceEvent, NodeSweep
    from gpusweep.db.bulk import insert_rows

    campaign = Campaign.objects.get(status="running")
    first = EvidenceEvent.objects.filter(campaign=campaign).count() // PER_SWEEP
    sweeps = list(NodeSweep.objects.filter(campaign=campaign).order_by("id").values_list("id", flat=True))
    chosen = sweeps[first:first + count // PER_SWEEP]
    assert len(chosen) == count // PER_SWEEP, "the running campaign has no sweep left: raise RUNNING_NODES"
    insert_rows(EvidenceEvent, ["campaign", "sweep", "seq", "node_seq", "kind", "actor", "at", "data", "prev_hash",
                                "hash"], _events(chosen, dict.fromkeys(chosen, campaign.pk), datetime.now(UTC)))


def _catch_up() -> tuple[int, float]:
    from metrics import rollup

    folds, started = 0, time.perf_counter()
    while rollup.fold():
        folds += 1
    return folds, time.perf_counter() - started


def _evidence_and_baseline() -> tuple[float, float, int]:
    """Medians: the evidence families after 1,000 new events, and the baseline over the whole log."""
    from django.db.models import Count
    from django.db.models.fields.json import KT

    from campaigns.models import EvidenceEvent
    from metrics import collect

    folded = []
    for _ in range(5):
        _append(1000)
        folded.append(_timed(lambda: list(collect.evidence())))

    def naive() -> None:
        list(EvidenceEvent.objects.filter(kind="step_done").values(step=KT("data__step")).annotate(n=Count("id")))

    return statistics.median(folded), statistics.median(_timed(naive) for _ in range(3)), EvidenceEvent.objects.count()


def run(args: argparse.Namespace) -> int:
    from django.db import connection
    from django.test import Client

    from metrics import collect, rollup

    started = time.perf_counter()
    node_ids = build_fleet(args.nodes, args.exposures_per_node)
    half = args.campaigns // 2
    events = add_finished(node_ids, range(half), args.campaign_nodes)
    print(f"built {args.nodes:,} nodes, {args.nodes * args.exposures_per_node:,} exposures, {events:,} evidence "
          f"events in {time.perf_counter() - started:.1f} s ({connection.vendor})")
    client = Client()

    def scrape() -> None:
        response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 200, response.content[:500]

    print(f"1. first scrape (folds {rollup.settings.GPUSWEEP_METRICS_FOLD_BATCH:,} of the backlog): "
          f"{_timed(scrape):.3f} s")
    folds, took = _catch_up()
    print(f"2. catch-up: {folds} more folds in {took:.1f} s")
    small = _evidence_and_baseline()
    events += add_finished(node_ids, range(half, args.campaigns), args.campaign_nodes)
    folds, took = _catch_up()
    print(f"   log grown to {events:,} events; catch-up: {folds} folds in {took:.1f} s")
    large = _evidence_and_baseline()
    idle = statistics.median(_timed(scrape) for _ in range(5))
    busy = []
    for _ in range(5):
        _append(1000)
        busy.append(_timed(scrape))
    steady = statistics.median(busy)
    print(f"3. steady scrape: {idle:.3f} s with nothing new, {steady:.3f} s after 1,000 new events (medians of 5)")
    for source in collect.SOURCES:
        print(f"   {source.__name__:12} {_timed(lambda s=source: list(s())):.3f} s")  # type: ignore[misc]
    for (evidence, baseline, size) in (small, large):
        print(f"4. log of {size:,} events: evidence families after 1,000 new events {evidence:.3f} s; baseline "
              f"(step_done counted by step over the whole log) {baseline:.3f} s; {baseline / evidence:.1f}x")
    growth = large[0] / small[0]
    ok = steady <= 1.0 and growth <= 1.5
    print(f"steady scrape {steady:.3f} s (target <= 1 s); evidence families {growth:.2f}x when the log grew "
          f"{large[2] / small[2]:.1f}x (target <= 1.5x; the baseline {large[1] / small[1]:.2f}x): "
          f"{'PASS' if ok else 'MISS'}")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--exposures-per-node", type=int, default=5)
    parser.add_argument("--campaigns", type=int, default=10)
    parser.add_argument("--campaign-nodes", type=int, default=10_000)
    parser.add_argument("--database-url", default=None, help="postgres://... (a NAME_bench database is made)")
    args = parser.parse_args()
    os.environ["GPUSWEEP_METRICS_TOKEN"] = TOKEN
    with tempfile.TemporaryDirectory() as tmp:
        dropped, _env = _setup_django(args.database_url, None, tmp)
        try:
            return run(args)
        finally:
            if dropped:
                import psycopg
                from django.db import connections

                connections.close_all()
                server, name = dropped.split("|")
                with psycopg.connect(server, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    raise SystemExit(main())
