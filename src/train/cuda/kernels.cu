// The CUDA backend's own kernels; see kernels.h. Element math comes from
// kernel_math.h (shared with the CPU tests); these files only map threads to
// elements. Reductions run in a fixed order (per-thread strided partial sums,
// then a fixed tree), so results are bitwise reproducible run to run.
#include "kernels.h"

#include <algorithm>
#include <cstdint>

#include "../kernel_math.h"
#include "kernel_support.cuh"

namespace ddprun::train::cuda {

namespace {
// Sum of `v` over the block (kThreads threads), valid in thread 0. Fixed tree.
__device__ double blockSum(double v) {
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

// ------------------------------------------------------------- optimizers
// The multi-tensor step. Chunk j owns blocks [first, first + ceil(n / kElemsPerBlock)) of the
// grid; a block finds its chunk by binary search over `first` (at most 64 entries, in the
// kernel's parameter bank) and updates kElemsPerBlock consecutive elements of it, each thread
// every kThreads-th one.
constexpr size_t kElemsPerBlock = 4 * kThreads;
struct MultiEntry {
  OptimChunk c;
  size_t first = 0;  // the chunk's first block
};
struct MultiTable {
  MultiEntry e[kMaxOptimChunks];
  int count = 0;
};
// Kernel parameters are limited to 4 KiB (before CUDA 12.1; sm_70+ allow more
// since, but 4 KiB needs no driver check): the table plus a few scalars.
static_assert(sizeof(MultiTable) + 64 <= 4096, "the chunk table must fit a kernel's parameters");


// The last entry whose first block <= block.
__device__ int entryOf(const MultiTable& t, size_t block) {
  int lo = 0, hi = t.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t.e[mid].first <= block) lo = mid; else hi = mid - 1;
  }
  return lo;
}

struct SgdOp {
  float lr, momentum, wd;
  bool first, nesterov;
  __device__ float operator()(const OptimChunk& c, size_t i) const {
    float w = c.w[i], buf = c.s1 ? c.s1[i] : 0.0f;
    kmath::sgdStep(w, c.g[i], buf, lr, momentum, wd, first, nesterov);
    c.w[i] = w;
    if (c.s1) c.s1[i] = buf;
    return w;
  }
};
struct AdamOp {
  kmath::AdamScalars s;
  float b1, b2, eps, wd;
  __device__ float operator()(const OptimChunk& c, size_t i) const {
    float w = c.w[i], m = c.s1[i], v = c.s2[i];
    kmath::adamStep(w, c.g[i], m, v, s, b1, b2, eps, wd);
    c.w[i] = w;
    c.s1[i] = m;
    c.s2[i] = v;
    return w;
  }
};

// __grid_constant__: the table stays in the parameter bank (read by index,
// never copied per thread to local memory).
template <class Op>
__global__ void multiStepKernel(const __grid_constant__ MultiTable t, Op op, bool bf16) {
  const int j = entryOf(t, blockIdx.x);
  const OptimChunk c = t.e[j].c;
  const size_t base = (blockIdx.x - t.e[j].first) * kElemsPerBlock;
  for (size_t k = threadIdx.x; k < kElemsPerBlock; k += kThreads) {
    const size_t i = base + k;
    if (i >= c.n) break;
    const float w = op(c, i);
    if (c.w16) store16(c.w16, i, w, bf16);
  }
}

// ---------------------------------------------------------- cross-entropy
__global__ void crossEntropyRowsKernel(const float* logits, const int32_t* labels, int64_t n,
                                       int64_t k, float* dlogits, float gradScale, float eps,
                                       double* rowLoss, int* rowHit) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float* z = logits + i * k;
  const int32_t y = labels[i];
  const kmath::CeRow r = kmath::crossEntropyRow(z, k);
  rowLoss[i] = kmath::crossEntropyLoss(z, r, y, eps, k);
  rowHit[i] = r.arg == y;
  if (dlogits) {
    float* d = dlogits + i * k;
    for (int64_t j = 0; j < k; ++j)
      d[j] = kmath::crossEntropyGrad(z[j], r.lse, j == y, n, gradScale, eps, k);
  }
}
__global__ void crossEntropyReduceKernel(const double* rowLoss, const int* rowHit, int64_t n,
                                         CeResult* out) {
  double loss = 0.0, hits = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    loss += rowLoss[i];
    hits += rowHit[i];
  }
  loss = blockSum(loss);
  hits = blockSum(hits);
  if (threadIdx.x == 0) {
    out->lossSum = loss;
    out->correct = static_cast<long long>(hits);
  }
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

// ------------------------------------------------------- pooling, resize
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

// ------------------------------------------------------ sync batch norm
// One block per channel; the (n, hw) elements of channel ch.
__global__ void channelSumKernel(const float* x, int64_t n, int64_t c, int64_t hw, double* out) {
  const int64_t ch = blockIdx.x;
  double s = 0.0;
  for (int64_t e = threadIdx.x; e < n * hw; e += blockDim.x)
    s += x[((e / hw) * c + ch) * hw + e % hw];
  s = blockSum(s);
  if (threadIdx.x == 0) {
    out[ch] = s;
    if (ch == 0) out[c] = static_cast<double>(n * hw);
  }
}
__global__ void channelSqDevKernel(const float* x, int64_t n, int64_t c, int64_t hw,
                                   const double* sums, double* out) {
  const int64_t ch = blockIdx.x;
  const double mean = sums[ch] / sums[c];
  double s = 0.0;
  for (int64_t e = threadIdx.x; e < n * hw; e += blockDim.x) {
    const double d = x[((e / hw) * c + ch) * hw + e % hw] - mean;
    s += d * d;
  }
  s = blockSum(s);
  if (threadIdx.x == 0) out[ch] = s;
}
__global__ void bnFinishStatsKernel(const double* sums, const double* sqdev, int64_t c,
                                    double eps, double momentum, float* mean, float* invstd,
                                    float* runningMean, float* runningVar) {
  const int64_t ch = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (ch >= c) return;
  const double count = sums[c];
  const double mu = sums[ch] / count, var = sqdev[ch] / count;
  mean[ch] = static_cast<float>(mu);
  invstd[ch] = kmath::bnInvStd(var, eps);
  if (runningMean)
    kmath::bnRunningUpdate(runningMean[ch], runningVar[ch], mu, var, count, momentum);
}
__global__ void bnNormalizeKernel(const float* x, const float* mean, const float* invstd,
                                  const float* gamma, const float* beta, float* xhat, float* y,
                                  int64_t n, int64_t c, int64_t hw) {
  const size_t total = static_cast<size_t>(n * c * hw);
  DDPRUN_GRID_LOOP(i, total) {
    const int64_t ch = static_cast<int64_t>(i / hw) % c;
    const float xh = kmath::bnXhat(x[i], mean[ch], invstd[ch]);
    xhat[i] = xh;
    y[i] = kmath::bnOut(xh, gamma[ch], beta[ch]);
  }
}
__global__ void bnBackwardSumsKernel(const float* dy, const float* xhat, int64_t n, int64_t c,
                                     int64_t hw, double* out) {
  const int64_t ch = blockIdx.x;
  double s1 = 0.0, s2 = 0.0;
  for (int64_t e = threadIdx.x; e < n * hw; e += blockDim.x) {
    const int64_t idx = ((e / hw) * c + ch) * hw + e % hw;
    const float g = dy[idx];
    s1 += g;
    s2 += static_cast<double>(g) * xhat[idx];
  }
  s1 = blockSum(s1);
  s2 = blockSum(s2);
  if (threadIdx.x == 0) {
    out[ch] = s1;
    out[c + ch] = s2;
    if (ch == 0) out[2 * c] = static_cast<double>(n * hw);
  }
}
__global__ void bnParamGradsKernel(const double* sums, int64_t c, float* dgamma, float* dbeta,
                                   bool overwriteGamma, bool overwriteBeta) {
  const int64_t ch = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (ch >= c) return;
  const float g = static_cast<float>(sums[c + ch]), b = static_cast<float>(sums[ch]);
  dgamma[ch] = overwriteGamma ? g : dgamma[ch] + g;
  dbeta[ch] = overwriteBeta ? b : dbeta[ch] + b;
}
__global__ void bnBackwardDataKernel(const float* dy, const float* xhat, const double* sums,
                                     const float* gamma, const float* invstd, float* dx, int64_t n,
                                     int64_t c, int64_t hw) {
  const size_t total = static_cast<size_t>(n * c * hw);
  const double m = sums[2 * c];
  DDPRUN_GRID_LOOP(i, total) {
    const int64_t ch = static_cast<int64_t>(i / hw) % c;
    const float k1 = static_cast<float>(sums[ch] / m), k2 = static_cast<float>(sums[c + ch] / m);
    dx[i] = kmath::bnBackward(dy[i], xhat[i], gamma[ch] * invstd[ch], k1, k2);
  }
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

int rowsBlocks(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }
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
namespace {
// Fills tables of up to kMaxOptimChunks non-empty chunks and launches each.
// A grid's x dimension holds 2^31 - 1 blocks: a table closes before that.
template <class Op>
void launchMulti(const OptimChunk* chunks, size_t count, const Op& op, bool bf16,
                 cudaStream_t s) {
  constexpr size_t kMaxBlocks = (size_t{1} << 31) - 1;
  MultiTable t;
  size_t blocks = 0;
  auto flush = [&] {
    if (t.count == 0) return;
    multiStepKernel<Op><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(t, op, bf16);
    checkLaunch();
    t.count = 0;
    blocks = 0;
  };
  for (size_t j = 0; j < count; ++j) {
    const OptimChunk& c = chunks[j];
    if (c.n == 0) continue;
    const size_t need = (c.n + kElemsPerBlock - 1) / kElemsPerBlock;
    if (need > kMaxBlocks)
      DDPRUN_THROW(::ddprun::InvalidArgument, "an optimizer chunk of ", c.n,
                   " elements is larger than one launch covers; split it");
    if (t.count == static_cast<int>(kMaxOptimChunks) || blocks + need > kMaxBlocks) flush();
    t.e[t.count++] = {c, blocks};
    blocks += need;
  }
  flush();
}
}  // namespace

// One parameter is a table of one chunk: the same kernel as the flat layout's,
// so per-parameter and flat steps agree bitwise (two kernels compiled from the
// same element math may still contract a*b+c into FMAs differently: seen on
// an H100, Adam's exp_avg differed in the last bit).
void launchSgd(float* w, const float* g, float* buf, size_t n, float lr, float momentum, float wd,
               bool first, bool nesterov, cudaStream_t s) {
  const OptimChunk c{w, g, buf, nullptr, nullptr, n};
  launchMulti(&c, 1, SgdOp{lr, momentum, wd, first, nesterov}, false, s);
}
void launchAdam(float* w, const float* g, float* m, float* v, size_t n, kmath::AdamScalars sc,
                float b1, float b2, float eps, float wd, cudaStream_t s) {
  const OptimChunk c{w, g, m, v, nullptr, n};
  launchMulti(&c, 1, AdamOp{sc, b1, b2, eps, wd}, false, s);
}

void launchSgdMulti(const OptimChunk* chunks, size_t count, float lr, float momentum, float wd,
                    bool first, bool nesterov, bool bf16, cudaStream_t s) {
  launchMulti(chunks, count, SgdOp{lr, momentum, wd, first, nesterov}, bf16, s);
}
void launchAdamMulti(const OptimChunk* chunks, size_t count, kmath::AdamScalars sc, float b1,
                     float b2, float eps, float wd, bool bf16, cudaStream_t s) {
  for (size_t j = 0; j < count; ++j)
    DDPRUN_CHECK(chunks[j].n == 0 || (chunks[j].s1 && chunks[j].s2),
                 "Adam's chunk ", j, " lacks its exp_avg or exp_avg_sq buffer");
  launchMulti(chunks, count, AdamOp{sc, b1, b2, eps, wd}, bf16, s);
}
namespace {
__global__ void accumulateLossKernel(const CeResult* r, double* acc) { *acc += r->lossSum; }
}  // namespace

void launchAccumulateLoss(const CeResult* r, double* acc, cudaStream_t s) {
  accumulateLossKernel<<<1, 1, 0, s>>>(r, acc);
  DDPRUN_CUDA_OK(cudaGetLastError());
}

void launchCrossEntropy(const float* logits, const int32_t* labels, int64_t n, int64_t k,
                        float* dlogits, float gradScale, float labelSmoothing, double* rowLoss,
                        int* rowHit, CeResult* out, cudaStream_t s) {
  if (n > 0) {
    crossEntropyRowsKernel<<<rowsBlocks(n), kThreads, 0, s>>>(
        logits, labels, n, k, dlogits, gradScale, labelSmoothing, rowLoss, rowHit);
    checkLaunch();
  }
  crossEntropyReduceKernel<<<1, kThreads, 0, s>>>(rowLoss, rowHit, n, out);
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
void launchResizeBilinear(const float* x, float* y, int64_t planes, int64_t h, int64_t w,
                          int64_t oh, int64_t ow, cudaStream_t s) {
  const size_t n = static_cast<size_t>(planes * oh * ow);
  if (!n) return;
  resizeKernel<<<blocksFor(n), kThreads, 0, s>>>(x, y, planes, h, w, oh, ow);
  checkLaunch();
}
void launchChannelSum(const float* x, int64_t n, int64_t c, int64_t hw, double* out,
                      cudaStream_t s) {
  if (c <= 0) return;
  channelSumKernel<<<static_cast<int>(c), kThreads, 0, s>>>(x, n, c, hw, out);
  checkLaunch();
}
void launchChannelSquaredDeviation(const float* x, int64_t n, int64_t c, int64_t hw,
                                   const double* sums, double* out, cudaStream_t s) {
  if (c <= 0) return;
  channelSqDevKernel<<<static_cast<int>(c), kThreads, 0, s>>>(x, n, c, hw, sums, out);
  checkLaunch();
}
void launchBnFinishStats(const double* sums, const double* sqdev, int64_t c, double eps,
                         double momentum, float* mean, float* invstd, float* runningMean,
                         float* runningVar, cudaStream_t s) {
  if (c <= 0) return;
  bnFinishStatsKernel<<<rowsBlocks(c), kThreads, 0, s>>>(sums, sqdev, c, eps, momentum, mean,
                                                         invstd, runningMean, runningVar);
  checkLaunch();
}
void launchBnNormalize(const float* x, const float* mean, const float* invstd,
                       const float* gamma, const float* beta, float* xhat, float* y, int64_t n,
                       int64_t c, int64_t hw, cudaStream_t s) {
  const size_t total = static_cast<size_t>(n * c * hw);
  if (!total) return;
  bnNormalizeKernel<<<blocksFor(total), kThreads, 0, s>>>(x, mean, invstd, gamma, beta, xhat, y,
                                                          n, c, hw);
  checkLaunch();
}
void launchBnBackwardSums(const float* dy, const float* xhat, int64_t n, int64_t c, int64_t hw,
                          double* out, cudaStream_t s) {
  if (c <= 0) return;
  bnBackwardSumsKernel<<<static_cast<int>(c), kThreads, 0, s>>>(dy, xhat, n, c, hw, out);
  checkLaunch();
}
void launchBnParamGrads(const double* sums, int64_t c, float* dgamma, float* dbeta,
                        cudaStream_t s) {
  launchBnParamGrads(sums, c, dgamma, dbeta, false, false, s);
}
void launchBnParamGrads(const double* sums, int64_t c, float* dgamma, float* dbeta,
                        bool overwriteGamma, bool overwriteBeta, cudaStream_t s) {
  if (c <= 0) return;
  bnParamGradsKernel<<<rowsBlocks(c), kThreads, 0, s>>>(sums, c, dgamma, dbeta, overwriteGamma,
                                                        overwriteBeta);
  checkLaunch();
}
void launchBnBackwardData(const float* dy, const float* xhat, const double* sums,
                          const float* gamma, const float* invstd, float* dx, int64_t n, int64_t c,
                          int64_t hw, cudaStream_t s) {
  const size_t total = static_cast<size_t>(n * c * hw);
  if (!total) return;
  bnBackwardDataKernel<<<blocksFor(total), kThreads, 0, s>>>(dy, xhat, sums, gamma, invstd, dx, n,
                                                             c, hw);
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
