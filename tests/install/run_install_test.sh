#!/usr/bin/env bash
# run_install_test.sh BUILD_DIR CONSUMER_DIR [EXAMPLE_DIR]: installs the build
# into a temporary prefix; checks that it has the three programs and no other,
# and exactly the public headers (the list below, as cmake/install.cmake says:
# the runtime's and the store's, the two common headers they include, and
# version.h; none of common's internal helpers), each of which compiles on its
# own against the install; builds the consumer project with find_package(ddprun),
# and runs it as 1 rank and as 2 ranks under the installed ddprun; then builds
# the user-written training loop of examples/cpp the same way and checks that
# its replicas stay identical and its loss falls.
set -euo pipefail
build=$1 consumer=$2 example=${3:-}
tmp=$(mktemp -d /tmp/ddprun_install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"

progs=$(cd "$tmp/prefix/bin" && ls | sort | tr '\n' ' ')
[ "$progs" = "ddprun ddprun-store train " ] || { echo "FAIL: installed programs: $progs"; exit 1; }
headers=$(cd "$tmp/prefix/include" && find . -type f | sed 's|^\./||' | sort)
# The public API (version.h is generated into the build directory: cmake/version.cmake).
public=$(printf 'ddprun/%s\n' version.h common/clock.h common/error.h \
  store/auth.h store/hash_store.h store/prefix_store.h store/reconnect.h store/server_state.h \
  store/store.h store/tcp_store.h store/tcp_store_server.h store/wire.h \
  runtime/collectives.h runtime/cuda.h runtime/process_group.h runtime/reducer.h \
  runtime/sampler.h runtime/types.h | sort)
private=$(comm -23 <(echo "$headers") <(echo "$public"))
[ -z "$private" ] || { echo "FAIL: installed headers outside the public set (internal):"; echo "$private"; exit 1; }
missing=$(comm -13 <(echo "$headers") <(echo "$public"))
[ -z "$missing" ] || { echo "FAIL: public headers not installed:"; echo "$missing"; exit 1; }
# Each installed header includes only installed ones (no internal helper behind a public header).
for h in $headers; do
  for inc in $(sed -n 's|^#include "\(ddprun/[^"]*\)".*|\1|p' "$tmp/prefix/include/$h"); do
    grep -qx "$inc" <<< "$headers" \
      || { echo "FAIL: installed $h includes $inc, which is not installed"; exit 1; }
  done
done
echo "OK: $(wc -l <<< "$headers") public headers installed, none beyond them"

# Each installed header compiles on its own: one translation unit per header,
# built against the installed package (its include path and definitions).
mkdir -p "$tmp/headers"
{
  echo 'cmake_minimum_required(VERSION 3.25)'
  echo 'project(ddprun_headers CXX)'
  echo 'set(CMAKE_CXX_STANDARD 20)'
  echo 'find_package(ddprun REQUIRED)'
  echo 'add_library(headers OBJECT'
  n=0
  while read -r h; do
    n=$((n + 1))
    printf '#include "%s"\n#include "%s"  // twice: the include guard holds\n' "$h" "$h" \
      > "$tmp/headers/h$n.cc"
    echo "  h$n.cc"
  done <<< "$headers"
  echo ')'
  echo 'target_compile_options(headers PRIVATE -Wall -Wextra -Wno-unused-parameter)'
  echo 'target_link_libraries(headers PRIVATE ddprun::runtime)'
} > "$tmp/headers/CMakeLists.txt"
cmake -S "$tmp/headers" -B "$tmp/headers/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  > "$tmp/headers.log" 2>&1 || { cat "$tmp/headers.log"; exit 1; }
cmake --build "$tmp/headers/build" -j2 > "$tmp/headers.log" 2>&1 \
  || { cat "$tmp/headers.log"; echo "FAIL: an installed header does not compile on its own"; exit 1; }
echo "OK: each installed header compiles on its own"
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
