#!/usr/bin/env bash
# `make pytest`: the tests that share no outside resource on every core (pytest-xdist), then the
# files of conftest.GROUPS (a real Slurm cluster, CRIU, the browser, real workers with timing
# bounds) in one process on an otherwise quiet machine. Usage: pytest-phases.sh BIN WORKERS [ARGS...]
set -uo pipefail
bin=$1 workers=$2
shift 2
"$bin/pytest" -n "$workers" --dist loadgroup --resource-groups without --durations=15 "$@"
first=$?
"$bin/pytest" -p no:xdist --resource-groups only --durations=0 "$@"
second=$?
# Exit 5 is "no test collected": fine for one phase when the other ran (ARGS naming one file),
# never for both.
if { [ "$first" -eq 0 ] || [ "$first" -eq 5 ]; } && { [ "$second" -eq 0 ] || [ "$second" -eq 5 ]; } \
   && ! { [ "$first" -eq 5 ] && [ "$second" -eq 5 ]; }; then
  exit 0
fi
[ "$first" -ne 0 ] && [ "$first" -ne 5 ] && exit "$first"
exit "$second"
