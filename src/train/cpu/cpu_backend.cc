// The CPU backend: oneDNN for convolutions (dnnl_conv.cc), OpenBLAS
// single-precision GEMM for the linear layers, straight loops for pooling,
// ReLU, batch norm, the loss and the optimizers (the loss's and the
// optimizers' element math from kernel_math.h, shared with the CUDA
// kernels, so both backends compute them alike). docs/conv_backend.md records
// the measurement behind the choice (oneDNN's convolutions beat im2col +
// OpenBLAS GEMM by 1.37x per LeNet step; oneDNN's NCHW pooling loses to a
// plain loop; linear layers tie).
//
// Determinism: every reduction runs in a fixed order and OpenBLAS runs with a
// fixed thread count, so the same inputs give bitwise-identical outputs.
#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>

#include "ddprun/common/error.h"
#include "ddprun/runtime/collectives.h"
#include "ddprun/runtime/reducer.h"
#include "ddprun/train/layers.h"
#include "dnnl_conv.h"
#include "../kernel_math.h"

namespace ddprun::train {
namespace {

using kmath::AdamScalars;
using kmath::adamScalars;
using kmath::CeRow;
using kmath::crossEntropyGrad;
using kmath::crossEntropyLoss;
using kmath::crossEntropyRow;

// C[M,N] (+)= op(A) op(B), row-major.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, const float* b,
          float* c, float beta) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0.0f) std::memset(c, 0, sizeof(float) * static_cast<size_t>(m * n));
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, a,
              static_cast<int>(ta ? m : k), b, static_cast<int>(tb ? k : n), beta, c,
              static_cast<int>(n));
}

// The gradient contract (Param::overwriteGrad): the first writer of a step
// stores, later ones add. `v` is a sum begun at +0 (never -0), so storing it
// is bitwise the same as adding it to a zeroed gradient.
inline void putGrad(float& g, float v, bool overwrite) { g = overwrite ? v : g + v; }

Param makeParam(const std::string& name, Shape shape) {
  Param p;
  p.name = name;
  p.value = Tensor(shape);
  p.grad = Tensor(shape);
  return p;
}

// ---------------------------------------------------------------- linear
class Linear final : public Layer {
 public:
  Linear(std::string name, int64_t in, int64_t out)
      : Layer(name), in_(in), out_(out), w_(makeParam(name + ".weight", {out, in})),
        b_(makeParam(name + ".bias", {out})) {}
  Shape outputShape(const Shape& s) const override {
    DDPRUN_CHECK(s.size() == 2 && s[1] == in_, name(), " expects [N, ", in_, "], got ",
                 shapeString(s));
    return {s[0], out_};
  }
  // y[N,out] = x[N,in] W^T + b
  void forward(const Tensor& x, Tensor& y, bool) override {
    const int64_t n = x.dim(0);
    y.ensure(outputShape(x.shape()));
    float* yd = y.data();
    for (int64_t i = 0; i < n; ++i) std::memcpy(yd + i * out_, b_.value.data(), out_ * 4);
    gemm(false, true, n, out_, in_, x.data(), w_.value.data(), yd, 1.0f);
  }
  // dW += dy^T x; db += sum_n dy; dx = dy W (= instead of += for a gradient
  // whose overwriteGrad is set: GEMM beta 0, which OpenBLAS computes as a
  // zeroed C plus the product, bitwise what a zeroed gradient would get).
  bool backwardReadsOutput() const override { return false; }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) override {
    const int64_t n = x.dim(0);
    gemm(true, false, out_, in_, n, dy.data(), x.data(), w_.grad.data(),
         w_.overwriteGrad ? 0.0f : 1.0f);
    w_.overwriteGrad = false;
    // Bias: sums over the batch in double (the order-independent part of
    // data-parallel equivalence: 2 ranks x B must match 1 rank x 2B).
    sums_.assign(static_cast<size_t>(out_), 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t o = 0; o < out_; ++o) sums_[o] += dy.data()[i * out_ + o];
    float* db = b_.grad.data();
    for (int64_t o = 0; o < out_; ++o)
      putGrad(db[o], static_cast<float>(sums_[o]), b_.overwriteGrad);
    b_.overwriteGrad = false;
    if (dx) {
      dx->ensure(x.shape());
      gemm(false, false, n, in_, out_, dy.data(), w_.value.data(), dx->data(), 0.0f);
    }
  }
  std::vector<Param*> params() override { return {&w_, &b_}; }

 private:
  int64_t in_, out_;
  Param w_, b_;
  std::vector<double> sums_;
};

// ---------------------------------------------------------------- max pool
// Window k, stride k, floor mode (PyTorch's MaxPool2d(k)). Forward takes the
// maximum with branch-free max instructions (the window order is random, a
// branch would mispredict); backward routes each gradient to the first
// element of its window equal to the maximum, the one PyTorch's CPU kernel
// picks (first maximum in scan order). NaN inputs are not propagated.
class MaxPool2d final : public Layer {
 public:
  MaxPool2d(std::string name, int k) : Layer(std::move(name)), k_(k) {}
  Shape outputShape(const Shape& s) const override {
    DDPRUN_CHECK(s.size() == 4 && s[2] >= k_ && s[3] >= k_, name(), " expects [N, C, H, W] with "
                 "H, W >= ", k_, ", got ", shapeString(s));
    return {s[0], s[1], s[2] / k_, s[3] / k_};
  }
  void forward(const Tensor& x, Tensor& y, bool) override {
    const Shape os = outputShape(x.shape());
    y.ensure(os);
    const int64_t planes = os[0] * os[1], h = x.dim(2), w = x.dim(3), oh = os[2], ow = os[3];
    for (int64_t pl = 0; pl < planes; ++pl) {
      const float* in = x.data() + pl * h * w;
      float* out = y.data() + pl * oh * ow;
      for (int64_t i = 0; i < oh; ++i) {
        float* o = out + i * ow;
        const float* row = in + i * k_ * w;
        for (int64_t j = 0; j < ow; ++j) o[j] = row[j * k_];
        for (int a = 0; a < k_; ++a)
          for (int b = 0; b < k_; ++b) {
            const float* r = row + a * w + b;
            for (int64_t j = 0; j < ow; ++j) o[j] = std::max(o[j], r[j * k_]);
          }
      }
    }
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override {
    if (!dx) return;
    dx->ensure(x.shape());
    dx->zero();
    const int64_t planes = y.dim(0) * y.dim(1), h = x.dim(2), w = x.dim(3), oh = y.dim(2),
                  ow = y.dim(3);
    for (int64_t pl = 0; pl < planes; ++pl) {
      const float* in = x.data() + pl * h * w;
      const float* out = y.data() + pl * oh * ow;
      const float* g = dy.data() + pl * oh * ow;
      float* d = dx->data() + pl * h * w;
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          const float m = out[i * ow + j];
          // Scan the window backwards with selects: the first match in
          // forward order is the last one taken.
          int64_t at = (i * k_) * w + j * k_;
          for (int a = k_ - 1; a >= 0; --a)
            for (int b = k_ - 1; b >= 0; --b) {
              const int64_t idx = (i * k_ + a) * w + j * k_ + b;
              at = in[idx] == m ? idx : at;
            }
          d[at] += g[i * ow + j];
        }
    }
  }

 private:
  int k_;
};

// ---------------------------------------------------------------- strided max pool
// Any window, stride and padding, floor mode: PyTorch's CPU kernel
// (max_pool2d, dilation 1). Window (i, j) covers rows [i s - p, i s - p + k)
// and columns likewise, clipped to the image, so padding never wins (it is
// -inf). The scan runs row by row, and an element replaces the maximum when it
// is greater or NaN, which makes the arg-max the first maximum in scan order
// (and the last NaN), as PyTorch's. Forward keeps that arg-max per output;
// backward adds each output's gradient to it, outputs in order (overlapping
// windows add up in a fixed order).
class StridedMaxPool2d final : public Layer {
 public:
  StridedMaxPool2d(std::string name, const Pool2dSpec& s) : Layer(std::move(name)), s_(s) {}
  Shape outputShape(const Shape& s) const override {
    DDPRUN_CHECK(s.size() == 4 && s[2] + 2 * s_.pad >= s_.kernel &&
                     s[3] + 2 * s_.pad >= s_.kernel,
                 name(), " expects [N, C, H, W] with H, W >= ", s_.kernel - 2 * s_.pad,
                 ", got ", shapeString(s));
    return {s[0], s[1], outSide(s[2]), outSide(s[3])};
  }
  void forward(const Tensor& x, Tensor& y, bool) override {
    const Shape os = outputShape(x.shape());
    y.ensure(os);
    const int64_t planes = os[0] * os[1], h = x.dim(2), w = x.dim(3), oh = os[2], ow = os[3];
    argmax_.resize(static_cast<size_t>(y.numel()));
    for (int64_t pl = 0; pl < planes; ++pl) {
      const float* in = x.data() + pl * h * w;
      float* out = y.data() + pl * oh * ow;
      int32_t* arg = argmax_.data() + pl * oh * ow;
      for (int64_t i = 0; i < oh; ++i) {
        const int64_t h0 = std::max<int64_t>(i * s_.stride - s_.pad, 0);
        const int64_t h1 = std::min<int64_t>(i * s_.stride - s_.pad + s_.kernel, h);
        for (int64_t j = 0; j < ow; ++j) {
          const int64_t w0 = std::max<int64_t>(j * s_.stride - s_.pad, 0);
          const int64_t w1 = std::min<int64_t>(j * s_.stride - s_.pad + s_.kernel, w);
          int64_t at = h0 * w + w0;
          float m = -std::numeric_limits<float>::infinity();
          for (int64_t a = h0; a < h1; ++a)
            for (int64_t b = w0; b < w1; ++b) {
              const float v = in[a * w + b];
              if (v > m || std::isnan(v)) {
                m = v;
                at = a * w + b;
              }
            }
          out[i * ow + j] = m;
          arg[i * ow + j] = static_cast<int32_t>(at);
        }
      }
    }
  }
  // Precondition: follows this layer's forward of `x` (the kept arg-maxes).
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override {
    if (!dx) return;
    DDPRUN_CHECK(argmax_.size() == static_cast<size_t>(y.numel()), name(),
                 ": backward without its forward");
    dx->ensure(x.shape());
    dx->zero();
    const int64_t planes = y.dim(0) * y.dim(1), hw = x.dim(2) * x.dim(3),
                  ohw = y.dim(2) * y.dim(3);
    for (int64_t pl = 0; pl < planes; ++pl) {
      const float* g = dy.data() + pl * ohw;
      const int32_t* arg = argmax_.data() + pl * ohw;
      float* d = dx->data() + pl * hw;
      for (int64_t o = 0; o < ohw; ++o) d[arg[o]] += g[o];
    }
  }

 private:
  int64_t outSide(int64_t in) const { return (in + 2 * s_.pad - s_.kernel) / s_.stride + 1; }

  Pool2dSpec s_;
  std::vector<int32_t> argmax_;  // per output: index into its input plane
};

// ---------------------------------------------------------------- global average pool
// [N, C, H, W] -> [N, C]: y = sum(x over H, W) / (H W), the sum in double in
// scan order (PyTorch computes mean({-1, -2}) in float32 with its own
// order: the two agree to float rounding). Backward: dx = dy / (H W) at every
// position, in float32 as PyTorch's mean backward.
class GlobalAvgPool final : public Layer {
 public:
  explicit GlobalAvgPool(std::string name) : Layer(std::move(name)) {}
  Shape outputShape(const Shape& s) const override {
    DDPRUN_CHECK(s.size() == 4 && s[2] > 0 && s[3] > 0, name(),
                 " expects [N, C, H, W] with H, W >= 1, got ", shapeString(s));
    return {s[0], s[1]};
  }
  void forward(const Tensor& x, Tensor& y, bool) override {
    y.ensure(outputShape(x.shape()));
    const int64_t planes = y.numel(), hw = x.dim(2) * x.dim(3);
    for (int64_t pl = 0; pl < planes; ++pl) {
      const float* in = x.data() + pl * hw;
      double s = 0.0;
      for (int64_t q = 0; q < hw; ++q) s += in[q];
      y.data()[pl] = static_cast<float>(s / static_cast<double>(hw));
    }
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override {
    if (!dx) return;
    dx->ensure(x.shape());
    const int64_t planes = y.numel(), hw = x.dim(2) * x.dim(3);
    const auto n = static_cast<float>(hw);
    for (int64_t pl = 0; pl < planes; ++pl) {
      const float g = dy.data()[pl] / n;
      std::fill(dx->data() + pl * hw, dx->data() + (pl + 1) * hw, g);
    }
  }
};

// ---------------------------------------------------------------- bilinear resize
// One axis of F.interpolate(mode="bilinear", align_corners=False) as
// PyTorch's CPU kernel computes it, in float32: scale = in / out; source
// position (dst + 0.5) * scale - 0.5, clamped at 0; i0 = floor of it, i1 =
// i0 + 1 except at the last row/column; l1 = position - i0, l0 = 1 - l1. An
// axis whose size does not change is copied (PyTorch's special case).
struct AxisTaps {
  std::vector<int64_t> i0, i1;
  std::vector<float> l0, l1;
};

AxisTaps axisTaps(int64_t in, int64_t out) {
  AxisTaps t;
  t.i0.resize(out), t.i1.resize(out), t.l0.resize(out), t.l1.resize(out);
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  for (int64_t d = 0; d < out; ++d) {
    if (in == out) {
      t.i0[d] = t.i1[d] = d;
      t.l0[d] = 1.0f;
      t.l1[d] = 0.0f;
      continue;
    }
    float src = scale * (static_cast<float>(d) + 0.5f) - 0.5f;
    if (src < 0.0f) src = 0.0f;
    const int64_t i0 = std::min(static_cast<int64_t>(src), in - 1);
    t.i0[d] = i0;
    t.i1[d] = i0 < in - 1 ? i0 + 1 : i0;
    t.l1[d] = std::clamp(src - static_cast<float>(i0), 0.0f, 1.0f);
    t.l0[d] = 1.0f - t.l1[d];
  }
  return t;
}

// y = l0h (l0w x[h0,w0] + l1w x[h0,w1]) + l1h (l0w x[h1,w0] + l1w x[h1,w1]),
// the order of PyTorch's separable evaluation (width inside, height outside).
void resizeBilinearCpu(const Tensor& x, int64_t oh, int64_t ow, Tensor& y) {
  DDPRUN_CHECK(x.rank() == 4 && x.dim(2) > 0 && x.dim(3) > 0 && oh > 0 && ow > 0,
               "bilinear resize of ", shapeString(x.shape()), " to ", oh, "x", ow,
               " (needs [N, C, H, W] and sizes >= 1)");
  const Shape os = {x.dim(0), x.dim(1), oh, ow};
  if (y.shape() != os) y.ensure(os);  // a view of the right shape stays a view
  DDPRUN_CHECK(y.data() != x.data(), "bilinear resize in place (the output must be another "
               "tensor)");
  const int64_t h = x.dim(2), w = x.dim(3), planes = x.dim(0) * x.dim(1);
  const AxisTaps th = axisTaps(h, oh), tw = axisTaps(w, ow);
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float* in = x.data() + pl * h * w;
    float* out = y.data() + pl * oh * ow;
    for (int64_t i = 0; i < oh; ++i) {
      const float* r0 = in + th.i0[i] * w;
      const float* r1 = in + th.i1[i] * w;
      for (int64_t j = 0; j < ow; ++j) {
        const int64_t a = tw.i0[j], b = tw.i1[j];
        const float top = r0[a] * tw.l0[j] + r0[b] * tw.l1[j];
        const float bottom = r1[a] * tw.l0[j] + r1[b] * tw.l1[j];
        out[i * ow + j] = top * th.l0[i] + bottom * th.l1[i];
      }
    }
  }
}

// ---------------------------------------------------------------- relu
class Relu final : public Layer {
 public:
  explicit Relu(std::string name) : Layer(std::move(name)) {}
  Shape outputShape(const Shape& s) const override { return s; }
  void forward(const Tensor& x, Tensor& y, bool) override {
    y.ensure(x.shape());
    const float* a = x.data();
    float* b = y.data();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) b[i] = a[i] > 0.0f ? a[i] : 0.0f;
  }
  bool worksInPlace() const override { return true; }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override {
    if (!dx) return;
    dx->ensure(x.shape());
    const float* __restrict o = y.data();
    const float* __restrict g = dy.data();
    float* __restrict d = dx->data();
    // Branch-free: a mask from the comparison ANDed into the gradient's bits
    // (vectorised; the sign pattern is random, a branch would mispredict).
    for (int64_t i = 0, n = x.numel(); i < n; ++i) {
      const uint32_t mask = o[i] > 0.0f ? 0xffffffffu : 0u;
      d[i] = std::bit_cast<float>(std::bit_cast<uint32_t>(g[i]) & mask);
    }
  }
};

// ---------------------------------------------------------------- batch norm
// Training: per-channel mean and biased variance over N*H*W (two passes:
// mean, then the mean of squared deviations); with `sync` both sums (and the
// count) are all-reduced, so every rank normalises with the global batch's
// statistics (SyncBatchNorm). Running statistics: momentum 0.1, unbiased
// variance, as PyTorch. Backward with xhat = (x - mean) * invstd:
//   dgamma += sum(dy * xhat), dbeta += sum(dy)          (local sums)
//   dx = gamma * invstd * (dy - S1/M - xhat * S2/M),  S1 = sum(dy), S2 = sum(dy*xhat)
// where S1, S2 and M are global (all-reduced) under sync, as in PyTorch's
// SyncBatchNorm backward.
class BatchNorm2d final : public Layer {
 public:
  BatchNorm2d(std::string name, int64_t c, runtime::ProcessGroup* sync)
      : Layer(name), c_(c), sync_(sync), w_(makeParam(name + ".weight", {c})),
        b_(makeParam(name + ".bias", {c})) {
    rm_ = {name + ".running_mean", Tensor({c}), false};
    rv_ = {name + ".running_var", Tensor({c}), false};
    nbt_ = {name + ".num_batches_tracked", Tensor({1}), true};
    std::fill(w_.value.data(), w_.value.data() + c, 1.0f);
    std::fill(rv_.value.data(), rv_.value.data() + c, 1.0f);
  }
  Shape outputShape(const Shape& s) const override {
    DDPRUN_CHECK(s.size() == 4 && s[1] == c_, name(), " expects [N, ", c_, ", H, W], got ",
                 shapeString(s));
    return s;
  }
  void forward(const Tensor& x, Tensor& y, bool training) override {
    y.ensure(outputShape(x.shape()));
    const int64_t n = x.dim(0), hw = x.dim(2) * x.dim(3);
    std::vector<double> mean(c_), var(c_);
    if (training) {
      batchStats(x, mean, var);
      updateRunning(mean, var);
    } else {
      for (int64_t c = 0; c < c_; ++c) {
        mean[c] = rm_.value.data()[c];
        var[c] = rv_.value.data()[c];
      }
    }
    invstd_.assign(c_, 0.0f);
    xhat_.ensure(x.shape());
    for (int64_t c = 0; c < c_; ++c) {
      const float is = static_cast<float>(1.0 / std::sqrt(var[c] + kEps));
      const float mu = static_cast<float>(mean[c]), g = w_.value.data()[c], bb = b_.value.data()[c];
      invstd_[c] = is;
      for (int64_t i = 0; i < n; ++i) {
        const float* in = x.data() + (i * c_ + c) * hw;
        float* xh = xhat_.data() + (i * c_ + c) * hw;
        float* out = y.data() + (i * c_ + c) * hw;
        for (int64_t q = 0; q < hw; ++q) {
          xh[q] = (in[q] - mu) * is;
          out[q] = xh[q] * g + bb;
        }
      }
    }
  }
  bool backwardReadsOutput() const override { return false; }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) override {
    const int64_t n = x.dim(0), hw = x.dim(2) * x.dim(3);
    std::vector<double> sums(2 * c_ + 1, 0.0);  // S1 per channel, S2 per channel, M
    for (int64_t c = 0; c < c_; ++c)
      for (int64_t i = 0; i < n; ++i) {
        const float* g = dy.data() + (i * c_ + c) * hw;
        const float* xh = xhat_.data() + (i * c_ + c) * hw;
        for (int64_t q = 0; q < hw; ++q) {
          sums[c] += g[q];
          sums[c_ + c] += static_cast<double>(g[q]) * xh[q];
        }
      }
    for (int64_t c = 0; c < c_; ++c) {
      putGrad(w_.grad.data()[c], static_cast<float>(sums[c_ + c]), w_.overwriteGrad);
      putGrad(b_.grad.data()[c], static_cast<float>(sums[c]), b_.overwriteGrad);
    }
    w_.overwriteGrad = b_.overwriteGrad = false;
    sums[2 * c_] = static_cast<double>(n * hw);
    allReduceSums(sums);
    if (!dx) return;
    dx->ensure(x.shape());
    const double m = sums[2 * c_];
    for (int64_t c = 0; c < c_; ++c) {
      const float k1 = static_cast<float>(sums[c] / m), k2 = static_cast<float>(sums[c_ + c] / m);
      const float scale = w_.value.data()[c] * invstd_[c];
      for (int64_t i = 0; i < n; ++i) {
        const float* g = dy.data() + (i * c_ + c) * hw;
        const float* xh = xhat_.data() + (i * c_ + c) * hw;
        float* d = dx->data() + (i * c_ + c) * hw;
        for (int64_t q = 0; q < hw; ++q) d[q] = scale * (g[q] - k1 - xh[q] * k2);
      }
    }
  }
  std::vector<Param*> params() override { return {&w_, &b_}; }
  std::vector<Buffer*> buffers() override { return {&rm_, &rv_, &nbt_}; }

 private:
  static constexpr double kEps = 1e-5, kMomentum = 0.1;

  void allReduceSums(std::vector<double>& v) {
    if (sync_)
      runtime::allReduce(*sync_, {.output = v.data(), .count = v.size(),
                                  .dtype = runtime::DType::kFloat64});
  }
  void batchStats(const Tensor& x, std::vector<double>& mean, std::vector<double>& var) {
    const int64_t n = x.dim(0), hw = x.dim(2) * x.dim(3);
    std::vector<double> s(c_ + 1, 0.0);
    for (int64_t c = 0; c < c_; ++c)
      for (int64_t i = 0; i < n; ++i) {
        const float* in = x.data() + (i * c_ + c) * hw;
        for (int64_t q = 0; q < hw; ++q) s[c] += in[q];
      }
    s[c_] = static_cast<double>(n * hw);
    allReduceSums(s);
    count_ = s[c_];
    DDPRUN_CHECK(count_ > 0, name(), ": empty batch");
    for (int64_t c = 0; c < c_; ++c) mean[c] = s[c] / count_;
    std::vector<double> q(c_, 0.0);
    for (int64_t c = 0; c < c_; ++c)
      for (int64_t i = 0; i < n; ++i) {
        const float* in = x.data() + (i * c_ + c) * hw;
        for (int64_t k = 0; k < hw; ++k) {
          const double d = in[k] - mean[c];
          q[c] += d * d;
        }
      }
    allReduceSums(q);
    for (int64_t c = 0; c < c_; ++c) var[c] = q[c] / count_;
  }
  void updateRunning(const std::vector<double>& mean, const std::vector<double>& var) {
    const double unbias = count_ > 1 ? count_ / (count_ - 1) : 1.0;
    for (int64_t c = 0; c < c_; ++c) {
      float& rm = rm_.value.data()[c];
      float& rv = rv_.value.data()[c];
      rm = static_cast<float>((1 - kMomentum) * rm + kMomentum * mean[c]);
      rv = static_cast<float>((1 - kMomentum) * rv + kMomentum * var[c] * unbias);
    }
    nbt_.value.data()[0] += 1.0f;
  }

  int64_t c_;
  runtime::ProcessGroup* sync_;
  Param w_, b_;
  Buffer rm_, rv_, nbt_;
  Tensor xhat_;
  std::vector<float> invstd_;
  double count_ = 0;
};

// ---------------------------------------------------------------- backend
class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : threads_(threads) {
    static std::once_flag once;
    std::call_once(once, [&] {
      openblas_set_num_threads(threads);
      setDnnlThreads(threads);
    });
  }
  Device device() const override { return Device::kCpu; }
  Allocator& allocator() override { return cpuAllocator(); }
  std::string describe() const override {
    return "cpu (oneDNN conv, OpenBLAS GEMM, " + std::to_string(threads_) + " thread" +
           (threads_ == 1 ? "" : "s") + ")";
  }
  std::unique_ptr<Layer> linear(std::string n, int64_t in, int64_t out) override {
    return std::make_unique<Linear>(std::move(n), in, out);
  }
  std::unique_ptr<Layer> conv2d(std::string n, const Conv2dSpec& s) override {
    return makeDnnlConv2d(std::move(n), s);
  }
  std::unique_ptr<Layer> maxPool2d(std::string n, const Pool2dSpec& s) override {
    const int stride = s.stride == 0 ? s.kernel : s.stride;
    DDPRUN_CHECK(s.kernel >= 1 && stride >= 1 && s.pad >= 0 && 2 * s.pad <= s.kernel, n,
                 ": max pooling window ", s.kernel, " stride ", s.stride, " padding ", s.pad,
                 " (window and stride >= 1, padding at most half the window, as PyTorch)");
    if (stride == s.kernel && s.pad == 0) return std::make_unique<MaxPool2d>(std::move(n), s.kernel);
    return std::make_unique<StridedMaxPool2d>(std::move(n), Pool2dSpec{s.kernel, stride, s.pad});
  }
  std::unique_ptr<Layer> globalAvgPool(std::string n) override {
    return std::make_unique<GlobalAvgPool>(std::move(n));
  }
  std::unique_ptr<Layer> relu(std::string n) override { return std::make_unique<Relu>(std::move(n)); }
  std::unique_ptr<Layer> batchNorm2d(std::string n, int64_t c, runtime::ProcessGroup* s) override {
    return std::make_unique<BatchNorm2d>(std::move(n), c, s);
  }

  // loss = mean_i (logsumexp(z_i) - z_i[y_i]); dL/dz = (softmax(z) - onehot(y)) / N;
  // with label smoothing eps the target onehot(y) becomes
  // (1 - eps) onehot(y) + eps/K (kernel_math.h).
  double crossEntropy(const Tensor& logits, const int32_t* labels, Tensor* dlogits,
                      int64_t* correct, float gradScale) override {
    const int64_t n = logits.dim(0), k = logits.dim(1);
    if (dlogits) dlogits->ensure(logits.shape());
    const float eps = labelSmoothing();
    double total = 0.0;
    int64_t hits = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float* z = logits.data() + i * k;
      const int32_t y = labels[i];
      DDPRUN_CHECK(y >= 0 && y < k, "label ", y, " outside [0, ", k, ")");
      const CeRow r = crossEntropyRow(z, k);
      hits += r.arg == y;
      total += crossEntropyLoss(z, r, y, eps, k);
      if (dlogits) {
        float* d = dlogits->data() + i * k;
        for (int64_t j = 0; j < k; ++j)
          d[j] = crossEntropyGrad(z[j], r.lse, j == y, n, gradScale, eps, k);
      }
    }
    if (correct) *correct = hits;
    return n ? total / static_cast<double>(n) : 0.0;
  }

  // torch.optim.SGD (dampening 0): g' = g + wd*w; buf = g' on the first
  // step, else momentum*buf + g'; w -= lr*buf, or with Nesterov
  // w -= lr*(g' + momentum*buf).
  void sgdUpdate(float* w, const float* g, float* buf, size_t n, float lr, float momentum,
                 float wd, bool first, bool nesterov) override {
    float none = 0.0f;  // momentum 0: no buffer
    for (size_t i = 0; i < n; ++i)
      kmath::sgdStep(w[i], g[i], momentum != 0.0f ? buf[i] : none, lr, momentum, wd, first,
                     nesterov);
  }
  // torch.optim.Adam (no amsgrad): m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
  // w -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps).
  void adamUpdate(float* w, const float* g, float* m, float* v, size_t n, float lr, float b1,
                  float b2, float eps, float wd, int64_t step) override {
    const AdamScalars s = adamScalars(lr, b1, b2, step);
    for (size_t i = 0; i < n; ++i) kmath::adamStep(w[i], g[i], m[i], v[i], s, b1, b2, eps, wd);
  }
  void add(const Tensor& a, const Tensor& b, Tensor& out) override {
    DDPRUN_CHECK(a.numel() == b.numel() && a.numel() == out.numel(), "add of ",
                 shapeString(a.shape()), " and ", shapeString(b.shape()), " into ",
                 shapeString(out.shape()));
    const float* x = a.data();
    const float* y = b.data();
    float* o = out.data();
    for (int64_t i = 0, n = a.numel(); i < n; ++i) o[i] = x[i] + y[i];
  }
  void zero(Tensor& t) override { t.zero(); }
  void copy(const Tensor& src, Tensor& dst) override {
    DDPRUN_CHECK(src.numel() == dst.numel(), "copy of ", shapeString(src.shape()), " into ",
                 shapeString(dst.shape()));
    if (src.numel() && src.data() != dst.data())
      std::memcpy(dst.data(), src.data(), src.bytes());
  }
  void resizeBilinear(const Tensor& x, int64_t h, int64_t w, Tensor& y) override {
    resizeBilinearCpu(x, h, w, y);
  }
  bool scaleAndCheckFinite(float* data, size_t n, float scale) override {
    bool finite = true;
    for (size_t i = 0; i < n; ++i) {
      data[i] *= scale;
      finite &= std::isfinite(data[i]);
    }
    return finite;
  }
  void synchronize() override {}
  std::unique_ptr<runtime::GradientMemory> gradientMemory(runtime::ProcessGroup& pg) override {
    return runtime::makeCpuGradientMemory(pg);
  }
  void upload(const float* host, float* dst, size_t n) override {
    if (n && host != dst) std::memcpy(dst, host, n * sizeof(float));
  }
  void download(const float* src, float* host, size_t n) override {
    if (n && host != src) std::memcpy(host, src, n * sizeof(float));
  }

 private:
  int threads_;
};

}  // namespace

std::unique_ptr<Backend> makeCpuBackend(int threads) {
  DDPRUN_CHECK(threads >= 1, "--threads must be at least 1");
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace ddprun::train
