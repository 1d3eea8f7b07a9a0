"""Strategy simulator benchmark: the Alibaba GPU fleet and its trace, every strategy, two cadences each.

    .venv/bin/python bench/simulate.py [--release-day 100] [--severity high] [--data ../shared/data/...]
        [--trace FILE] [--nodes FILE] [--sensitivity] [--parallelism 1%,5%] [--param NAME=VALUE ...]

`--trace` and `--nodes` take any pod/task CSV in the openb format (or sacct -P output) and any node
file; `--sensitivity` also sweeps parallelism, window cadence, checkpointable share and wait limit,
one at a time, and prints the table (costs.sensitivity); `--param` sets any other model parameter
(`--param last_group=cold_restart`).

Reads the 1,213 GPU nodes of `openb_node_list_gpu_node.csv` (through the inventory importer and
its alibaba-openb-2023 mapping) and the 8,152 tasks of `openb_pod_list_default.csv`, places the
trace on the fleet, and replays the maintenance window (monthly, quarterly), rolling drain and wait
and the planner-planned checkpoint-migrate sweep (1% and 5% of the fleet at a time), with the
model's default parameters (printed). Prints the comparison table and the time of each phase;
the target is at most 30 s in all. No database is used (the deadline policy's defaults apply).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TARGET_S = 30.0


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=root.parent / "shared" / "data" / "traces" / "alibaba-openb-2023")
    parser.add_argument("--release-day", type=float, default=100.0,
                        help="release, in days after the trace's start (100: both windows fall inside the trace)")
    parser.add_argument("--severity", default="high")
    parser.add_argument("--trace", type=Path, help="a pod/task CSV (openb format) or sacct -P output")
    parser.add_argument("--nodes", type=Path, help="a node file (what import_nodes reads)")
    parser.add_argument("--parallelism", default="1%,5%", help="nodes at a time, comma separated")
    parser.add_argument("--sensitivity", action="store_true", help="also the one-at-a-time sensitivity table")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="any model parameter (costs.model.Params), e.g. last_group=cold_restart; repeatable")
    args = parser.parse_args()
    nodes_file = args.nodes or args.data / "openb_node_list_gpu_node.csv"
    pods_file = args.trace or args.data / "openb_pod_list_default.csv"
    if not nodes_file.exists() or not pods_file.exists():
        print(f"missing {nodes_file} or {pods_file}: the shared data folder sits beside the checkout", file=sys.stderr)
        return 2
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpusweep.settings")
    os.environ.setdefault("GPUSWEEP_VAR_DIR", tempfile.mkdtemp(prefix="gpusweep-bench-simulate-"))
    import django

    django.setup()
    from costs import fleet, report
    from costs.inputs import deadline_days, is_sacct, params_from, read_trace
    from costs.model import ModelError
    from costs.sensitivity import sensitivity, table
    from costs.simulate import simulate
    from costs.tracestats import trace_stats

    began = time.perf_counter()
    nodes = fleet.from_file(nodes_file)
    loaded_fleet = time.perf_counter()
    given = dict(item.split("=", 1) for item in args.param if "=" in item)
    try:
        params = params_from({"parallelism": args.parallelism, **given}, severity=args.severity,
                             deadline_days=deadline_days(args.severity), release_s=args.release_day * 86400)
    except ModelError as exc:
        print(f"bad parameter: {exc}", file=sys.stderr)
        return 2
    text = pods_file.read_text(encoding="utf-8")
    trace = read_trace(text, params, source=pods_file.name)
    loaded_trace = time.perf_counter()
    result = simulate(nodes, trace, params)
    if not is_sacct(text):
        result.stats = trace_stats(text, (result.release,))
    finished = time.perf_counter()
    total = finished - began

    print(report.sim_table(result))
    print()
    print(f"parameters: {params.as_dict()}")
    print(f"fleet read: {loaded_fleet - began:.2f} s; trace read: {loaded_trace - loaded_fleet:.2f} s; "
          f"placement and {len(result.rows)} runs: {finished - loaded_trace:.2f} s "
          f"({', '.join(f'{r.strategy} {r.cadence} {r.seconds:.2f} s' for r in result.rows)})")
    print(f"total {total:.2f} s (target <= {TARGET_S:.0f} s): {'met' if total <= TARGET_S else 'MISSED'}")
    if args.sensitivity:
        began = time.perf_counter()
        print()
        print(f"sensitivity (one parameter at a time; the others as above; {pods_file.name}):")
        print(table(sensitivity(nodes, trace, params)))
        print(f"sensitivity: {time.perf_counter() - began:.2f} s")
    return 0 if total <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
