#!/usr/bin/env bash
# run_deb_test.sh BUILD_DIR VERSION: builds the Debian package with CPack from
# the (built) BUILD_DIR and checks it: name and version, a Depends line computed
# by dpkg-shlibdeps that names the libraries' Debian packages, no bundled
# libraries, the three programs and only the public headers. Then it unpacks
# the package into a temporary root (no dpkg -i) and runs the unpacked ddprun:
# a two-worker --no-python job, and a two-worker `train` job (the bare name is
# found beside ddprun, so the unpacked train runs), and `train --help`.
# Exits 77 (skipped) when cpack or dpkg-deb is missing.
set -euo pipefail
build=$1 version=$2
for tool in cpack dpkg-deb; do
  if ! command -v "$tool" > /dev/null; then
    echo "SKIPPED: $tool is not installed, so the Debian package cannot be built or inspected"
    exit 77
  fi
done
tmp=$(mktemp -d /tmp/ddprun_deb.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

(cd "$tmp" && cpack -G DEB --config "$build/CPackConfig.cmake" -B "$tmp/out") > "$tmp/cpack.log" 2>&1 \
  || { cat "$tmp/cpack.log"; fail "cpack -G DEB failed"; }
debs=("$tmp"/out/ddprun_*.deb)
[ ${#debs[@]} = 1 ] && [ -f "${debs[0]}" ] || fail "expected one ddprun_*.deb, found: ${debs[*]}"
deb=${debs[0]}
echo "package: $(basename "$deb"), $(stat -c %s "$deb") bytes"

info=$(dpkg-deb --info "$deb")
echo "$info"
[ "$(dpkg-deb --field "$deb" Package)" = ddprun ] || fail "package name is not ddprun"
[ "$(dpkg-deb --field "$deb" Version)" = "$version" ] || fail "version is not $version"
[ -n "$(dpkg-deb --field "$deb" Maintainer)" ] || fail "no Maintainer"
[ -n "$(dpkg-deb --field "$deb" Description)" ] || fail "no Description"
depends=$(dpkg-deb --field "$deb" Depends)
# dpkg-shlibdeps names the packages of the libraries the programs link.
for pkg in libc6 libstdc++6 libdnnl libopenblas libssl3 zlib1g libgomp1; do
  grep -q "\b$pkg" <<< "$depends" || fail "Depends does not name $pkg: $depends"
done

contents=$(dpkg-deb -c "$deb" | awk '{print $NF}' | sed 's|^\./||')
for prog in ddprun ddprun-store train; do
  grep -qx "usr/bin/$prog" <<< "$contents" || fail "usr/bin/$prog is not in the package"
done
extra=$(grep '^usr/bin/.' <<< "$contents" | grep -vx -e usr/bin/ddprun -e usr/bin/ddprun-store \
        -e usr/bin/train || true)
[ -z "$extra" ] || fail "programs beyond ddprun, ddprun-store, train: $extra"
# ddprun's own CUDA plugins (a CUDA build) are its code, not bundled libraries.
plugins=(usr/lib/ddprun/libddprun_runtime_cuda.so usr/lib/ddprun/libddprun_train_cuda.so)
bundled=$(grep -E '\.so(\.|$)' <<< "$contents" | grep -vx -e "${plugins[0]}" -e "${plugins[1]}" || true)
[ -z "$bundled" ] || fail "the package bundles shared libraries (Depends should provide them): $bundled"
cuda_build=0
[ -f "$build/lib/ddprun/libddprun_runtime_cuda.so" ] && cuda_build=1
for p in "${plugins[@]}"; do
  if [ "$cuda_build" = 1 ]; then
    grep -qx "$p" <<< "$contents" || fail "a CUDA build's package lacks $p"
  else
    grep -qx "$p" <<< "$contents" && fail "a CPU build's package has $p"
  fi
done
private=$(grep '^usr/include/.*\.h' <<< "$contents" \
          | grep -vE '^usr/include/ddprun/(version|common/(clock|error)|store/(auth|hash_store|prefix_store|reconnect|server_state|store|tcp_store|tcp_store_server|wire)|runtime/(collectives|cuda|process_group|reducer|sampler|types))\.h$' \
          || true)  # the public API only (cmake/install.cmake)
[ -z "$private" ] || fail "headers outside the public set: $private"
grep -q '^usr/include/ddprun/runtime/cuda_check\.h$' <<< "$contents" \
  && fail "runtime/cuda_check.h (internal) is in the package"
grep -q '^usr/include/ddprun/runtime/process_group\.h$' <<< "$contents" \
  || fail "the public header runtime/process_group.h is missing"
grep -q '^usr/lib/.*cmake/ddprun/ddprunConfig\.cmake$' <<< "$contents" \
  || fail "the CMake package config is missing"

root=$tmp/root
dpkg-deb -x "$deb" "$root"
bin=$root/usr/bin
out=$(cd "$tmp" && "$bin/ddprun" --nproc-per-node=2 --no-python sh -c 'echo "worker $RANK of $WORLD_SIZE"' \
      2>"$tmp/job.err" | sort) || { cat "$tmp/job.err"; fail "the --no-python job failed"; }
echo "$out"
[ "$out" = "$(printf 'worker 0 of 2\nworker 1 of 2')" ] || fail "unexpected worker output"
"$bin/train" --help | grep -q "Usage: train" || fail "train --help"
(cd "$tmp" && "$bin/ddprun" --nproc-per-node=2 train --model mlp --data synthetic --device cpu \
   --max-steps 5 --train-samples 640 --test-samples 128 --quiet) > "$tmp/train.out" 2> "$tmp/train.err" \
  || { cat "$tmp/train.out" "$tmp/train.err"; fail "the two-worker train job failed"; }
tail -1 "$tmp/train.out"
tail -1 "$tmp/train.out" | python3 -c 'import json, sys; assert json.loads(sys.stdin.read())["world"] == 2' \
  || fail "train did not end with its JSON summary of a two-rank run"
# The unpacked train finds its CUDA plugins beside it (usr/lib/ddprun), or
# says it has none; either way --device cuda without a GPU is exit 2.
set +e
"$bin/train" --device cuda > "$tmp/cuda.out" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || { cat "$tmp/cuda.out"; fail "train --device cuda exited $rc, not 2"; }
if [ "$cuda_build" = 1 ]; then
  grep -q "no CUDA GPU is visible" "$tmp/cuda.out" || { cat "$tmp/cuda.out"; fail "train did not load its CUDA plugins"; }
else
  grep -q "CPU-only ddprun" "$tmp/cuda.out" || { cat "$tmp/cuda.out"; fail "train --device cuda did not say it is CPU-only"; }
fi
echo "OK: the Debian package has the programs and public headers, computed Depends, and runs unpacked"
