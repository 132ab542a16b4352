// The CUDA backend's optimizer kernels (optim_kernels.h): SGD and Adam as
// multi-tensor steps over chunk tables. Element math from kernel_math.h.
#include "optim_kernels.h"

#include <algorithm>
#include <cstdint>

#include "../kernel_math.h"
#include "kernel_support.cuh"

namespace ddprun::train::cuda {

namespace {
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

// Each op holds its per-step scalars by value and, when `step` is not null,
// takes them from device memory at the kernel's start (resolved()).
struct SgdOp {
  float lr, momentum, wd;
  bool first, nesterov;
  const OptimStepScalars* step = nullptr;
  __device__ SgdOp resolved() const {
    SgdOp o = *this;
    if (step) {
      o.lr = step->lr;
      o.first = step->first != 0;
    }
    return o;
  }
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
  const OptimStepScalars* step = nullptr;
  __device__ AdamOp resolved() const {
    AdamOp o = *this;
    if (step) o.s = step->adam;
    return o;
  }
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
__global__ void multiStepKernel(const __grid_constant__ MultiTable t, Op given, bool bf16) {
  const Op op = given.resolved();
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
                    bool first, bool nesterov, bool bf16, cudaStream_t s,
                    const OptimStepScalars* step) {
  launchMulti(chunks, count, SgdOp{lr, momentum, wd, first, nesterov, step}, bf16, s);
}
void launchAdamMulti(const OptimChunk* chunks, size_t count, kmath::AdamScalars sc, float b1,
                     float b2, float eps, float wd, bool bf16, cudaStream_t s,
                     const OptimStepScalars* step) {
  for (size_t j = 0; j < count; ++j)
    DDPRUN_CHECK(chunks[j].n == 0 || (chunks[j].s1 && chunks[j].s2),
                 "Adam's chunk ", j, " lacks its exp_avg or exp_avg_sq buffer");
  launchMulti(chunks, count, AdamOp{sc, b1, b2, eps, wd, step}, bf16, s);
}

}  // namespace ddprun::train::cuda
