// What the CUDA backend's kernel files (*.cu) share: the launch shape of
// grid-stride loops, a fixed-order block sum, the launch check,
// and element access over the activations' storage types (float, bf16,
// fp16: loaded exactly into float, stored rounded to nearest even) with the
// host-side dispatch from a runtime::DType to a kernel's template argument.
// Internal to src/train/cuda/; include from .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "ddprun/common/error.h"
#include "ddprun/runtime/cuda_check.h"
#include "ddprun/runtime/types.h"
#include "launch_stream.h"

namespace ddprun::train::cuda {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements.
inline int blocksFor(size_t n) {
  return static_cast<int>(std::min<size_t>((n + kThreads - 1) / kThreads, 8192));
}

// Blocks of kThreads for one thread per row (no cap).
inline int rowsBlocks(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

// Throws CudaError for the last launch's error.
inline void checkLaunch() { DDPRUN_CUDA_OK(cudaGetLastError()); }

// Programmatic dependent launch (launch_stream.h). A kernel that may be
// launched with LaunchStream::pdl calls this first, before any memory access:
// it returns once the grids before it on the stream have completed and their
// memory is visible (griddepcontrol.wait), then lets the grid after it on the
// stream be scheduled (griddepcontrol.launch_dependents: once every block of
// this grid has passed here, the next one's blocks may take free SM slots and
// wait in their own gridDependencyStart; none of them touches memory before
// this grid has completed). No-ops in a kernel launched without PDL, and
// compiled out below compute capability 9.0 (no PDL there: Context asks for
// it only where the kernels were compiled for sm_90, pdlCompiled()).
__device__ __forceinline__ void gridDependencyStart() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, 0, on.stream>>>(args...), with PDL allowed when
// on.pdl (cudaLaunchKernelEx with the programmatic stream serialization
// attribute). Precondition: `kernel` begins with gridDependencyStart().
// Throws CudaError when the launch fails.
template <typename... Params, typename... Args>
void launchKernel(void (*kernel)(Params...), dim3 grid, dim3 block, LaunchStream on,
                  Args&&... args) {
  if (!on.pdl) {
    kernel<<<grid, block, 0, on.stream>>>(std::forward<Args>(args)...);
    checkLaunch();
    return;
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = on.stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  DDPRUN_CUDA_OK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

#define DDPRUN_GRID_LOOP(i, n)                                                    \
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<size_t>(gridDim.x) * blockDim.x)

// Sum of `v` over the block (kThreads threads), valid in thread 0. Fixed tree.
__device__ inline double blockSum(double v) {
  __shared__ double s[kThreads];
  s[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  const double r = s[0];
  __syncthreads();  // s may be reused by a second call
  return r;
}

// One stored element to float (exact) and a float to storage (round to
// nearest even; fp16 overflows to inf, never clamped).
__device__ inline float toFloat(float v) { return v; }
__device__ inline float toFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float toFloat(__half v) { return __half2float(v); }
template <typename T>
__device__ inline T fromFloat(float v);
template <>
__device__ inline float fromFloat<float>(float v) { return v; }
template <>
__device__ inline __nv_bfloat16 fromFloat<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ inline __half fromFloat<__half>(float v) { return __float2half_rn(v); }
template <typename T>
__device__ inline float ldf(const T* p, size_t i) {
  return toFloat(p[i]);
}
template <typename T>
__device__ inline void stf(T* p, size_t i, float v) {
  p[i] = fromFloat<T>(v);
}
// The 16-bit type chosen at run time (bf16, else fp16).
__device__ inline float load16(const void* p, size_t i, bool bf16) {
  return bf16 ? ldf(static_cast<const __nv_bfloat16*>(p), i)
              : ldf(static_cast<const __half*>(p), i);
}
__device__ inline void store16(void* p, size_t i, float v, bool bf16) {
  if (bf16)
    stf(static_cast<__nv_bfloat16*>(p), i, v);
  else
    stf(static_cast<__half*>(p), i, v);
}

// Calls f with a null T* for the storage type t (T = float, __nv_bfloat16,
// __half), which the launcher turns into its kernel's template argument
// (DDPRUN_T(tag)); another t throws InvalidArgument naming it.
template <class F>
void byType(runtime::DType t, F&& f) {
  switch (t) {
    case runtime::DType::kFloat32: return f(static_cast<float*>(nullptr));
    case runtime::DType::kBFloat16: return f(static_cast<__nv_bfloat16*>(nullptr));
    case runtime::DType::kFloat16: return f(static_cast<__half*>(nullptr));
    default:
      DDPRUN_THROW(InvalidArgument, "the CUDA kernels store activations as float32, bfloat16 "
                   "or float16, not ", runtime::dtypeName(t));
  }
}
#define DDPRUN_T(tag) std::remove_pointer_t<decltype(tag)>

}  // namespace ddprun::train::cuda
