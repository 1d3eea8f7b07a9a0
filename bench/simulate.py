"""Strategy simulator benchmark: the Alibaba GPU fleet and its trace, every strategy, two cadences each.

    .venv/bin/python bench/simulate.py [--release-day 100] [--severity high] [--data ../shared/data/...]

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
    args = parser.parse_args()
    nodes_file = args.data / "openb_node_list_gpu_node.csv"
    pods_file = args.data / "openb_pod_list_default.csv"
    if not nodes_file.exists() or not pods_file.exists():
        print(f"missing {nodes_file} or {pods_file}: the shared data folder sits beside the checkout", file=sys.stderr)
        return 2
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpusweep.settings")
    os.environ.setdefault("GPUSWEEP_VAR_DIR", tempfile.mkdtemp(prefix="gpusweep-bench-simulate-"))
    import django

    django.setup()
    from costs import fleet, report
    from costs.inputs import deadline_days, params_from, read_trace
    from costs.simulate import simulate

    began = time.perf_counter()
    nodes = fleet.from_file(nodes_file)
    loaded_fleet = time.perf_counter()
    params = params_from({}, severity=args.severity, deadline_days=deadline_days(args.severity),
                         release_s=args.release_day * 86400)
    trace = read_trace(pods_file.read_text(encoding="utf-8"), params, source=pods_file.name)
    loaded_trace = time.perf_counter()
    result = simulate(nodes, trace, params)
    finished = time.perf_counter()
    total = finished - began

    print(report.sim_table(result))
    print()
    print(f"parameters: {params.as_dict()}")
    print(f"fleet read: {loaded_fleet - began:.2f} s; trace read: {loaded_trace - loaded_fleet:.2f} s; "
          f"placement and {len(result.rows)} runs: {finished - loaded_trace:.2f} s "
          f"({', '.join(f'{r.strategy} {r.cadence} {r.seconds:.2f} s' for r in result.rows)})")
    print(f"total {total:.2f} s (target <= {TARGET_S:.0f} s): {'met' if total <= TARGET_S else 'MISSED'}")
    return 0 if total <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
