#!/usr/bin/env bash
# The main job on a fresh machine: installs the build dependencies and
# Fashion-MNIST (Debian packages), builds and installs ddprun into a virtual
# environment the way a user installs it (pip install of this tree: the wheel's
# ddprun, ddprun-store and train, its Python package), then trains LeNet on 4
# workers with the bundled trainer:
#     ddprun --nproc_per_node=4 train
# One build: the wheel's CMake build stays in build-wheel/, so `pip install .
# -C build-dir=build-wheel` into another environment (README, Install) and the
# next run of this script only relink. With a GPU visible and nvcc installed it
# installs the CUDA variant (-C ddprun.cuda=true, which pulls NVIDIA's CUDA
# packages from PyPI). Extra arguments go to train (e.g. scripts/demo.sh
# --epochs 3 --model lenet-bn).
#   DDPRUN_VENV        the environment (default: .venv)
#   DDPRUN_NPROC       workers (default: 4)
#   DDPRUN_DEMO_CUDA   1: the CUDA variant, 0: the CPU one (default: auto)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv=${DDPRUN_VENV:-$root/.venv}

scripts/setup.sh
cuda=${DDPRUN_DEMO_CUDA:-auto}
if [ "$cuda" = auto ]; then
  cuda=0
  if nvidia-smi -L >/dev/null 2>&1 && { command -v nvcc || [ -x /usr/local/cuda/bin/nvcc ]; } >/dev/null; then
    cuda=1
  fi
fi
flags=(--config-settings=build-dir="$root/build-wheel")
if [ "$cuda" = 1 ]; then
  flags+=(--config-settings=ddprun.cuda=true)
  command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
fi
# No other setting: the README's `pip install . -C build-dir=build-wheel` must
# find the very same configuration to reuse the objects.

[ -x "$venv/bin/pip" ] || /usr/bin/python3 -m venv "$venv"
mkdir -p "$root/build-wheel"
log="$root/build-wheel/pip-install.log"
echo "demo: building and installing ddprun$([ "$cuda" = 1 ] && echo ' (CUDA variant)') into $venv" \
     "(a first build takes about 2 minutes on 2 idle cores; full log: $log)" >&2
# pip -v prints CMake's output; only the build's progress lines reach the screen.
"$venv/bin/pip" install -v --disable-pip-version-check "$root" "${flags[@]}" > "$log" 2>&1 < /dev/null &
pip_pid=$!
tail -n +1 -f "$log" --pid "$pip_pid" 2>/dev/null \
  | grep --line-buffered -E '^ *\[ *[0-9]+(/[0-9]+\]|%\])' | sed -u 's/^ */  /' >&2 || true
if ! wait "$pip_pid"; then
  tail -n 40 "$log" >&2
  echo "demo: pip install failed (full log: $log)" >&2
  exit 1
fi
echo "demo: installed $("$venv/bin/ddprun" --version 2>&1 | head -1)" >&2
export PATH="$venv/bin:$PATH"
echo "+ ddprun --nproc_per_node=${DDPRUN_NPROC:-4} train $*" >&2
exec ddprun --nproc_per_node="${DDPRUN_NPROC:-4}" train "$@"
