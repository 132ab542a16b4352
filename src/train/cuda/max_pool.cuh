// The NHWC max pooling kernel, V channels a thread, shared by our max pool
// (pool_kernels.cu: the stored values) and the fused stem (bn_nhwc.cu: the
// batch norm's activation recomputed under each window), and the backward's
// gather of the pooled gradient, shared by both backwards. Internal to
// src/train/cuda/; include from .cu files only.
//
// One thread per (pooled pixel, group of V channels), channel groups fastest:
// each tap is one aligned V-element load (16 bytes for 8 bf16 or 4 floats),
// the pooled output one V-element store (vector_access.cuh), the winning taps
// V bytes. The window is scanned row by row; kmath::poolReplaces picks (the
// first maximum wins, NaN propagates), each channel on its own, exactly as the
// scalar form did.
#pragma once

#include <cstdint>

#include "../kernel_math.h"
#include "kernel_support.cuh"
#include "pool_kernels.h"
#include "vector_access.cuh"

namespace ddprun::train::cuda {

// What is pooled: act.channels<V>(ch0) gives a thread's per-channel
// constants, act(channels, k, v) the value pooled for the stored element v of
// channel ch0 + k. PoolStored: the element itself (our max pool).
struct PoolStored {
  template <int V>
  struct Channels {};
  template <int V>
  __device__ Channels<V> channels(int64_t) const {
    return {};
  }
  template <int V>
  __device__ float operator()(const Channels<V>&, int, float v) const {
    return v;
  }
};

// y (V channels a thread) = the window's maximum of act(x), act's value as
// the pooled tensor stores it; arg (not null) the winning tap a * k + b.
// Precondition: g.c % V == 0, x and y aligned to V elements.
template <class T, int V, class Act>
__global__ void maxPoolVecKernel(const T* x, T* y, uint8_t* arg, PoolShape g, Act act) {
  const int64_t groups = g.c / V;
  DDPRUN_GRID_LOOP(i, static_cast<size_t>(g.n * g.oh * g.ow * groups)) {
    const int64_t ch0 = static_cast<int64_t>(i % static_cast<size_t>(groups)) * V;
    int64_t rest = static_cast<int64_t>(i / static_cast<size_t>(groups));
    const int64_t oj = rest % g.ow;
    rest /= g.ow;
    const int64_t oi = rest % g.oh, img = rest / g.oh;
    const auto consts = act.template channels<V>(ch0);
    float best[V];
    int tap[V];
#pragma unroll
    for (int k = 0; k < V; ++k) best[k] = 0.0f, tap[k] = -1;
    for (int a = 0; a < g.k; ++a) {
      const int64_t ii = oi * g.s - g.p + a;
      if (ii < 0 || ii >= g.h) continue;
      for (int b = 0; b < g.k; ++b) {
        const int64_t jj = oj * g.s - g.p + b;
        if (jj < 0 || jj >= g.w) continue;
        float v[V];
        toFloats(ldv<T, V>(x, static_cast<size_t>(((img * g.h + ii) * g.w + jj) * g.c + ch0)), v);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float val = act(consts, k, v[k]);
          if (tap[k] < 0 || kmath::poolReplaces(val, best[k])) best[k] = val, tap[k] = a * g.k + b;
        }
      }
    }
    const size_t o = i * V;  // ((img * oh + oi) * ow + oj) * c + ch0
    stv<T, V>(y, o, best);
    if (arg) {
#pragma unroll
      for (int k = 0; k < V; ++k) arg[o + k] = static_cast<uint8_t>(tap[k]);
    }
  }
}

// The backward's gather for input pixel (img, ii, jj), channels ch0 ..
// ch0 + V - 1: sum[k] = dy of the outputs whose window covers the pixel
// (kmath::poolCoverRange) and whose winning tap (maxPoolVecKernel's a * k +
// b) it is, in output order, in float.
template <class T, int V>
__device__ void gatherPooledGrad(const void* dy, const uint8_t* arg, const PoolShape& g,
                                 int64_t img, int64_t ii, int64_t jj, int64_t ch0,
                                 float (&sum)[V]) {
  const kmath::TapRange ri = kmath::poolCoverRange(ii, g.oh, g.k, g.s, g.p);
  const kmath::TapRange rj = kmath::poolCoverRange(jj, g.ow, g.k, g.s, g.p);
#pragma unroll
  for (int k = 0; k < V; ++k) sum[k] = 0.0f;
  for (int64_t oi = ri.lo; oi < ri.hi; ++oi)
    for (int64_t oj = rj.lo; oj < rj.hi; ++oj) {
      const size_t o = static_cast<size_t>(((img * g.oh + oi) * g.ow + oj) * g.c + ch0);
      const int64_t tap = (ii - (oi * g.s - g.p)) * g.k + (jj - (oj * g.s - g.p));
      float d[V];
      toFloats(ldv<T, V>(dy, o), d);
#pragma unroll
      for (int k = 0; k < V; ++k)
        if (arg[o + k] == tap) sum[k] += d[k];
    }
}

// InvalidArgument naming `what` unless g is a pooling these kernels take:
// windows up to 16 (a tap fits a byte), pad <= kernel / 2, floor mode.
inline void checkPoolShape(const char* what, const PoolShape& g) {
  DDPRUN_CHECK(g.n >= 0 && g.h > 0 && g.w > 0 && g.c >= 0 && g.k > 0 && g.k <= 16 && g.s > 0 &&
                   g.p >= 0 && g.p <= g.k / 2 && g.oh == (g.h + 2 * g.p - g.k) / g.s + 1 &&
                   g.ow == (g.w + 2 * g.p - g.k) / g.s + 1,
               what, ": max pooling window ", g.k, ", stride ", g.s, ", pad ", g.p, " over ", g.h,
               "x", g.w, " into ", g.oh, "x", g.ow, ": our NHWC kernels take windows up to 16 "
               "with pad <= kernel / 2, floor mode");
}

// Launches maxPoolVecKernel<T, V, Act> for storage type `t`, V the widest
// that c and the pointers allow; act(tag) makes the functor for T. `what`
// names the caller in a bad shape's message (checkPoolShape).
template <class MakeAct>
void launchMaxPoolVec(const char* what, const void* x, void* y, uint8_t* arg, runtime::DType t,
                      const PoolShape& g, MakeAct makeAct, cudaStream_t s) {
  checkPoolShape(what, g);
  byType(t, [&](auto tag) {
    using T = DDPRUN_T(tag);
    withWidth(vectorWidth(g.c, sizeof(T), {x, y}), [&](auto vw) {
      constexpr int V = decltype(vw)::value;
      const size_t total = static_cast<size_t>(g.n * g.oh * g.ow * (g.c / V));
      if (!total) return;
      maxPoolVecKernel<T, V><<<blocksFor(total), kThreads, 0, s>>>(
          static_cast<const T*>(x), static_cast<T*>(y), arg, g, makeAct(tag));
      checkLaunch();
    });
  });
}

}  // namespace ddprun::train::cuda
