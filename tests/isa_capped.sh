#!/usr/bin/env bash
# isa_capped.sh COMMAND [ARG...]: runs COMMAND with the CPU math libraries held
# to an older instruction set than this machine has, so that one kind of CI
# machine exercises the kernels another kind runs (issue 39: an AMD EPYC, AVX2
# only, took oneDNN and OpenBLAS paths an AVX-512 Xeon never did, and a test
# that passed on every Xeon failed on every EPYC).
#   AVX-512 machine: oneDNN and PyTorch's oneDNN at AVX2, OpenBLAS's Haswell
#     kernels, PyTorch's ATen at avx2, MKL at AVX2 (an EPYC's paths).
#   AVX2-only machine: one step further down, AVX without FMA (oneDNN AVX,
#     OpenBLAS Sandybridge, ATen default, MKL AVX). An AVX2 machine cannot run
#     the AVX-512 kernels a Xeon takes, so "the reverse" is not to be had;
#     this is a second code path next to its own.
#   DDPRUN_ISA_CAP=AVX2|AVX forces a level (to try the other one here).
# OPENBLAS_CORETYPE is left alone where the machine already sets it (some
# machines set it because their OpenBLAS misbehaves without it). Exits 77
# (ctest: skipped) on a machine without AVX2, where there is nothing to cap.
set -u
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { [[ " $flags " == *" $1 "* ]]; }
level=${DDPRUN_ISA_CAP:-}
if [ -z "$level" ]; then
  if has avx512f; then level=AVX2
  elif has avx2; then level=AVX
  else echo "SKIPPED: this CPU has no AVX2: no older instruction set to hold the libraries to"; exit 77
  fi
fi
case $level in
  AVX2) onednn=AVX2 openblas=Haswell aten=avx2 mkl=AVX2 ;;
  AVX)  onednn=AVX openblas=Sandybridge aten=default mkl=AVX ;;
  *) echo "isa_capped.sh: DDPRUN_ISA_CAP=$level: expected AVX2 or AVX" >&2; exit 2 ;;
esac
export ONEDNN_MAX_CPU_ISA=$onednn DNNL_MAX_CPU_ISA=$onednn ATEN_CPU_CAPABILITY=$aten \
       MKL_ENABLE_INSTRUCTIONS=$mkl
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then export OPENBLAS_CORETYPE=$openblas; fi
echo "isa_capped: $level (oneDNN $ONEDNN_MAX_CPU_ISA, OpenBLAS $OPENBLAS_CORETYPE," \
     "ATen $ATEN_CPU_CAPABILITY, MKL $MKL_ENABLE_INSTRUCTIONS)"
exec "$@"
