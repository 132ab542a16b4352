#!/usr/bin/env bash
# Installs what only the tests need; ddprun itself builds and runs without it.
#  - Debian's python3-torch (PyTorch 1.13) for wire-dialect interop tests
#  - PyTorch 2.x from PyPI in a virtual environment ($DDPRUN_TORCH2_VENV,
#    default /opt/ddprun-test/venv-torch2); skipped with DDPRUN_SKIP_TORCH2=1;
#    matplotlib in it too, for the real plots of `python -m ddprun.plot`
#  - clang's runtime (libFuzzer, sanitizers), iproute2, and stress-ng for
#    scripts/test-under-load.sh
#  - Slurm and MUNGE for tests/pyutil/slurm_cluster.py (its own daemons)
# Idempotent and quick when everything is present.
set -euo pipefail

TORCH2_VERSION=${DDPRUN_TORCH2_VERSION:-2.15.0}
VENV=${DDPRUN_TORCH2_VENV:-/opt/ddprun-test/venv-torch2}
TORCHVISION_VERSION=${DDPRUN_TORCHVISION_VERSION:-0.29.2}  # the release for PyTorch 2.15
pkgs=(python3 python3-venv python3-torch python3-numpy clang libclang-rt-14-dev iproute2
      stress-ng slurmctld slurmd slurm-client munge)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup-test-deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "${DDPRUN_SKIP_TORCH2:-0}" != 1 ]; then
  if [ -x "$VENV/bin/python" ] &&
     "$VENV/bin/python" -c "import torch,prometheus_client,sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH2_VERSION')" 2>/dev/null; then
    echo "setup-test-deps: PyTorch $TORCH2_VERSION present in $VENV"
  else
    echo "setup-test-deps: installing PyTorch $TORCH2_VERSION into $VENV (PyPI, a few minutes)"
    mkdir -p "$(dirname "$VENV")"
    /usr/bin/python3 -m venv "$VENV"
    if ! "$VENV/bin/pip" install -q --disable-pip-version-check "torch==$TORCH2_VERSION" numpy prometheus_client; then
      echo "setup-test-deps: WARNING: PyTorch $TORCH2_VERSION could not be installed;" \
           "the PyTorch 2.x interop tests will report themselves skipped" >&2
      rm -rf "$VENV"
    fi
  fi
  # torchvision (with Pillow) for the checks of train's data readers and
  # transforms against torchvision's; its version goes with PyTorch's.
  if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -c "import torchvision, PIL" 2>/dev/null; then
    echo "setup-test-deps: installing torchvision $TORCHVISION_VERSION into $VENV (PyPI)"
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps \
        "torchvision==$TORCHVISION_VERSION" &&
      "$VENV/bin/pip" install -q --disable-pip-version-check pillow ||
      echo "setup-test-deps: WARNING: torchvision could not be installed; the transform," \
           "CIFAR and image folder checks against it will report themselves skipped" >&2
  fi
  if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -c "import matplotlib" 2>/dev/null; then
    echo "setup-test-deps: installing matplotlib into $VENV (PyPI)"
    "$VENV/bin/pip" install -q --disable-pip-version-check matplotlib ||
      echo "setup-test-deps: WARNING: matplotlib could not be installed;" \
           "python_package's real plot will report itself skipped" >&2
  fi
fi
