#!/usr/bin/env bash
# The test command: installs dependencies, builds, runs every test via ctest.
# Exits non-zero on any failure.
#   DDPRUN_BUILD_DIR   build directory (default: build)
#   DDPRUN_CUDA        AUTO|ON|OFF (default ON in CI, AUTO otherwise)
#   extra arguments go to ctest (e.g. -R wire -L unit)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${DDPRUN_BUILD_DIR:-build}
cuda=${DDPRUN_CUDA:-$([ "${CI:-}" = true ] && echo ON || echo AUTO)}

scripts/setup.sh --tests
cmake -S . -B "$build" -DDDPRUN_CUDA="$cuda" -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" -j"$(nproc)"
(cd "$build" && ctest --output-on-failure --timeout 900 "$@")

# Second pass: unit and integration tests under AddressSanitizer + UBSan
# (DDPRUN_SANITIZE_PASS=0 skips it).
if [ "${DDPRUN_SANITIZE_PASS:-1}" = 1 ] && [ $# -eq 0 ]; then
  asan=${build}-asan
  cmake -S . -B "$asan" -DDDPRUN_SANITIZE=ON -DDDPRUN_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug
  cmake --build "$asan" -j"$(nproc)" --target unit_tests train_unit_tests store_integration_tests \
    launcher_integration_tests rendezvous_integration_tests static_liveness_tests \
    ddprun-store ddprun coll_check
  # The collective matrix runs trimmed here (3 dtypes, sizes up to 4097); the
  # trainer's end-to-end runs (full epochs of a Debug build) only in the first pass.
  (cd "$asan" && DDPRUN_RUNTIME_TEST_QUICK=1 ctest --output-on-failure --timeout 900 \
     -L 'unit|integration' -E '^train_e2e$')
fi
