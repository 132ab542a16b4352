#!/usr/bin/env bash
# Shows that the ResNet replay (tests/interop/test_resnet_parity.py) fails on a
# wrong gradient in `train` itself, not only on the faked ones its self-test
# uses: builds `train` in a scratch worktree with
# tests/interop/faults/train_gradient_faults.patch applied (the fault is picked
# at run time by SCRATCH_FAULT), then runs both stems' replays with no fault
# (must pass) and with each fault (must fail). Exits 0 when that holds.
#   scripts/replay_fault_check.sh [torch1|torch2]     (default torch1)
# About 5 minutes on 2 cores (most of it the scratch build).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
which=${1:-torch1}
scratch=$(mktemp -d /tmp/ddprun-fault-XXXXXX)
cleanup() { git -C "$root" worktree remove --force "$scratch/src" >/dev/null 2>&1 || true
            rm -rf "$scratch"; }
trap cleanup EXIT
git -C "$root" worktree add --detach "$scratch/src" HEAD >/dev/null
git -C "$scratch/src" apply "$root/tests/interop/faults/train_gradient_faults.patch"
cmake -S "$scratch/src" -B "$scratch/build" -DDDPRUN_CUDA=OFF -DDDPRUN_BUILD_TESTS=OFF \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$scratch/build" -j"$(nproc)" --target train >/dev/null
status=0
for fault in none bn_drop_mean bn_k2_1pct conv_dx_1pct conv_dw_window; do
  log="$scratch/$fault.log"
  if SCRATCH_FAULT=$fault DDPRUN_BIN_DIR="$scratch/build/bin" \
       "$root/tests/interop/run_interop.sh" "$which" test_resnet_parity.py \
       ResNetParity.test_cifar_stem_replay ResNetParity.test_imagenet_stem_replay >"$log" 2>&1
  then result=passed; else result=failed; fi
  first=$(grep -m1 '^AssertionError' "$log" | cut -c1-160 || true)
  echo "replay_fault_check: $fault: $result ${first:+($first)}"
  if [ "$fault" = none ] && [ $result != passed ]; then status=1; cat "$log"; fi
  if [ "$fault" != none ] && [ $result != failed ]; then status=1; fi
done
exit $status
