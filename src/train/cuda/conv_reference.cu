// The float64 convolution reference on the GPU; see conv_reference.h. The
// element math is kernel_math.h's; these kernels only map threads to output
// elements (grid-stride loops, NCHW / OIHW index order).
#include <cuda_runtime.h>

#include <algorithm>

#include "conv_reference.h"
#include "ddprun/runtime/cuda_check.h"
#include "kernel_support.cuh"

namespace ddprun::train::cuda {

// Launch shapes, grid-stride loops and the launch check: kernel_support.cuh
// (every launcher below returns before a launch over 0 elements).
namespace {

// Element e of a 4-d array [d0, d1, d2, d3] as its four indices.
struct Index4 {
  int64_t a, b, c, d;
};
__device__ Index4 unflatten(size_t e, int64_t d1, int64_t d2, int64_t d3) {
  const int64_t i = static_cast<int64_t>(e);
  return {i / (d1 * d2 * d3), (i / (d2 * d3)) % d1, (i / d3) % d2, i % d3};
}

__global__ void forwardKernel(const float* x, const float* w, double* y, kmath::ConvGeom g) {
  const size_t n = static_cast<size_t>(g.n * g.k * g.oh * g.ow);
  DDPRUN_GRID_LOOP(e, n) {
    const Index4 q = unflatten(e, g.k, g.oh, g.ow);
    y[e] = kmath::convForwardAt(x, w, g, q.a, q.b, q.c, q.d);
  }
}
__global__ void backwardDataKernel(const float* w, const float* dy, double* dx,
                                   kmath::ConvGeom g) {
  const size_t n = static_cast<size_t>(g.n * g.c * g.h * g.w);
  DDPRUN_GRID_LOOP(e, n) {
    const Index4 q = unflatten(e, g.c, g.h, g.w);
    dx[e] = kmath::convBackwardDataAt(w, dy, g, q.a, q.b, q.c, q.d);
  }
}
__global__ void backwardFilterKernel(const float* x, const float* dy, double* dw,
                                     kmath::ConvGeom g) {
  const size_t n = static_cast<size_t>(g.k * g.c * g.kernel * g.kernel);
  DDPRUN_GRID_LOOP(e, n) {
    const Index4 q = unflatten(e, g.c, g.kernel, g.kernel);
    dw[e] = kmath::convBackwardFilterAt(x, dy, g, q.a, q.b, q.c, q.d);
  }
}
__global__ void fillKernel(float* p, size_t n, uint64_t seed) {
  DDPRUN_GRID_LOOP(e, n) p[e] = kmath::hashUniform(seed, e);
}
__global__ void fill16Kernel(void* p, size_t n, uint64_t seed, bool bf16) {
  DDPRUN_GRID_LOOP(e, n) store16(p, e, kmath::hashUniform(seed, e), bf16);
}

// One block: per-thread maxima, then a fixed tree. `bigger` keeps a NaN.
__device__ double bigger(double a, double b) { return (b > a || b != b) ? b : a; }
__global__ void maxErrorKernel(const float* got, const double* want, size_t n, double* out) {
  __shared__ double err[kThreads], mag[kThreads];
  double e = 0.0, m = 0.0;
  for (size_t i = threadIdx.x; i < n; i += kThreads) {
    e = bigger(e, fabs(static_cast<double>(got[i]) - want[i]));
    m = bigger(m, fabs(want[i]));
  }
  err[threadIdx.x] = e;
  mag[threadIdx.x] = m;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      err[threadIdx.x] = bigger(err[threadIdx.x], err[threadIdx.x + s]);
      mag[threadIdx.x] = bigger(mag[threadIdx.x], mag[threadIdx.x + s]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out[0] = err[0];
    out[1] = mag[0];
  }
}
}  // namespace

void launchConvReferenceForward(const float* x, const float* w, double* y,
                                const kmath::ConvGeom& g, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(g.n * g.k * g.oh * g.ow);
  if (!n) return;
  forwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(x, w, y, g);
  checkLaunch();
}

void launchConvReferenceBackwardData(const float* w, const float* dy, double* dx,
                                     const kmath::ConvGeom& g, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(g.n * g.c * g.h * g.w);
  if (!n) return;
  backwardDataKernel<<<blocksFor(n), kThreads, 0, stream>>>(w, dy, dx, g);
  checkLaunch();
}

void launchConvReferenceBackwardFilter(const float* x, const float* dy, double* dw,
                                       const kmath::ConvGeom& g, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(g.k * g.c * g.kernel * g.kernel);
  if (!n) return;
  backwardFilterKernel<<<blocksFor(n), kThreads, 0, stream>>>(x, dy, dw, g);
  checkLaunch();
}

void launchFillUniform(float* p, size_t n, uint64_t seed, cudaStream_t stream) {
  if (!n) return;
  fillKernel<<<blocksFor(n), kThreads, 0, stream>>>(p, n, seed);
  checkLaunch();
}

void launchFillUniform16(void* p, size_t n, uint64_t seed, bool bf16, cudaStream_t stream) {
  if (!n) return;
  fill16Kernel<<<blocksFor(n), kThreads, 0, stream>>>(p, n, seed, bf16);
  checkLaunch();
}

void launchMaxError(const float* got, const double* want, size_t n, double* out,
                    cudaStream_t stream) {
  maxErrorKernel<<<1, kThreads, 0, stream>>>(got, want, n, out);
  checkLaunch();
}

}  // namespace ddprun::train::cuda
