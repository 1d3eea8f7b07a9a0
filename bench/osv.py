"""Distribution advisories at fleet scale (issue 30): 100,000 nodes in 50 package sets of 2,000
packages each, half of them running a linux-nvidia kernel below USN-7328-2's fix.

Targets, on PostgreSQL: ingesting the kernel USN, exposures included, <= 1 s on every one of
`--runs` ingests (each after the last one's advisory was deleted); a full OS rematch <= 10 s; an
unchanged package set adds no statement to a heartbeat (counted). After the build, PostgreSQL's
tables are analyzed, as autovacuum does a table loaded this fast: a fleet's tables have statistics.

    .venv/bin/python bench/osv.py --database-url postgres://root@127.0.0.1:5432/bench_osv
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

INGEST_TARGET_S = 1.0
FULL_TARGET_S = 10.0
USN = REPO / "tests" / "advisories" / "fixtures" / "osv" / "USN-7328-2.json"
JAMMY = {"ID": "ubuntu", "VERSION_ID": "22.04", "VERSION_CODENAME": "jammy", "VERSION": "22.04.5 LTS"}


def image_packages(image: int, count: int) -> list[list[str]]:
    """An image's packages: filler, and two kernels of the nvidia flavour (old and fixed)."""
    rows = [[f"pkg-{i}", f"1.{i}.{image}-0ubuntu1", "amd64", f"src-{i // 4}", f"1.{i}.{image}-0ubuntu1"]
            for i in range(count - 4)]
    for abi, version in (("1042", "5.15.0-1042.42"), ("1073", "5.15.0-1073.74")):
        rows.append([f"linux-image-5.15.0-{abi}-nvidia", version, "amd64", "linux-signed-nvidia", version])
        rows.append([f"linux-modules-5.15.0-{abi}-nvidia", version, "amd64", "linux-nvidia", version])
    return rows


def build(nodes: int, images: int, packages: int) -> None:
    from inventory.models import Cluster, Node
    from inventory.packages import package_set, parse_os_report

    clusters = Cluster.objects.bulk_create([Cluster(name=f"bench-{i}", kind="slurm") for i in range(10)])
    reports = [parse_os_report({"os": {"release": JAMMY, "packages": image_packages(i, packages)}})
               for i in range(images)]
    sets = [package_set(report) for report in reports if report is not None]
    rows = [Node(cluster=clusters[i % 10], name=f"n{i:06}", package_set=sets[i % images],
                 running_kernel="5.15.0-1042-nvidia" if i % 2 else "5.15.0-1073-nvidia") for i in range(nodes)]
    Node.objects.bulk_create(rows, batch_size=5000)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--images", type=int, default=50)
    parser.add_argument("--packages", type=int, default=2_000)
    parser.add_argument("--runs", type=int, default=5, help="ingests of the USN, each must meet the target")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""),
                        help="default: $DATABASE_URL, else a temporary SQLite file")
    args = parser.parse_args()

    from bench.boot import boot

    _tmp = boot(args.database_url)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    from advisories.ingest import ingest_documents
    from advisories.models import Advisory, Exposure
    from advisories.osmatch import recompute_os
    from advisories.sources import resolve
    from inventory.models import Node
    from inventory.packages import OsState, apply_os_report, parse_os_report

    setup_test_environment(debug=False)
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    ok = True
    try:
        started = time.perf_counter()
        build(args.nodes, args.images, args.packages)
        print(f"{connection.vendor}: {args.nodes} nodes, {args.images} package sets of {args.packages} packages "
              f"built in {time.perf_counter() - started:.1f} s")
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")
        times = []
        for run in range(args.runs):
            if run:  # the last run's advisory and exposures gone: the next ingest is a first one again
                Exposure.objects.filter(advisory__publisher_id="USN-7328-2").delete()
                Advisory.objects.filter(publisher_id="USN-7328-2").delete()
            started = time.perf_counter()
            summary = ingest_documents(resolve(str(USN)).items())
            times.append(time.perf_counter() - started)
            ok &= summary.new == 1
        opened = Exposure.objects.filter(state="open").count()
        worst = max(times)
        ok &= worst <= INGEST_TARGET_S
        print(f"ingest USN-7328-2 with exposures, {args.runs} runs: {', '.join(f'{t:.2f}' for t in times)} s, "
              f"{opened} open (target <= {INGEST_TARGET_S} s every run): "
              f"{'PASS' if worst <= INGEST_TARGET_S else 'FAIL'}")
        started = time.perf_counter()
        recompute_os()
        full_s = time.perf_counter() - started
        ok &= full_s <= FULL_TARGET_S
        print(f"full OS rematch: {full_s:.2f} s (target <= {FULL_TARGET_S} s): "
              f"{'PASS' if full_s <= FULL_TARGET_S else 'FAIL'}")
        node = Node.objects.select_related("package_set").first()
        assert node is not None and node.package_set is not None
        report = parse_os_report({"os": {"release": JAMMY, "packages": image_packages(0, args.packages),
                                         "running_kernel": node.running_kernel}})
        # What the heartbeat's lock of the node row read (inventory.queries.LOCK_NODE) is all it compares with.
        current = OsState.of(node.package_set.digest, node.running_kernel, node.livepatch)
        with CaptureQueriesContext(connection) as queries:
            apply_os_report(node.id, report, current=current)
        ok &= not queries
        print(f"unchanged package set in a full heartbeat: {len(queries)} statement(s) beyond the node row's lock "
              f"(a short heartbeat, the digest path, reads no package at all): {'PASS' if not queries else 'FAIL'}")
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
