#!/usr/bin/env bash
# Builds the store's libFuzzer target with clang and runs it for a bounded time.
#   scripts/fuzz.sh [--seconds N] [--jobs J]
# Runs on a copy of tests/fuzz/corpus (the committed seeds are never written).
# Exits non-zero when the fuzzer finds a crash or an invariant violation; the
# reproducer's path is printed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=60
jobs=1
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    *) echo "usage: scripts/fuzz.sh [--seconds N] [--jobs J]" >&2; exit 2 ;;
  esac
done
cxx=${CXX:-clang++}
out=${DDPRUN_FUZZ_DIR:-$root/build-fuzz}
mkdir -p "$out"
bin=$out/store_fuzz
srcs=("$root"/tests/fuzz/store_fuzz.cc "$root"/src/store/wire.cc "$root"/src/store/server_state.cc
      "$root"/src/store/server_auth.cc "$root"/src/store/server_leases.cc "$root"/src/store/auth.cc
      "$root"/src/common/error.cc "$root"/src/common/strings.cc "$root"/src/common/env.cc
      "$root"/src/common/user_input.cc)
if [ ! -x "$bin" ] || [ -n "$(find "${srcs[@]}" "$root"/include -newer "$bin" 2>/dev/null | head -1)" ]; then
  echo "fuzz: building $bin with $cxx"
  "$cxx" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I"$root/include" "${srcs[@]}" -lcrypto -o "$bin"
fi
run=$(mktemp -d "$out/run.XXXXXX")
cp "$root"/tests/fuzz/corpus/* "$run/"
mkdir -p "$out/crashes"
echo "fuzz: running for ${seconds}s (jobs $jobs), corpus copy in $run"
set +e
"$bin" "$run" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$out/crashes/" \
  $([ "$jobs" -gt 1 ] && echo "-jobs=$jobs -workers=$jobs") 2>"$out/fuzz.log"
rc=$?
set -e
grep -E "^#[0-9]+.*(DONE|pulse)|stat::number_of_executed_units|stat::average_exec_per_sec|cov:" "$out/fuzz.log" | tail -4
if [ $rc -ne 0 ]; then
  echo "fuzz: FAILED (exit $rc); reproducer(s):"
  ls -1 "$out"/crashes/ 2>/dev/null | sed "s|^|  $out/crashes/|"
  tail -40 "$out/fuzz.log"
  exit 1
fi
rm -rf "$run"
echo "fuzz: no crashes in ${seconds}s"
