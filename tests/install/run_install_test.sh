#!/usr/bin/env bash
# run_install_test.sh BUILD_DIR CONSUMER_DIR: installs the build into a
# temporary prefix, builds the consumer project with find_package(ddprun),
# and runs it as 1 rank and as 2 ranks under the installed ddprun.
set -euo pipefail
build=$1 consumer=$2
tmp=$(mktemp -d /tmp/ddprun_install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
cmake -S "$consumer" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" > "$tmp/configure.log" \
  || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/build" > "$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; exit 1; }
out=$("$tmp/build/consumer")
echo "$out"
[ "$out" = "rank 0 of 1: 1 2" ]
out=$("$tmp/prefix/bin/ddprun" --nproc-per-node=2 --no-python "$tmp/build/consumer" 2>/dev/null | sort)
echo "$out"
[ "$out" = "$(printf 'rank 0 of 2: 3 4\nrank 1 of 2: 3 4')" ]
echo "OK: installed ddprun::runtime links into a separate project and runs"
