// The CUDA backend's pooling and resizing kernels (pool_kernels.h): global
// average pooling (NCHW and NHWC), our NHWC max pooling with its one-byte
// argmax, and bilinear resizing. Element math from kernel_math.h; element
// access and the storage-type dispatch from kernel_support.cuh.
#include "pool_kernels.h"

#include <algorithm>
#include <cstdint>

#include "../kernel_math.h"
#include "kernel_support.cuh"
#include "max_pool.cuh"

namespace ddprun::train::cuda {

namespace {
// One warp per plane.
__global__ void globalAvgPoolKernel(const float* x, float* y, int64_t planes, int64_t hw) {
  const int64_t p = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (p >= planes) return;  // whole warps leave together
  const float* in = x + p * hw;
  float s = 0.0f;
  for (int64_t q = lane; q < hw; q += 32) s += in[q];
  for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
  if (lane == 0) y[p] = s / static_cast<float>(hw);
}
__global__ void globalAvgPoolBackwardKernel(const float* dy, float* dx, int64_t planes,
                                            int64_t hw) {
  const size_t n = static_cast<size_t>(planes * hw);
  DDPRUN_GRID_LOOP(i, n) dx[i] = dy[i / hw] / static_cast<float>(hw);
}
__global__ void resizeKernel(const float* x, float* y, int64_t planes, int64_t h, int64_t w,
                             int64_t oh, int64_t ow) {
  const size_t n = static_cast<size_t>(planes * oh * ow);
  DDPRUN_GRID_LOOP(i, n) {
    const int64_t ox = static_cast<int64_t>(i % ow);
    const int64_t oy = static_cast<int64_t>((i / ow) % oh);
    const int64_t p = static_cast<int64_t>(i / (ow * oh));
    const kmath::Lerp r = kmath::bilinearIndex(oy, h, oh);
    const kmath::Lerp c = kmath::bilinearIndex(ox, w, ow);
    y[i] = kmath::bilinearAt(x + p * h * w, w, r, c);
  }
}

// One thread per (image, channel): consecutive threads read consecutive
// channels (coalesced); the sum runs over the positions in order, in float.
template <typename T>
__global__ void globalAvgPoolNhwcKernel(const T* x, T* y, int64_t n, int64_t c, int64_t hw) {
  DDPRUN_GRID_LOOP(i, static_cast<size_t>(n * c)) {
    const int64_t img = static_cast<int64_t>(i) / c, ch = static_cast<int64_t>(i) % c;
    const T* in = x + img * hw * c + ch;
    float s = 0.0f;
    for (int64_t q = 0; q < hw; ++q) s += ldf(in, static_cast<size_t>(q * c));
    stf(y, i, s / static_cast<float>(hw));
  }
}
template <typename T>
__global__ void globalAvgPoolNhwcBackwardKernel(const T* dy, T* dx, int64_t n, int64_t c,
                                                int64_t hw) {
  DDPRUN_GRID_LOOP(i, static_cast<size_t>(n * hw * c)) {
    const int64_t img = static_cast<int64_t>(i) / (hw * c), ch = static_cast<int64_t>(i) % c;
    stf(dx, i, ldf(dy, static_cast<size_t>(img * c + ch)) / static_cast<float>(hw));
  }
}
// One thread per input element: the pooled gradient gathered from the
// outputs whose winning tap it is (gatherPooledGrad).
template <typename T>
__global__ void maxPoolNhwcBackwardKernel(const T* dy, const uint8_t* arg, T* dx, PoolShape g) {
  DDPRUN_GRID_LOOP(i, static_cast<size_t>(g.n * g.h * g.w * g.c)) {
    const int64_t ch = static_cast<int64_t>(i) % g.c;
    int64_t rest = static_cast<int64_t>(i) / g.c;
    const int64_t jj = rest % g.w;
    rest /= g.w;
    const int64_t ii = rest % g.h, img = rest / g.h;
    float sum[1];
    gatherPooledGrad<T, 1>(dy, arg, g, img, ii, jj, ch, sum);
    stf(dx, i, sum[0]);
  }
}
}  // namespace

void launchGlobalAvgPool(const float* x, float* y, int64_t planes, int64_t hw, cudaStream_t s) {
  if (planes <= 0) return;
  const int warpsPerBlock = kThreads / 32;
  globalAvgPoolKernel<<<static_cast<int>((planes + warpsPerBlock - 1) / warpsPerBlock), kThreads,
                        0, s>>>(x, y, planes, hw);
  checkLaunch();
}
void launchGlobalAvgPoolBackward(const float* dy, float* dx, int64_t planes, int64_t hw,
                                 cudaStream_t s) {
  if (planes * hw <= 0) return;
  globalAvgPoolBackwardKernel<<<blocksFor(static_cast<size_t>(planes * hw)), kThreads, 0, s>>>(
      dy, dx, planes, hw);
  checkLaunch();
}
void launchGlobalAvgPoolNhwc(const void* x, void* y, runtime::DType t, int64_t n, int64_t c,
                             int64_t hw, cudaStream_t s) {
  const size_t total = static_cast<size_t>(n * c);
  if (!total) return;
  byType(t, [&](auto tag) {
    using T = DDPRUN_T(tag);
    globalAvgPoolNhwcKernel<T><<<blocksFor(total), kThreads, 0, s>>>(
        static_cast<const T*>(x), static_cast<T*>(y), n, c, hw);
  });
  checkLaunch();
}
void launchGlobalAvgPoolNhwc(const float* x, float* y, int64_t n, int64_t c, int64_t hw,
                             cudaStream_t s) {
  launchGlobalAvgPoolNhwc(x, y, runtime::DType::kFloat32, n, c, hw, s);
}
void launchGlobalAvgPoolNhwcBackward(const void* dy, void* dx, runtime::DType t, int64_t n,
                                     int64_t c, int64_t hw, cudaStream_t s) {
  const size_t total = static_cast<size_t>(n * hw * c);
  if (!total) return;
  byType(t, [&](auto tag) {
    using T = DDPRUN_T(tag);
    globalAvgPoolNhwcBackwardKernel<T><<<blocksFor(total), kThreads, 0, s>>>(
        static_cast<const T*>(dy), static_cast<T*>(dx), n, c, hw);
  });
  checkLaunch();
}
void launchGlobalAvgPoolNhwcBackward(const float* dy, float* dx, int64_t n, int64_t c,
                                     int64_t hw, cudaStream_t s) {
  launchGlobalAvgPoolNhwcBackward(dy, dx, runtime::DType::kFloat32, n, c, hw, s);
}
void launchMaxPoolNhwc(const void* x, void* y, uint8_t* arg, runtime::DType t, int64_t n,
                       int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow, int k, int s,
                       int p, cudaStream_t stream) {
  const PoolShape g{.n = n, .h = h, .w = w, .c = c, .oh = oh, .ow = ow, .k = k, .s = s, .p = p};
  launchMaxPoolVec("launchMaxPoolNhwc", x, y, arg, t, g, [](auto) { return PoolStored{}; },
                   stream);
}
void launchMaxPoolNhwcBackward(const void* dy, const uint8_t* arg, void* dx, runtime::DType t,
                               int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh,
                               int64_t ow, int k, int s, int p, cudaStream_t stream) {
  const size_t total = static_cast<size_t>(n * h * w * c);
  if (!total) return;
  const PoolShape g{.n = n, .h = h, .w = w, .c = c, .oh = oh, .ow = ow, .k = k, .s = s, .p = p};
  byType(t, [&](auto tag) {
    using T = DDPRUN_T(tag);
    maxPoolNhwcBackwardKernel<T><<<blocksFor(total), kThreads, 0, stream>>>(
        static_cast<const T*>(dy), arg, static_cast<T*>(dx), g);
  });
  checkLaunch();
}
void launchResizeBilinear(const float* x, float* y, int64_t planes, int64_t h, int64_t w,
                          int64_t oh, int64_t ow, cudaStream_t s) {
  const size_t n = static_cast<size_t>(planes * oh * ow);
  if (!n) return;
  resizeKernel<<<blocksFor(n), kThreads, 0, s>>>(x, y, planes, h, w, oh, ow);
  checkLaunch();
}

}  // namespace ddprun::train::cuda
