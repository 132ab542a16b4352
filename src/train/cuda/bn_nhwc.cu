// The NHWC batch norm kernels; see bn_nhwc.h. This file: the element-wise
// passes (forward, backward data, evaluation's invstd); the sums are in
// bn_nhwc_sums.cu, what both share in bn_nhwc_support.cuh. Element math comes from
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
#include "bn_nhwc_support.cuh"
#include "max_pool.cuh"

namespace ddprun::train::cuda {

namespace {
using namespace bn_nhwc;

// ------------------------------------------------------- element-wise
template <class T, int V>
__global__ void __launch_bounds__(kBx* kBy)
    forwardKernel(const void* x, const void* z, void* y, int64_t rows, int64_t c,
                  const float* meanP, const float* invstdP, const float* gammaP,
                  const float* betaP, bool relu) {
  gridDependencyStart();  // may run under PDL (launch_stream.h)
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
  gridDependencyStart();  // may run under PDL (launch_stream.h)
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

// ------------------------------------------------------- fused stem
// The value the fused stem pools (max_pool.cuh): the batch norm's activation
// with the ReLU, rounded to T as forwardKernel stores it.
template <class T>
struct PoolBnAct {
  const float *meanP, *invstdP, *gammaP, *betaP;
  template <int V>
  struct Channels {
    float mean[V], invstd[V], gamma[V], beta[V];
  };
  template <int V>
  __device__ Channels<V> channels(int64_t ch0) const {
    Channels<V> c;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      c.mean[k] = meanP[ch0 + k], c.invstd[k] = invstdP[ch0 + k];
      c.gamma[k] = gammaP[ch0 + k], c.beta[k] = betaP[ch0 + k];
    }
    return c;
  }
  template <int V>
  __device__ float operator()(const Channels<V>& c, int k, float x) const {
    return toFloat(fromFloat<T>(
        kmath::bnActForward(x, c.mean[k], c.invstd[k], c.gamma[k], c.beta[k], 0.0f, true)));
  }
};

__global__ void invStdKernel(const float* var, int64_t c, double eps, float* invstd) {
  gridDependencyStart();  // may run under PDL (launch_stream.h)
  const int64_t ch = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (ch < c) invstd[ch] = kmath::bnInvStd(var[ch], eps);
}
}  // namespace

void launchBnNhwcInvStd(const float* var, int64_t c, double eps, float* invstd, LaunchStream s) {
  if (c <= 0) return;
  launchKernel(invStdKernel, static_cast<unsigned>((c + 255) / 256), 256, s, var, c, eps, invstd);
}

void launchBnActPoolForward(const void* x, void* y, uint8_t* arg, runtime::DType t,
                            const PoolShape& g, const float* mean, const float* invstd,
                            const float* gamma, const float* beta, cudaStream_t s) {
  launchMaxPoolVec("launchBnActPoolForward", x, y, arg, t, g, [&](auto tag) {
    return PoolBnAct<DDPRUN_T(tag)>{mean, invstd, gamma, beta};
  }, s);
}

void launchBnNhwcForward(const void* x, const void* z, void* y, runtime::DType t, int64_t rows,
                         int64_t c, const float* mean, const float* invstd, const float* gamma,
                         const float* beta, bool relu, LaunchStream s) {
  checkShape("launchBnNhwcForward", rows, c);
  byType(t, [&](auto tag) {
    using T = DDPRUN_T(tag);
    if (rows == 0 || c == 0) return;
    withWidth(vectorWidth(c, sizeof(T), {x, z, y}), [&](auto vw) {
      constexpr int V = decltype(vw)::value;
      const dim3 grid(channelTiles(c, V), rowBlocks(rows));
      launchKernel(forwardKernel<T, V>, grid, dim3(kBx, kBy), s, x, z, y, rows, c, mean, invstd,
                   gamma, beta, relu);
    });
  });
}

void launchBnNhwcBackwardData(const void* x, const void* y, const void* dy, const void* g,
                              void* dx, runtime::DType t, int64_t rows, int64_t c,
                              const double* sums, const float* gamma, const float* mean,
                              const float* invstd, bool relu, LaunchStream s) {
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
      launchKernel(backwardDataKernel<T, V>, grid, dim3(kBx, kBy), s, x, yUsed, dyUsed, g, dx,
                   rows, c, sums, gamma, mean, invstd, relu);
    });
  });
}

}  // namespace ddprun::train::cuda
