// The NHWC batch norm's sums (bn_nhwc.h): the batch statistics, the
// backward sums with the residual's gradient, and the statistics' finish;
// unfolded (partials, chunk reduction, epilogue: a launch each) or folded
// into one launch (BnFold). Thread mapping and reduction order: bn_nhwc.cu's
// comment.
#include "bn_nchw.h"  // launchBnParamGrads
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
static_assert(kRy == kmath::kBnChunkLanes, "a lane of the chunk reduction is a row of threads");

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
using SumsTile = double[kBy][kBx * kMaxV];
template <class T, int V, class Op>
__device__ __forceinline__ void blockPartials(Op& op, int64_t rows, int64_t c, int64_t chunkRows,
                                              double* ws, SumsTile& sa, SumsTile& sb) {
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
template <class T, int V, class Op>
__global__ void __launch_bounds__(kBx* kBy, kSumsMinBlocks)
    partialSumsKernel(Op op, int64_t rows, int64_t c, int64_t chunkRows, double* ws) {
  gridDependencyStart();  // may run under PDL (launch_stream.h)
  __shared__ SumsTile sa, sb;
  blockPartials<T, V, Op>(op, rows, c, chunkRows, ws, sa, sb);
}

// out[j] = sum over chunks of ws[chunk][j] for j < 2c (fixed order); out[2c] = rows.
__global__ void __launch_bounds__(kRx* kRy)
    chunkSumsKernel(const double* ws, int64_t chunks, int64_t c, int64_t rows, double* out) {
  gridDependencyStart();  // may run under PDL (launch_stream.h)
  __shared__ double s[kRy][kRx];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t n2 = 2 * c;
  const int64_t j = blockIdx.x * static_cast<int64_t>(kRx) + tx;
  s[ty][tx] = j < n2 ? kmath::bnChunkLaneSum([&](int64_t k) { return ws[k * n2 + j]; }, chunks, ty)
                     : 0.0;
  __syncthreads();
  for (int w = kRy / 2; w > 0; w >>= 1) {
    if (ty < w) s[ty][tx] += s[ty + w][tx];
    __syncthreads();
  }
  if (ty == 0 && j < n2) out[j] = s[0][tx];
  if (blockIdx.x == 0 && tx == 0 && ty == 0) out[n2] = static_cast<double>(rows);
}

// ------------------------------------------------------- per channel
__device__ __forceinline__ void finishChannel(double sum, double sumSq, double count, int64_t ch,
                                              double eps, double momentum, float* mean,
                                              float* invstd, float* runningMean,
                                              float* runningVar) {
  const kmath::BnMoments mo = kmath::bnMomentsFromSums(sum, sumSq, count);
  mean[ch] = static_cast<float>(mo.mean);
  invstd[ch] = kmath::bnInvStd(mo.var, eps);
  if (runningMean && count > 0)
    kmath::bnRunningUpdate(runningMean[ch], runningVar[ch], mo.mean, mo.var, count, momentum);
}
__global__ void finishKernel(const double* sums, int64_t c, double eps, double momentum,
                             float* mean, float* invstd, float* runningMean, float* runningVar) {
  gridDependencyStart();  // may run under PDL (launch_stream.h)
  const int64_t ch = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (ch >= c) return;
  finishChannel(sums[ch], sums[c + ch], sums[2 * c], ch, eps, momentum, mean, invstd,
                runningMean, runningVar);
}

// ------------------------------------------------------------ folded
// The tile's last block: its 2 * kBx * V columns of the chunks' partials
// reduced kFoldCols at a time, kmath::kBnChunkLanes lanes a column (each
// thread kBnChunkLanes / kFoldGroups of them) and the lanes' tree in shared
// memory: chunkSumsKernel's order. Partials written by other blocks are read
// through L2 (__ldcg: this multiprocessor's L1 may hold lines of them read
// by another tile's last block). Then the epilogue, a thread a channel.
constexpr int kFoldCols = 32, kFoldGroups = kBx * kBy / kFoldCols;
static_assert(kFoldCols * kmath::kBnChunkLanes <= kBy * kBx * kMaxV,
              "the fold's lanes fit in one sums tile");
template <int V>
__device__ void foldTile(const BnFold& f, const double* ws, int64_t chunks, int64_t c,
                         int64_t rows, double* out, double* s) {
  const int tid = threadIdx.y * kBx + threadIdx.x;
  const int col = tid % kFoldCols, group = tid / kFoldCols;
  const int64_t n2 = 2 * c, tileCh = int64_t{kBx} * V, tileStart = blockIdx.x * tileCh;
  for (int64_t q0 = 0; q0 < 2 * tileCh; q0 += kFoldCols) {
    const int64_t j = kmath::bnFoldColumn(tileStart, tileCh, q0 + col, c);
    for (int l = group; l < kmath::kBnChunkLanes; l += kFoldGroups)
      s[l * kFoldCols + col] =
          j < 0 ? 0.0
                : kmath::bnChunkLaneSum([&](int64_t k) { return __ldcg(ws + k * n2 + j); },
                                        chunks, l);
    __syncthreads();
    for (int w = kmath::kBnChunkLanes / 2; w > 0; w >>= 1) {
      for (int l = group; l < w; l += kFoldGroups)
        s[l * kFoldCols + col] += s[(l + w) * kFoldCols + col];
      __syncthreads();
    }
    if (group == 0 && j >= 0) out[j] = s[col];
    __syncthreads();  // out visible to the epilogue; s free for the next columns
  }
  if (blockIdx.x == 0 && tid == 0) out[n2] = static_cast<double>(rows);
  const double count = static_cast<double>(rows);
  for (int64_t q = tid; q < tileCh && tileStart + q < c; q += kBx * kBy) {
    const int64_t ch = tileStart + q;
    const double a = __ldcg(out + ch), b = __ldcg(out + c + ch);
    const BnFold::Finish& fi = f.finish;
    if (fi.mean)
      finishChannel(a, b, count, ch, fi.eps, fi.momentum, fi.mean, fi.invstd, fi.runningMean,
                    fi.runningVar);
    const BnFold::Grads& gr = f.grads;
    if (gr.dgamma) {
      gr.dgamma[ch] = kmath::bnGradAccumulate(gr.dgamma[ch], b, gr.overwriteGamma);
      gr.dbeta[ch] = kmath::bnGradAccumulate(gr.dbeta[ch], a, gr.overwriteBeta);
    }
  }
}

// partialSumsKernel, then (in the tile's last block) the chunk reduction and
// the epilogue: grid (channel tiles, chunks) as partialSumsKernel's.
template <class T, int V, class Op>
__global__ void __launch_bounds__(kBx* kBy, kSumsMinBlocks)
    foldedSumsKernel(Op op, int64_t rows, int64_t c, int64_t chunkRows, double* ws, BnFold f,
                     double* out) {
  gridDependencyStart();  // may run under PDL (launch_stream.h)
  __shared__ SumsTile sa, sb;
  __shared__ bool last;
  blockPartials<T, V, Op>(op, rows, c, chunkRows, ws, sa, sb);
  __threadfence();  // this block's partials before its arrival
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    const unsigned before = atomicAdd(f.counters + blockIdx.x, 1u);
    last = kmath::bnIsLastArrival(before, gridDim.y);
    if (last) f.counters[blockIdx.x] = 0;  // every block of the tile has arrived
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  foldTile<V>(f, ws, gridDim.y, c, rows, out, &sa[0][0]);
}

// The unfolded epilogue (BnFold without counters).
void launchEpilogue(const BnFold& f, const double* sums, int64_t c, LaunchStream s) {
  const BnFold::Finish& fi = f.finish;
  if (fi.mean)
    launchBnNhwcFinish(sums, c, fi.eps, fi.momentum, fi.mean, fi.invstd, fi.runningMean,
                       fi.runningVar, s);
  const BnFold::Grads& gr = f.grads;
  if (gr.dgamma)
    launchBnParamGrads(sums, c, gr.dgamma, gr.dbeta, gr.overwriteGamma, gr.overwriteBeta,
                       s.stream);  // an ordinary launch: its kernel does not wait (no PDL)
}

// The partial sums of `op` (V wide) then the chunk reduction into out, and
// fold's epilogue: one launch with fold's counters (rows and c > 0), else
// a launch each.
template <class T, int V, class Op>
void launchSums(const Op& op, int64_t rows, int64_t c, void* workspace, double* out,
                LaunchStream s, const BnFold* fold) {
  const int64_t chunks = (rows > 0 && c > 0) ? chunksFor(rows) : 0;
  if (fold) {
    DDPRUN_CHECK(!fold->finish.runningMean == !fold->finish.runningVar,
                 "BnFold: give both running statistics or neither");
    DDPRUN_CHECK(!fold->finish.mean == !fold->finish.invstd &&
                     !fold->grads.dgamma == !fold->grads.dbeta,
                 "BnFold: give mean with invstd and dgamma with dbeta");
  }
  if (fold && fold->counters && chunks > 0) {
    const dim3 grid(channelTiles(c, V), static_cast<unsigned>(chunks));
    launchKernel(foldedSumsKernel<T, V, Op>, grid, dim3(kBx, kBy), s, op, rows, c,
                 chunkRows(rows), static_cast<double*>(workspace), *fold, out);
    return;
  }
  if (chunks > 0) {
    const dim3 grid(channelTiles(c, V), static_cast<unsigned>(chunks));
    launchKernel(partialSumsKernel<T, V, Op>, grid, dim3(kBx, kBy), s, op, rows, c,
                 chunkRows(rows), static_cast<double*>(workspace));
  }
  const unsigned blocks = static_cast<unsigned>(std::max<int64_t>(1, (2 * c + kRx - 1) / kRx));
  launchKernel(chunkSumsKernel, blocks, dim3(kRx, kRy), s,
               static_cast<const double*>(workspace), chunks, c, rows, out);
  if (fold) launchEpilogue(*fold, out, c, s);
}
}  // namespace

size_t bnNhwcFoldCounters(int64_t c) { return std::max<size_t>(1, channelTiles(c, 1)); }

size_t bnNhwcWorkspaceBytes(int64_t rows, int64_t c) {
  if (rows <= 0 || c <= 0) return 0;
  return static_cast<size_t>(chunksFor(rows)) * 2 * static_cast<size_t>(c) * sizeof(double);
}

void launchBnNhwcStats(const void* x, runtime::DType t, int64_t rows, int64_t c,
                       void* workspace, double* out, LaunchStream s, const BnFold* fold) {
  checkShape("launchBnNhwcStats", rows, c);
  byType(t, [&](auto tag) {
    using T = DDPRUN_T(tag);
    withWidth(vectorWidth(c, sizeof(T), {x}), [&](auto vw) {
      constexpr int V = decltype(vw)::value;
      launchSums<T, V>(StatsOp<T, V>{x}, rows, c, workspace, out, s, fold);
    });
  });
}

void launchBnNhwcBackwardSums(const void* x, const void* y, const void* dy, void* gOut,
                              runtime::DType t, int64_t rows, int64_t c, const float* mean,
                              const float* invstd, bool relu, void* workspace, double* out,
                              LaunchStream s, const BnFold* fold) {
  checkShape("launchBnNhwcBackwardSums", rows, c);
  DDPRUN_CHECK(!relu || y || rows == 0 || c == 0,
               "launchBnNhwcBackwardSums: the ReLU's backward needs its output y");
  byType(t, [&](auto tag) {
    using T = DDPRUN_T(tag);
    withWidth(vectorWidth(c, sizeof(T), {x, relu ? y : nullptr, dy, gOut}), [&](auto vw) {
      constexpr int V = decltype(vw)::value;
      BackwardSumsOp<T, V> op{x, y, dy, gOut, mean, invstd, relu, {}, {}};
      launchSums<T, V>(op, rows, c, workspace, out, s, fold);
    });
  });
}

void launchBnActPoolBackwardSums(const void* x, const void* dy, const uint8_t* arg, void* gOut,
                                 runtime::DType t, const PoolShape& g, const float* mean,
                                 const float* invstd, const float* gamma, const float* beta,
                                 void* workspace, double* out, LaunchStream s,
                                 const BnFold* fold) {
  const int64_t rows = g.n * g.h * g.w;
  checkShape("launchBnActPoolBackwardSums", rows, g.c);
  byType(t, [&](auto tag) {
    using T = DDPRUN_T(tag);
    withWidth(vectorWidth(g.c, sizeof(T), {x, dy, gOut}), [&](auto vw) {
      constexpr int V = decltype(vw)::value;
      PoolGradSumsOp<T, V> op{x, dy, arg, gOut, g, mean, invstd, gamma, beta, {}, {}, {}, {}};
      launchSums<T, V>(op, rows, g.c, workspace, out, s, fold);
    });
  });
}

void launchBnNhwcFinish(const double* sums, int64_t c, double eps, double momentum, float* mean,
                        float* invstd, float* runningMean, float* runningVar, LaunchStream s) {
  DDPRUN_CHECK(!runningMean == !runningVar,
               "launchBnNhwcFinish: give both running statistics or neither");
  if (c <= 0) return;
  launchKernel(finishKernel, static_cast<unsigned>((c + 255) / 256), 256, s, sums, c, eps,
               momentum, mean, invstd, runningMean, runningVar);
}

}  // namespace ddprun::train::cuda
