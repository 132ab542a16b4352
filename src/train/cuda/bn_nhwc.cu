// The NHWC batch norm kernels; see bn_nhwc.h. Element math comes from
// kernel_math.h (checked on the CPU by kernel_math_test.cc); this file maps
// threads to elements and sums in a fixed order.
//
// Thread mapping (every kernel): a block is 16 x 16 threads; threadIdx.x picks
// a group of V consecutive channels (V = 4, 2 or 1: the widest vector that
// divides c and that every activation pointer is aligned to; 16-bit storage
// then loads 8 bytes a thread, float 16), threadIdx.y a row, so a warp reads
// two (V = 4, c = 64) or more whole rows' worth of consecutive memory:
// coalesced. blockIdx.x tiles the channels (16 * V per tile).
//
// Sums (launchBnNhwcStats, launchBnNhwcBackwardSums): blockIdx.y is a chunk
// of chunkRows(rows) consecutive rows (at most kMaxChunks chunks, at least
// kMinChunkRows rows each: 512 blocks for rows = 128*56*56 at c = 64). Each
// thread sums, in row order, the rows of its chunk congruent to threadIdx.y
// mod 16 (the statistics in double term by term; the backward sums in float
// over the kUnroll rows of one loop step, then in double: kmath::BnGradGroup);
// a fixed tree over threadIdx.y gives the chunk's partial,
// written to the workspace ([chunk][2c]); a second kernel sums the partials
// over the chunks (a fixed strided split of the chunks over 32 threads, then a
// fixed tree). The order depends on rows only (not on V, the device or the
// timing): bitwise reproducible. Loads are issued kUnroll rows at a time
// before their arithmetic (memory-level parallelism).
//
// Memory traffic per element (E = the storage's bytes, 2 or 4):
//   stats:           reads x                               E
//   forward:         reads x (+ z), writes y               2E (3E)
//   backward sums:   reads x, dy (+ y), writes g (if gOut)  2E .. 4E
//   backward data:   reads x, g (or dy (+ y)), writes dx   3E (3E .. 4E)
// plus the per-chunk partials (2c doubles per chunk, under 1% at c = 64).
// Per element the statistics take one float->double conversion and two
// double operations; the backward sums, two float operations (and per group
// of kUnroll rows two conversions and two double adds). Every output is one
// vector store a thread and row (storeWords).
#include "bn_nhwc.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../kernel_math.h"
#include "kernel_support.cuh"

namespace ddprun::train::cuda {

namespace {

constexpr int kBx = 16;  // channel groups per block
constexpr int kBy = 16;  // rows per block
constexpr int kUnroll = 4;
// The backward sums' float groups are the rows of one loop step.
static_assert(kUnroll == kmath::kBnGradGroup, "a float group is one loop step's rows");
constexpr int kMaxV = 4;
constexpr int64_t kMaxChunks = 512;
constexpr int64_t kMinChunkRows = 64;
// The element-wise kernels' row blocks (each thread then loops over rows).
constexpr int64_t kMaxRowBlocks = 1024;
// The chunk reduction: 32 sums x 32 chunk lanes, 16 loads a thread at 512
// chunks (with 8 lanes, 64: the 40 reductions of a ResNet-18 step took
// 0.21 ms, 5 us each, on an H200).
constexpr int kRx = 32, kRy = 32;

int64_t chunkRows(int64_t rows) {
  return std::max(kMinChunkRows, (rows + kMaxChunks - 1) / kMaxChunks);
}
int64_t chunksFor(int64_t rows) {
  return rows <= 0 ? 0 : (rows + chunkRows(rows) - 1) / chunkRows(rows);
}

// V consecutive elements, loaded and stored as one aligned access.
template <class T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};
template <class T, int V>
__device__ Vec<T, V> ldv(const void* p, size_t i) {
  return *reinterpret_cast<const Vec<T, V>*>(static_cast<const T*>(p) + i);
}
// The store is one vector st.global of 32-bit words, written in PTX. A plain
// store of the Vec (or of a uint4/float4 built from it) at p + (row * c + ch)
// compiled to one scalar store per element: nvcc 13.0 splits a vector store
// whose 64-bit index is a product with a run-time value (its PTX: st.global.f32
// x4, .v2.u16 x2), and every output of these kernels (y, g, dx) was written at
// a quarter of the width, four store instructions per 16 or 8 bytes (the SASS:
// STG.E.U16 / STG.E). __stwb/__stcg are not split but come out as strong
// stores (STG.E.64.STRONG.SM/.GPU); this is the plain STG.E.64/.128. The
// asm is volatile (never dropped: it has no outputs) and its "memory" clobber
// keeps it ordered with the kernel's other accesses (y may be x: read before
// written). tests/cuda/ptx_vector_width_test.py checks the PTX
// of every kernel here.
__device__ inline void storeWords(void* q, const unsigned (&w)[4]) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(q), "r"(w[0]), "r"(w[1]),
               "r"(w[2]), "r"(w[3])
               : "memory");
}
__device__ inline void storeWords(void* q, const unsigned (&w)[2]) {
  asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(q), "r"(w[0]), "r"(w[1]) : "memory");
}
__device__ inline void storeWords(void* q, const unsigned (&w)[1]) {
  asm volatile("st.global.u32 [%0], %1;" ::"l"(q), "r"(w[0]) : "memory");
}
template <class T>
__device__ unsigned storedBits(float f) {
  if constexpr (sizeof(T) == 4) {
    return __float_as_uint(f);
  } else {
    const T v = fromFloat<T>(f);
    unsigned short u;
    memcpy(&u, &v, sizeof u);
    return u;
  }
}
template <class T, int V>
__device__ void stv(void* p, size_t i, const float (&f)[V]) {
  T* q = static_cast<T*>(p) + i;
  constexpr int kPerWord = 4 / static_cast<int>(sizeof(T));
  if constexpr (V < kPerWord) {
    *q = fromFloat<T>(f[0]);  // one 16-bit element
  } else {
    constexpr int kWords = V / kPerWord;
    unsigned w[kWords];
#pragma unroll
    for (int j = 0; j < kWords; ++j) {
      if constexpr (kPerWord == 1)
        w[j] = storedBits<T>(f[j]);
      else  // little-endian: the lower address in the low half
        w[j] = storedBits<T>(f[2 * j]) | storedBits<T>(f[2 * j + 1]) << 16;
    }
    storeWords(q, w);
  }
}
template <class T, int V>
__device__ void toFloats(const Vec<T, V>& in, float (&f)[V]) {
#pragma unroll
  for (int k = 0; k < V; ++k) f[k] = toFloat(in.v[k]);
}

// ------------------------------------------------------------ sums
// The per-element terms of the two sums: a += pa, b += double(pa) * pb.
template <class T, int V>
struct StatsOp {
  // x and x^2 in double term by term: the variance is their difference
  // (kmath::bnMomentsFromSums), which float partials would cancel away.
  static constexpr bool kFloatGroups = false;
  const void* x;
  struct Raw {
    Vec<T, V> x;
  };
  __device__ void init(int64_t) {}
  __device__ void load(size_t i, Raw& r) const { r.x = ldv<T, V>(x, i); }
  __device__ void eval(const Raw& r, size_t, float (&pa)[V], float (&pb)[V]) const {
    toFloats(r.x, pa);
#pragma unroll
    for (int k = 0; k < V; ++k) pb[k] = pa[k];
  }
};

template <class T, int V>
struct BackwardSumsOp {
  // g and g * xhat (xhat is centred: no cancellation) in float over the rows
  // of one loop step, then in double (kmath::BnGradGroup).
  static constexpr bool kFloatGroups = true;
  const void *x, *y, *dy;
  void* gOut;
  const float *meanP, *invstdP;
  bool relu;
  float mean[V], invstd[V];
  struct Raw {
    Vec<T, V> x, y, dy;
  };
  __device__ void init(int64_t ch0) {
#pragma unroll
    for (int k = 0; k < V; ++k) mean[k] = meanP[ch0 + k], invstd[k] = invstdP[ch0 + k];
  }
  __device__ void load(size_t i, Raw& r) const {
    r.x = ldv<T, V>(x, i);
    r.dy = ldv<T, V>(dy, i);
    if (relu) r.y = ldv<T, V>(y, i);
  }
  __device__ void eval(const Raw& r, size_t i, float (&pa)[V], float (&pb)[V]) const {
    float xv[V], dyv[V], yv[V];
    toFloats(r.x, xv);
    toFloats(r.dy, dyv);
    if (relu) toFloats(r.y, yv);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      pa[k] = kmath::bnActGrad(relu ? yv[k] : 0.0f, dyv[k], relu);
      pb[k] = kmath::bnXhat(xv[k], mean[k], invstd[k]);
    }
    if (gOut) stv<T, V>(gOut, i, pa);  // exact: g is dy or 0
  }
};

// Partials of one (channel tile, row chunk) block into ws[chunk][2c].
// At least two blocks per multiprocessor: the backward sums' unrolled loads
// and double partials took 141 registers a thread at V = 4 (bf16, sm_90),
// one block of 8 warps per multiprocessor, and on an H200 that kernel ran at
// about 1 TB/s (1.83 ms a ResNet-18 step against PyTorch's 0.69). Capped at
// 128 it needs 116, without spills (ptxas -v; also with the float groups).
constexpr int kSumsMinBlocks = 2;
template <class T, int V, class Op>
__global__ void __launch_bounds__(kBx* kBy, kSumsMinBlocks)
    partialSumsKernel(Op op, int64_t rows, int64_t c, int64_t chunkRows, double* ws) {
  __shared__ double sa[kBy][kBx * kMaxV], sb[kBy][kBx * kMaxV];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t ch0 = (blockIdx.x * static_cast<int64_t>(kBx) + tx) * V;
  const bool active = ch0 < c;
  const int64_t r0 = blockIdx.y * chunkRows;
  const int64_t r1 = rows < r0 + chunkRows ? rows : r0 + chunkRows;
  double a[V], b[V];
#pragma unroll
  for (int k = 0; k < V; ++k) a[k] = 0.0, b[k] = 0.0;
  if (active) {
    op.init(ch0);
    for (int64_t r = r0 + ty; r < r1; r += kBy * kUnroll) {
      typename Op::Raw raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t rr = r + u * kBy;
        if (rr < r1) op.load(static_cast<size_t>(rr * c + ch0), raw[u]);
      }
      kmath::BnGradGroup group[V];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t rr = r + u * kBy;
        if (rr >= r1) break;
        float pa[V], pb[V];
        op.eval(raw[u], static_cast<size_t>(rr * c + ch0), pa, pb);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          if constexpr (Op::kFloatGroups) {
            group[k].add(pa[k], pb[k]);
          } else {
            a[k] += pa[k];
            b[k] += static_cast<double>(pa[k]) * static_cast<double>(pb[k]);
          }
        }
      }
      if constexpr (Op::kFloatGroups) {
#pragma unroll
        for (int k = 0; k < V; ++k) group[k].flush(a[k], b[k]);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) sa[ty][tx * V + k] = a[k], sb[ty][tx * V + k] = b[k];
  __syncthreads();
  for (int s = kBy / 2; s > 0; s >>= 1) {
    if (ty < s) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        sa[ty][tx * V + k] += sa[ty + s][tx * V + k];
        sb[ty][tx * V + k] += sb[ty + s][tx * V + k];
      }
    }
    __syncthreads();
  }
  if (ty == 0 && active) {
    double* w = ws + blockIdx.y * 2 * c;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      w[ch0 + k] = sa[0][tx * V + k];
      w[c + ch0 + k] = sb[0][tx * V + k];
    }
  }
}

// out[j] = sum over chunks of ws[chunk][j] for j < 2c (fixed order); out[2c] = rows.
__global__ void __launch_bounds__(kRx* kRy)
    chunkSumsKernel(const double* ws, int64_t chunks, int64_t c, int64_t rows, double* out) {
  __shared__ double s[kRy][kRx];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t n2 = 2 * c;
  const int64_t j = blockIdx.x * static_cast<int64_t>(kRx) + tx;
  double v = 0.0;
  if (j < n2)
    for (int64_t k = ty; k < chunks; k += kRy) v += ws[k * n2 + j];
  s[ty][tx] = v;
  __syncthreads();
  for (int w = kRy / 2; w > 0; w >>= 1) {
    if (ty < w) s[ty][tx] += s[ty + w][tx];
    __syncthreads();
  }
  if (ty == 0 && j < n2) out[j] = s[0][tx];
  if (blockIdx.x == 0 && tx == 0 && ty == 0) out[n2] = static_cast<double>(rows);
}

// ------------------------------------------------------- element-wise
template <class T, int V>
__global__ void __launch_bounds__(kBx* kBy)
    forwardKernel(const void* x, const void* z, void* y, int64_t rows, int64_t c,
                  const float* meanP, const float* invstdP, const float* gammaP,
                  const float* betaP, bool relu) {
  const int64_t ch0 = (blockIdx.x * static_cast<int64_t>(kBx) + threadIdx.x) * V;
  if (ch0 >= c) return;
  float mean[V], invstd[V], gamma[V], beta[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    mean[k] = meanP[ch0 + k], invstd[k] = invstdP[ch0 + k];
    gamma[k] = gammaP[ch0 + k], beta[k] = betaP[ch0 + k];
  }
  const int64_t stride = static_cast<int64_t>(gridDim.y) * kBy;
  for (int64_t r = blockIdx.y * static_cast<int64_t>(kBy) + threadIdx.y; r < rows;
       r += stride * kUnroll) {
    Vec<T, V> xr[kUnroll], zr[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t rr = r + u * stride;
      if (rr < rows) {
        xr[u] = ldv<T, V>(x, static_cast<size_t>(rr * c + ch0));
        if (z) zr[u] = ldv<T, V>(z, static_cast<size_t>(rr * c + ch0));
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t rr = r + u * stride;
      if (rr >= rows) break;
      float xv[V], zv[V], out[V];
      toFloats(xr[u], xv);
      if (z) {
        toFloats(zr[u], zv);
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) zv[k] = 0.0f;
      }
#pragma unroll
      for (int k = 0; k < V; ++k)
        out[k] = kmath::bnActForward(xv[k], mean[k], invstd[k], gamma[k], beta[k], zv[k], relu);
      stv<T, V>(y, static_cast<size_t>(rr * c + ch0), out);
    }
  }
}

template <class T, int V>
__global__ void __launch_bounds__(kBx* kBy)
    backwardDataKernel(const void* x, const void* y, const void* dy, const void* g, void* dx,
                       int64_t rows, int64_t c, const double* sums, const float* gammaP,
                       const float* meanP, const float* invstdP, bool relu) {
  const int64_t ch0 = (blockIdx.x * static_cast<int64_t>(kBx) + threadIdx.x) * V;
  if (ch0 >= c) return;
  const double m = sums[2 * c];
  float mean[V], invstd[V];
  kmath::BnBackwardCoefs coef[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t ch = ch0 + k;
    mean[k] = meanP[ch], invstd[k] = invstdP[ch];
    coef[k] = kmath::bnBackwardCoefs(sums[ch], sums[c + ch], m, gammaP[ch], invstd[k]);
  }
  const bool useY = !g && relu;
  const int64_t stride = static_cast<int64_t>(gridDim.y) * kBy;
  for (int64_t r = blockIdx.y * static_cast<int64_t>(kBy) + threadIdx.y; r < rows;
       r += stride * kUnroll) {
    Vec<T, V> xr[kUnroll], gr[kUnroll], yr[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t rr = r + u * stride;
      if (rr < rows) {
        const size_t i = static_cast<size_t>(rr * c + ch0);
        xr[u] = ldv<T, V>(x, i);
        gr[u] = ldv<T, V>(g ? g : dy, i);
        if (useY) yr[u] = ldv<T, V>(y, i);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t rr = r + u * stride;
      if (rr >= rows) break;
      float xv[V], gv[V], yv[V], out[V];
      toFloats(xr[u], xv);
      toFloats(gr[u], gv);
      if (useY) toFloats(yr[u], yv);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float gk = useY ? kmath::bnActGrad(yv[k], gv[k], true)
                              : (g ? gv[k] : kmath::bnActGrad(0.0f, gv[k], false));
        out[k] = kmath::bnActBackwardData(xv[k], gk, mean[k], invstd[k], coef[k]);
      }
      stv<T, V>(dx, static_cast<size_t>(rr * c + ch0), out);
    }
  }
}

// ------------------------------------------------------- per channel
__global__ void finishKernel(const double* sums, int64_t c, double eps, double momentum,
                             float* mean, float* invstd, float* runningMean, float* runningVar) {
  const int64_t ch = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (ch >= c) return;
  const double count = sums[2 * c];
  const kmath::BnMoments mo = kmath::bnMomentsFromSums(sums[ch], sums[c + ch], count);
  mean[ch] = static_cast<float>(mo.mean);
  invstd[ch] = kmath::bnInvStd(mo.var, eps);
  if (runningMean && count > 0)
    kmath::bnRunningUpdate(runningMean[ch], runningVar[ch], mo.mean, mo.var, count, momentum);
}
__global__ void invStdKernel(const float* var, int64_t c, double eps, float* invstd) {
  const int64_t ch = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (ch < c) invstd[ch] = kmath::bnInvStd(var[ch], eps);
}

// ------------------------------------------------------- dispatch
// The widest V in {4, 2, 1} dividing c with every non-null pointer aligned to V elements.
int vectorWidth(int64_t c, size_t elem, std::initializer_list<const void*> ptrs) {
  for (int v : {4, 2}) {
    if (c % v != 0) continue;
    bool ok = true;
    for (const void* p : ptrs)
      if (p && reinterpret_cast<uintptr_t>(p) % (elem * v) != 0) ok = false;
    if (ok) return v;
  }
  return 1;
}
template <class F>
void withWidth(int v, F&& f) {
  if (v == 4)
    f(std::integral_constant<int, 4>{});
  else if (v == 2)
    f(std::integral_constant<int, 2>{});
  else
    f(std::integral_constant<int, 1>{});
}
unsigned channelTiles(int64_t c, int v) {
  return static_cast<unsigned>((c / v + kBx - 1) / kBx);
}
unsigned rowBlocks(int64_t rows) {
  return static_cast<unsigned>(
      std::min<int64_t>((rows + kBy * kUnroll - 1) / (kBy * kUnroll), kMaxRowBlocks));
}
void checkShape(const char* what, int64_t rows, int64_t c) {
  DDPRUN_CHECK(rows >= 0 && c >= 0, what, ": rows (", rows, ") and channels (", c,
               ") must not be negative");
}

// The partial sums of `op` (V wide) then the chunk reduction into out.
template <class T, int V, class Op>
void launchSums(const Op& op, int64_t rows, int64_t c, void* workspace, double* out,
                cudaStream_t s) {
  const int64_t chunks = (rows > 0 && c > 0) ? chunksFor(rows) : 0;
  if (chunks > 0) {
    const dim3 grid(channelTiles(c, V), static_cast<unsigned>(chunks));
    partialSumsKernel<T, V, Op><<<grid, dim3(kBx, kBy), 0, s>>>(
        op, rows, c, chunkRows(rows), static_cast<double*>(workspace));
    checkLaunch();
  }
  const unsigned blocks = static_cast<unsigned>(std::max<int64_t>(1, (2 * c + kRx - 1) / kRx));
  chunkSumsKernel<<<blocks, dim3(kRx, kRy), 0, s>>>(static_cast<const double*>(workspace),
                                                     chunks, c, rows, out);
  checkLaunch();
}

}  // namespace

size_t bnNhwcWorkspaceBytes(int64_t rows, int64_t c) {
  if (rows <= 0 || c <= 0) return 0;
  return static_cast<size_t>(chunksFor(rows)) * 2 * static_cast<size_t>(c) * sizeof(double);
}

void launchBnNhwcStats(const void* x, runtime::DType t, int64_t rows, int64_t c,
                       void* workspace, double* out, cudaStream_t s) {
  checkShape("launchBnNhwcStats", rows, c);
  byType(t, [&](auto tag) {
    using T = DDPRUN_T(tag);
    withWidth(vectorWidth(c, sizeof(T), {x}), [&](auto vw) {
      constexpr int V = decltype(vw)::value;
      launchSums<T, V>(StatsOp<T, V>{x}, rows, c, workspace, out, s);
    });
  });
}

void launchBnNhwcBackwardSums(const void* x, const void* y, const void* dy, void* gOut,
                              runtime::DType t, int64_t rows, int64_t c, const float* mean,
                              const float* invstd, bool relu, void* workspace, double* out,
                              cudaStream_t s) {
  checkShape("launchBnNhwcBackwardSums", rows, c);
  DDPRUN_CHECK(!relu || y || rows == 0 || c == 0,
               "launchBnNhwcBackwardSums: the ReLU's backward needs its output y");
  byType(t, [&](auto tag) {
    using T = DDPRUN_T(tag);
    withWidth(vectorWidth(c, sizeof(T), {x, relu ? y : nullptr, dy, gOut}), [&](auto vw) {
      constexpr int V = decltype(vw)::value;
      BackwardSumsOp<T, V> op{x, y, dy, gOut, mean, invstd, relu, {}, {}};
      launchSums<T, V>(op, rows, c, workspace, out, s);
    });
  });
}

void launchBnNhwcFinish(const double* sums, int64_t c, double eps, double momentum, float* mean,
                        float* invstd, float* runningMean, float* runningVar, cudaStream_t s) {
  DDPRUN_CHECK(!runningMean == !runningVar,
               "launchBnNhwcFinish: give both running statistics or neither");
  if (c <= 0) return;
  finishKernel<<<static_cast<unsigned>((c + 255) / 256), 256, 0, s>>>(
      sums, c, eps, momentum, mean, invstd, runningMean, runningVar);
  checkLaunch();
}

void launchBnNhwcInvStd(const float* var, int64_t c, double eps, float* invstd, cudaStream_t s) {
  if (c <= 0) return;
  invStdKernel<<<static_cast<unsigned>((c + 255) / 256), 256, 0, s>>>(var, c, eps, invstd);
  checkLaunch();
}

void launchBnNhwcForward(const void* x, const void* z, void* y, runtime::DType t, int64_t rows,
                         int64_t c, const float* mean, const float* invstd, const float* gamma,
                         const float* beta, bool relu, cudaStream_t s) {
  checkShape("launchBnNhwcForward", rows, c);
  byType(t, [&](auto tag) {
    using T = DDPRUN_T(tag);
    if (rows == 0 || c == 0) return;
    withWidth(vectorWidth(c, sizeof(T), {x, z, y}), [&](auto vw) {
      constexpr int V = decltype(vw)::value;
      const dim3 grid(channelTiles(c, V), rowBlocks(rows));
      forwardKernel<T, V><<<grid, dim3(kBx, kBy), 0, s>>>(x, z, y, rows, c, mean, invstd, gamma,
                                                          beta, relu);
      checkLaunch();
    });
  });
}

void launchBnNhwcBackwardData(const void* x, const void* y, const void* dy, const void* g,
                              void* dx, runtime::DType t, int64_t rows, int64_t c,
                              const double* sums, const float* gamma, const float* mean,
                              const float* invstd, bool relu, cudaStream_t s) {
  checkShape("launchBnNhwcBackwardData", rows, c);
  DDPRUN_CHECK(g || !relu || y || rows == 0 || c == 0,
               "launchBnNhwcBackwardData: without g, the ReLU's backward needs its output y");
  byType(t, [&](auto tag) {
    using T = DDPRUN_T(tag);
    if (rows == 0 || c == 0) return;
    const void* yUsed = !g && relu ? y : nullptr;
    const void* dyUsed = g ? nullptr : dy;
    withWidth(vectorWidth(c, sizeof(T), {x, yUsed, dyUsed, g, dx}), [&](auto vw) {
      constexpr int V = decltype(vw)::value;
      const dim3 grid(channelTiles(c, V), rowBlocks(rows));
      backwardDataKernel<T, V><<<grid, dim3(kBx, kBy), 0, s>>>(
          x, yUsed, dyUsed, g, dx, rows, c, sums, gamma, mean, invstd, relu);
      checkLaunch();
    });
  });
}

}  // namespace ddprun::train::cuda
