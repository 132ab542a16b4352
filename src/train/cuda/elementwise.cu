// The CUDA backend's element-wise kernels (elementwise.h): ReLU, add, the
// scalar update of num_batches_tracked, the loss scaler's scale-and-check,
// a channel bias and its gradient's column sums, and the casts of autocast
// and of the gradient buckets. Element math from kernel_math.h; element
// access and the storage-type dispatch from kernel_support.cuh.
#include "elementwise.h"

#include <algorithm>
#include <cstdint>

#include "../kernel_math.h"
#include "kernel_support.cuh"

namespace ddprun::train::cuda {

namespace {
// ---------------------------------------------------------- element-wise
// 16-bit ReLU results are exact (a stored value or zero); the sum is
// rounded once, as PyTorch's bf16/fp16 add.
struct ReluOp {
  __device__ float operator()(float x, float) const { return kmath::reluForward(x); }
};
struct ReluBackwardOp {  // (y, dy)
  __device__ float operator()(float y, float dy) const { return kmath::reluBackward(y, dy); }
};
struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
// 16 bytes of elements (8 16-bit or 4 float), loaded and stored as one access.
template <typename T>
struct alignas(16) Pack16 {
  static constexpr int kW = 16 / static_cast<int>(sizeof(T));
  T v[kW];
};
// out[i] = op(a[i], b[i]) (b null: op(a[i], 0)), each element's math the
// same as one at a time; `packed` (every pointer 16-byte aligned, as the
// allocator's blocks are): 16 bytes a thread, then the last n % kW elements
// one at a time. In place (out == a) is fine: each index is read and
// written by one thread.
template <typename T, class Op>
__global__ void mapKernel(const T* a, const T* b, T* out, size_t n, bool packed, Op op) {
  constexpr int kW = Pack16<T>::kW;
  const size_t packs = packed ? n / kW : 0;
  DDPRUN_GRID_LOOP(q, packs) {
    const Pack16<T> pa = reinterpret_cast<const Pack16<T>*>(a)[q];
    Pack16<T> pb{};
    if (b) pb = reinterpret_cast<const Pack16<T>*>(b)[q];
    Pack16<T> po;
#pragma unroll
    for (int k = 0; k < kW; ++k)
      po.v[k] = fromFloat<T>(op(toFloat(pa.v[k]), b ? toFloat(pb.v[k]) : 0.0f));
    reinterpret_cast<Pack16<T>*>(out)[q] = po;
  }
  DDPRUN_GRID_LOOP(i, n - packs * kW) {
    const size_t j = packs * kW + i;
    stf(out, j, op(ldf(a, j), b ? ldf(b, j) : 0.0f));
  }
}
template <class Op>
void launchMap(const void* a, const void* b, void* out, size_t n, runtime::DType t,
               cudaStream_t s) {
  if (!n) return;
  const bool packed = (reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
                       reinterpret_cast<uintptr_t>(out)) % 16 == 0;
  byType(t, [&](auto tag) {
    using T = DDPRUN_T(tag);
    const size_t units = packed ? n / Pack16<T>::kW + n % Pack16<T>::kW : n;
    mapKernel<T, Op><<<std::max(1, blocksFor(units)), kThreads, 0, s>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n, packed,
        Op{});
  });
  checkLaunch();
}
__global__ void addScalarKernel(float* p, float v) { *p += v; }
__global__ void scaleCheckKernel(float* data, size_t n, float scale, int* nonFinite) {
  bool ok = true;
  DDPRUN_GRID_LOOP(i, n) ok &= kmath::scaleFinite(data[i], scale);
  if (!ok) atomicExch(nonFinite, 1);  // any writer: the flag is all that matters
}

template <typename T>
__global__ void columnSumKernel(const T* dy, float* db, int64_t rows, int64_t cols,
                                bool accumulate) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  double s = 0.0;
  for (int64_t r = 0; r < rows; ++r) s += ldf(dy, static_cast<size_t>(r * cols + c));
  // s starts at +0 and is never -0, so "=" is bitwise "+=" into a zeroed db.
  if (accumulate)
    db[c] += static_cast<float>(s);
  else
    db[c] = static_cast<float>(s);
}
// y[r * c + ch] += bias[ch] over rows x c (NHWC as [N*H*W, C]), rounded once.
template <typename T>
__global__ void addChannelBiasKernel(T* y, const float* bias, int64_t rows, int64_t c) {
  DDPRUN_GRID_LOOP(i, static_cast<size_t>(rows * c))
    stf(y, i, ldf(y, i) + bias[static_cast<int64_t>(i) % c]);
}

// ------------------------------------------------------ gradient buckets
__global__ void compressKernel(const float* src, void* dst16, size_t n, float scale, bool bf16) {
  DDPRUN_GRID_LOOP(i, n) store16(dst16, i, src[i] * scale, bf16);
}
__global__ void decompressKernel(const void* src16, float* dst, size_t n, bool bf16) {
  DDPRUN_GRID_LOOP(i, n) dst[i] = load16(src16, i, bf16);
}

// ---------------------------------------------- autocast (bf16 / fp16)
__global__ void from16Kernel(const void* src16, const float* bias, float* dst, size_t total,
                             int64_t c, int64_t hw, bool bf16) {
  DDPRUN_GRID_LOOP(i, total) {
    const float v = load16(src16, i, bf16);
    dst[i] = bias ? v + bias[static_cast<int64_t>(i / hw) % c] : v;
  }
}
__global__ void accumulate16Kernel(const void* src16, float* dst, size_t n, bool bf16) {
  DDPRUN_GRID_LOOP(i, n) dst[i] += load16(src16, i, bf16);
}
}  // namespace

void launchRelu(const void* x, void* y, size_t n, runtime::DType t, cudaStream_t s) {
  launchMap<ReluOp>(x, nullptr, y, n, t, s);
}
void launchReluBackward(const void* y, const void* dy, void* dx, size_t n, runtime::DType t,
                        cudaStream_t s) {
  launchMap<ReluBackwardOp>(y, dy, dx, n, t, s);
}
void launchAdd(const void* a, const void* b, void* out, size_t n, runtime::DType t,
               cudaStream_t s) {
  launchMap<AddOp>(a, b, out, n, t, s);
}

void launchRelu(const float* x, float* y, size_t n, cudaStream_t s) {
  launchRelu(x, y, n, runtime::DType::kFloat32, s);
}
void launchReluBackward(const float* y, const float* dy, float* dx, size_t n, cudaStream_t s) {
  launchReluBackward(y, dy, dx, n, runtime::DType::kFloat32, s);
}
void launchAdd(const float* a, const float* b, float* out, size_t n, cudaStream_t s) {
  launchAdd(a, b, out, n, runtime::DType::kFloat32, s);
}
void launchAddScalar(float* p, float v, cudaStream_t s) {
  addScalarKernel<<<1, 1, 0, s>>>(p, v);
  checkLaunch();
}
void launchScaleCheckFinite(float* data, size_t n, float scale, int* nonFinite, cudaStream_t s) {
  if (!n) return;
  scaleCheckKernel<<<blocksFor(n), kThreads, 0, s>>>(data, n, scale, nonFinite);
  checkLaunch();
}
void launchColumnSum(const void* dy, runtime::DType t, float* db, int64_t rows, int64_t cols,
                     bool accumulate, cudaStream_t s) {
  if (cols <= 0) return;
  byType(t, [&](auto tag) {
    using T = DDPRUN_T(tag);
    columnSumKernel<T><<<rowsBlocks(cols), kThreads, 0, s>>>(static_cast<const T*>(dy), db, rows,
                                                             cols, accumulate);
  });
  checkLaunch();
}
void launchColumnSum(const float* dy, float* db, int64_t rows, int64_t cols, bool accumulate,
                     cudaStream_t s) {
  launchColumnSum(dy, runtime::DType::kFloat32, db, rows, cols, accumulate, s);
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
void launchCompress16(const float* src, void* dst16, size_t n, float scale, bool bf16,
                      cudaStream_t s) {
  if (!n) return;
  compressKernel<<<blocksFor(n), kThreads, 0, s>>>(src, dst16, n, scale, bf16);
  checkLaunch();
}
void launchTo16(const float* src, void* dst16, size_t n, bool bf16, cudaStream_t s) {
  if (!n) return;
  compressKernel<<<blocksFor(n), kThreads, 0, s>>>(src, dst16, n, 1.0f, bf16);  // v * 1 == v
  checkLaunch();
}
void launchFrom16(const void* src16, const float* bias, float* dst, int64_t n, int64_t c,
                  int64_t hw, bool bf16, cudaStream_t s) {
  const size_t total = static_cast<size_t>(n * c * hw);
  if (!total) return;
  from16Kernel<<<blocksFor(total), kThreads, 0, s>>>(src16, bias, dst, total, c, hw, bf16);
  checkLaunch();
}
void launchAccumulate16(const void* src16, float* dst, size_t n, bool bf16, cudaStream_t s) {
  if (!n) return;
  accumulate16Kernel<<<blocksFor(n), kThreads, 0, s>>>(src16, dst, n, bf16);
  checkLaunch();
}
void launchDecompress16(const void* src16, float* dst, size_t n, bool bf16, cudaStream_t s) {
  if (!n) return;
  decompressKernel<<<blocksFor(n), kThreads, 0, s>>>(src16, dst, n, bf16);
  checkLaunch();
}

}  // namespace ddprun::train::cuda
