// Whether the kernels of this build carry programmatic dependent launch
// (launch_stream.h).
#include "kernel_support.cuh"
#include "launch_stream.h"

namespace ddprun::train::cuda {

namespace {
// Compiled as every kernel of the plugin is: its PTX version is theirs.
__global__ void pdlProbeKernel() { gridDependencyStart(); }
}  // namespace

bool pdlCompiled() {
  cudaFuncAttributes a{};
  if (cudaFuncGetAttributes(&a, pdlProbeKernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.ptxVersion >= 90;
}

}  // namespace ddprun::train::cuda
