// The NHWC batch norm's sums (bn_nhwc.h): the batch statistics, the
// backward sums with the residual's gradient, and the statistics' finish.
// Thread mapping and reduction order: bn_nhwc.cu's comment.
#include "bn_nhwc.h"
#include "bn_nhwc_support.cuh"
#include "max_pool.cuh"  // gatherPooledGrad

namespace ddprun::train::cuda {

namespace {
using namespace bn_nhwc;

constexpr int64_t kMaxChunks = 512;
constexpr int64_t kMinChunkRows = 64;
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

// The fused stem's backward sums (launchBnActPoolBackwardSums): row i of x
// is input pixel (img, ii, jj); its pooled gradient is gathered from the
// outputs whose window covers it and whose winning tap it is (in output
// order, in float, rounded to T as the unfused pooling's backward stores it),
// then masked by the activation recomputed as the unfused forward stored it.
template <class T, int V>
struct PoolGradSumsOp {
  static constexpr bool kFloatGroups = true;
  const void *x, *dy;
  const uint8_t* arg;
  void* gOut;
  PoolShape g;
  const float *meanP, *invstdP, *gammaP, *betaP;
  float mean[V], invstd[V], gamma[V], beta[V];
  struct Raw {
    Vec<T, V> x;
  };
  __device__ void init(int64_t ch0) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      mean[k] = meanP[ch0 + k], invstd[k] = invstdP[ch0 + k];
      gamma[k] = gammaP[ch0 + k], beta[k] = betaP[ch0 + k];
    }
  }
  __device__ void load(size_t i, Raw& r) const { r.x = ldv<T, V>(x, i); }
  __device__ void eval(const Raw& r, size_t i, float (&pa)[V], float (&pb)[V]) const {
    const int64_t row = static_cast<int64_t>(i) / g.c, ch0 = static_cast<int64_t>(i) % g.c;
    const int64_t jj = row % g.w, ii = (row / g.w) % g.h, img = row / (g.w * g.h);
    float sum[V];
    gatherPooledGrad<T, V>(dy, arg, g, img, ii, jj, ch0, sum);
    float xv[V];
    toFloats(r.x, xv);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float pooled = toFloat(fromFloat<T>(sum[k]));
      const float act = toFloat(fromFloat<T>(
          kmath::bnActForward(xv[k], mean[k], invstd[k], gamma[k], beta[k], 0.0f, true)));
      pa[k] = kmath::bnActGrad(act, pooled, true);
      pb[k] = kmath::bnXhat(xv[k], mean[k], invstd[k]);
    }
    if (gOut) stv<T, V>(gOut, i, pa);  // exact: g is a stored value or 0
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

void launchBnActPoolBackwardSums(const void* x, const void* dy, const uint8_t* arg, void* gOut,
                                 runtime::DType t, const PoolShape& g, const float* mean,
                                 const float* invstd, const float* gamma, const float* beta,
                                 void* workspace, double* out, cudaStream_t s) {
  const int64_t rows = g.n * g.h * g.w;
  checkShape("launchBnActPoolBackwardSums", rows, g.c);
  byType(t, [&](auto tag) {
    using T = DDPRUN_T(tag);
    withWidth(vectorWidth(g.c, sizeof(T), {x, dy, gOut}), [&](auto vw) {
      constexpr int V = decltype(vw)::value;
      PoolGradSumsOp<T, V> op{x, dy, arg, gOut, g, mean, invstd, gamma, beta, {}, {}, {}, {}};
      launchSums<T, V>(op, rows, g.c, workspace, out, s);
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

}  // namespace ddprun::train::cuda
