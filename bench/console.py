"""The console's pages at fleet scale: 100,000 nodes and their exposures (bench/exposure.py's fleet
and the shared CSAF corpus), each page rendered in-process through the whole URL stack by a
logged-in admin, its figures printed (median and p95 of `--repeat` requests, and the first, cold
request of the overview). A throw-away database (Django's test-database machinery):
`--database-url postgres://...` or a temporary SQLite file.

    .venv/bin/python bench/console.py --database-url postgres://root@127.0.0.1:5432/bench_console
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--clusters", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""))
    parser.add_argument("--corpus", default="")
    args = parser.parse_args()

    from bench.boot import boot, corpus_folder

    _tmp = boot(args.database_url)  # kept alive (deleted when collected) while the bench runs
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.core.cache import cache
    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_test_environment
    from django.utils import timezone

    from advisories import counts
    from advisories.exposure import recompute
    from advisories.ingest import ingest_documents
    from advisories.models import Advisory, Exposure
    from advisories.sources import FolderSource
    from bench.exposure import build_fleet
    from console import overview
    from gpusweep import registry
    from inventory.models import Node

    corpus = corpus_folder(args.corpus)
    if corpus is None:
        return 2
    setup_test_environment(debug=False)
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        started = time.perf_counter()
        ingest_documents(FolderSource(str(corpus)).items())
        build_fleet(args.nodes, args.clusters)
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")
        recompute()
        print(f"engine {connection.vendor}: {Node.objects.count()} nodes, {Exposure.objects.count()} exposures, "
              f"{Advisory.objects.count()} advisories, set up in {time.perf_counter() - started:.0f} s")
        client = Client()
        client.force_login(User.objects.create_superuser("bench", password="bench-password-12345"))
        advisory = Advisory.objects.filter(publisher_id="5703").first() or Advisory.objects.first()
        node = Node.objects.first()
        assert advisory is not None and node is not None
        for label, compute in (("overview's figures", lambda: overview.figures(registry.overview, timezone.now())),
                               ("exposed counts per advisory", counts.per_advisory)):
            started = time.perf_counter()
            compute()
            print(f"{label}, computed (served from the cache for GPUSWEEP_CONSOLE_FIGURES_S="
                  f"{settings.GPUSWEEP_CONSOLE_FIGURES_S}): {1000 * (time.perf_counter() - started):.0f} ms")
        cache.clear()
        started = time.perf_counter()
        assert client.get("/").status_code == 200
        print(f"overview, first request (figures computed): {1000 * (time.perf_counter() - started):.0f} ms")
        pages = {
            "overview": "/",
            "advisories": "/advisories/?affects=1&sort=exposed",
            "advisory 5703": f"/advisories/{advisory.public_id}/",
            "exposures (searched, sorted, grouped)": "/advisories/exposures/?q=node-0001&sort=severity&group=advisory",
            "exposures (critical, one cluster)": "/advisories/exposures/?severity=critical&cluster=bench-3",
            "node": f"/nodes/{node.pk}/",
            "wizard": f"/campaigns/new/?advisories={advisory.public_id}",
            "wizard's live count": f"/campaigns/new/match/?clusters=bench-3&advisories={advisory.public_id}",
        }
        for label, url in pages.items():
            times = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                response = client.get(url)
                times.append(1000 * (time.perf_counter() - started))
                assert response.status_code == 200, (url, response.status_code)
            times.sort()
            p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
            print(f"{label:40s} median {statistics.median(times):7.1f} ms   p95 {p95:7.1f} ms")
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
