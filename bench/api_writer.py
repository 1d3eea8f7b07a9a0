"""bench/api.py --with-writes: the writes a fleet makes while API clients read.

A process of its own (its CPU is not the server's nor the readers'): short agent heartbeats at a
set rate (signed as agents sign them, a new connection each, primed with one full heartbeat per
agent first) and a campaign over its own `--campaign-nodes` nodes (cluster `bench-campaign-N`, the
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.heartbeat import PATH, SECRET, Agent

CAMPAIGN_CLUSTER = "bench-campaign"  # the writer's clusters (bench/api.py leaves them out of the fleet's count)

AGENTS = 2000
SENDERS = 8  # threads sending heartbeats, each its share of the rate
STEP_S = 0.5  # each agent operation of the memory executor


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


def _campaign(cluster: str, parallelism: int, target: str) -> str:
    """One campaign over the cluster's nodes, planned, approved and run to its end (its status).
    Scoped to the cluster: a campaign without clusters plans against the whole 100,000-node fleet."""
    from django.contrib.auth.models import User

    from campaigns import services
    from campaigns.choices import CampaignStatus
    from campaigns.models import Campaign

    requester, _ = User.objects.get_or_create(username="bench-requester")
    approver, _ = User.objects.get_or_create(username="bench-approver")
    campaign = services.create_campaign(requester, {
        "name": f"bench writes {cluster} {target}", "clusters": [cluster], "node_selector": {"sweep": cluster},
        "target_versions": {"driver": target}, "parallelism_per_cluster": str(parallelism), "step_timeout_s": 3600,
        "error_budget": "0", "canary": "0"})
    services.make_plan(campaign.pk, requester)
    services.approve(campaign.pk, approver)
    services.start(campaign.pk, requester)
    while (status := Campaign.objects.filter(pk=campaign.pk).values_list("status", flat=True).get()) not in (
            CampaignStatus.TERMINAL | {CampaignStatus.HALTED}):
        time.sleep(0.2)
    return str(status)


def _campaigns(cluster: str, nodes: int, until: float, done: list[str]) -> None:
    from campaigns.services import CampaignError

    turn = 0
    while time.monotonic() < until:
        try:  # each a newer driver than the last (a campaign patches upwards only)
            done.append(_campaign(cluster, max(1, nodes // 4), f"570.{200 + turn}.01"))
        except CampaignError as exc:
            done.append(f"refused: {exc}"[:120])
            return
        turn += 1


def run_writer(spec_path: str) -> int:
    spec: dict[str, Any] = json.loads(Path(spec_path).read_text())
    state = Path(tempfile.mkdtemp(dir=spec["folder"])) / "fleet"
    os.environ.update(DATABASE_URL=spec["database_url"], GPUSWEEP_MEMORY_EXECUTOR_STATE=str(state),
                      GPUSWEEP_AGENT_FLEET_SECRET=SECRET, GPUSWEEP_HEARTBEAT_REDIS_URL=spec["heartbeat_redis_url"],
                      GPUSWEEP_ADVISORY_SOURCES="", PGAPPNAME="gpusweep-bench-writer",
                      DEBUG="true")  # as bench/sweep.py: evidence signs with the development key
    import django

    django.setup()
    from django.db import connection

    from bench.sweep import Pool, _build_fleet
    from campaigns import queue as campaign_queue
    from executors.memory import Fleet
    from inventory.models import Cluster

    agents = _agents()
    with ThreadPoolExecutor(SENDERS) as primer:  # each agent's first heartbeat: its endpoint and digest
        primed = list(primer.map(lambda agent: _send(spec["port"], agent, "prime"), agents))
    for agent, (status, raw) in zip(agents, primed, strict=True):
        if status != 200:
            print(f"priming failed: {status} {raw[:300]!r}", flush=True)
            return 1
        agent.digest = json.loads(raw)["digest"]
    # A cluster of its own per run (campaigns' evidence is kept: an earlier run's stays as it is).
    name = f"{CAMPAIGN_CLUSTER}-{Cluster.objects.filter(name__startswith=CAMPAIGN_CLUSTER).count() + 1}"
    Fleet().reset()
    _build_fleet(spec["campaign_nodes"], STEP_S, cluster_name=name, prefix="cw",
                 spares=spec["campaign_nodes"] // 8 + 2)
    pool = Pool(spec["campaign_nodes"] // 4 + 4)
    campaign_queue.ENQUEUE.insert(0, pool.enqueue)
    connection.close()
    until = time.monotonic() + spec["seconds"]
    sent: list[int] = [0]
    failed: list[str] = []
    done: list[str] = []
    started = time.monotonic()
    # The campaign's thread is a daemon: when the time is up this process reports and exits, a
    # campaign under way with it (its open transaction rolls back; bench/api.py deletes the
    # cluster at its next start).
    campaign = threading.Thread(target=_campaigns, args=(name, spec["campaign_nodes"], until, done), daemon=True)
    beats = threading.Thread(target=_heartbeats, args=(spec["port"], agents, spec["rate"], until, sent, failed))
    campaign.start()
    beats.start()
    print(f"ready: {len(agents)} agents primed, a {spec['campaign_nodes']}-node campaign starting", flush=True)
    beats.join()
    wall = time.monotonic() - started
    from campaigns.models import Campaign, NodeSweep

    steps = NodeSweep.objects.filter(campaign__node_selector={"sweep": name}).exclude(state="pending").count()
    states = list(Campaign.objects.filter(node_selector={"sweep": name}).values_list("status", flat=True))
    connection.close()
    print(f"{sent[0]} short heartbeats in {wall:.0f} s ({sent[0] / wall:.0f}/s), {len(failed)} failed "
          f"{sorted(set(failed))[:2]}; campaigns ended {done}, now {states}, {steps} node sweeps past pending",
          flush=True)
    os._exit(0)  # the daemon threads (campaign, engine pool) end with the process


if __name__ == "__main__":
    sys.exit(run_writer(sys.argv[1]))
