#!/usr/bin/env bash
# The main job on a fresh machine: installs the build dependencies and
# Fashion-MNIST (Debian packages), builds ddprun in Release, then trains LeNet
# on 4 workers with the bundled trainer:
#     ddprun --nproc_per_node=4 train
# Extra arguments go to train (e.g. scripts/demo.sh --epochs 3 --model lenet-bn).
#   DDPRUN_BUILD_DIR   build directory (default: build-release)
#   DDPRUN_NPROC       workers (default: 4)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${DDPRUN_BUILD_DIR:-build-release}

scripts/setup.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDDPRUN_BUILD_TESTS=OFF > "$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
rm -f "$build.configure.log"
cmake --build "$build" -j"$(nproc)" --target ddprun train
export PATH="$root/$build/bin:$PATH"
echo "+ ddprun --nproc_per_node=${DDPRUN_NPROC:-4} train $*" >&2
exec ddprun --nproc_per_node="${DDPRUN_NPROC:-4}" train "$@"
