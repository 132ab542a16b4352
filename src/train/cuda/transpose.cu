// The CUDA backend's layout transposes (transpose.h): NCHW <-> NHWC
// activations and OIHW <-> KRSC filters, written, added or cast to and from
// 16 bits in the same pass. Index math from kernel_math.h; element access
// and the storage-type dispatch from kernel_support.cuh.
#include "transpose.h"

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
}  // namespace

void launchTranspose(const float* x, float* y, int64_t batches, int64_t rows, int64_t cols,
                     bool accumulate, cudaStream_t s) {
  transpose(LoadT<float>{x}, StoreFloat{y, accumulate}, batches, rows, cols, s);
}
void launchTranspose(const void* x, void* y, runtime::DType t, int64_t batches, int64_t rows,
                     int64_t cols, cudaStream_t s) {
  byType(t, [&](auto tag) {
    using T = DDPRUN_T(tag);
    transpose(LoadT<T>{static_cast<const T*>(x)}, StoreT<T>{static_cast<T*>(y)}, batches, rows,
              cols, s);
  });
}
void launchTransposeTo16(const float* x, void* y16, int64_t batches, int64_t rows, int64_t cols,
                         bool bf16, cudaStream_t s) {
  transpose(LoadT<float>{x}, Store16{y16, bf16}, batches, rows, cols, s);
}
void launchTransposeFrom16(const void* x16, float* y, int64_t batches, int64_t rows,
                           int64_t cols, bool bf16, bool accumulate, cudaStream_t s) {
  transpose(Load16{x16, bf16}, StoreFloat{y, accumulate}, batches, rows, cols, s);
}

}  // namespace ddprun::train::cuda
