#!/usr/bin/env bash
# Builds a libFuzzer target with clang and runs it for a bounded time.
#   scripts/fuzz.sh [--target store|cifar|image] [--seconds N] [--jobs J]
# store (the default): the store's request parser and server state machine,
# seeds in tests/fuzz/corpus; cifar: the CIFAR batch readers and the pickle
# reader (tests/fuzz/cifar_fuzz.cc), seeds in tests/fuzz/cifar_corpus.
# image: the JPEG and PNG decoders (tests/fuzz/image_fuzz.cc), seeds in
# tests/fuzz/image_corpus (tests/fuzz/make_image_corpus.py writes them).
# Runs on a copy of the seeds (the committed ones are never written).
# Exits non-zero when the fuzzer finds a crash or an invariant violation; the
# reproducer's path is printed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=60
jobs=1
target=store
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    *) echo "usage: scripts/fuzz.sh [--target store|cifar|image] [--seconds N] [--jobs J]" >&2; exit 2 ;;
  esac
done
cxx=${CXX:-clang++}
out=${DDPRUN_FUZZ_DIR:-$root/build-fuzz}
mkdir -p "$out"
case $target in
  store)
    bin=$out/store_fuzz
    corpus=$root/tests/fuzz/corpus
    crashes=$out/crashes
    log=$out/fuzz.log
    maxlen=4096
    libs=(-lcrypto)
    srcs=("$root"/tests/fuzz/store_fuzz.cc "$root"/src/store/wire.cc "$root"/src/store/server_state.cc
          "$root"/src/store/server_auth.cc "$root"/src/store/server_leases.cc "$root"/src/store/auth.cc
          "$root"/src/common/error.cc "$root"/src/common/strings.cc "$root"/src/common/env.cc
          "$root"/src/common/user_input.cc) ;;
  cifar)
    bin=$out/cifar_fuzz
    corpus=$root/tests/fuzz/cifar_corpus
    crashes=$out/crashes-cifar
    log=$out/cifar-fuzz.log
    maxlen=16384  # the seeds hold two 3072-byte images
    libs=()
    srcs=("$root"/tests/fuzz/cifar_fuzz.cc "$root"/src/train/cifar.cc
          "$root"/src/train/pickle_reader.cc "$root"/src/common/error.cc
          "$root"/src/common/strings.cc "$root"/src/common/user_input.cc) ;;
  image)
    bin=$out/image_fuzz
    corpus=$root/tests/fuzz/image_corpus
    crashes=$out/crashes-image
    log=$out/image-fuzz.log
    maxlen=65536
    libs=(-ljpeg -lpng)
    srcs=("$root"/tests/fuzz/image_fuzz.cc "$root"/src/train/image_decode.cc
          "$root"/src/common/error.cc) ;;
  *) echo "fuzz: unknown --target '$target' (store | cifar | image)" >&2; exit 2 ;;
esac
if [ ! -x "$bin" ] || [ -n "$(find "${srcs[@]}" "$root"/include -newer "$bin" 2>/dev/null | head -1)" ]; then
  echo "fuzz: building $bin with $cxx"
  "$cxx" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I"$root/include" "${srcs[@]}" "${libs[@]}" -o "$bin"
fi
run=$(mktemp -d "$out/run.XXXXXX")
cp "$corpus"/* "$run/"
mkdir -p "$crashes"
echo "fuzz: running $target for ${seconds}s (jobs $jobs), corpus copy in $run"
set +e
"$bin" "$run" -max_total_time="$seconds" -max_len="$maxlen" -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$crashes/" \
  $([ "$jobs" -gt 1 ] && echo "-jobs=$jobs -workers=$jobs") 2>"$log"
rc=$?
set -e
grep -E "^#[0-9]+.*(DONE|pulse)|stat::number_of_executed_units|stat::average_exec_per_sec|cov:" "$log" | tail -4
if [ $rc -ne 0 ]; then
  echo "fuzz: FAILED (exit $rc); reproducer(s):"
  ls -1 "$crashes"/ 2>/dev/null | sed "s|^|  $crashes/|"
  tail -40 "$log"
  exit 1
fi
rm -rf "$run"
echo "fuzz: no crashes in ${seconds}s ($target)"
