#!/usr/bin/env bash
# Installs what ddprun needs to build and run, from Debian's packages.
# Idempotent: when everything is present it only checks and returns.
#   scripts/setup.sh            build/run dependencies
#   scripts/setup.sh --tests    also what only the tests need (PyTorch, clang
#                               fuzzing runtime, iproute2); see setup-test-deps.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

pkgs=(build-essential cmake g++ libboost-dev libboost-filesystem-dev libboost-system-dev
      libopenblas-dev libdnnl-dev zlib1g-dev libjpeg-dev libpng-dev libssl-dev dataset-fashion-mnist
      nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev python3-venv)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: build dependencies present"
fi

if [ "${1:-}" = "--tests" ]; then
  "$here/setup-test-deps.sh"
fi
