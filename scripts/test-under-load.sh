#!/usr/bin/env bash
# Runs the tests while a CPU hog loads every core, N times in a row, and stops
# at the first failure: the habit that keeps the suite independent of speed,
# load and scheduling order (a test that passes only on a quiet machine is a
# defect). Run it before you stop; CI machines differ from yours by 3x.
#   scripts/test-under-load.sh [-n RUNS] [-- ctest args]
#     -n RUNS   how many runs in a row (default 3)
#     ctest args after --, e.g. -- -L integration (then scripts/test.sh's
#     sanitizer pass is skipped, as it is for any ctest arguments)
#   DDPRUN_LOAD_WORKERS  hog processes (default: nproc)
# Exit: 0 every run passed, else the failing run's exit status.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=3
while [ $# -gt 0 ]; do
  case $1 in
    -n) runs=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "usage: $0 [-n RUNS] [-- ctest args]" >&2; exit 2 ;;
  esac
done
workers=${DDPRUN_LOAD_WORKERS:-$(nproc)}
if ! command -v stress-ng >/dev/null; then
  echo "test-under-load: stress-ng not found (scripts/setup.sh --tests installs it)" >&2
  exit 2
fi
stress-ng --cpu "$workers" --timeout 6h --quiet &
hog=$!
trap 'kill "$hog" 2>/dev/null; wait "$hog" 2>/dev/null || true' EXIT
echo "test-under-load: stress-ng --cpu $workers (pid $hog) on $(nproc) cores;" \
     "$(lscpu | sed -n 's/^Model name: *//p' | head -1)"
for i in $(seq 1 "$runs"); do
  echo "test-under-load: run $i of $runs"
  start=$(date +%s)
  rc=0
  bash "$root/scripts/test.sh" "$@" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "test-under-load: run $i of $runs FAILED (exit $rc)" >&2
    exit "$rc"
  fi
  echo "test-under-load: run $i of $runs passed in $(( $(date +%s) - start )) s"
done
echo "test-under-load: $runs of $runs runs passed under load"
