#!/usr/bin/env bash
# `make pytest`: the tests that share no outside resource on every core (pytest-xdist); then the
# files of conftest.GROUPS in one process: the LANES (the real Slurm cluster; CRIU, the agents and
# the browser), then the `alone` group (real workers killed mid-campaign, timing bounds).
# The lanes are not run side by side: every test agent finds every Slurm job step on this host
# through /proc's cgroups (one host plays all the nodes), so the agents of the second lane listed
# the Slurm lane's jobs as their own, and the GPU-holder and demo tests failed.
# Usage: pytest-phases.sh BIN WORKERS [ARGS...]
set -uo pipefail
bin=$1 workers=$2
shift 2
codes=()
"$bin/pytest" -n "$workers" --dist loadgroup --resource-groups without --durations=15 "$@"
codes+=($?)
"$bin/pytest" -p no:xdist --resource-groups lanes --durations=0 "$@"
codes+=($?)
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
