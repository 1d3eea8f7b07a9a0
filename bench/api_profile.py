"""In-process profile of bench/api.py's uncached lists: the CPU of the web side and of its
PostgreSQL backend per request, the queries each request makes (count and time), and where the
web side's time goes (cProfile), without gunicorn or concurrent clients.

It runs against a database bench/api.py kept (`--keep`: `test_<name>`), with the answer cache off
(GPUSWEEP_CACHE_URL unset), through django.test.Client with the bench's Bearer token:

    .venv/bin/python bench/api_profile.py --database-url postgres://root@127.0.0.1:5432/test_bench_api \
        --requests 200 [--profile 25]

The PostgreSQL figure is the backend process's CPU (/proc, so the server must run on this machine)
over the same requests; the web figure is this process's CPU time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.api import ALL_REQUESTS, cpu_seconds  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", required=True, help="the kept bench database (test_<name>)")
    parser.add_argument("--requests", type=int, default=200, help="timed requests per list")
    parser.add_argument("--profile", type=int, default=0, help="then this many requests per list under cProfile")
    parser.add_argument("--rounds", type=int, default=1, help="timed rounds, the lists alternated")
    args = parser.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="gpusweep-bench-profile-")
    os.environ.update(
        DATABASE_URL=args.database_url,
        DJANGO_SETTINGS_MODULE="gpusweep.settings",
        GPUSWEEP_VAR_DIR=tmp.name,
        SECRET_KEY="bench-profile-" + "x" * 40,
        DEBUG="false",
        CELERY_BROKER_URL="memory://",
        GPUSWEEP_CACHE_URL="",
        DB_CONN_MAX_AGE="600",
    )
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    from accounts import services as tokens

    setup_test_environment(debug=False)
    User.objects.filter(username="bench-profile").delete()
    user = User.objects.create_superuser("bench-profile", password="unused-" + "y" * 20)
    _token, key = tokens.issue(user, "bench-profile")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_ACCEPT="application/json")
    paths = {name: path for name, path in ALL_REQUESTS.items() if path.startswith("/api/")}
    try:
        for path in paths.values():  # warm: the process's caches, the backend's plans
            for _ in range(5):
                assert client.get(path).status_code == 200, path
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backend = int(cursor.fetchone()[0])
        print(f"load average {os.getloadavg()[0]:.1f}")
        for round_ in range(args.rounds):
            for name, path in paths.items():
                web, db = time.process_time(), cpu_seconds([backend])
                for _ in range(args.requests):
                    client.get(path)
                web, db = time.process_time() - web, cpu_seconds([backend]) - db
                print(
                    f"round {round_ + 1}, {name}: web {1000 * web / args.requests:.2f} ms, PostgreSQL "
                    f"{1000 * db / args.requests:.2f} ms per request (load {os.getloadavg()[0]:.1f})"
                )
        for name, path in paths.items():
            with CaptureQueriesContext(connection) as queries:
                client.get(path)
            print(f"{name}: {len(queries)} queries, {sum(float(q['time']) for q in queries) * 1000:.2f} ms wall")
            for q in queries:
                print(f"  {float(q['time']) * 1000:6.2f} ms  {q['sql'][:3000]}")
        if args.profile:
            for name, path in paths.items():
                profile = cProfile.Profile(time.process_time)  # CPU time, not the waits on PostgreSQL
                profile.enable()
                for _ in range(args.profile):
                    client.get(path)
                profile.disable()
                out = io.StringIO()
                pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(60)
                print(f"--- {name}, {args.profile} requests, cumulative\n{out.getvalue()}")
                out = io.StringIO()
                pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(30)
                print(f"--- {name}, {args.profile} requests, own time\n{out.getvalue()}")
    finally:
        User.objects.filter(username="bench-profile").delete()
        connection.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
