#!/usr/bin/env bash
# The test command: installs dependencies, builds, runs every test via ctest.
# Exits non-zero on any failure. Prints where the time went when it ends
# (setup, build, first pass, sanitizer build, sanitizer pass), pass or fail.
#   DDPRUN_BUILD_DIR   build directory (default: build)
#   DDPRUN_CUDA        AUTO|ON|OFF (default ON in CI, AUTO otherwise)
#   CUDAARCHS          CUDA architectures to compile for (CMake's variable;
#                      default 90 in CI, where no GPU runs them: one
#                      architecture instead of two halves the CUDA compile;
#                      80 90 otherwise)
#   extra arguments go to ctest (e.g. -R wire -L unit)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${DDPRUN_BUILD_DIR:-build}
cuda=${DDPRUN_CUDA:-$([ "${CI:-}" = true ] && echo ON || echo AUTO)}
if [ "${CI:-}" = true ] && [ -z "${CUDAARCHS:-}" ]; then export CUDAARCHS=90; fi

# Phase timing: "name seconds" lines, printed by the EXIT trap.
phases=()
phase_start=$(date +%s)
run_start=$phase_start
phase_end() {
  local now; now=$(date +%s)
  phases+=("$1 $((now - phase_start))")
  phase_start=$now
}
report() {
  local rc=$? line
  echo "test.sh: time split ($(nproc) cores, $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)):"
  for line in "${phases[@]}"; do
    printf '  %-18s %5d s\n' "${line% *}" "${line##* }"
  done
  printf '  %-18s %5d s (exit %d)\n' total "$(( $(date +%s) - run_start ))" "$rc"
}
trap report EXIT

scripts/setup.sh --tests
phase_end setup
cmake -S . -B "$build" -DDDPRUN_CUDA="$cuda" -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" -j"$(nproc)"
phase_end build
(cd "$build" && ctest --output-on-failure --timeout 900 "$@")
phase_end "first pass"

# Second pass: unit and integration tests under AddressSanitizer + UBSan
# (DDPRUN_SANITIZE_PASS=0 skips it).
if [ "${DDPRUN_SANITIZE_PASS:-1}" = 1 ] && [ $# -eq 0 ]; then
  asan=${build}-asan
  cmake -S . -B "$asan" -DDDPRUN_SANITIZE=ON -DDDPRUN_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug
  cmake --build "$asan" -j"$(nproc)" --target unit_tests train_unit_tests store_integration_tests \
    launcher_integration_tests rendezvous_integration_tests static_liveness_tests \
    ddprun-store ddprun coll_check
  phase_end "sanitizer build"
  # The collective matrix runs trimmed here (3 dtypes, sizes up to 4097); the
  # trainer's end-to-end runs (full epochs of a Debug build) only in the first pass.
  (cd "$asan" && DDPRUN_RUNTIME_TEST_QUICK=1 ctest --output-on-failure --timeout 900 \
     -L 'unit|integration' -E '^train_e2e$')
  phase_end "sanitizer pass"
fi
