"""The API and the overview under load: 100,000 nodes with their exposures on PostgreSQL, gunicorn,
50 concurrent clients on loopback.

Target (issue 16, done when 3): the node list, the exposure list (filtered and sorted) and the
overview page each answer with p95 <= 200 ms and no errors. The fleet is bench/exposure.py's
(100,000 nodes over 10 clusters, the shared CSAF corpus, a full recompute: about 520,000
exposures), in a throw-away database (Django's test-database machinery; dropped at the end).
Clients are threads of this process, each with its own connection (kept alive where the server
keeps it), cycling through the three requests for `--seconds` with no pause; the node list and
the exposure list authenticate with a Bearer token (accounts), the overview page with a session
cookie. The server is the deployment's (Dockerfile, deploy/kubernetes): `gunicorn --workers 3`,
sync workers, with GPUSWEEP_CACHE_URL pointing at Redis (`--cache-url`) for the shared cache of
the figures and the API answers (gpusweep.responses). It prints the CPU time per request of the
gunicorn processes, of their PostgreSQL backends and of the clients, which other load on the
machine barely changes.

    .venv/bin/python bench/api.py --database-url postgres://root@127.0.0.1:5432/bench_api \
        --cache-url redis://127.0.0.1:6379/0

Options for the paths users feel (issue 33):
- `--no-cache`: the answer cache off (GPUSWEEP_CACHE_URL unset, whatever the environment says): the
  uncached list path that every first request after a write takes.
- `--client`: `http.client` (threads of this process, as before), `aiohttp` (keep-alive clients:
  one aiohttp session per client holding its connection, all in one event loop, as ticketing
  integrations run), or `both` (on the same server, four phases of half `--seconds` in the order
  http.client, aiohttp, aiohttp, http.client, the ratio of the rates printed).
- `--with-writes`: a separate writer process sends short agent heartbeats at `--heartbeat-rate` per
  second (2,000 agents of the fleet, primed with one full heartbeat each before the clients start)
  and keeps a `--campaign-nodes` campaign stepping (the memory executor, the engine's tasks on
  threads of the writer), so the reads are measured under the invalidations a fleet causes.
- `--worker-class gthread` (with `--threads`, 8 by default for gthread) beside the default sync workers.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TARGET_P95_MS = 200.0  # issue 16; issue 33's done-when 2 asks 300 ms with writes flowing (--with-writes)
TARGET_WRITES_P95_MS = 300.0
ALL_REQUESTS = {
    "node list": "/api/v1/inventory/nodes/?limit=100",
    "exposures (filtered, sorted)": "/api/v1/advisories/exposures/?state=open&severity=critical&cluster=bench-3"
                                    "&ordering=-deadline&limit=100",
    "overview": "/",
}
REQUESTS = dict(ALL_REQUESTS)
CLIENTS = ("http.client", "aiohttp")
CAMPAIGN_CLUSTER = "bench-campaign"  # the writer's clusters (--with-writes: bench-campaign-N), not the fleet's


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def start_gunicorn(env: dict[str, str], port: int, workers: int, threads: int, worker_class: str,
                   log: Path) -> subprocess.Popen[bytes]:
    gunicorn = Path(sys.executable).with_name("gunicorn")
    with log.open("wb") as out:
        proc = subprocess.Popen([str(gunicorn), "gpusweep.wsgi:application", "--bind", f"127.0.0.1:{port}",
                                 "--workers", str(workers), "--worker-class", worker_class, "--threads", str(threads),
                                 "--keep-alive", "30", "--timeout", "120", "--backlog", "512"],
                                env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(log.read_text()[-3000:])
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/healthz")
            if connection.getresponse().status == 200:
                return proc
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("gunicorn did not answer /healthz: " + log.read_text()[-3000:])


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes (their threads included), from /proc; a process gone counts 0."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / tick


def server_pids(proc: subprocess.Popen[bytes]) -> list[int]:
    """gunicorn's arbiter and its workers (children of the arbiter)."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    return [proc.pid, *(int(p) for p in children.read_text().split())] if children.exists() else [proc.pid]


def client(port: int, headers: dict[str, dict[str, str]], until: float, results: dict[str, list[float]],
           errors: dict[str, list[str]], lock: threading.Lock, offset: int) -> None:
    names = list(REQUESTS)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    turn = offset
    while time.monotonic() < until:
        name = names[turn % len(names)]
        turn += 1
        started = time.perf_counter()
        try:
            connection.request("GET", REQUESTS[name], headers=headers[name])
            response = connection.getresponse()
            response.read()
            status = response.status
            if response.getheader("Connection", "").lower() == "close":
                connection.close()
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            status, problem = 0, f"{type(exc).__name__}: {exc}"
        else:
            problem = f"HTTP {status}"
        elapsed_ms = (time.perf_counter() - started) * 1000
        with lock:
            if status == 200:
                results[name].append(elapsed_ms)
            else:
                errors[name].append(problem)
    connection.close()


async def aiohttp_client(port: int, headers: dict[str, dict[str, str]], until: float,
                         results: dict[str, list[float]], errors: dict[str, list[str]], offset: int) -> None:
    """A keep-alive client: one aiohttp session holding one connection, reused while the server keeps it."""
    import aiohttp

    names = list(REQUESTS)
    turn = offset
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        while time.monotonic() < until:
            name = names[turn % len(names)]
            turn += 1
            started = time.perf_counter()
            try:
                async with session.get(f"http://127.0.0.1:{port}{REQUESTS[name]}", headers=headers[name]) as answer:
                    await answer.read()
                    status, problem = answer.status, f"HTTP {answer.status}"
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                status, problem = 0, f"{type(exc).__name__}: {exc}"
            elapsed_ms = (time.perf_counter() - started) * 1000
            if status == 200:
                results[name].append(elapsed_ms)
            else:
                errors[name].append(problem)


def run_clients(kind: str, clients: int, port: int, headers: dict[str, dict[str, str]], seconds: float,
                results: dict[str, list[float]], errors: dict[str, list[str]]) -> None:
    until = time.monotonic() + seconds
    if kind == "aiohttp":
        async def everyone() -> None:
            await asyncio.gather(*(aiohttp_client(port, headers, until, results, errors, i) for i in range(clients)))

        asyncio.run(everyone())
        return
    lock = threading.Lock()
    threads = [threading.Thread(target=client, args=(port, headers, until, results, errors, lock, i))
               for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def start_writer(args: argparse.Namespace, url: str, port: int, folder: Path, seconds: float) -> subprocess.Popen[str]:
    """The writer process (bench/api_writer.py), once it says its agents are primed and its campaign runs."""
    spec = folder / "writer.json"
    spec.write_text(json.dumps({"database_url": url, "port": port, "rate": args.heartbeat_rate,
                                "campaign_nodes": args.campaign_nodes, "seconds": seconds, "folder": str(folder),
                                "heartbeat_redis_url": args.cache_url}))
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--writer", str(spec)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("ready"):
        proc.kill()
        raise RuntimeError(f"the writer did not start: {line}{proc.stdout.read()[-3000:]}")
    print(f"writer: {line.strip()}")
    return proc


def finish_writer(proc: subprocess.Popen[str]) -> str:
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        from tests.helpers import stop_process_group

        stop_process_group(proc)  # type: ignore[arg-type]
        return "writer: did not report within 120 s (stopped)"
    return "writer: " + (out.strip().splitlines() or ["(nothing)"])[-1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writer", help=argparse.SUPPRESS)  # the writer process (--with-writes)
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--clusters", type=int, default=10)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the clients run (per client kind)")
    # The server as the Dockerfile and deploy/kubernetes run it: `gunicorn --workers 3` (sync workers).
    parser.add_argument("--workers", type=int, default=3, help="gunicorn worker processes")
    parser.add_argument("--worker-class", default="sync", choices=("sync", "gthread"), help="gunicorn worker class")
    parser.add_argument("--threads", type=int, default=0,
                        help="threads per gunicorn worker (default: 8 for gthread, 1 for sync)")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""),
                        help="a PostgreSQL URL (default: $DATABASE_URL); a throw-away database is made beside it")
    parser.add_argument("--corpus", default="", help="CSAF folder (default: the shared nvidia-csaf mirror)")
    parser.add_argument("--only", default="", help="comma-separated words picking some of the requests "
                        "(e.g. 'node,exposures' leaves the overview out)")
    parser.add_argument("--cache-url", default=os.environ.get("GPUSWEEP_CACHE_URL", ""),
                        help="GPUSWEEP_CACHE_URL for the server (default: $GPUSWEEP_CACHE_URL), e.g. "
                        "redis://127.0.0.1:6379/10: the shared cache of the fleet-wide figures and the API answers")
    parser.add_argument("--no-cache", action="store_true", help="no answer cache, whatever --cache-url says")
    parser.add_argument("--client", default="http.client", choices=(*CLIENTS, "both"),
                        help="http.client threads, aiohttp keep-alive clients, or both (phases A B B A)")
    parser.add_argument("--with-writes", action="store_true",
                        help="short heartbeats and a stepping campaign in the background (a writer process)")
    parser.add_argument("--heartbeat-rate", type=float, default=200.0, help="with --with-writes: heartbeats per second")
    parser.add_argument("--campaign-nodes", type=int, default=100, help="with --with-writes: the campaign's nodes")
    parser.add_argument("--stale-s", type=int, default=0,
                        help="GPUSWEEP_ANSWER_STALE_S for the server: cached answers served up to this many seconds "
                        "after a write while one request recomputes them (gpusweep.responses; 0: every write shows "
                        "at the next request)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the database (test_<name>) and reuse it next time instead of building it again")
    args = parser.parse_args(argv)
    if args.no_cache:
        args.cache_url = ""
    if args.threads <= 0:
        args.threads = 8 if args.worker_class == "gthread" else 1
    if args.stale_s < 0:
        parser.error("--stale-s is 0 (every write shows at the next request) or more")
    if args.with_writes and (args.heartbeat_rate <= 0 or args.campaign_nodes < 1):
        parser.error("--with-writes needs a positive --heartbeat-rate and --campaign-nodes")
    return args


def main() -> int:
    args = parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # each line as it is known
    if args.writer:
        from bench.api_writer import run_writer

        return run_writer(args.writer)
    if args.only:
        words = [w.strip() for w in args.only.split(",") if w.strip()]
        REQUESTS.clear()
        REQUESTS.update({name: path for name, path in ALL_REQUESTS.items() if any(w in name for w in words)})
    if not args.database_url.startswith(("postgres://", "postgresql://")):
        print("bench/api.py runs on PostgreSQL: pass --database-url postgres://...", file=sys.stderr)
        return 2

    tmp = tempfile.TemporaryDirectory(prefix="gpusweep-bench-api-")
    secret = secrets.token_urlsafe(40)
    os.environ.update(DATABASE_URL=args.database_url, DJANGO_SETTINGS_MODULE="gpusweep.settings",
                      GPUSWEEP_VAR_DIR=tmp.name, SECRET_KEY=secret, DEBUG="false", ALLOWED_HOSTS="127.0.0.1",
                      CELERY_BROKER_URL="memory://", GPUSWEEP_CACHE_URL=args.cache_url)
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.contrib.sessions.backends.db import SessionStore
    from django.db import connection
    from django.test.utils import setup_test_environment

    from accounts import services as tokens
    from advisories.exposure import recompute
    from advisories.ingest import ingest_documents
    from advisories.models import Exposure
    from advisories.sources import FolderSource
    from bench.boot import corpus_folder
    from bench.exposure import build_fleet
    from inventory.models import Node

    corpus = corpus_folder(args.corpus)
    if corpus is None:
        return 2
    setup_test_environment(debug=False)
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=not args.keep, serialize=False,
                                                  keepdb=args.keep)
    bench_db = connection.settings_dict["NAME"]
    proc = None
    try:
        started = time.perf_counter()
        if Node.objects.exclude(cluster__name__startswith=CAMPAIGN_CLUSTER).count() != args.nodes:
            Node.objects.all().delete()
            ingest_documents(FolderSource(str(corpus)).items())
            build_fleet(args.nodes, args.clusters)
            recompute()
        User.objects.filter(username="bench").delete()
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")  # what autovacuum does to a table this size soon after
        print(f"fleet: {Node.objects.count()} nodes, {Exposure.objects.count()} exposures "
              f"({Exposure.objects.filter(state='open').count()} open), built in {time.perf_counter() - started:.0f} s")
        user = User.objects.create_superuser("bench", password=secrets.token_urlsafe(16))
        _token, key = tokens.issue(user, "bench")
        session = SessionStore()
        session["_auth_user_id"] = str(user.pk)
        session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
        session["_auth_user_hash"] = user.get_session_auth_hash()
        session.create()
        api = {"Authorization": f"Bearer {key}", "Accept": "application/json"}
        headers = {name: api for name in REQUESTS}
        if "overview" in REQUESTS:
            headers["overview"] = {"Cookie": f"{settings.SESSION_COOKIE_NAME}={session.session_key}"}
        connection.close()

        from tests.helpers import free_port

        port = free_port()
        url = args.database_url.rsplit("/", 1)[0] + f"/{bench_db}"
        env = {**os.environ, "DATABASE_URL": url, "DB_CONN_MAX_AGE": "600",
               "GPUSWEEP_ANSWER_STALE_S": str(args.stale_s)}
        if args.with_writes:  # the agents' fleet secret, and their counters in Redis where there is one
            from bench.api_writer import SECRET

            env.update(GPUSWEEP_AGENT_FLEET_SECRET=SECRET, GPUSWEEP_HEARTBEAT_REDIS_URL=args.cache_url)
        log = Path(tmp.name) / "gunicorn.log"
        proc = start_gunicorn(env, port, args.workers, args.threads, args.worker_class, log)
        for name, path in REQUESTS.items():  # warm up every worker's connection and caches
            for _ in range(args.workers * 2):
                warm = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                warm.request("GET", path, headers=headers[name])
                answer = warm.getresponse()
                answer.read()
                if answer.status != 200:
                    print(f"{name}: HTTP {answer.status} in warm-up", file=sys.stderr)
                    return 1
                warm.close()

        from django.db import connection as db

        def database_backends() -> set[int]:
            with db.cursor() as cursor:  # the server's PostgreSQL backends, for their CPU time
                cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
                               "AND application_name <> 'gpusweep-bench-writer'", [bench_db])
                pids = {row[0] for row in cursor.fetchall()}
            db.close()
            return pids

        cache_server: list[int] = []
        if args.cache_url:  # the Redis server's CPU too, when it runs on this machine
            import redis

            pid = int(redis.Redis.from_url(args.cache_url).info("server")["process_id"])
            cache_server = [pid] if Path(f"/proc/{pid}/stat").exists() else []
        # Both kinds: four half phases in the order A B B A, so a drift of the machine's load (or the
        # writer's campaign starting) weighs on both alike; each kind's rate is over its two phases.
        kinds = [*CLIENTS, *reversed(CLIENTS)] if args.client == "both" else [args.client]
        phase_s = args.seconds / 2 if args.client == "both" else args.seconds
        writer = None
        if args.with_writes:
            writer = start_writer(args, url, port, Path(tmp.name), len(kinds) * (phase_s + 5) + 10)
        ok = True
        served: dict[str, list[float]] = {}  # kind -> [requests, seconds]
        for kind in kinds:
            results: dict[str, list[float]] = {name: [] for name in REQUESTS}
            errors: dict[str, list[str]] = {name: [] for name in REQUESTS}
            backends = list(database_backends())
            servers = server_pids(proc)
            load_before = os.getloadavg()[0]
            server_cpu, db_cpu, own_cpu = cpu_seconds(servers), cpu_seconds(backends), time.process_time()
            cache_cpu = cpu_seconds(cache_server)
            began = time.perf_counter()
            run_clients(kind, args.clients, port, headers, phase_s, results, errors)
            wall = time.perf_counter() - began
            own_cpu = time.process_time() - own_cpu
            server_cpu, db_cpu = cpu_seconds(servers) - server_cpu, cpu_seconds(backends) - db_cpu
            cache_cpu = cpu_seconds(cache_server) - cache_cpu
            db_cpu += cpu_seconds(list(database_backends() - set(backends)))  # opened during the run
            print(f"{args.clients} {kind} clients for {wall:.1f} s against gunicorn ({args.workers} "
                  f"{args.worker_class} workers x {args.threads} threads) on {os.cpu_count()} CPUs, load average "
                  f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after; cache "
                  f"{args.cache_url or 'per process (no answer cache)'}"
                  f"{'; with writes (' + str(args.heartbeat_rate) + ' heartbeats/s, a campaign)' if writer else ''}"
                  f"{'; answers up to ' + str(args.stale_s) + ' s stale' if args.stale_s else ''}")
            answered = sum(len(v) + len(errors[k]) for k, v in results.items()) or 1
            served.setdefault(kind, [0.0, 0.0])
            served[kind][0] += answered
            served[kind][1] += wall
            print(f"CPU per request: gunicorn {1000 * server_cpu / answered:.2f} ms, PostgreSQL backends "
                  f"{1000 * db_cpu / answered:.2f} ms, the Redis server (all its users) "
                  f"{1000 * cache_cpu / answered:.2f} ms, clients {1000 * own_cpu / answered:.2f} ms; "
                  f"{answered / wall:.1f} requests/s in all")
            for name in REQUESTS:
                times, failed = results[name], errors[name]
                if not times:
                    print(f"{name}: no successful request; errors {failed[:3]}")
                    ok = False
                    continue
                p95 = percentile(times, 0.95)
                target = TARGET_WRITES_P95_MS if writer else TARGET_P95_MS
                verdict = "PASS" if p95 <= target and not failed else "FAIL"
                ok &= verdict == "PASS"
                print(f"{name}: {len(times)} requests ({len(times) / wall:.1f}/s), p50 {statistics.median(times):.0f} "
                      f"ms, p95 {p95:.0f} ms, p99 {percentile(times, 0.99):.0f} ms, max {max(times):.0f} ms, "
                      f"errors {len(failed)}{' ' + str(sorted(set(failed))[:3]) if failed else ''} "
                      f"(target p95 <= {target:.0f} ms, no errors): {verdict}")
        rates = {kind: n / seconds for kind, (n, seconds) in served.items()}
        if len(rates) == 2:
            print(f"keep-alive clients' rate / http.client's: {rates['aiohttp'] / rates['http.client']:.2f} "
                  f"({rates['aiohttp']:.1f} / {rates['http.client']:.1f} requests/s over two phases each; "
                  "target >= 0.80)")
            ok &= rates["aiohttp"] >= 0.8 * rates["http.client"]
        if writer is not None:
            print(finish_writer(writer))
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        if proc is not None:
            from tests.helpers import stop_process_group

            stop_process_group(proc)
        connection.close()
        if not args.keep:
            connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    sys.exit(main())
