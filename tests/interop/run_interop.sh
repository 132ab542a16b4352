#!/usr/bin/env bash
# run_interop.sh torch1|torch2 SCRIPT: runs an interop test with Debian's
# PyTorch 1.13 or the PyTorch 2.x venv; exits 77 (ctest: skipped) when that
# interpreter has no PyTorch.
set -u
which=$1; shift
case $which in
  torch1) py=/usr/bin/python3 ;;
  torch2) py=${DDPRUN_TORCH2_VENV:-/opt/ddprun-test/venv-torch2}/bin/python ;;
  *) echo "unknown interpreter $which"; exit 2 ;;
esac
if ! "$py" -c "import torch.distributed" 2>/dev/null; then
  echo "SKIPPED: PyTorch not installed for $which at $py (run scripts/setup-test-deps.sh)"
  exit 77
fi
cd "$(dirname "$0")"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# The bound: ctest's TIMEOUT of the test, passed as DDPRUN_INTEROP_TIMEOUT where it is not 300.
exec timeout "${DDPRUN_INTEROP_TIMEOUT:-300}" "$py" "$@"
