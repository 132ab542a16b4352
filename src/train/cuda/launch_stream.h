// Where a kernel launcher enqueues its work: the stream and whether the
// launch may use programmatic dependent launch (PDL, compute capability 9.0
// and later; issue 44 item 3). Host header, shared by the launchers'
// declarations and the layers that call them.
//
// With `programmatic` set, a kernel may be scheduled while the kernel before
// it on the stream is still finishing, so its launch latency hides under that
// kernel's tail. Such a kernel must wait at its very start for the kernels
// before it (gridDependencyStart() in kernel_support.cuh) before it touches
// memory: stream order is then kept exactly, and each launcher that accepts
// a LaunchStream launches only kernels that do (tests/cuda/
// ptx_grid_dependency_test.py checks their PTX). Without it (the default,
// and what a plain cudaStream_t converts to) a launch is an ordinary one.
#pragma once

#include <cuda_runtime_api.h>

namespace ddprun::train::cuda {

struct LaunchStream {
  // Implicit: every launcher taking a LaunchStream also takes a plain stream.
  LaunchStream(cudaStream_t s, bool programmatic = false)  // NOLINT(google-explicit-constructor)
      : stream(s), pdl(programmatic) {}
  cudaStream_t stream;
  bool pdl;
};

// Whether this build's kernels carry programmatic dependent launch on the
// current device: run from code compiled for compute capability 9.0 or later
// (cudaFuncGetAttributes' ptxVersion; a build for sm_80 alone, JIT-compiled
// on an H100, has the waits compiled out). launch_stream.cu.
bool pdlCompiled();

}  // namespace ddprun::train::cuda
