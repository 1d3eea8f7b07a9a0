"""Agent heartbeats over HTTP at fleet scale: gunicorn on PostgreSQL with a 100,000-node fleet.

    .venv/bin/python bench/heartbeat.py --database-url postgres://root@127.0.0.1:5432/bench_heartbeat \
        --broker-url redis://127.0.0.1:6379/5 [--nodes 100000] [--agents 2000] [--clients 16] [--seconds 20]

The fleet is bench/exposure.py's (100,000 nodes, their components, the shared CSAF corpus
matched: about 500,000 exposures) in a fresh database NAME_heartbeat, dropped at the end, or
without --database-url in a temporary SQLite file (the embedded default, with the filesystem
broker: heartbeats then write their counter and last_seen themselves). The
server is `gunicorn gpusweep.wsgi -w --web-workers` (persistent database connections,
DB_CONN_MAX_AGE=600); the load generator is a separate process (`--load`, threads, each request a
new connection as the agent makes them) sending --agents distinct nodes' signed heartbeats.
Phases, in one run:

1. prime: one full heartbeat per agent (registers its endpoint; not measured);
2. full (today's path, the baseline): full heartbeats with nothing changed, as every agent older
   than digests sends them;
3. short: unchanged heartbeats carrying only the digest (inventory/heartbeats.py);
4. changed: full heartbeats whose driver alternates between two versions, so each one writes
   ChangeLog rows and recomputes that node's exposures;
5. api: an API client's GET of one node (token authentication), for the API's per-core figure.

`--in-process N` measures without gunicorn or the load generator, for iterating on the code: N
changed heartbeats (and N short ones) through the whole URL stack in this process (Django's test
client), printing this process's CPU (time.process_time), its PostgreSQL backend's CPU and the SQL
statements per heartbeat; `--profile` adds a cProfile of the changed ones. `--keep` keeps the
database NAME_heartbeat (built once, reused by the next run with --keep), so such runs take seconds.

Per phase: heartbeats per second, latency p50/p95/p99, errors, the gunicorn processes' CPU time
per heartbeat (utime + stime from /proc over the phase, divided by the heartbeats answered),
PostgreSQL's CPU per heartbeat (its backends serving the workers), and SQL statements per
heartbeat (counted in the workers, bench/heartbeat_gunicorn.py; flushes included). Targets
(issue 20): short <= 1.5 ms server CPU, >= 500/s, p95 <= 50 ms, 0 errors; changed <= 10 ms.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "agent" / "src"))

SECRET = "bench-heartbeat-fleet-secret-0123456789"
PATH = "/api/v1/inventory/agent/heartbeat"
TICK = os.sysconf("SC_CLK_TCK")
SHORT_CPU_MS, SHORT_RATE, SHORT_P95_MS, CHANGED_CPU_MS = 1.5, 500.0, 50.0, 10.0
DRIVERS = ("570.86.15", "570.133.07")


# -- the load generator (its own process) -----------------------------------------------


class Agent:
    """One node's agent, as gpusweep_agent.heartbeat sends: counter nonces, the same signature."""

    def __init__(self, node_id: int, cluster: str, node: str, components: dict[str, str]) -> None:
        from gpusweep_agent.auth import derive_node_key

        self.node_id, self.cluster, self.node = node_id, cluster, node
        self.key = derive_node_key(SECRET, cluster, node)
        self.components = components
        self.counter = 0
        self.digest = ""
        # The first changed heartbeat moves the driver off what the node has (a kept database
        # may hold either version from an earlier run).
        self.flip = 1 if components.get("driver") == DRIVERS[1] else 0

    def payload(self, driver: str | None = None) -> dict[str, Any]:
        components = dict(self.components)
        if driver:
            components["driver"] = driver
        return {"schema": "gpusweep.heartbeat/1", "cluster": self.cluster, "node": self.node, "agent_version": "0.1.0",
                "endpoint": f"http://{self.node}.bench:17100", "sent_at": "2026-12-02T00:00:00Z",
                "facts": {"gpu_model": "NVIDIA H100 80GB HBM3", "gpu_count": 8, "product_line": "tesla",
                          "os_family": "linux", "components": components},
                "workloads": []}

    def request(self, mode: str) -> bytes:
        from gpusweep_agent.heartbeat import content_digest

        if mode == "short":
            body: dict[str, Any] = {"schema": "gpusweep.heartbeat/1", "cluster": self.cluster, "node": self.node,
                                    "agent_version": "0.1.0", "sent_at": "2026-12-02T00:00:00Z",
                                    "digest": self.digest}
        elif mode == "changed":
            self.flip += 1
            body = self.payload(DRIVERS[self.flip % 2])
            body["digest"] = content_digest(body)
        elif mode == "full":  # an agent older than digests
            body = self.payload()
        else:  # prime: the new agent's first heartbeat
            body = self.payload()
            body["digest"] = content_digest(body)
        return json.dumps(body).encode()

    def headers(self, body: bytes) -> dict[str, str]:
        from gpusweep_agent.auth import sign

        now = time.time()
        self.counter = max(self.counter + 1, int(now * 1_000_000))
        return {"Content-Type": "application/json",
                **sign(self.key, f"{self.cluster}/{self.node}", "POST", PATH, body, now=now, nonce=str(self.counter))}


def _cpu(pids: list[int]) -> dict[int, float]:
    """CPU seconds (utime + stime) of each process still there."""
    found = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[pid] = (int(fields[11]) + int(fields[12])) / TICK
    return found


def _cpu_since(before: dict[int, float], pids: list[int]) -> float:
    """CPU used since `before` by `pids` (a process that appeared since counts from zero)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in _cpu(pids).items())


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                pass
    return found


def _backends(url: str) -> list[int]:
    if not url.startswith("postgres"):
        return []  # SQLite: the database is in the workers' own processes
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid()").fetchall()
    return [row[0] for row in rows]


def _sql_count(folder: str) -> int:
    return sum(int(p.read_text() or 0) for p in Path(folder).iterdir())


class Phase:
    """One phase of the load: --clients threads sending heartbeats of `mode` until the deadline
    (or, priming, one per agent)."""

    def __init__(self, agents: list[Agent], port: int, mode: str, seconds: float, token: str) -> None:
        self.agents, self.port, self.mode, self.seconds, self.token = agents, port, mode, seconds, token
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.errors: dict[str, int] = {}
        self.next_agent = 0
        self.deadline = 0.0

    def run(self, clients: int) -> float:
        began = time.monotonic()
        self.deadline = began + self.seconds
        threads = [threading.Thread(target=self.client) for _ in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return time.monotonic() - began

    def client(self) -> None:
        while True:
            with self.lock:
                index = self.next_agent
                self.next_agent += 1
                if self.mode == "prime" and index >= len(self.agents):
                    return
                if self.mode != "prime" and time.monotonic() >= self.deadline:
                    return
                agent = self.agents[index % len(self.agents)]
                if self.mode == "api":  # an API client reading one node, as a ticketing system does
                    method, path, body = "GET", f"/api/v1/inventory/nodes/{agent.node_id}/", b""
                    headers = {"Authorization": f"Token {self.token}"}
                else:
                    method, path, body = "POST", PATH, agent.request(self.mode)
                    headers = agent.headers(body)
            started = time.perf_counter()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                conn.request(method, path, body or None, headers)
                response = conn.getresponse()
                raw = response.read()
                conn.close()
                status = response.status
            except OSError as exc:
                status, raw = 0, str(exc).encode()
            elapsed = time.perf_counter() - started
            with self.lock:
                if status == 200:
                    self.latencies.append(elapsed)
                    if self.mode == "prime":
                        agent.digest = json.loads(raw)["digest"]
                else:
                    key = f"{status} {raw[:120]!r}"
                    self.errors[key] = self.errors.get(key, 0) + 1


def run_load(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    agents = [Agent(*a) for a in spec["agents"]]
    results = []
    for mode, seconds in [("prime", 0.0), ("full", spec["seconds"]), ("short", spec["seconds"]),
                          ("changed", spec["seconds"]), ("api", spec["seconds"])]:
        phase = Phase(agents, spec["port"], mode, seconds, spec["token"])
        server = [spec["master"], *_children(spec["master"])]
        postgres = _backends(spec["database_url"])  # the workers' connections (persistent)
        cpu0, pg0, sql0 = _cpu(server), _cpu(postgres), _sql_count(spec["sql_dir"])
        own0 = time.process_time()
        wall = phase.run(spec["clients"])
        own = time.process_time() - own0
        time.sleep(0.2)  # the last requests' counts written
        server = [spec["master"], *_children(spec["master"])]
        postgres = sorted(set(postgres) | set(_backends(spec["database_url"])))
        cpu, pg, sql = _cpu_since(cpu0, server), _cpu_since(pg0, postgres), _sql_count(spec["sql_dir"]) - sql0
        answered = len(phase.latencies)
        ordered = sorted(phase.latencies) or [0.0]

        def pct(p: float, values: list[float] = ordered) -> float:
            return values[min(len(values) - 1, int(p * len(values)))] * 1000

        results.append({
            "mode": mode, "heartbeats": answered, "seconds": wall, "rate": answered / wall,
            "p50_ms": pct(0.50), "p95_ms": pct(0.95), "p99_ms": pct(0.99),
            "mean_ms": statistics.fmean(ordered) * 1000,
            "errors": sum(phase.errors.values()), "error_kinds": dict(list(phase.errors.items())[:3]),
            "cpu_ms": cpu * 1000 / max(answered, 1), "pg_cpu_ms": pg * 1000 / max(answered, 1),
            "sql": sql / max(answered, 1), "load_cpu_ms": own * 1000 / max(answered, 1),
        })
    print(json.dumps(results))
    return 0


# -- the server side ---------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load", help=argparse.SUPPRESS)  # the load generator's own process
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--agents", type=int, default=2_000)
    parser.add_argument("--clients", type=int, default=16, help="concurrent requests of the load generator")
    parser.add_argument("--seconds", type=float, default=20.0, help="per measured phase")
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--no-exposures", action="store_true", help="skip the corpus (a fleet without exposures)")
    parser.add_argument("--database-url", default="", help="postgres://... (default: a temporary SQLite file)")
    parser.add_argument("--broker-url", default="",
                        help="redis://... for the heartbeat counters (without it they are written per heartbeat)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the database (and reuse one an earlier --keep run built) instead of dropping it")
    parser.add_argument("--in-process", type=int, default=0, metavar="N",
                        help="time N changed and N short heartbeats in this process instead of over HTTP")
    parser.add_argument("--profile", action="store_true", help="with --in-process: cProfile the changed ones")
    args = parser.parse_args()
    if args.load:
        return run_load(args.load)
    sqlite = not args.database_url.startswith("postgres")

    tmp = tempfile.TemporaryDirectory(prefix="gpusweep-bench-hb-")
    os.environ.update(DATABASE_URL=args.database_url, DJANGO_SETTINGS_MODULE="gpusweep.settings",
                      GPUSWEEP_VAR_DIR=tmp.name, GPUSWEEP_AGENT_FLEET_SECRET=SECRET)
    if sqlite:
        os.environ["DATABASE_URL"] = f"sqlite:///{tmp.name}/base.sqlite3"
    os.environ["CELERY_BROKER_URL"] = args.broker_url or "filesystem://"
    os.environ["GPUSWEEP_HEARTBEAT_REDIS_URL"] = args.broker_url if args.broker_url.startswith("redis") else ""
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection
    from django.test.utils import setup_test_environment

    from advisories.exposure import recompute
    from advisories.ingest import ingest_documents
    from advisories.models import Exposure
    from advisories.sources import FolderSource
    from bench.exposure import build_fleet
    from inventory.models import Node, NodeComponent

    setup_test_environment(debug=False)
    connection.settings_dict["TEST"]["NAME"] = (f"{tmp.name}/heartbeat.sqlite3" if sqlite
                                                else f"{connection.settings_dict['NAME']}_heartbeat")
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False, keepdb=args.keep)
    web = None
    from inventory import heartbeats

    if settings.GPUSWEEP_HEARTBEAT_REDIS_URL:  # counters of an earlier run's database of this name
        heartbeats._client(settings.GPUSWEEP_HEARTBEAT_REDIS_URL).delete(*heartbeats._keys())
    try:
        started = time.perf_counter()
        built = args.keep and Node.objects.exists()
        if built:
            print("fleet: kept from an earlier --keep run")
        else:
            if not args.no_exposures:
                ingest_documents(FolderSource(str(Path(settings.GPUSWEEP_SHARED_DATA_DIR) / "nvidia-csaf")).items())
            build_fleet(args.nodes, 10)
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")
            if not args.no_exposures:
                recompute()
        print(f"fleet: {Node.objects.count()} nodes, {NodeComponent.objects.count()} components, "
              f"{Exposure.objects.count()} exposures, ready in {time.perf_counter() - started:.0f} s")
        step = max(1, args.nodes // args.agents)
        chosen = list(Node.objects.filter(id__in=list(Node.objects.values_list("id", flat=True)[::step][:args.agents]))
                      .values_list("id", "cluster__name", "name"))
        components: dict[int, dict[str, str]] = {}
        for node_id, component, version in NodeComponent.objects.filter(
                node_id__in=[c[0] for c in chosen]).values_list("node_id", "component", "version"):
            components.setdefault(node_id, {})[component] = version
        agents = [(node_id, cluster, name, components.get(node_id, {})) for node_id, cluster, name in chosen]
        if args.in_process:
            return in_process([Agent(*a) for a in agents[:args.in_process]], args.profile)
        from django.contrib.auth.models import Group, User
        from rest_framework.authtoken.models import Token

        User.objects.filter(username="bench-reader").delete()  # a kept database's earlier reader
        reader = User.objects.create_user("bench-reader")
        reader.groups.add(Group.objects.get(name="viewer"))
        token = Token.objects.create(user=reader).key

        db = connection.settings_dict
        url = (f"sqlite:///{db['NAME']}" if sqlite else
               f"postgres://{db['USER'] or 'root'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}")
        sql_dir = Path(tmp.name) / "sql"
        sql_dir.mkdir()
        port = _free_port()
        env = {**os.environ, "DATABASE_URL": url, "DB_CONN_MAX_AGE": "600", "BENCH_SQL_DIR": str(sql_dir),
               "DEBUG": "0", "GPUSWEEP_ADVISORY_SOURCES": "", "SECRET_KEY": "bench-" + "x" * 50,
               "ALLOWED_HOSTS": "127.0.0.1,localhost"}
        log = (Path(tmp.name) / "gunicorn.log").open("ab")
        web = subprocess.Popen([sys.executable, "-m", "gunicorn", "gpusweep.wsgi:application", "--bind",
                                f"127.0.0.1:{port}", "--workers", str(args.web_workers), "-c",
                                str(REPO / "bench" / "heartbeat_gunicorn.py")],
                               env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        _wait_ready(port, web, Path(tmp.name) / "gunicorn.log")
        connection.close()  # the load generator finds the workers' database backends by name
        spec = Path(tmp.name) / "spec.json"
        spec.write_text(json.dumps({"agents": agents, "port": port, "master": web.pid, "database_url": url,
                                    "token": token, "seconds": args.seconds, "clients": args.clients,
                                    "sql_dir": str(sql_dir)}))
        load = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--load", str(spec)],
                              capture_output=True, text=True, timeout=3600)
        if load.returncode != 0:
            print(load.stdout, load.stderr, file=sys.stderr)
            return 1
        results = {r["mode"]: r for r in json.loads(load.stdout.strip().splitlines()[-1])}
        with open("/proc/loadavg") as f:
            loadavg = f.read().split()[:3]
        redis_mode = "Redis" if settings.GPUSWEEP_HEARTBEAT_REDIS_URL else "per-heartbeat writes (no Redis)"
        print(f"server: gunicorn -w {args.web_workers} on {connection.vendor}, heartbeat counters via {redis_mode}; "
              f"{len(agents)} agents, {args.clients} concurrent clients; {os.cpu_count()} cores, "
              f"load average {' '.join(loadavg)} at the end")
        print(f"{'phase':<28} {'hb/s':>7} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} {'errors':>6} "
              f"{'cpu ms/hb':>9} {'pg ms/hb':>8} {'sql/hb':>6} {'load ms/hb':>10}")
        names = {"full": "full, unchanged (today)", "short": "short, unchanged (digest)",
                 "changed": "full, driver changed", "api": "API GET one node (token)"}
        for mode in ("full", "short", "changed", "api"):
            r = results[mode]
            print(f"{names[mode]:<28} {r['rate']:7.0f} {r['p50_ms']:7.1f} {r['p95_ms']:7.1f} {r['p99_ms']:7.1f} "
                  f"{r['errors']:6d} {r['cpu_ms']:9.2f} {r['pg_cpu_ms']:8.2f} {r['sql']:6.1f} {r['load_cpu_ms']:10.2f}")
            if r["errors"]:
                print(f"  errors: {r['error_kinds']}")
        short, full, changed = results["short"], results["full"], results["changed"]
        print(f"short vs today's path: {full['cpu_ms'] / max(short['cpu_ms'], 1e-9):.1f}x less server CPU, "
              f"{short['rate'] / max(full['rate'], 1e-9):.1f}x the rate; one core answers "
              f"{1000 / max(short['cpu_ms'], 1e-9):.0f} short heartbeats/s, so 100,000 agents at 30 s need "
              f"{100_000 / 30 * short['cpu_ms'] / 1000:.1f} cores of web processes")
        ok = (short["cpu_ms"] <= SHORT_CPU_MS and short["rate"] >= SHORT_RATE and short["p95_ms"] <= SHORT_P95_MS
              and short["errors"] == 0 and changed["cpu_ms"] <= CHANGED_CPU_MS and changed["errors"] == 0)
        print("PASS" if ok else "FAIL: a target was missed "
              f"(short <= {SHORT_CPU_MS} ms CPU, >= {SHORT_RATE:.0f}/s, p95 <= {SHORT_P95_MS:.0f} ms, 0 errors; "
              f"changed <= {CHANGED_CPU_MS:.0f} ms CPU)")
        return 0 if ok else 1
    finally:
        if web is not None:
            import signal

            os.killpg(web.pid, signal.SIGTERM)
            web.wait(timeout=30)
        connection.close()
        connection.creation.destroy_test_db(old_name, verbosity=0, keepdb=args.keep)


def in_process(agents: list[Agent], profile: bool) -> int:
    """Each agent's full heartbeat (not timed), then one changed and one short heartbeat per agent
    through the URL stack in this process: CPU and SQL statements per heartbeat."""
    import cProfile
    import pstats

    from django.db import connection
    from django.test import Client

    client = Client()
    count = [0]

    def counting(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        count[0] += 1
        return execute(sql, params, many, context)

    def send(agent: Agent, mode: str) -> None:
        body = agent.request(mode)
        response = client.post(PATH, body, content_type="application/json", headers=agent.headers(body))
        if response.status_code != 200:
            raise SystemExit(f"{mode} heartbeat of {agent.node}: {response.status_code} {response.content[:300]!r}")
        if mode != "short":
            agent.digest = response.json()["digest"]
            if mode == "changed" and response.json()["changed"] != ["driver"]:
                raise SystemExit(f"changed heartbeat of {agent.node} changed {response.json()['changed']}")

    for agent in agents:
        send(agent, "prime")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()" if connection.vendor == "postgresql" else "SELECT 0")
        backend = [cursor.fetchone()[0]] if connection.vendor == "postgresql" else []
    rows: list[tuple[str, float, float, float, int]] = []
    for mode in ("changed", "short", "changed"):  # the second changed round: warm caches
        profiler = cProfile.Profile(time.process_time) if profile and mode == "changed" and rows else None
        pg0, sql0 = _cpu(backend), count[0]
        cpu0, wall0 = time.process_time(), time.perf_counter()
        with connection.execute_wrapper(counting):
            if profiler:
                profiler.enable()
            for agent in agents:
                send(agent, mode)
            if profiler:
                profiler.disable()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        pg, sql = _cpu_since(pg0, backend), count[0] - sql0
        rows.append((mode, cpu, wall, pg, sql))
        if profiler:
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(60)
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
            dump = Path(tempfile.gettempdir()) / "gpusweep-heartbeat.prof"
            profiler.dump_stats(dump)
            print(f"profile of the changed heartbeats: {dump} (python -m pstats)")
    if profile:  # the statements of one more changed heartbeat
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as queries:
            send(agents[0], "changed")
        for query in queries.captured_queries:
            print(f"{query['time']:>6} {' '.join(query['sql'].split())[:300]}")
    n = len(agents)
    with open("/proc/loadavg") as f:
        loadavg = " ".join(f.read().split()[:3])
    print(f"in process on {connection.vendor}, {n} agents, load average {loadavg}")
    print(f"{'round':<10} {'cpu ms/hb':>9} {'wall ms/hb':>10} {'pg ms/hb':>8} {'sql/hb':>6}")
    for mode, cpu, wall, pg, sql in rows:
        print(f"{mode:<10} {cpu * 1000 / n:9.2f} {wall * 1000 / n:10.2f} {pg * 1000 / n:8.2f} {sql / n:6.1f}")
    return 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    status = conn.getresponse().status
    conn.close()
    return status


def _wait_ready(port: int, web: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if web.poll() is not None:
            raise SystemExit(f"gunicorn exited: {log.read_text()[-3000:]}")
        try:
            _get(port, "/healthz")
            return
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"gunicorn did not answer: {log.read_text()[-3000:]}")


if __name__ == "__main__":
    raise SystemExit(main())
