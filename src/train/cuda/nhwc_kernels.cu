// The CUDA backend's kernels over NHWC activations (nhwc_kernels.h): the
// layout transposes, global average and max pooling, the channel bias of a
// 16-bit convolution output. Element math from kernel_math.h; element access
// and the storage-type dispatch from kernel_support.cuh.
#include "nhwc_kernels.h"

#include <algorithm>

#include "../kernel_math.h"
#include "kernel_support.cuh"

namespace ddprun::train::cuda {

namespace {
// Loads and stores of the transposes: of a storage type T (16-bit to 16-bit
// moves exactly), of the 16-bit type chosen at run time, or float written or
// added.
template <typename T>
struct LoadT {
  const T* p;
  __device__ float operator()(size_t i) const { return ldf(p, i); }
};
template <typename T>
struct StoreT {
  T* p;
  __device__ void operator()(size_t i, float v) const { stf(p, i, v); }
};
struct Load16 {
  const void* p;
  bool bf16;
  __device__ float operator()(size_t i) const { return load16(p, i, bf16); }
};
struct StoreFloat {
  float* p;
  bool accumulate;
  __device__ void operator()(size_t i, float v) const {
    if (accumulate)
      p[i] += v;
    else
      p[i] = v;
  }
};
struct Store16 {
  void* p;
  bool bf16;
  __device__ void operator()(size_t i, float v) const { store16(p, i, v, bf16); }
};
constexpr int kTile = 32, kTileRows = 8;
// One 32x32 tile per block (32 x 8 threads) through shared memory (padded
// against bank conflicts): reads and writes both coalesced.
template <class Load, class Store>
__global__ void transposeKernel(Load ld, Store st, int64_t rows, int64_t cols) {
  __shared__ float tile[kTile][kTile + 1];
  const size_t base = static_cast<size_t>(blockIdx.z) * rows * cols;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int k = threadIdx.y; k < kTile; k += kTileRows) {
    const int64_t r = r0 + k, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[k][threadIdx.x] = ld(base + r * cols + c);
  }
  __syncthreads();
  for (int k = threadIdx.y; k < kTile; k += kTileRows) {
    const int64_t c = c0 + k, r = r0 + threadIdx.x;
    if (r < rows && c < cols) st(base + c * rows + r, tile[threadIdx.x][k]);
  }
}
// A matrix with a narrow side (<= kmath::kNarrowMax: the model's 3-channel
// input, 3x3 filters): one chunk of the wide side per block through shared
// memory, read and written in runs (kmath::narrowTranspose); batches strided
// over the grid's y.
constexpr int kNarrowThreads = 256;
template <class Load, class Store>
__global__ void __launch_bounds__(kNarrowThreads)
    narrowTransposeKernel(Load ld, Store st, kmath::NarrowTranspose p, int64_t batches) {
  __shared__ float tile[kmath::kNarrowTile + kmath::kNarrowMax];
  const int64_t w0 = static_cast<int64_t>(blockIdx.x) * p.chunkWidth;
  const int n = static_cast<int>(p.wide - w0 < p.chunkWidth ? p.wide - w0 : p.chunkWidth);
  const int total = static_cast<int>(p.narrow) * n, pitch = n + 1;
  const size_t mat = static_cast<size_t>(p.narrow * p.wide);
  for (int64_t b = blockIdx.y; b < batches; b += gridDim.y) {
    const size_t base = static_cast<size_t>(b) * mat;
    for (int e = threadIdx.x; e < total; e += kNarrowThreads) {
      const kmath::NarrowSlot sl = kmath::narrowLoadSlot(p, w0, n, e);
      tile[sl.t * pitch + sl.j] = ld(base + static_cast<size_t>(sl.mem));
    }
    __syncthreads();
    for (int e = threadIdx.x; e < total; e += kNarrowThreads) {
      const kmath::NarrowSlot sl = kmath::narrowStoreSlot(p, w0, n, e);
      st(base + static_cast<size_t>(sl.mem), tile[sl.t * pitch + sl.j]);
    }
    __syncthreads();  // the next batch's loads overwrite the tile
  }
}
template <class Load, class Store>
void transpose(Load ld, Store st, int64_t batches, int64_t rows, int64_t cols, cudaStream_t s) {
  if (batches <= 0 || rows <= 0 || cols <= 0) return;
  if (std::min(rows, cols) <= kmath::kNarrowMax) {
    const kmath::NarrowTranspose p = kmath::narrowTranspose(rows, cols);
    const dim3 grid(static_cast<unsigned>((p.wide + p.chunkWidth - 1) / p.chunkWidth),
                    static_cast<unsigned>(std::min<int64_t>(batches, 65535)));
    narrowTransposeKernel<<<grid, kNarrowThreads, 0, s>>>(ld, st, p, batches);
    checkLaunch();
    return;
  }
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile),
                  static_cast<unsigned>((rows + kTile - 1) / kTile),
                  static_cast<unsigned>(batches));
  transposeKernel<<<grid, dim3(kTile, kTileRows), 0, s>>>(ld, st, rows, cols);
  checkLaunch();
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
// y[r * c + ch] += bias[ch] over rows x c (NHWC as [N*H*W, C]), rounded once.
template <typename T>
__global__ void addChannelBiasKernel(T* y, const float* bias, int64_t rows, int64_t c) {
  DDPRUN_GRID_LOOP(i, static_cast<size_t>(rows * c))
    stf(y, i, ldf(y, i) + bias[static_cast<int64_t>(i) % c]);
}
// One thread per output element (NHWC: consecutive threads on consecutive
// channels, coalesced); the window scanned row by row, the first maximum kept.
template <typename T>
__global__ void maxPoolNhwcKernel(const T* x, T* y, uint8_t* arg, int64_t n, int64_t c, int64_t h,
                                  int64_t w, int64_t oh, int64_t ow, int k, int s, int p) {
  DDPRUN_GRID_LOOP(i, static_cast<size_t>(n * oh * ow * c)) {
    const int64_t ch = static_cast<int64_t>(i) % c;
    int64_t rest = static_cast<int64_t>(i) / c;
    const int64_t oj = rest % ow;
    rest /= ow;
    const int64_t oi = rest % oh, img = rest / oh;
    float best = 0.0f;
    int tap = -1;
    for (int a = 0; a < k; ++a) {
      const int64_t ii = oi * s - p + a;
      if (ii < 0 || ii >= h) continue;
      for (int b = 0; b < k; ++b) {
        const int64_t jj = oj * s - p + b;
        if (jj < 0 || jj >= w) continue;
        const float v = ldf(x, static_cast<size_t>(((img * h + ii) * w + jj) * c + ch));
        if (tap < 0 || v > best) {
          best = v;
          tap = a * k + b;
        }
      }
    }
    stf(y, i, best);
    if (arg) arg[i] = static_cast<uint8_t>(tap);
  }
}
// One thread per input element: the outputs whose window covers it
// (kmath::poolCoverRange), in order, those whose winner it is.
template <typename T>
__global__ void maxPoolNhwcBackwardKernel(const T* dy, const uint8_t* arg, T* dx, int64_t n,
                                          int64_t c, int64_t h, int64_t w, int64_t oh,
                                          int64_t ow, int k, int s, int p) {
  DDPRUN_GRID_LOOP(i, static_cast<size_t>(n * h * w * c)) {
    const int64_t ch = static_cast<int64_t>(i) % c;
    int64_t rest = static_cast<int64_t>(i) / c;
    const int64_t jj = rest % w;
    rest /= w;
    const int64_t ii = rest % h, img = rest / h;
    const kmath::TapRange ri = kmath::poolCoverRange(ii, oh, k, s, p);
    const kmath::TapRange rj = kmath::poolCoverRange(jj, ow, k, s, p);
    float g = 0.0f;
    for (int64_t oi = ri.lo; oi < ri.hi; ++oi)
      for (int64_t oj = rj.lo; oj < rj.hi; ++oj) {
        const size_t o = static_cast<size_t>(((img * oh + oi) * ow + oj) * c + ch);
        const int64_t tap = (ii - (oi * s - p)) * k + (jj - (oj * s - p));
        if (arg[o] == tap) g += ldf(dy, o);
      }
    stf(dx, i, g);
  }
}
}  // namespace

void launchTranspose(const float* x, float* y, int64_t batches, int64_t rows, int64_t cols,
                     bool accumulate, cudaStream_t s) {
  transpose(LoadT<float>{x}, StoreFloat{y, accumulate}, batches, rows, cols, s);
}
void launchTransposeTo16(const float* x, void* y16, int64_t batches, int64_t rows, int64_t cols,
                         bool bf16, cudaStream_t s) {
  transpose(LoadT<float>{x}, Store16{y16, bf16}, batches, rows, cols, s);
}
void launchTransposeFrom16(const void* x16, float* y, int64_t batches, int64_t rows,
                           int64_t cols, bool bf16, bool accumulate, cudaStream_t s) {
  transpose(Load16{x16, bf16}, StoreFloat{y, accumulate}, batches, rows, cols, s);
}
void launchTranspose(const void* x, void* y, runtime::DType t, int64_t batches, int64_t rows,
                     int64_t cols, cudaStream_t s) {
  byType(t, [&](auto tag) {
    using T = DDPRUN_T(tag);
    transpose(LoadT<T>{static_cast<const T*>(x)}, StoreT<T>{static_cast<T*>(y)}, batches, rows,
              cols, s);
  });
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
void launchGlobalAvgPoolNhwc(const float* x, float* y, int64_t n, int64_t c, int64_t hw,
                             cudaStream_t s) {
  launchGlobalAvgPoolNhwc(x, y, runtime::DType::kFloat32, n, c, hw, s);
}
void launchGlobalAvgPoolNhwcBackward(const float* dy, float* dx, int64_t n, int64_t c,
                                     int64_t hw, cudaStream_t s) {
  launchGlobalAvgPoolNhwcBackward(dy, dx, runtime::DType::kFloat32, n, c, hw, s);
}
void launchMaxPoolNhwc(const void* x, void* y, uint8_t* arg, runtime::DType t, int64_t n,
                       int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow, int k, int s,
                       int p, cudaStream_t stream) {
  DDPRUN_CHECK(k > 0 && k <= 16 && s > 0 && p >= 0 && p <= k / 2, "max pooling kernel ", k,
               ", stride ", s, ", pad ", p, ": our NHWC kernels take windows up to 16 with "
               "pad <= kernel / 2");
  const size_t total = static_cast<size_t>(n * oh * ow * c);
  if (!total) return;
  byType(t, [&](auto tag) {
    using T = DDPRUN_T(tag);
    maxPoolNhwcKernel<T><<<blocksFor(total), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), arg, n, c, h, w, oh, ow, k, s, p);
  });
  checkLaunch();
}
void launchMaxPoolNhwcBackward(const void* dy, const uint8_t* arg, void* dx, runtime::DType t,
                               int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh,
                               int64_t ow, int k, int s, int p, cudaStream_t stream) {
  const size_t total = static_cast<size_t>(n * h * w * c);
  if (!total) return;
  byType(t, [&](auto tag) {
    using T = DDPRUN_T(tag);
    maxPoolNhwcBackwardKernel<T><<<blocksFor(total), kThreads, 0, stream>>>(
        static_cast<const T*>(dy), arg, static_cast<T*>(dx), n, c, h, w, oh, ow, k, s, p);
  });
  checkLaunch();
}
void launchAddChannelBias(void* y, runtime::DType t, const float* bias, int64_t rows, int64_t c,
                          cudaStream_t s) {
  const size_t total = static_cast<size_t>(rows * c);
  if (!total) return;
  byType(t, [&](auto tag) {
    using T = DDPRUN_T(tag);
    addChannelBiasKernel<T><<<blocksFor(total), kThreads, 0, s>>>(static_cast<T*>(y), bias,
                                                                   rows, c);
  });
  checkLaunch();
}

}  // namespace ddprun::train::cuda
