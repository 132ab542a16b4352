#!/usr/bin/env bash
# run_install_test.sh BUILD_DIR CONSUMER_DIR [EXAMPLE_DIR]: installs the build
# into a temporary prefix, builds the consumer project with find_package(ddprun),
# and runs it as 1 rank and as 2 ranks under the installed ddprun; then builds
# the user-written training loop of examples/cpp the same way and checks that
# its replicas stay identical and its loss falls.
set -euo pipefail
build=$1 consumer=$2 example=${3:-}
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

[ -n "$example" ] || exit 0
cmake -S "$example" -B "$tmp/example" -DCMAKE_PREFIX_PATH="$tmp/prefix" > "$tmp/configure2.log" \
  || { cat "$tmp/configure2.log"; exit 1; }
cmake --build "$tmp/example" > "$tmp/build2.log" 2>&1 || { cat "$tmp/build2.log"; exit 1; }
out=$("$tmp/prefix/bin/ddprun" --nproc-per-node=2 --no-python "$tmp/example/my_trainer" 3 2>/dev/null | sort)
echo "$out"
python3 - "$out" <<'PY'
import re, sys
ranks = re.findall(r"rank (\d) of 2: first_loss ([0-9.]+) loss ([0-9.]+) checksum (-?[0-9.]+)", sys.argv[1])
assert len(ranks) == 2, ranks
assert ranks[0][1:] == ranks[1][1:], "replicas diverged: %s" % (ranks,)
assert float(ranks[0][2]) < 0.5 * float(ranks[0][1]), "loss did not fall: %s" % (ranks,)
PY
echo "OK: examples/cpp (reducer + sampler in a user's own loop) builds against the install and trains"
