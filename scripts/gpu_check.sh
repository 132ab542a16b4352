#!/usr/bin/env bash
# Every GPU check of `train` and its benchmark, on a machine with an NVIDIA GPU:
#   1. build with CUDA (build-gpu/; skipped with --prebuilt DIR: binaries built
#      elsewhere, e.g. carried to a lent GPU machine),
#   2. the CUDA tests: the CUDA layers against the CPU layers, the collective
#      smoke test, `train` on the GPU (CPU/CUDA parity, 2 ranks sharing a GPU,
#      resume after kill -9, checkpoints across devices, fp16 loss scaling),
#   3. the benchmark against PyTorch DDP on the same GPU
#      (scripts/bench/resnet_bench.py --device cuda), figures to --out (default docs/).
#
#   scripts/gpu_check.sh [--prebuilt DIR] [--quick] [--out DIR] [--python PY]
#                        [--skip-bench] [--skip-tests]
# --python: the interpreter with PyTorch (CUDA) for the reference side
# (default: python3). Exit status: 0 when every step passed, 1 otherwise; 2
# for bad flags; 3 when no GPU is visible (nothing was checked).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
prebuilt="" quick="" out="$root/docs" py=python3 bench=1 tests=1
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) prebuilt=$2; shift 2 ;;
    --quick) quick=--quick; shift ;;
    --out) out=$2; shift 2 ;;
    --python) py=$2; shift 2 ;;
    --skip-bench) bench=0; shift ;;
    --skip-tests) tests=0; shift ;;
    -h|--help) sed -n 2,16p "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check.sh: no NVIDIA GPU is visible (nvidia-smi -L failed): nothing to check" >&2
  exit 3
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"

if [ -n "$prebuilt" ]; then
  bin=$(cd "$prebuilt" && pwd)
else
  cmake -S "$root" -B "$root/build-gpu" -DDDPRUN_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
        -DDDPRUN_BUILD_TESTS=ON >/dev/null || exit 1
  cmake --build "$root/build-gpu" -j"$(nproc)" || exit 1
  bin="$root/build-gpu/bin"
fi
export DDPRUN_BIN_DIR="$bin"
status=0
step() {  # step NAME COMMAND...: runs it, reports, remembers a failure
  local name=$1; shift
  echo "=== $name"
  if "$@"; then echo "=== $name: passed"; else echo "=== $name: FAILED"; status=1; fi
}
if [ "$tests" = 1 ]; then
  for t in cuda_train_tests cuda_optim_tests cuda_smoke_test; do
    [ -x "$bin/$t" ] && step "$t" "$bin/$t"
  done
  step train_gpu "$py" "$root/tests/cuda/train_gpu_test.py"
  step collectives_cuda "$py" "$root/tests/runtime/runtime_test.py" CudaMatrix
fi
if [ "$bench" = 1 ]; then
  step resnet_bench "$py" "$root/scripts/bench/resnet_bench.py" --device cuda $quick \
       --out "$out" --python "$py"
fi
exit $status
