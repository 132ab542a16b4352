// The element-wise mathematics of the trainer's own kernels, written once for
// the CPU and the GPU: every function is `__host__ __device__` under nvcc
// (DDPRUN_HD is empty for the host compiler), so the CUDA kernels in
// src/train/cuda/*.cu call exactly what tests/unit/train/kernel_math_test.cc
// checks on the CPU against the CPU backend.
//
// The formulas follow the CPU backend (cpu/cpu_backend.cc) operation for
// operation, including which intermediate values are float and which double,
// so the two backends agree to rounding (nvcc may still contract a*b+c into
// one FMA where the host compiler does not).
//
// Thread-safety: pure functions. Preconditions are stated per function.
#pragma once

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define DDPRUN_HD __host__ __device__
#else
#define DDPRUN_HD
#endif

namespace ddprun::train::kmath {

// ------------------------------------------------------------- optimizers
// torch.optim.SGD (dampening 0) on one element, in the order of PyTorch's
// _single_tensor_sgd and _multi_tensor_sgd (torch/optim/sgd.py), one float
// rounding per op:
//   g' = g + wd*w                       grad.add(param, alpha=wd)
//   buf = g' (first step), else
//   buf = momentum*buf + g'             buf.mul_(momentum).add_(grad)
//   d = buf, or with `nesterov`
//   d = g' + momentum*buf               grad.add(buf, alpha=momentum)
//   w -= lr*d                           param.add_(grad, alpha=-lr)
// Momentum 0 skips the buffer (and Nesterov: PyTorch refuses nesterov
// without momentum; optimizerOptionsProblem in optim.h). nesterov = false is
// the arithmetic this function had before Nesterov, bit for bit. (PyTorch's
// CPU kernels fuse add-with-alpha into one FMA where the vector unit has
// one; the host build here does not contract, nvcc does: both agree with
// PyTorch to float rounding, not bitwise.)
DDPRUN_HD inline void sgdStep(float& w, float g, float& buf, float lr, float momentum, float wd,
                              bool first, bool nesterov = false) {
  float d = wd != 0.0f ? g + wd * w : g;
  if (momentum != 0.0f) {
    buf = first ? d : momentum * buf + d;
    d = nesterov ? d + momentum * buf : buf;
  }
  w -= lr * d;
}

// The per-step scalars of torch.optim.Adam, computed once on the host:
// stepSize = lr / (1 - b1^t), bc2Sqrt = sqrt(1 - b2^t) (in double, rounded).
struct AdamScalars {
  float stepSize = 0.0f;
  float bc2Sqrt = 1.0f;
};
inline AdamScalars adamScalars(float lr, float b1, float b2, int64_t step) {
  const double bc1 = 1.0 - pow(static_cast<double>(b1), static_cast<double>(step));
  const double bc2 = 1.0 - pow(static_cast<double>(b2), static_cast<double>(step));
  return {static_cast<float>(lr / bc1), static_cast<float>(sqrt(bc2))};
}

// torch.optim.Adam (no amsgrad) on one element: m = b1 m + (1-b1) g';
// v = b2 v + (1-b2) g'^2; w -= stepSize * m / (sqrt(v)/bc2Sqrt + eps).
DDPRUN_HD inline void adamStep(float& w, float g, float& m, float& v, AdamScalars s, float b1,
                               float b2, float eps, float wd) {
  const float d = wd != 0.0f ? g + wd * w : g;
  m = m * b1 + (1.0f - b1) * d;
  v = v * b2 + (1.0f - b2) * d * d;
  const float denom = sqrtf(v) / s.bc2Sqrt + eps;
  w -= s.stepSize * (m / denom);
}

// ---------------------------------------------------------- cross-entropy
// torch.nn.CrossEntropyLoss(label_smoothing=eps) with class-index targets
// and reduction "mean", over k classes and n rows: row i's loss is
//   (1 - eps) * (lse - z_y) + eps/k * sum_j (lse - z_j)
// (the target distribution (1 - eps) * onehot(y) + eps/k), and the gradient
//   dL/dz_j = (softmax_j - ((1 - eps) [j == y] + eps/k)) / n.
// PyTorch computes the same as (1 - eps) * nll + eps/k * smooth_loss
// (aten's cross_entropy_loss_label_smoothing); here in double, rounded once.
// eps = 0 is today's arithmetic bit for bit (the branch keeps it).
//
// One row of logits z[0..k) (k >= 1): the arg max (first maximum, as the CPU
// backend and torch.argmax) and log-sum-exp in double, shifted by the max.
struct CeRow {
  int64_t arg = 0;
  double lse = 0.0;
};
DDPRUN_HD inline CeRow crossEntropyRow(const float* z, int64_t k) {
  int64_t arg = 0;
  for (int64_t j = 1; j < k; ++j)
    if (z[j] > z[arg]) arg = j;
  const float mx = z[arg];
  double se = 0.0;
  for (int64_t j = 0; j < k; ++j) se += exp(static_cast<double>(z[j] - mx));
  return {arg, mx + log(se)};
}
// The row's loss: lse - z[label]; with eps > 0 (k: the row's length) the
// smoothed loss above, its smoothing sum taken term by term (each term >= 0).
DDPRUN_HD inline double crossEntropyLoss(const float* z, CeRow r, int32_t label, float eps = 0.0f,
                                         int64_t k = 0) {
  const double nll = r.lse - z[label];
  if (eps == 0.0f) return nll;
  double smooth = 0.0;
  for (int64_t j = 0; j < k; ++j) smooth += r.lse - z[j];
  const double e = eps;
  return (1.0 - e) * nll + e / static_cast<double>(k) * smooth;
}
// dL/dz_j of the batch mean over n rows, times the loss scale:
// (softmax_j - target_j) / n * gradScale, target_j = [j == label] without
// smoothing, (1 - eps) [j == label] + eps/k with it (k: the row's length).
DDPRUN_HD inline float crossEntropyGrad(float zj, double lse, bool isLabel, int64_t n,
                                        float gradScale, float eps = 0.0f, int64_t k = 1) {
  double target = isLabel ? 1.0 : 0.0;
  if (eps != 0.0f) {
    const double e = eps, off = e / static_cast<double>(k);
    target = isLabel ? (1.0 - e) + off : off;
  }
  return static_cast<float>((exp(zj - lse) - target) / static_cast<double>(n)) * gradScale;
}

// ------------------------------------------------------------- element-wise
DDPRUN_HD inline float reluForward(float x) { return x > 0.0f ? x : 0.0f; }
// From the layer's output (as the CPU backend): the gradient passes where y > 0.
DDPRUN_HD inline float reluBackward(float y, float g) { return y > 0.0f ? g : 0.0f; }

// Finite: neither infinite nor NaN (NaN fails every comparison).
DDPRUN_HD inline bool isFiniteF(float x) { return fabsf(x) <= 3.40282347e+38f; }
// x *= scale; true when the result is finite (the loss scaler's check).
DDPRUN_HD inline bool scaleFinite(float& x, float scale) {
  x *= scale;
  return isFiniteF(x);
}

// -------------------------------------------------------- bilinear resize
// F.interpolate(mode="bilinear", align_corners=False) along one axis: output
// index `dst` of `outSize` reads input rows i0 and i1 of `inSize` with weights
// l0 and l1 (PyTorch's area_pixel_compute_source_index: scale in/out in
// float, source = scale * (dst + 0.5) - 0.5 clamped at 0). inSize, outSize >= 1.
struct Lerp {
  int64_t i0 = 0, i1 = 0;
  float l0 = 1.0f, l1 = 0.0f;
};
DDPRUN_HD inline Lerp bilinearIndex(int64_t dst, int64_t inSize, int64_t outSize) {
  const float scale = static_cast<float>(inSize) / static_cast<float>(outSize);
  float src = scale * (static_cast<float>(dst) + 0.5f) - 0.5f;
  if (src < 0.0f) src = 0.0f;
  Lerp r;
  r.i0 = static_cast<int64_t>(src);
  if (r.i0 > inSize - 1) r.i0 = inSize - 1;
  r.i1 = r.i0 + (r.i0 < inSize - 1 ? 1 : 0);
  float l1 = src - static_cast<float>(r.i0);
  l1 = l1 < 0.0f ? 0.0f : (l1 > 1.0f ? 1.0f : l1);
  r.l1 = l1;
  r.l0 = 1.0f - l1;
  return r;
}
// One output element from an input plane of width w.
DDPRUN_HD inline float bilinearAt(const float* plane, int64_t w, Lerp row, Lerp col) {
  const float* r0 = plane + row.i0 * w;
  const float* r1 = plane + row.i1 * w;
  return row.l0 * (col.l0 * r0[col.i0] + col.l1 * r0[col.i1]) +
         row.l1 * (col.l0 * r1[col.i0] + col.l1 * r1[col.i1]);
}

// -------------------------------------------------------------- batch norm
// Training-mode statistics from the (global) sums: mean = s/count, biased
// var = q/count; invstd = 1/sqrt(var + eps) rounded to float.
DDPRUN_HD inline float bnInvStd(double var, double eps) {
  return static_cast<float>(1.0 / sqrt(var + eps));
}
// PyTorch's running statistics: momentum-weighted, the variance unbiased by
// count/(count-1) (count > 1; 1 keeps it biased).
DDPRUN_HD inline void bnRunningUpdate(float& rm, float& rv, double mean, double var, double count,
                                      double momentum) {
  const double unbias = count > 1 ? count / (count - 1) : 1.0;
  rm = static_cast<float>((1 - momentum) * rm + momentum * mean);
  rv = static_cast<float>((1 - momentum) * rv + momentum * var * unbias);
}
// xhat = (x - mean) * invstd; y = xhat * gamma + beta.
DDPRUN_HD inline float bnXhat(float x, float mean, float invstd) { return (x - mean) * invstd; }
DDPRUN_HD inline float bnOut(float xhat, float gamma, float beta) { return xhat * gamma + beta; }
// dx = gamma*invstd * (dy - S1/M - xhat * S2/M) with k1 = S1/M, k2 = S2/M and
// scale = gamma*invstd (S1 = sum dy, S2 = sum dy*xhat over the global batch).
DDPRUN_HD inline float bnBackward(float dy, float xhat, float scale, float k1, float k2) {
  return scale * (dy - k1 - xhat * k2);
}

// ------------------------------------- fused batch norm (NHWC, bn_nhwc.cu)
// The element math of the NHWC batch norm kernels (src/train/cuda/bn_nhwc.cu),
// whose activations are stored as float, bf16 or fp16 and converted to float
// on load (exactly) and rounded to nearest even on store; everything below is
// in float, the sums in double. Statistics come from one-pass sums
// (sum x, sum x^2, count: all-reduced over ranks for SyncBatchNorm).
//
// Mean and biased variance from the sums: var = q/count - mean^2, clamped at
// 0 (cancellation can make it slightly negative when the spread is tiny
// against the mean: in double, x^2 summed at mean 100 and std 1 keeps about
// 12 digits of the variance). count <= 0 (no elements): mean 0, var 0.
struct BnMoments {
  double mean = 0.0, var = 0.0;
};
DDPRUN_HD inline BnMoments bnMomentsFromSums(double sum, double sumSq, double count) {
  BnMoments m;
  if (!(count > 0)) return m;
  m.mean = sum / count;
  const double var = sumSq / count - m.mean * m.mean;
  m.var = var > 0.0 ? var : 0.0;
  return m;
}
// y = relu?(xhat * gamma + beta + z) with xhat = (x - mean) * invstd
// (bnXhat, bnOut): the batch norm, the residual's add (z = 0 without a
// residual: adding +0 changes nothing but a -0 into +0) and the ReLU.
DDPRUN_HD inline float bnActForward(float x, float mean, float invstd, float gamma, float beta,
                                    float z, bool relu) {
  const float v = bnOut(bnXhat(x, mean, invstd), gamma, beta) + z;
  return relu ? reluForward(v) : v;
}
// The gradient at the batch norm's output (and the residual's, dz): through
// the ReLU from its stored output y (reluBackward), or dy itself without one.
DDPRUN_HD inline float bnActGrad(float y, float dy, bool relu) {
  return relu ? reluBackward(y, dy) : dy;
}
// The backward sums S1 = sum g, S2 = sum g*xhat of one thread: a group of
// terms (at most kBnGradGroup, the rows one loop step of bn_nhwc_sums.cu's
// kernel loads) is summed in float, g added and g*xhat fused-multiply-added
// in term order, and each group's two float sums are then added to the
// thread's double sums (flush). Per term that is two float operations instead
// of three float->double conversions and two double operations, the work that
// held the kernel under half the memory bandwidth. The error stays far under
// float's unit roundoff u times the condition sum |g| (1 + |xhat|): at most
// about (kBnGradGroup + 1) u per group, and g (a 16-bit or float value) sums
// exactly while the exponents stay within float's extra bits. The order is a
// function of the term sequence only, so the sums repeat bitwise.
constexpr int kBnGradGroup = 4;
struct BnGradGroup {
  float s1 = 0.0f, s2 = 0.0f;
  DDPRUN_HD void add(float g, float xhat) {
    s1 += g;
    s2 = fmaf(g, xhat, s2);
  }
  // Adds the group to (a, b) and starts an empty one.
  DDPRUN_HD void flush(double& a, double& b) {
    a += static_cast<double>(s1);
    b += static_cast<double>(s2);
    s1 = 0.0f, s2 = 0.0f;
  }
};
// The chunk reduction of the NHWC sums (bn_nhwc_sums.cu), folded or not:
// column j of the chunks' partials is summed by kBnChunkLanes lanes, lane l
// adding chunks l, l + 32, l + 64, ... in turn from 0.0 (bnChunkLaneSum;
// load(k) is chunk k's partial of the column), then the lanes pairwise as a
// tree (lane l += lane l + w for w = 16, 8, 4, 2, 1). The order is a function
// of the chunk count only: the folded launch reproduces it bit for bit.
constexpr int kBnChunkLanes = 32;
template <class Load>
DDPRUN_HD inline double bnChunkLaneSum(Load load, int64_t chunks, int lane) {
  double v = 0.0;
  for (int64_t k = lane; k < chunks; k += kBnChunkLanes) v += load(k);
  return v;
}
// The folded launch (bn_nhwc.h's BnFold): a counter per channel tile counts
// the tile's finished blocks; the block that saw `before` on its increment is
// the tile's last of `blocks` when before + 1 == blocks (it then resets the
// counter to 0 for the next launch and reduces the tile).
DDPRUN_HD inline bool bnIsLastArrival(unsigned before, unsigned blocks) {
  return before + 1u == blocks;
}
// Column q (0 <= q < 2 * tileCh) of the channel tile [tileStart, tileStart +
// tileCh) among the 2c sums (S1 of channel ch at ch, S2 at c + ch): the sum's
// index j, or -1 where the tile runs past channel c - 1.
DDPRUN_HD inline int64_t bnFoldColumn(int64_t tileStart, int64_t tileCh, int64_t q, int64_t c) {
  const bool second = q >= tileCh;
  const int64_t ch = tileStart + (second ? q - tileCh : q);
  if (ch >= c) return -1;
  return second ? c + ch : ch;
}
// A parameter's gradient from its double sum, rounded to float: written
// (overwrite: the first contribution of a step) or added to what is there.
DDPRUN_HD inline float bnGradAccumulate(float old, double sum, bool overwrite) {
  const float g = static_cast<float>(sum);
  return overwrite ? g : old + g;
}
// bnBackward's per-channel factors from the sums S1 = sum g, S2 = sum g*xhat
// over M elements (the global batch): scale = gamma*invstd, k1 = S1/M,
// k2 = S2/M, each rounded to float. M > 0.
struct BnBackwardCoefs {
  float scale = 0.0f, k1 = 0.0f, k2 = 0.0f;
};
DDPRUN_HD inline BnBackwardCoefs bnBackwardCoefs(double s1, double s2, double m, float gamma,
                                                 float invstd) {
  BnBackwardCoefs k;
  k.scale = gamma * invstd;
  k.k1 = static_cast<float>(s1 / m);
  k.k2 = static_cast<float>(s2 / m);
  return k;
}
// dx = scale * (g - k1 - xhat * k2) (bnBackward) with xhat recomputed from x.
DDPRUN_HD inline float bnActBackwardData(float x, float g, float mean, float invstd,
                                         BnBackwardCoefs k) {
  return bnBackward(g, bnXhat(x, mean, invstd), k.scale, k.k1, k.k2);
}

// ------------------------- fused stem: batch norm + ReLU + max pool (NHWC)
// ResNet's stem (bn1, its ReLU and the 3x3/2 max pool) as one layer
// (bn_nhwc.cu's launchBnActPoolForward, bn_nhwc_sums.cu's
// launchBnActPoolBackwardSums): each window's activations are recomputed from
// the input and the statistics, bnActForward then rounded to the storage
// exactly as the unfused batch norm stores them, and pooled by the rule
// below; backward gathers each input's pooled gradient (poolCoverRange, the
// outputs in order, summed in float and rounded to the storage, as the
// unfused pooling's backward stores it) and masks it with the recomputed
// activation (bnActGrad), so the fused layer computes what the three layers
// do, bit for bit.
//
// Max pooling's choice, as PyTorch's kernels and the CPU backend: a value
// replaces the window's maximum when it is greater, or NaN; so the first
// maximum in scan order (row, then column) wins, and a NaN propagates (the
// last one in scan order). The window's first tap starts the maximum.
DDPRUN_HD inline bool poolReplaces(float v, float best) { return v > best || v != v; }

// ------------------------------------------------------------ convolution
// The float64 reference of a convolution, one output element per call (the
// CUDA backend's accuracy check of cuDNN's algorithms runs these, one GPU
// thread per element; conv_reference.cu). Cross-correlation, as cuDNN and
// PyTorch: x NCHW [n, c, h, w], weights OIHW [k, c, r, r] (square kernel r,
// stride s >= 1, zero padding p >= 0), y NCHW [n, k, oh, ow] with
// oh = (h + 2p - r) / s + 1 (floor), ow likewise. Products and sums in
// double: the result is exact to double rounding for float inputs.
struct ConvGeom {
  int64_t n = 0, c = 0, h = 0, w = 0;  // input
  int64_t k = 0, oh = 0, ow = 0;       // output channels, output size
  int64_t kernel = 1, stride = 1, pad = 0;
};
// The geometry of an input [n, c, h, w] under a k-channel convolution.
DDPRUN_HD inline ConvGeom convGeom(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k,
                                   int64_t kernel, int64_t stride, int64_t pad) {
  ConvGeom g;
  g.n = n, g.c = c, g.h = h, g.w = w, g.k = k;
  g.kernel = kernel, g.stride = stride, g.pad = pad;
  g.oh = (h + 2 * pad - kernel) / stride + 1;
  g.ow = (w + 2 * pad - kernel) / stride + 1;
  return g;
}
// The output positions i in [0, outSize) whose window, at tap a, reads an
// input row inside [0, inSize): i * s - p + a in range. Empty: lo >= hi.
struct TapRange {
  int64_t lo = 0, hi = 0;
};
DDPRUN_HD inline TapRange convTapRange(int64_t a, int64_t inSize, int64_t outSize, int64_t s,
                                       int64_t p) {
  // i >= ceil((p - a) / s) and i <= floor((inSize - 1 + p - a) / s).
  const int64_t lowNum = p - a, highNum = inSize - 1 + p - a;
  TapRange r;
  r.lo = lowNum <= 0 ? 0 : (lowNum + s - 1) / s;
  r.hi = highNum < 0 ? 0 : highNum / s + 1;
  if (r.hi > outSize) r.hi = outSize;
  return r;
}
// The output positions i in [0, outSize) whose pooling window (k wide,
// stride s, padding p) covers input position h: i*s - p <= h <= i*s - p + k - 1.
// Empty: lo >= hi. (Max pooling's backward gathers dx[h] from these.)
DDPRUN_HD inline TapRange poolCoverRange(int64_t h, int64_t outSize, int64_t k, int64_t s,
                                         int64_t p) {
  // i >= ceil((h + p - k + 1) / s) and i <= floor((h + p) / s).
  const int64_t lowNum = h + p - k + 1, highNum = h + p;
  TapRange r;
  r.lo = lowNum <= 0 ? 0 : (lowNum + s - 1) / s;
  r.hi = highNum < 0 ? 0 : highNum / s + 1;
  if (r.hi > outSize) r.hi = outSize;
  return r;
}
// y[n, o, i, j] = sum over c, a, b of x[n, c, i*s - p + a, j*s - p + b] * w[o, c, a, b].
DDPRUN_HD inline double convForwardAt(const float* x, const float* wt, const ConvGeom& g,
                                      int64_t n, int64_t o, int64_t i, int64_t j) {
  double sum = 0.0;
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t a = 0; a < g.kernel; ++a) {
      const int64_t ii = i * g.stride - g.pad + a;
      if (ii < 0 || ii >= g.h) continue;
      const float* xr = x + ((n * g.c + c) * g.h + ii) * g.w;
      const float* wr = wt + ((o * g.c + c) * g.kernel + a) * g.kernel;
      for (int64_t b = 0; b < g.kernel; ++b) {
        const int64_t jj = j * g.stride - g.pad + b;
        if (jj < 0 || jj >= g.w) continue;
        sum += static_cast<double>(xr[jj]) * static_cast<double>(wr[b]);
      }
    }
  return sum;
}
// dx[n, c, ii, jj] = sum over o and the taps (a, b) with ii = i*s - p + a,
// jj = j*s - p + b for an output position (i, j) of dy[n, o, i, j] * w[o, c, a, b].
DDPRUN_HD inline double convBackwardDataAt(const float* wt, const float* dy, const ConvGeom& g,
                                           int64_t n, int64_t c, int64_t ii, int64_t jj) {
  double sum = 0.0;
  for (int64_t o = 0; o < g.k; ++o)
    for (int64_t a = 0; a < g.kernel; ++a) {
      const int64_t ti = ii + g.pad - a;
      if (ti < 0 || ti % g.stride != 0 || ti / g.stride >= g.oh) continue;
      const float* dyr = dy + ((n * g.k + o) * g.oh + ti / g.stride) * g.ow;
      const float* wr = wt + ((o * g.c + c) * g.kernel + a) * g.kernel;
      for (int64_t b = 0; b < g.kernel; ++b) {
        const int64_t tj = jj + g.pad - b;
        if (tj < 0 || tj % g.stride != 0 || tj / g.stride >= g.ow) continue;
        sum += static_cast<double>(dyr[tj / g.stride]) * static_cast<double>(wr[b]);
      }
    }
  return sum;
}
// dw[o, c, a, b] = sum over n, i, j of dy[n, o, i, j] * x[n, c, i*s - p + a, j*s - p + b].
DDPRUN_HD inline double convBackwardFilterAt(const float* x, const float* dy, const ConvGeom& g,
                                             int64_t o, int64_t c, int64_t a, int64_t b) {
  const TapRange ri = convTapRange(a, g.h, g.oh, g.stride, g.pad);
  const TapRange rj = convTapRange(b, g.w, g.ow, g.stride, g.pad);
  double sum = 0.0;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t i = ri.lo; i < ri.hi; ++i) {
      const float* xr = x + ((n * g.c + c) * g.h + i * g.stride - g.pad + a) * g.w;
      const float* dyr = dy + ((n * g.k + o) * g.oh + i) * g.ow;
      for (int64_t j = rj.lo; j < rj.hi; ++j)
        sum += static_cast<double>(dyr[j]) * static_cast<double>(xr[j * g.stride - g.pad + b]);
    }
  return sum;
}

// A transpose y[j][i] = x[i][j] of a row-major [rows, cols] matrix whose
// narrow side (min(rows, cols)) is at most kNarrowMax: a 32x32 tile would
// leave all but `narrow` of its 32 lanes idle on one side (the model's
// input, C = 3; a 3x3 filter, R*S = 9), so a block instead takes a chunk of
// chunkWidth positions of the wide side into shared memory ([narrow][n + 1],
// n <= chunkWidth) and both its reads and its writes are runs of consecutive
// elements: on the [narrow][wide] side runs of n, on the [wide][narrow] side
// the whole chunk (narrow * n elements) in one run.
constexpr int64_t kNarrowMax = 32;
constexpr int64_t kNarrowTile = 4096;  // tile elements a chunk fills at most (plus padding)
struct NarrowTranspose {
  bool narrowRows;  // rows is the narrow side: x is [narrow][wide], y [wide][narrow]
  int64_t narrow, wide, chunkWidth;
};
DDPRUN_HD inline NarrowTranspose narrowTranspose(int64_t rows, int64_t cols) {
  NarrowTranspose t{};
  t.narrowRows = rows <= cols;
  t.narrow = t.narrowRows ? rows : cols;
  t.wide = t.narrowRows ? cols : rows;
  // A multiple of 32 (>= 128 for narrow <= 32): the [wide][narrow] pass then
  // walks the tile with a pitch of 1 mod 32 banks.
  t.chunkWidth = kNarrowTile / (t.narrow > 0 ? t.narrow : 1) / 32 * 32;
  return t;
}
// Where element e (< narrow * n) of the chunk starting at wide position w0
// (n positions) lives: `mem` in the matrix (offset from its first element),
// (t, j) in the tile (narrow index, wide index within the chunk).
struct NarrowSlot {
  int64_t mem;
  int t, j;
};
// In the [narrow][wide] layout: e runs along the wide side (runs of n).
DDPRUN_HD inline NarrowSlot narrowMajorSlot(const NarrowTranspose& p, int64_t w0, int n, int e) {
  const int t = e / n, j = e % n;
  return {t * p.wide + w0 + j, t, j};
}
// In the [wide][narrow] layout: e runs through the chunk's narrow * n
// consecutive elements.
DDPRUN_HD inline NarrowSlot wideMajorSlot(const NarrowTranspose& p, int64_t w0, int e) {
  const int narrow = static_cast<int>(p.narrow);
  const int j = e / narrow, t = e % narrow;
  return {(w0 + j) * p.narrow + t, t, j};
}
// The load reads x, the store writes y: x is [narrow][wide] when rows is the
// narrow side, y is then [wide][narrow], and the other way round.
DDPRUN_HD inline NarrowSlot narrowLoadSlot(const NarrowTranspose& p, int64_t w0, int n, int e) {
  return p.narrowRows ? narrowMajorSlot(p, w0, n, e) : wideMajorSlot(p, w0, e);
}
DDPRUN_HD inline NarrowSlot narrowStoreSlot(const NarrowTranspose& p, int64_t w0, int n, int e) {
  return p.narrowRows ? wideMajorSlot(p, w0, e) : narrowMajorSlot(p, w0, n, e);
}

// A reproducible uniform value in [-1, 1) for element i of stream `seed`
// (splitmix64 of seed and index; a multiple of 2^-23, so exact in float),
// the same on the host and the device.
DDPRUN_HD inline float hashUniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

}  // namespace ddprun::train::kmath
