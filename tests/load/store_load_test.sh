#!/usr/bin/env bash
# Load test: 1,000 concurrent connections doing ADDs on 16 shared counters
# against ddprun-store. Asserts every counter ends exact, the server survives
# and keeps serving, and its peak RSS stays under a bound.
#
# Bound: 32 MiB. The server reads every socket into one shared 64 KiB buffer
# (it waits for readability first), so an idle connection costs only its
# session (~1 KiB of state and socket); 1,000 of them plus 16 keys and the
# binary (~4 MiB) stay far below. Measured: about 5 MiB.
set -euo pipefail
bin=${DDPRUN_BIN_DIR:?}
rss_limit_kb=$((32 * 1024))
log=$(mktemp)
"$bin/ddprun-store" --port 0 >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 100); do grep -q "listening on" "$log" && break; sleep 0.05; done
port=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$log")
[ -n "$port" ] || { echo "FAILED: server did not start"; cat "$log"; exit 1; }

ulimit -n "$(ulimit -Hn)"
echo "load: 1000 connections x 200 ADDs on 16 counters"
timeout 60 "$bin/store_loadgen" --port "$port" --connections 1000 --ops 200 --keys 16 \
  --op add --verify --json | tee /dev/stderr | grep -q '"verify_mismatches": 0' ||
  { echo "FAILED: counters not exact or loadgen failed"; exit 1; }

kill -0 $server || { echo "FAILED: server died under load"; cat "$log"; exit 1; }
timeout 20 "$bin/store_loadgen" --port "$port" --connections 1 --ops 100 --op mixed >/dev/null ||
  { echo "FAILED: server no longer serves after the load"; exit 1; }
hwm=$(awk '/VmHWM/ {print $2}' /proc/$server/status)
echo "load: server peak RSS ${hwm} kB (limit ${rss_limit_kb} kB)"
[ "$hwm" -lt "$rss_limit_kb" ] || { echo "FAILED: server peak RSS ${hwm} kB over the bound"; exit 1; }
if grep -q "closing connection" "$log"; then
  echo "FAILED: the server closed connections of well-behaved clients:"; cat "$log"; exit 1
fi
echo "load: passed"
