"""bench/api.py --with-writes: the writes a fleet makes while API clients read.

A process of its own (its CPU is not the server's nor the readers'): short agent heartbeats at a
set rate (signed as agents sign them, a new connection each, primed with one full heartbeat per
agent first) and a campaign over its own `--campaign-nodes` nodes (cluster `bench-campaign`, the
memory executor, the engine's tasks on threads here, as bench/sweep.py runs them), started again
with the other driver whenever one ends. It prints `ready ...` once both run, and a summary line
when its time is up. Every heartbeat flush and every campaign step raises the generations the
cached lists depend on (gpusweep.datagen), so readers see the misses a real fleet causes.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.heartbeat import PATH, SECRET, Agent

AGENTS = 2000
SENDERS = 8  # threads sending heartbeats, each its share of the rate
STEP_S = 0.5  # each agent operation of the memory executor
DRIVERS = ("570.195.03", "570.211.01")


def _send(port: int, agent: Agent, mode: str) -> tuple[int, bytes]:
    body = agent.request(mode)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", PATH, body, agent.headers(body))
        response = connection.getresponse()
        return response.status, response.read()
    except OSError as exc:
        return 0, str(exc).encode()
    finally:
        connection.close()


def _agents() -> list[Agent]:
    from inventory.models import Node, NodeComponent

    step = max(1, Node.objects.count() // AGENTS)
    ids = list(Node.objects.order_by("pk").values_list("pk", flat=True)[::step][:AGENTS])
    components: dict[int, dict[str, str]] = {}
    for node_id, component, version in NodeComponent.objects.filter(node_id__in=ids).values_list(
            "node_id", "component", "version"):
        components.setdefault(node_id, {})[component] = version
    return [Agent(pk, cluster, name, components.get(pk, {}))
            for pk, cluster, name in Node.objects.filter(pk__in=ids).values_list("pk", "cluster__name", "name")]


def _heartbeats(port: int, agents: list[Agent], rate: float, until: float, sent: list[int], failed: list[str]) -> None:
    lock = threading.Lock()

    def sender(share: list[Agent]) -> None:
        interval = SENDERS / rate
        due = time.monotonic()
        turn = 0
        while time.monotonic() < until:
            due += interval
            status, raw = _send(port, share[turn % len(share)], "short")
            turn += 1
            with lock:
                if status == 200:
                    sent[0] += 1
                else:
                    failed.append(f"{status} {raw[:100]!r}")
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)

    threads = [threading.Thread(target=sender, args=(agents[i::SENDERS],)) for i in range(SENDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _campaigns(nodes: int, until: float, done: list[str]) -> None:
    from django.db import connection

    from bench.sweep import _run_campaign

    turn = 0
    while time.monotonic() < until:
        _elapsed, campaign = _run_campaign({"sweep": "bench-campaign"}, max(1, nodes // 4), DRIVERS[turn % 2])
        done.append(str(campaign.status))
        turn += 1
    connection.close()


def run_writer(spec_path: str) -> int:
    spec: dict[str, Any] = json.loads(Path(spec_path).read_text())
    state = Path(tempfile.mkdtemp(dir=spec["folder"])) / "fleet"
    os.environ.update(DATABASE_URL=spec["database_url"], GPUSWEEP_MEMORY_EXECUTOR_STATE=str(state),
                      GPUSWEEP_AGENT_FLEET_SECRET=SECRET, GPUSWEEP_HEARTBEAT_REDIS_URL=spec["heartbeat_redis_url"],
                      GPUSWEEP_ADVISORY_SOURCES="", PGAPPNAME="gpusweep-bench-writer")
    import django

    django.setup()
    from django.db import connection

    from bench.sweep import Pool, _build_fleet
    from campaigns import queue as campaign_queue
    from executors.memory import Fleet
    from inventory.models import Cluster

    agents = _agents()
    for agent in agents:  # each agent's first heartbeat: its endpoint and digest
        status, raw = _send(spec["port"], agent, "prime")
        if status != 200:
            print(f"priming failed: {status} {raw[:300]!r}", flush=True)
            return 1
        agent.digest = json.loads(raw)["digest"]
    Cluster.objects.filter(name="bench-campaign").delete()
    Fleet().reset()
    _build_fleet(spec["campaign_nodes"], STEP_S, cluster_name="bench-campaign", prefix="cw",
                 spares=spec["campaign_nodes"] // 8 + 2)
    pool = Pool(spec["campaign_nodes"] // 4 + 4)
    campaign_queue.ENQUEUE.insert(0, pool.enqueue)
    connection.close()
    until = time.monotonic() + spec["seconds"]
    sent: list[int] = [0]
    failed: list[str] = []
    done: list[str] = []
    started = time.monotonic()
    threads = [threading.Thread(target=_heartbeats, args=(spec["port"], agents, spec["rate"], until, sent, failed)),
               threading.Thread(target=_campaigns, args=(spec["campaign_nodes"], until, done))]
    for thread in threads:
        thread.start()
    print(f"ready: {len(agents)} agents primed, a {spec['campaign_nodes']}-node campaign starting", flush=True)
    threads[0].join()
    wall = time.monotonic() - started
    threads[1].join(timeout=120)  # the campaign under way ends (4 waves of a few seconds)
    pool.stop()
    Cluster.objects.filter(name="bench-campaign").delete()  # the fleet's count stays the bench's
    connection.close()
    print(f"{sent[0]} short heartbeats in {wall:.0f} s ({sent[0] / wall:.0f}/s), {len(failed)} failed "
          f"{sorted(set(failed))[:2]}; campaigns ended: {done}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_writer(sys.argv[1]))
