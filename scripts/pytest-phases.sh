#!/usr/bin/env bash
# `make pytest`: the tests that share no outside resource on every core (pytest-xdist); then the
# files of conftest.GROUPS: the LANES side by side, one process each (real Slurm clusters, CRIU,
# the agents, the browser), with nothing else beside them; then the `alone` group (real workers
# killed mid-campaign, timing bounds) in one process.
# The lanes share no port, folder or test database (each lane's is test_<name>_<lane>), and an
# agent lists only the Slurm steps whose cgroup names its own node (conftest.py, GROUPS). Each
# lane's output is printed whole once all have ended.
# Usage: pytest-phases.sh BIN WORKERS [ARGS...]
set -uo pipefail
bin=$1 workers=$2
shift 2
if [ "$workers" = auto ]; then
  # One and a half per core (at least 2): the phase's tests wait on subprocesses, live servers and
  # sockets more than they compute; on 2 cores 3 workers took it from 353 s to 200 s (bench/README.md).
  cores=$(nproc)
  workers=$(( cores * 3 / 2 ))
  [ "$workers" -lt 2 ] && workers=2
fi
codes=()
"$bin/pytest" -n "$workers" --dist loadgroup --resource-groups without --durations=15 "$@"
codes+=($?)
logs=$(mktemp -d)
pids=()
lanes=(slurm slurm-executor demo agents-browser)  # conftest.LANES
for lane in "${lanes[@]}"; do
  "$bin/pytest" -p no:xdist --resource-groups "$lane" --durations=0 "$@" >"$logs/$lane.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do
  wait "$pid"
  codes+=($?)
done
for lane in "${lanes[@]}"; do
  echo "===== lane $lane"
  cat "$logs/$lane.log"
done
rm -rf "$logs"
"$bin/pytest" -p no:xdist --resource-groups alone --durations=0 "$@"
codes+=($?)
# Exit 5 is "no test collected": fine for a phase when another ran (ARGS naming one file), never
# for all of them.
ran=0
for code in "${codes[@]}"; do
  if [ "$code" -ne 0 ] && [ "$code" -ne 5 ]; then exit "$code"; fi
  [ "$code" -eq 0 ] && ran=1
done
[ "$ran" -eq 1 ] && exit 0
exit 5
