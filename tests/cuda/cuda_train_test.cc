// The CUDA backend of `train`, layer by layer against the CPU backend on the
// same random inputs and parameters (forward outputs, dL/dx, accumulated
// parameter gradients, batch norm buffers), plus the loss, the optimizers,
// the element-wise operations, the gradient memory and the error messages.
//
// Where the CPU backend lacks a layer configuration (it says "CPU backend" in
// an InvalidArgument: strided or bias-free convolution, padded pooling, global
// average pooling, bilinear resize while those are being written), the layer
// is checked against a naive double-precision reference in this file instead,
// and the test says so on its output.
//
// The comparisons with the CPU backend and the bitwise-repeat checks run the
// CUDA backend in deterministic mode (CudaBackendOptions::deterministic:
// direct-sum, deterministic cuDNN algorithms); the fast mode's convolutions
// (any algorithm that passes the per-layer accuracy check) are tested against
// the float64 reference with the check's own bounds.
//
// Without a GPU every test skips (GTEST_SKIP); ctest reports them as skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/caching_allocator.h"
#include "cuda/conv_check.h"
#include "cuda/conv_reference.h"
#include "cuda/elementwise.h"
#include "cuda/transpose.h"
#include "ddprun/common/error.h"
#include "ddprun/runtime/collectives.h"
#include "ddprun/runtime/cuda.h"
#include "ddprun/runtime/cuda_check.h"
#include "ddprun/runtime/reducer.h"
#include "ddprun/train/layers.h"
#include "ddprun/train/models.h"
#include "train/random_vector.h"
#include "require_gpu.h"
#include "kernel_math.h"
#include "rank_threads.h"

namespace ddprun::train {
namespace {


using ddprun::testing::randomVector;

Tensor hostTensor(const Shape& s, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Tensor t(s);
  const auto v = randomVector(static_cast<size_t>(t.numel()), seed, lo, hi);
  std::copy(v.begin(), v.end(), t.data());
  return t;
}

Tensor copyOf(const Tensor& t) {
  Tensor c(t.shape());
  std::copy(t.data(), t.data() + t.numel(), c.data());
  return c;
}

std::vector<float> hostValues(const Tensor& t) {
  return std::vector<float>(t.data(), t.data() + t.numel());
}

// Set while the 16-bit tests run: expectClose prints each worst error, so
// the output shows how far below its tolerance a precision stays.
bool gPrintWorst = false;

// |got - want| <= rtol * (|want| + 0.1 * max|want|): relative, with a floor
// at a tenth of the tensor's scale (sums of many terms near zero).
void expectClose(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
  size_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double tol = rtol * (std::fabs(want[i]) + 0.1 * scale) + 1e-30;
    worst = std::max(worst, err / (std::fabs(want[i]) + 0.1 * scale + 1e-30));
    if (!(err <= tol) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size()
                     << " elements off; worst relative error " << worst;
  if (gPrintWorst)
    std::cout << "[ error    ] " << what << ": worst relative error " << worst << " (tolerance "
              << rtol << ")\n";
}

// ||got - want||_2 / ||want||_2 (large tensors, where one element's error
// says little).
double normwiseError(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// NCHW -> NHWC (toNhwc) or back on the host, for tensors of [N, C, H, W]
// (others unchanged): what an NHWC backend's activations look like in memory.
std::vector<float> relayout(const std::vector<float>& v, const Shape& s, bool toNhwc) {
  if (s.size() != 4) return v;
  const int64_t n = s[0], c = s[1], hw = s[2] * s[3];
  std::vector<float> out(v.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t q = 0; q < hw; ++q) {
        const int64_t nchw = (i * c + ch) * hw + q, nhwc = (i * hw + q) * c + ch;
        out[toNhwc ? nhwc : nchw] = v[toNhwc ? nchw : nhwc];
      }
  return out;
}

bool cpuLacks(const InvalidArgument& e) {
  return std::string(e.what()).find("CPU backend") != std::string::npos;
}

// ---------------------------------------------------------------- references
// Naive double-precision layers for configurations the CPU backend lacks.
class RefConv2d final : public Layer {
 public:
  explicit RefConv2d(const Conv2dSpec& s) : Layer("ref"), s_(s) {
    w_ = {"w", Tensor({s.outC, s.inC, s.kernel, s.kernel}), Tensor({s.outC, s.inC, s.kernel, s.kernel})};
    b_ = {"b", Tensor({s.outC}), Tensor({s.outC})};
  }
  Shape outputShape(const Shape& x) const override {
    return {x[0], s_.outC, (x[2] + 2 * s_.pad - s_.kernel) / s_.stride + 1,
            (x[3] + 2 * s_.pad - s_.kernel) / s_.stride + 1};
  }
  // Calls f(n, o, i, j, c, a, b, xIndex) for every in-bounds tap.
  template <typename F>
  void taps(const Shape& x, const Shape& y, F f) const {
    for (int64_t n = 0; n < y[0]; ++n)
      for (int64_t o = 0; o < y[1]; ++o)
        for (int64_t i = 0; i < y[2]; ++i)
          for (int64_t j = 0; j < y[3]; ++j)
            for (int64_t c = 0; c < x[1]; ++c)
              for (int a = 0; a < s_.kernel; ++a)
                for (int b = 0; b < s_.kernel; ++b) {
                  const int64_t ii = i * s_.stride - s_.pad + a, jj = j * s_.stride - s_.pad + b;
                  if (ii < 0 || jj < 0 || ii >= x[2] || jj >= x[3]) continue;
                  f(n, o, i, j, c, a, b, ((n * x[1] + c) * x[2] + ii) * x[3] + jj);
                }
  }
  void forward(const Tensor& x, Tensor& y, bool) override {
    y.ensure(outputShape(x.shape()));
    const Shape& ys = y.shape();
    std::vector<double> acc(static_cast<size_t>(y.numel()), 0.0);
    taps(x.shape(), ys, [&](int64_t n, int64_t o, int64_t i, int64_t j, int64_t c, int a, int b,
                            int64_t xi) {
      acc[((n * ys[1] + o) * ys[2] + i) * ys[3] + j] +=
          static_cast<double>(w_.value.data()[((o * s_.inC + c) * s_.kernel + a) * s_.kernel + b]) *
          x.data()[xi];
    });
    for (int64_t e = 0; e < y.numel(); ++e)
      y.data()[e] = static_cast<float>(acc[e] + (s_.bias ? b_.value.data()[(e / (ys[2] * ys[3])) % ys[1]] : 0.0f));
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override {
    const Shape& ys = y.shape();
    std::vector<double> dw(static_cast<size_t>(w_.value.numel()), 0.0), dxs(static_cast<size_t>(x.numel()), 0.0);
    taps(x.shape(), ys, [&](int64_t n, int64_t o, int64_t i, int64_t j, int64_t c, int a, int b,
                            int64_t xi) {
      const double g = dy.data()[((n * ys[1] + o) * ys[2] + i) * ys[3] + j];
      const int64_t wi = ((o * s_.inC + c) * s_.kernel + a) * s_.kernel + b;
      dw[wi] += g * x.data()[xi];
      dxs[xi] += g * w_.value.data()[wi];
    });
    for (size_t k = 0; k < dw.size(); ++k) w_.grad.data()[k] += static_cast<float>(dw[k]);
    if (s_.bias) {
      std::vector<double> db(static_cast<size_t>(s_.outC), 0.0);
      for (int64_t e = 0; e < dy.numel(); ++e) db[(e / (ys[2] * ys[3])) % ys[1]] += dy.data()[e];
      for (int64_t o = 0; o < s_.outC; ++o) b_.grad.data()[o] += static_cast<float>(db[o]);
    }
    if (dx) {
      dx->ensure(x.shape());
      for (size_t k = 0; k < dxs.size(); ++k) dx->data()[k] = static_cast<float>(dxs[k]);
    }
  }
  std::vector<Param*> params() override {
    if (s_.bias) return {&w_, &b_};
    return {&w_};
  }

 private:
  Conv2dSpec s_;
  Param w_, b_;
};

// Max pooling with -inf padding; the first maximum in scan order wins.
class RefMaxPool final : public Layer {
 public:
  explicit RefMaxPool(const Pool2dSpec& s)
      : Layer("ref"), k_(s.kernel), st_(s.stride ? s.stride : s.kernel), p_(s.pad) {}
  Shape outputShape(const Shape& x) const override {
    return {x[0], x[1], (x[2] + 2 * p_ - k_) / st_ + 1, (x[3] + 2 * p_ - k_) / st_ + 1};
  }
  void forward(const Tensor& x, Tensor& y, bool) override {
    y.ensure(outputShape(x.shape()));
    arg_.assign(static_cast<size_t>(y.numel()), -1);
    const int64_t h = x.dim(2), w = x.dim(3), oh = y.dim(2), ow = y.dim(3);
    for (int64_t pl = 0; pl < y.dim(0) * y.dim(1); ++pl)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          int64_t best = -1;
          for (int a = 0; a < k_; ++a)
            for (int b = 0; b < k_; ++b) {
              const int64_t ii = i * st_ - p_ + a, jj = j * st_ - p_ + b;
              if (ii < 0 || jj < 0 || ii >= h || jj >= w) continue;
              const int64_t idx = (pl * h + ii) * w + jj;
              if (best < 0 || x.data()[idx] > x.data()[best]) best = idx;
            }
          arg_[(pl * oh + i) * ow + j] = best;
          y.data()[(pl * oh + i) * ow + j] = x.data()[best];
        }
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override {
    dx->ensure(x.shape());
    std::fill(dx->data(), dx->data() + dx->numel(), 0.0f);
    for (int64_t e = 0; e < y.numel(); ++e) dx->data()[arg_[e]] += dy.data()[e];
  }

 private:
  int k_, st_, p_;
  std::vector<int64_t> arg_;
};

class RefAvgPool final : public Layer {
 public:
  RefAvgPool() : Layer("ref") {}
  Shape outputShape(const Shape& x) const override { return {x[0], x[1]}; }
  void forward(const Tensor& x, Tensor& y, bool) override {
    y.ensure(outputShape(x.shape()));
    const int64_t hw = x.dim(2) * x.dim(3);
    for (int64_t p = 0; p < y.numel(); ++p) {
      double s = 0;
      for (int64_t q = 0; q < hw; ++q) s += x.data()[p * hw + q];
      y.data()[p] = static_cast<float>(s / hw);
    }
  }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) override {
    dx->ensure(x.shape());
    const int64_t hw = x.dim(2) * x.dim(3);
    for (int64_t e = 0; e < x.numel(); ++e) dx->data()[e] = dy.data()[e / hw] / static_cast<float>(hw);
  }
};

// ------------------------------------------------------------------ fixture
class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DDPRUN_REQUIRE_GPU("CUDA backend");
    cpu_ = makeCpuBackend(1);
    gpu_ = makeCudaBackend({.device = 0, .precision = Precision::kFp32, .deterministic = true});
  }

  Tensor toGpu(const Tensor& host, Backend* be = nullptr) {
    Backend& b = be ? *be : *gpu_;
    Tensor t(host.shape(), b.allocator());
    b.upload(host.data(), t.data(), static_cast<size_t>(host.numel()));
    return t;
  }
  std::vector<float> fromGpu(const Tensor& t, Backend* be = nullptr) {
    Backend& b = be ? *be : *gpu_;
    std::vector<float> v(static_cast<size_t>(t.numel()));
    b.download(t.data(), v.data(), v.size());
    return v;
  }
  // An activation (x, y, dy, dx) to and from the device in the layout and
  // element type of the backend under test (nhwc_, act_): host tensors are
  // always NCHW float. A 16-bit activation goes up rounded to nearest even
  // (roundAct() gives a reference the same values) and comes back exactly.
  Tensor toGpuAct(const Tensor& host, Backend* be = nullptr) {
    Backend& b = be ? *be : *gpu_;
    const std::vector<float> v =
        nhwc_ ? relayout(hostValues(host), host.shape(), true) : hostValues(host);
    if (act_ == DType::kFloat32) {
      Tensor t(host.shape(), b.allocator());
      b.upload(v.data(), t.data(), v.size());
      return t;
    }
    std::vector<uint16_t> bits(v.size());
    for (size_t i = 0; i < v.size(); ++i) bits[i] = to16(v[i]);
    Tensor t(host.shape(), b.allocator(), act_);
    b.synchronize();  // the backend's stream does not order the legacy-stream copy
    DDPRUN_CUDA_OK(cudaMemcpy(t.raw(), bits.data(), t.bytes(), cudaMemcpyHostToDevice));
    DDPRUN_CUDA_OK(cudaDeviceSynchronize());
    return t;
  }
  std::vector<float> fromGpuAct(const Tensor& t, Backend* be = nullptr) {
    std::vector<float> v;
    if (t.is16()) {
      (be ? *be : *gpu_).synchronize();
      std::vector<uint16_t> bits(static_cast<size_t>(t.numel()));
      DDPRUN_CUDA_OK(cudaMemcpy(bits.data(), t.raw(), t.bytes(), cudaMemcpyDeviceToHost));
      v.resize(bits.size());
      for (size_t i = 0; i < bits.size(); ++i)
        v[i] = t.dtype() == DType::kBFloat16 ? runtime::bf16ToFloat(bits[i])
                                             : runtime::halfToFloat(bits[i]);
    } else {
      v = fromGpu(t, be);
    }
    return nhwc_ ? relayout(v, t.shape(), false) : v;
  }
  // A host activation as the backend under test stores it: each value
  // rounded to act_ (itself for float).
  Tensor roundAct(const Tensor& host) const {
    Tensor r = copyOf(host);
    if (act_ == DType::kFloat32) return r;
    for (int64_t i = 0; i < r.numel(); ++i) {
      const uint16_t b = to16(r.data()[i]);
      r.data()[i] = act_ == DType::kBFloat16 ? runtime::bf16ToFloat(b) : runtime::halfToFloat(b);
    }
    return r;
  }
  uint16_t to16(float v) const {
    return act_ == DType::kBFloat16 ? runtime::floatToBf16(v) : runtime::floatToHalf(v);
  }
  // Runs f with gpu_ an NHWC backend (deterministic, precision p) and the
  // activations converted accordingly.
  void withNhwc(Precision p, const std::function<void()>& f) {
    withBackend({.device = 0, .precision = p, .deterministic = true, .nhwc = true}, f);
  }
  // Runs f with gpu_ the backend `o` makes (deterministic as o says), the
  // activations converted to its layout and (activations16) element type;
  // 16-bit precisions print their worst errors.
  void withBackend(const CudaBackendOptions& o, const std::function<void()>& f) {
    auto other = makeCudaBackend(o);
    std::swap(gpu_, other);
    const CudaBackendOptions before = opts_;
    opts_ = o;
    const bool p16 = o.precision == Precision::kBf16 || o.precision == Precision::kFp16;
    nhwc_ = o.nhwc;
    if (o.activations16 && o.nhwc && p16)
      act_ = o.precision == Precision::kBf16 ? DType::kBFloat16 : DType::kFloat16;
    gPrintWorst = p16;
    std::cout << "[ backend  ] " << gpu_->describe() << "\n";
    f();
    gPrintWorst = false;
    act_ = DType::kFloat32;
    nhwc_ = false;
    opts_ = before;
    std::swap(gpu_, other);
  }

  // The reference for a layer: the CPU backend's, or `ref` where the CPU
  // backend lacks the configuration.
  std::unique_ptr<Layer> reference(const std::function<std::unique_ptr<Layer>()>& cpu,
                                   const std::function<std::unique_ptr<Layer>()>& ref) {
    try {
      return cpu();
    } catch (const InvalidArgument& e) {
      if (!cpuLacks(e)) throw;
      std::cout << "[ note     ] the CPU backend lacks this layer (" << e.message()
                << "): checked against the test's naive reference\n";
      return ref();
    }
  }

  // Same random parameters and initial gradients (so accumulation shows) in
  // both layers; forward and backward on the same input; everything compared.
  void checkLayer(Layer& ref, Layer& gpu, const Shape& in, bool training, double rtol,
                  uint64_t seed = 1) {
    auto rp = ref.params();
    auto gp = gpu.params();
    ASSERT_EQ(rp.size(), gp.size());
    for (size_t i = 0; i < rp.size(); ++i) {
      ASSERT_EQ(rp[i]->value.shape(), gp[i]->value.shape()) << gp[i]->name;
      Tensor v = hostTensor(rp[i]->value.shape(), seed * 100 + i, -0.5f, 0.5f);
      if (gp[i]->name.find("bn") != std::string::npos && gp[i]->name.ends_with(".weight"))
        v = hostTensor(rp[i]->value.shape(), seed * 100 + i, 0.5f, 1.5f);
      Tensor g = hostTensor(rp[i]->value.shape(), seed * 100 + 50 + i, -0.1f, 0.1f);
      std::copy(v.data(), v.data() + v.numel(), rp[i]->value.data());
      std::copy(g.data(), g.data() + g.numel(), rp[i]->grad.data());
      gpu_->upload(v.data(), gp[i]->value.data(), static_cast<size_t>(v.numel()));
      gpu_->upload(g.data(), gp[i]->grad.data(), static_cast<size_t>(g.numel()));
    }
    const Tensor x = roundAct(hostTensor(in, seed, -2.0f, 2.0f));
    const Tensor xg = toGpuAct(x);
    Tensor yr, yg;
    try {
      ref.forward(x, yr, training);
    } catch (const InvalidArgument& e) {
      if (cpuLacks(e)) GTEST_SKIP() << "the CPU backend lacks this layer: " << e.message();
      throw;
    }
    gpu.forward(xg, yg, training);
    ASSERT_EQ(yr.shape(), yg.shape());
    expectClose(fromGpuAct(yg), hostValues(yr), rtol, gpu.name() + " forward");
    if (!training) return;
    // dy has y's element type (a float linear output's, or 16-bit).
    const DType saved = act_;
    if (!yg.is16()) act_ = DType::kFloat32;
    const Tensor dy = roundAct(hostTensor(yr.shape(), seed + 7));
    const Tensor dyg = toGpuAct(dy);
    act_ = saved;
    Tensor dxr, dxg;
    ref.backward(x, yr, dy, &dxr);
    gpu.backward(xg, yg, dyg, &dxg);
    ASSERT_EQ(dxr.shape(), dxg.shape());
    expectClose(fromGpuAct(dxg), hostValues(dxr), rtol, gpu.name() + " dx");
    for (size_t i = 0; i < rp.size(); ++i)
      expectClose(fromGpu(gp[i]->grad), hostValues(rp[i]->grad), rtol, gp[i]->name + " grad");
    auto rb = ref.buffers();
    auto gb = gpu.buffers();
    ASSERT_EQ(rb.size(), gb.size());
    for (size_t i = 0; i < rb.size(); ++i)
      expectClose(fromGpu(gb[i]->value), hostValues(rb[i]->value), rtol, gb[i]->name);
  }

  // Against the CPU backend where it has the configuration, and always
  // against the float64 reference as well.
  void checkConv(const Conv2dSpec& s, const Shape& in, double rtol = 1e-4) {
    auto ref = reference([&] { return cpu_->conv2d("conv", s); },
                         [&] { return std::make_unique<RefConv2d>(s); });
    auto gpu = gpu_->conv2d("conv", s);
    checkLayer(*ref, *gpu, in, true, rtol);
    RefConv2d exact(s);
    auto gpu2 = gpu_->conv2d("conv", s);
    checkLayer(exact, *gpu2, in, true, rtol, 2);
  }
  void checkPool(const Pool2dSpec& s, const Shape& in) {
    auto ref = reference([&] { return cpu_->maxPool2d("pool", s); },
                         [&] { return std::make_unique<RefMaxPool>(s); });
    auto gpu = gpu_->maxPool2d("pool", s);
    checkLayer(*ref, *gpu, in, true, 1e-6);
  }

  // Runs f with gpu_ a deterministic backend of precision p (16-bit:
  // printing worst errors).
  void withPrecision(Precision p, const std::function<void()>& f) {
    withBackend({.device = 0, .precision = p, .deterministic = true}, f);
  }

  // Batch norm + ReLU (+ the residual add) as one layer of gpu_ against the
  // CPU's composition: with and without the residual, inputs around 0 and
  // around 100 (the variance must not cancel), two training steps (running
  // statistics, accumulated gradients), then evaluation. Inputs as the
  // backend stores them (roundAct); tolOf(centre) bounds the outputs (y, dx,
  // dz, evaluation), the parameter gradients and the buffers.
  struct BnTol {
    double out, grad, buf;
  };
  void checkBatchNormAct(const std::function<BnTol(float)>& tolOf) {
    for (const bool residual : {false, true})
      for (const float centre : {0.0f, 100.0f}) {
        const std::string what = gpu_->describe() + (residual ? " bn+add+relu" : " bn+relu") +
                                 (centre != 0.0f ? " mean 100" : "");
        const BnTol tol = tolOf(centre);
        auto ref = cpu_->batchNormAct("bn", 8, nullptr, residual);
        auto gpu = gpu_->batchNormAct("bn", 8, nullptr, residual);
        auto rp = ref->params(), gp = gpu->params();
        ASSERT_EQ(rp.size(), gp.size());
        for (size_t i = 0; i < rp.size(); ++i) {
          const Tensor v = hostTensor(rp[i]->value.shape(), 90 + i, 0.5f, 1.5f);
          std::copy(v.data(), v.data() + v.numel(), rp[i]->value.data());
          gpu_->upload(v.data(), gp[i]->value.data(), static_cast<size_t>(v.numel()));
          rp[i]->overwriteGrad = gp[i]->overwriteGrad = true;
        }
        for (uint64_t step = 0; step < 2; ++step) {
          const Shape shape{4, 8, 6, 5};
          const Tensor x = roundAct(hostTensor(shape, 100 + step, centre - 1.7f, centre + 1.7f));
          const Tensor z = roundAct(hostTensor(shape, 200 + step));
          const Tensor dy = roundAct(hostTensor(shape, 300 + step));
          const Tensor xg = toGpuAct(x), zg = toGpuAct(z), dyg = toGpuAct(dy);
          Tensor yr, yg, dxr, dxg, dzr, dzg;
          ref->forward(x, residual ? &z : nullptr, yr, true);
          gpu->forward(xg, residual ? &zg : nullptr, yg, true);
          EXPECT_EQ(yg.dtype(), act_) << what;
          expectClose(fromGpuAct(yg), hostValues(yr), tol.out, what + " forward");
          ref->backward(x, yr, dy, &dxr, residual ? &dzr : nullptr);
          gpu->backward(xg, yg, dyg, &dxg, residual ? &dzg : nullptr);
          expectClose(fromGpuAct(dxg), hostValues(dxr), tol.out, what + " dx");
          if (residual) expectClose(fromGpuAct(dzg), hostValues(dzr), tol.out, what + " dz");
          for (size_t i = 0; i < rp.size(); ++i)
            expectClose(fromGpu(gp[i]->grad), hostValues(rp[i]->grad), tol.grad,
                        what + " " + gp[i]->name + " grad");
        }
        auto rb = ref->buffers(), gb = gpu->buffers();
        for (size_t i = 0; i < rb.size(); ++i)
          expectClose(fromGpu(gb[i]->value), hostValues(rb[i]->value), tol.buf,
                      what + " " + gb[i]->name);
        // Evaluation: running statistics.
        const Tensor x = roundAct(hostTensor({2, 8, 6, 5}, 400, centre - 1.7f, centre + 1.7f));
        const Tensor z = roundAct(hostTensor({2, 8, 6, 5}, 401));
        const Tensor xg = toGpuAct(x), zg = toGpuAct(z);
        Tensor yr, yg;
        ref->forward(x, residual ? &z : nullptr, yr, false);
        gpu->forward(xg, residual ? &zg : nullptr, yg, false);
        expectClose(fromGpuAct(yg), hostValues(yr), tol.out, what + " eval");
      }
  }

  // Runs f with gpu_ an NHWC backend (deterministic, precision p: bf16 or
  // fp16) keeping 16-bit activations, and the activations converted
  // accordingly.
  void withAct16(Precision p, const std::function<void()>& f) {
    withBackend({.device = 0, .precision = p, .deterministic = true, .nhwc = true,
                 .activations16 = true},
                f);
  }

  std::unique_ptr<Backend> cpu_, gpu_;
  CudaBackendOptions opts_;  // gpu_'s, inside withBackend
  bool nhwc_ = false;  // gpu_'s activations are NHWC (withNhwc)
  DType act_ = DType::kFloat32;  // and their element type (withAct16)
};

// Tolerances of bf16/fp16 (autocast) layers against the float64 reference,
// in expectClose's measure: 16 units of roundoff of the 16-bit type for bf16
// (u = 2^-8: 6.25e-2) and 20 for fp16 (u = 2^-11: 9.8e-3). Inputs, weights and
// dy are rounded to 16 bits and so are cuDNN's outputs, sums accumulate in
// float. A host emulation of exactly that rounding on these shapes and input
// ranges (20 seeds) gave worst errors of 2.6e-2 (bf16) and 3.5e-3 (fp16),
// about 2.5x below; the rest is room for the algorithms' own summation order
// (tensor-core tiles, Winograd/FFT transforms where cuDNN picks them). On an
// H100 (cuDNN 9.14) the worst seen were 1.9e-2 (bf16) and 2.4e-3 (fp16).
double tolerance16(Precision p) { return p == Precision::kBf16 ? 16.0 / 256 : 20.0 / 2048; }
constexpr Precision k16Bit[] = {Precision::kBf16, Precision::kFp16};

// ------------------------------------------------------------- convolution
TEST_F(CudaBackendTest, ConvStride1Pad1Bias) { checkConv({3, 8, 3, 1, 1, true}, {2, 3, 10, 9}); }
TEST_F(CudaBackendTest, ConvLeNet5x5Pad2) { checkConv({1, 6, 5, 1, 2, true}, {3, 1, 28, 28}); }
TEST_F(CudaBackendTest, ConvStride2Pad1NoBias) { checkConv({4, 8, 3, 2, 1, false}, {2, 4, 11, 12}); }
TEST_F(CudaBackendTest, ConvStride2Kernel1NoBias) { checkConv({8, 16, 1, 2, 0, false}, {2, 8, 8, 8}); }
TEST_F(CudaBackendTest, ConvResNetStem7x7) { checkConv({3, 8, 7, 2, 3, false}, {2, 3, 20, 20}); }
TEST_F(CudaBackendTest, ConvStride2Pad1Bias) { checkConv({3, 5, 3, 2, 1, true}, {2, 3, 9, 9}); }

TEST_F(CudaBackendTest, ConvTf32IsCloseAndDeterministic) {
  auto tf32 = makeCudaBackend({.device = 0, .precision = Precision::kTf32, .deterministic = true});
  EXPECT_NE(tf32->describe().find("tf32"), std::string::npos) << tf32->describe();
  const Conv2dSpec s{16, 16, 3, 1, 1, true};
  auto ref = cpu_->conv2d("conv", s);
  std::swap(gpu_, tf32);  // checkLayer uploads through gpu_
  auto gpu = gpu_->conv2d("conv", s);
  checkLayer(*ref, *gpu, {4, 16, 12, 12}, true, 1e-2);
  // Same inputs again: bitwise the same gradients (deterministic algorithms).
  auto w1 = fromGpu(gpu->params()[0]->grad);
  auto again = gpu_->conv2d("conv", s);
  auto again2 = cpu_->conv2d("conv", s);
  checkLayer(*again2, *again, {4, 16, 12, 12}, true, 1e-2);
  EXPECT_EQ(w1, fromGpu(again->params()[0]->grad));
  std::swap(gpu_, tf32);
}

// ------------------------------------ convolution: fast and deterministic modes
// max|got - want| / max|want|: the measure of the accuracy check
// (conv_check.h); a NaN in got gives NaN, which fails every bound.
double scaledError(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (std::isnan(d) || d > err) err = std::isnan(err) ? err : d;
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return scale > 0 ? err / scale : err;
}

struct ConvGeometryCase {
  Conv2dSpec spec;
  Shape in;
  const char* name;
};
// ResNet-18's and LeNet's convolution geometries (smaller images and
// batches than training's, so that the host reference stays quick).
const ConvGeometryCase kConvGeometries[] = {
    {{64, 64, 3, 1, 1, false}, {2, 64, 28, 28}, "3x3 s1 p1 64->64"},
    {{64, 128, 3, 2, 1, false}, {2, 64, 28, 28}, "3x3 s2 p1 64->128"},
    {{64, 128, 1, 2, 0, false}, {2, 64, 28, 28}, "1x1 s2 64->128 (downsample)"},
    {{3, 64, 7, 2, 3, false}, {2, 3, 112, 112}, "7x7 s2 p3 3->64 (stem)"},
    {{1, 6, 5, 1, 2, true}, {8, 1, 28, 28}, "LeNet 5x5 p2 1->6"},
};
constexpr Precision kAllPrecisions[] = {Precision::kFp32, Precision::kTf32, Precision::kBf16,
                                        Precision::kFp16};

// Uploads seeded values in [-1, 1) into a device layer's parameters (and the
// same into `host`'s, when given).
void setParams(Backend& be, Layer& gpu, Layer* host, uint64_t seed) {
  auto gp = gpu.params();
  for (size_t i = 0; i < gp.size(); ++i) {
    const auto v = randomVector(static_cast<size_t>(gp[i]->value.numel()), seed + i);
    be.upload(v.data(), gp[i]->value.data(), v.size());
    if (host) std::copy(v.begin(), v.end(), host->params()[i]->value.data());
  }
}

// The fast mode (the default) in every precision against the float64
// reference, forward, dx, dW and db, within the accuracy check's bounds
// (convErrorBound: fp32 1e-4, tf32 3.9e-3, bf16 3.1e-2, fp16 3.9e-3 of the
// output's scale): whatever algorithm the search admits, the layer is that
// accurate. The gradients start as NaN with overwriteGrad set, so they must
// be written, never read. DDPRUN_CONV_LOG=1 puts each choice in the output.
// The same through cuDNN's graph API (CudaBackendOptions::graphConv, NHWC):
// its engines must be found, checked and chosen for every problem here, so
// the legacy search's fallback warning must not appear.
TEST_F(CudaBackendTest, ConvFastModeWithinTheCheckBounds) {
  setenv("DDPRUN_CONV_LOG", "1", 1);
  using GraphConv = CudaBackendOptions::GraphConv;
  struct Kind {
    Precision p;
    bool nhwc;
    GraphConv graph;
  };
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<Kind> kinds;
  const std::pair<bool, GraphConv> searches[] = {
      {false, GraphConv::kOff}, {true, GraphConv::kOff}, {true, GraphConv::kPrecompiled}};
  for (const auto& [nhwc, graph] : searches)
    for (const Precision p : kAllPrecisions) {
      backends.push_back(
          makeCudaBackend({.device = 0, .precision = p, .nhwc = nhwc, .graphConv = graph}));
      kinds.push_back({p, nhwc, graph});
    }
  uint64_t seed = 700;
  for (const ConvGeometryCase& c : kConvGeometries) {
    RefConv2d ref(c.spec);
    const auto values = seed;
    seed += 10;
    {
      auto rp = ref.params();
      for (size_t i = 0; i < rp.size(); ++i) {
        const auto v = randomVector(static_cast<size_t>(rp[i]->value.numel()), values + i);
        std::copy(v.begin(), v.end(), rp[i]->value.data());
      }
    }
    const Tensor x = hostTensor(c.in, seed++);
    Tensor yr, dxr;
    ref.forward(x, yr, true);
    const Tensor dy = hostTensor(yr.shape(), seed++);
    ref.backward(x, yr, dy, &dxr);  // the reference's gradients start at zero
    for (size_t k = 0; k < backends.size(); ++k) {
      Backend& be = *backends[k];
      const auto [p, nhwc, graph] = kinds[k];
      nhwc_ = nhwc;
      const double bound = cuda::convErrorBound(p);
      const std::string what = std::string(c.name) + " " + precisionName(p) + " fast" +
                               (nhwc ? " nhwc" : "") + (graph != GraphConv::kOff ? " graph" : "");
      if (graph != GraphConv::kOff) ::testing::internal::CaptureStderr();
      auto conv = be.conv2d("conv", c.spec);
      auto gp = conv->params();
      setParams(be, *conv, nullptr, values);
      for (Param* q : gp) {
        const std::vector<float> nan(static_cast<size_t>(q->grad.numel()), std::nanf(""));
        be.upload(nan.data(), q->grad.data(), nan.size());
        q->overwriteGrad = true;
      }
      const Tensor xg = toGpuAct(x, &be), dyg = toGpuAct(dy, &be);
      Tensor yg, dxg;
      conv->forward(xg, yg, true);
      conv->backward(xg, yg, dyg, &dxg);
      if (graph != GraphConv::kOff) {
        const std::string log = ::testing::internal::GetCapturedStderr();
        std::cout << log;
        EXPECT_EQ(log.find("no cuDNN graph-API engine may run"), std::string::npos) << what;
        EXPECT_NE(log.find("engine "), std::string::npos) << what << ": no graph engine chosen";
      }
      const double ey = scaledError(fromGpuAct(yg, &be), hostValues(yr));
      const double edx = scaledError(fromGpuAct(dxg, &be), hostValues(dxr));
      std::cout << "[ fast     ] " << what << ": forward " << ey << ", dx " << edx;
      EXPECT_LE(ey, bound) << what << " forward";
      EXPECT_LE(edx, bound) << what << " dx";
      auto rp = ref.params();
      for (size_t i = 0; i < gp.size(); ++i) {
        const double e = scaledError(fromGpu(gp[i]->grad, &be), hostValues(rp[i]->grad));
        std::cout << ", " << gp[i]->name << " grad " << e;
        EXPECT_LE(e, bound) << what << " " << gp[i]->name << " grad";
        EXPECT_FALSE(gp[i]->overwriteGrad) << what << ": backward leaves the flag set";
      }
      std::cout << " (bound " << bound << ")\n";
    }
  }
  nhwc_ = false;
  unsetenv("DDPRUN_CONV_LOG");
}

// Deterministic mode: the same layer run twice on the same inputs gives
// bitwise the same output, dx and gradients, in every precision.
TEST_F(CudaBackendTest, ConvDeterministicModeRepeatsBitwise) {
  for (const Precision p : kAllPrecisions) {
    auto be = makeCudaBackend({.device = 0, .precision = p, .deterministic = true});
    for (const ConvGeometryCase& c : {kConvGeometries[0], kConvGeometries[4]}) {
      const std::string what = std::string(c.name) + " " + precisionName(p) + " deterministic";
      auto conv = be->conv2d("conv", c.spec);
      setParams(*be, *conv, nullptr, 800);
      const Tensor xg = toGpu(hostTensor(c.in, 801), be.get());
      Tensor y, dx;
      conv->forward(xg, y, true);
      const Tensor dyg = toGpu(hostTensor(y.shape(), 802), be.get());
      auto run = [&] {
        for (Param* q : conv->params()) q->overwriteGrad = true;
        conv->forward(xg, y, true);
        conv->backward(xg, y, dyg, &dx);
        std::vector<std::vector<float>> out = {fromGpu(y, be.get()), fromGpu(dx, be.get())};
        for (Param* q : conv->params()) out.push_back(fromGpu(q->grad, be.get()));
        return out;
      };
      conv->backward(xg, y, dyg, &dx);  // the first backward searches
      const auto first = run(), second = run();
      ASSERT_EQ(first.size(), second.size());
      const char* names[] = {"y", "dx", "dW", "db"};
      for (size_t i = 0; i < first.size(); ++i)
        EXPECT_EQ(first[i], second[i]) << what << ": " << names[i] << " differs between runs";
    }
  }
}

// Param::overwriteGrad: a gradient holding NaN with the flag set ends equal
// to the fresh gradient (written with beta = 0 / the 16-bit cast, never
// read); without the flag backward adds to what is there; an empty batch
// zeroes a flagged gradient and leaves an unflagged one alone. The flag is
// cleared each time. fp32 and bf16 (the 16-bit dW path).
TEST_F(CudaBackendTest, ConvOverwriteGradContract) {
  const Conv2dSpec spec{3, 8, 3, 1, 1, true};
  const Shape in{2, 3, 10, 9};
  for (const Precision p : {Precision::kFp32, Precision::kBf16}) {
    const std::string what = precisionName(p);
    auto be = makeCudaBackend({.device = 0, .precision = p, .deterministic = true});
    auto conv = be->conv2d("conv", spec);
    const auto ps = conv->params();
    ASSERT_EQ(ps.size(), 2u);
    setParams(*be, *conv, nullptr, 900);
    const Tensor xg = toGpu(hostTensor(in, 901), be.get());
    Tensor y, dx;
    conv->forward(xg, y, true);
    const Tensor dyg = toGpu(hostTensor(y.shape(), 902), be.get());
    std::vector<std::vector<float>> zeros, nans, start;
    for (Param* q : ps) {
      const size_t n = static_cast<size_t>(q->grad.numel());
      zeros.emplace_back(n, 0.0f);
      nans.emplace_back(n, std::nanf(""));
      start.push_back(randomVector(n, 903 + start.size()));
    }
    // The gradients after one forward + backward from `init`, flag `flag`.
    auto gradsAfter = [&](const Tensor& x, const std::vector<std::vector<float>>& init,
                          bool flag) {
      for (size_t i = 0; i < ps.size(); ++i) {
        be->upload(init[i].data(), ps[i]->grad.data(), init[i].size());
        ps[i]->overwriteGrad = flag;
      }
      Tensor yy, dd;
      conv->forward(x, yy, true);
      dd.ensure(yy.shape(), be->allocator());
      if (yy.numel()) be->copy(dyg, dd);
      conv->backward(x, yy, dd, &dx);
      std::vector<std::vector<float>> g;
      for (Param* q : ps) {
        EXPECT_FALSE(q->overwriteGrad) << what << " " << q->name;
        g.push_back(fromGpu(q->grad, be.get()));
      }
      return g;
    };
    const auto fresh = gradsAfter(xg, zeros, false);
    const auto over = gradsAfter(xg, nans, true);
    const auto added = gradsAfter(xg, start, false);
    for (size_t i = 0; i < ps.size(); ++i) {
      for (float v : fresh[i]) ASSERT_TRUE(std::isfinite(v)) << what << " " << ps[i]->name;
      EXPECT_EQ(over[i], fresh[i]) << what << " " << ps[i]->name << ": not overwritten";
      std::vector<float> sum(fresh[i].size());
      for (size_t j = 0; j < sum.size(); ++j) sum[j] = start[i][j] + fresh[i][j];
      expectClose(added[i], sum, 1e-6, what + " " + ps[i]->name + " accumulated");
    }
    const Tensor empty(Shape{0, 3, 10, 9}, be->allocator());
    const auto zeroed = gradsAfter(empty, nans, true);
    const auto kept = gradsAfter(empty, start, false);
    for (size_t i = 0; i < ps.size(); ++i) {
      EXPECT_EQ(zeroed[i], zeros[i]) << what << " " << ps[i]->name << ": empty batch, flag set";
      EXPECT_EQ(kept[i], start[i]) << what << " " << ps[i]->name << ": empty batch, no flag";
    }
  }
}

// The float64 reference kernels of the accuracy check against the same
// functions on the host (kernel_math.h, which the CPU unit tests compare
// with the CPU backend); the fill and the error reduction too.
TEST_F(CudaBackendTest, ConvReferenceKernelsMatchHost) {
  auto ctx = std::make_shared<cuda::Context>(
      CudaBackendOptions{.device = 0, .precision = Precision::kFp32});
  const cudaStream_t s = ctx->stream();
  for (const kmath::ConvGeom& g :
       {kmath::convGeom(2, 3, 11, 12, 5, 3, 2, 1), kmath::convGeom(3, 1, 12, 12, 6, 5, 1, 2),
        kmath::convGeom(2, 8, 8, 9, 16, 1, 2, 0), kmath::convGeom(1, 3, 20, 17, 4, 7, 2, 3)}) {
    const size_t nx = g.n * g.c * g.h * g.w, nw = g.k * g.c * g.kernel * g.kernel,
                 ny = g.n * g.k * g.oh * g.ow;
    const auto x = randomVector(nx, 1), w = randomVector(nw, 2), dy = randomVector(ny, 3);
    cuda::DeviceArray<float> xd(ctx), wd(ctx), dyd(ctx);
    cuda::DeviceArray<double> yd(ctx), dxd(ctx), dwd(ctx);
    ctx->upload(x.data(), xd.ensure(nx), nx * 4);
    ctx->upload(w.data(), wd.ensure(nw), nw * 4);
    ctx->upload(dy.data(), dyd.ensure(ny), ny * 4);
    cuda::launchConvReferenceForward(xd.get(), wd.get(), yd.ensure(ny), g, s);
    cuda::launchConvReferenceBackwardData(wd.get(), dyd.get(), dxd.ensure(nx), g, s);
    cuda::launchConvReferenceBackwardFilter(xd.get(), dyd.get(), dwd.ensure(nw), g, s);
    std::vector<double> y(ny), dx(nx), dw(nw);
    ctx->download(yd.get(), y.data(), ny * 8);
    ctx->download(dxd.get(), dx.data(), nx * 8);
    ctx->download(dwd.get(), dw.data(), nw * 8);
    size_t e = 0;
    for (int64_t n = 0; n < g.n; ++n)
      for (int64_t o = 0; o < g.k; ++o)
        for (int64_t i = 0; i < g.oh; ++i)
          for (int64_t j = 0; j < g.ow; ++j, ++e)
            ASSERT_NEAR(y[e], kmath::convForwardAt(x.data(), w.data(), g, n, o, i, j), 1e-9);
    e = 0;
    for (int64_t n = 0; n < g.n; ++n)
      for (int64_t c = 0; c < g.c; ++c)
        for (int64_t i = 0; i < g.h; ++i)
          for (int64_t j = 0; j < g.w; ++j, ++e)
            ASSERT_NEAR(dx[e], kmath::convBackwardDataAt(w.data(), dy.data(), g, n, c, i, j),
                        1e-9);
    e = 0;
    for (int64_t o = 0; o < g.k; ++o)
      for (int64_t c = 0; c < g.c; ++c)
        for (int64_t a = 0; a < g.kernel; ++a)
          for (int64_t b = 0; b < g.kernel; ++b, ++e)
            ASSERT_NEAR(dw[e], kmath::convBackwardFilterAt(x.data(), dy.data(), g, o, c, a, b),
                        1e-9);
  }
  cuda::DeviceArray<float> u(ctx);
  cuda::launchFillUniform(u.ensure(1000), 1000, 42, s);
  std::vector<float> uh(1000);
  ctx->download(u.get(), uh.data(), 4000);
  for (size_t i = 0; i < uh.size(); ++i) ASSERT_EQ(uh[i], kmath::hashUniform(42, i)) << i;
  cuda::DeviceArray<uint16_t> u16(ctx);  // the 16-bit fill: the same values, rounded once
  std::vector<uint16_t> bits(1000);
  for (const bool bf16 : {true, false}) {
    cuda::launchFillUniform16(u16.ensure(1000), 1000, 42, bf16, s);
    ctx->download(u16.get(), bits.data(), 2000);
    for (size_t i = 0; i < bits.size(); ++i)
      ASSERT_EQ(bits[i], bf16 ? runtime::floatToBf16(kmath::hashUniform(42, i))
                              : runtime::floatToHalf(kmath::hashUniform(42, i)))
          << (bf16 ? "bf16 " : "fp16 ") << i;
  }
  const std::vector<float> got = {1.0f, 2.0f, 3.0f};
  const std::vector<double> want = {1.0, 2.5, -4.0};
  cuda::DeviceArray<float> gd(ctx);
  cuda::DeviceArray<double> wd2(ctx), out(ctx);
  ctx->upload(got.data(), gd.ensure(3), 12);
  ctx->upload(want.data(), wd2.ensure(3), 24);
  cuda::launchMaxError(gd.get(), wd2.get(), 3, out.ensure(2), s);
  double r[2] = {0, 0};
  ctx->download(out.get(), r, sizeof r);
  EXPECT_EQ(r[0], 7.0);
  EXPECT_EQ(r[1], 4.0);
  const float nan = std::nanf("");
  ctx->upload(&nan, gd.get() + 1, 4);
  cuda::launchMaxError(gd.get(), wd2.get(), 3, out.get(), s);
  ctx->download(out.get(), r, sizeof r);
  EXPECT_TRUE(std::isnan(r[0])) << "a NaN output must fail the check";
}

// The layout transposes against the host's, exactly: matrices with a narrow
// side (the model's 3-channel input, 3x3 and 1x1 filters, each way; chunks
// of the wide side, the last one partial) and without (32x32 tiles), written
// and added, and through 16 bits and back (rounded once, then exact).
TEST_F(CudaBackendTest, TransposesOfNarrowAndWideMatricesAreExact) {
  auto ctx = std::make_shared<cuda::Context>(
      CudaBackendOptions{.device = 0, .precision = Precision::kFp32});
  const cudaStream_t s = ctx->stream();
  struct Case {
    int64_t batches, rows, cols;
  };
  for (const Case c : {Case{2, 3, 3000}, Case{3, 3000, 3}, Case{5, 64, 9}, Case{5, 9, 64},
                       Case{2, 512, 1}, Case{2, 1, 700}, Case{3, 32, 100}, Case{2, 33, 40},
                       Case{2, 40, 33}, Case{1, 1, 1}}) {
    const std::string what = std::to_string(c.batches) + "x" + std::to_string(c.rows) + "x" +
                             std::to_string(c.cols);
    const size_t n = static_cast<size_t>(c.batches * c.rows * c.cols);
    const auto x = randomVector(n, 11);
    std::vector<float> want(n);
    for (int64_t b = 0; b < c.batches; ++b)
      for (int64_t i = 0; i < c.rows; ++i)
        for (int64_t j = 0; j < c.cols; ++j)
          want[static_cast<size_t>((b * c.cols + j) * c.rows + i)] =
              x[static_cast<size_t>((b * c.rows + i) * c.cols + j)];
    cuda::DeviceArray<float> xd(ctx), yd(ctx), back(ctx);
    cuda::DeviceArray<uint16_t> h(ctx);
    ctx->upload(x.data(), xd.ensure(n), n * 4);
    std::vector<float> got(n);
    cuda::launchTranspose(xd.get(), yd.ensure(n), c.batches, c.rows, c.cols, false, s);
    ctx->download(yd.get(), got.data(), n * 4);
    ASSERT_EQ(got, want) << what;
    cuda::launchTranspose(xd.get(), yd.get(), c.batches, c.rows, c.cols, true, s);
    ctx->download(yd.get(), got.data(), n * 4);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], 2.0f * want[i]) << what << " added, " << i;
    for (const bool bf16 : {true, false}) {
      cuda::launchTransposeTo16(xd.get(), h.ensure(n), c.batches, c.rows, c.cols, bf16, s);
      cuda::launchTransposeFrom16(h.get(), back.ensure(n), c.batches, c.cols, c.rows, bf16,
                                  false, s);
      ctx->download(back.get(), got.data(), n * 4);
      for (size_t i = 0; i < n; ++i) {
        const float r = bf16 ? runtime::bf16ToFloat(runtime::floatToBf16(x[i]))
                             : runtime::halfToFloat(runtime::floatToHalf(x[i]));
        ASSERT_EQ(got[i], r) << what << (bf16 ? " bf16 " : " fp16 ") << i;
      }
    }
  }
}

// ReLU, its backward and the add, in every storage type, against the host
// element by element, exactly: 16 bytes a thread where the pointers are
// 16-byte aligned (sizes with and without a remainder), one element at a
// time where they are not (a view one element in), in place too.
TEST_F(CudaBackendTest, ElementwiseKernelsAreExactAlignedOrNot) {
  auto ctx = std::make_shared<cuda::Context>(
      CudaBackendOptions{.device = 0, .precision = Precision::kFp32});
  const cudaStream_t s = ctx->stream();
  using runtime::DType;
  for (const DType t : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const size_t es = t == DType::kFloat32 ? 4 : 2;
    // Host values as the type stores them (round once), and back.
    auto stored = [&](float v) {
      return t == DType::kFloat32    ? v
             : t == DType::kBFloat16 ? runtime::bf16ToFloat(runtime::floatToBf16(v))
                                     : runtime::halfToFloat(runtime::floatToHalf(v));
    };
    auto bytesOf = [&](const std::vector<float>& v) {
      std::vector<uint8_t> b(v.size() * es);
      for (size_t i = 0; i < v.size(); ++i) {
        if (t == DType::kFloat32) {
          std::memcpy(&b[i * 4], &v[i], 4);
        } else {
          const uint16_t h = t == DType::kBFloat16 ? runtime::floatToBf16(v[i])
                                                   : runtime::floatToHalf(v[i]);
          std::memcpy(&b[i * 2], &h, 2);
        }
      }
      return b;
    };
    auto valuesOf = [&](const std::vector<uint8_t>& b) {
      std::vector<float> v(b.size() / es);
      for (size_t i = 0; i < v.size(); ++i) {
        if (t == DType::kFloat32) {
          std::memcpy(&v[i], &b[i * 4], 4);
        } else {
          uint16_t h;
          std::memcpy(&h, &b[i * 2], 2);
          v[i] = t == DType::kBFloat16 ? runtime::bf16ToFloat(h) : runtime::halfToFloat(h);
        }
      }
      return v;
    };
    for (const size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{1000},
                           size_t{1003}}) {
      for (const size_t offset : {size_t{0}, size_t{1}}) {
        const std::string what = std::string(runtime::dtypeName(t)) + " n " + std::to_string(n) +
                                 (offset ? " unaligned" : " aligned");
        std::vector<float> a = randomVector(n, 21), b = randomVector(n, 22);
        for (size_t i = 0; i < n; ++i) a[i] = stored(a[i]), b[i] = stored(b[i]);
        cuda::DeviceArray<uint8_t> ad(ctx), bd(ctx), od(ctx);
        const size_t bytes = (n + offset) * es;
        uint8_t* ap = ad.ensure(bytes) + offset * es;
        uint8_t* bp = bd.ensure(bytes) + offset * es;
        uint8_t* op = od.ensure(bytes) + offset * es;
        const auto ab = bytesOf(a), bb = bytesOf(b);
        ctx->upload(ab.data(), ap, ab.size());
        ctx->upload(bb.data(), bp, bb.size());
        std::vector<uint8_t> got(n * es);
        auto result = [&](const uint8_t* p) {
          ctx->download(p, got.data(), got.size());
          return valuesOf(got);
        };
        std::vector<float> want(n);
        cuda::launchRelu(ap, op, n, t, s);
        for (size_t i = 0; i < n; ++i) want[i] = a[i] > 0.0f ? a[i] : 0.0f;
        ASSERT_EQ(result(op), want) << what << " relu";
        cuda::launchReluBackward(op, bp, op, n, t, s);  // in place over y
        for (size_t i = 0; i < n; ++i) want[i] = want[i] > 0.0f ? b[i] : 0.0f;
        ASSERT_EQ(result(op), want) << what << " relu backward";
        cuda::launchAdd(ap, bp, op, n, t, s);
        for (size_t i = 0; i < n; ++i) want[i] = stored(a[i] + b[i]);
        ASSERT_EQ(result(op), want) << what << " add";
        cuda::launchAdd(ap, bp, ap, n, t, s);  // in place over a
        ASSERT_EQ(result(ap), want) << what << " add in place";
      }
    }
  }
}

// The accuracy check on every algorithm of every direction, per precision,
// for LeNet's conv1 and a 3x3 64-channel layer (the shapes behind the
// bounds): the errors are printed (inf: the algorithm does not run there),
// the direct fp32 sums stay 10x inside the fp32 bound, and in every
// precision and direction some algorithm passes (else the layer would fall
// back to the deterministic choice).
TEST_F(CudaBackendTest, ConvAccuracyCheckOfEveryAlgorithm) {
  auto ctx = std::make_shared<cuda::Context>(
      CudaBackendOptions{.device = 0, .precision = Precision::kFp32});
  const ConvGeometryCase cases[] = {
      {{1, 6, 5, 1, 2, true}, {64, 1, 28, 28}, "LeNet conv1 5x5 p2 1->6"},
      {{64, 64, 3, 1, 1, false}, {32, 64, 56, 56}, "3x3 s1 p1 64->64 56x56"},
  };
  for (const Precision p : kAllPrecisions) {
    const cudnnDataType_t type = p == Precision::kBf16   ? CUDNN_DATA_BFLOAT16
                                 : p == Precision::kFp16 ? CUDNN_DATA_HALF
                                                         : CUDNN_DATA_FLOAT;
    const cudnnMathType_t math = p == Precision::kFp32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
    const double bound = cuda::convErrorBound(p);
    for (const ConvGeometryCase& c : cases) {
      const Conv2dSpec& sp = c.spec;
      auto wDesc = cuda::FilterDesc::create();
      auto conv = cuda::ConvDesc::create();
      DDPRUN_CUDNN_OK(cudnnSetFilter4dDescriptor(wDesc, type, CUDNN_TENSOR_NCHW,
                                                 static_cast<int>(sp.outC),
                                                 static_cast<int>(sp.inC), sp.kernel, sp.kernel));
      DDPRUN_CUDNN_OK(cudnnSetConvolution2dDescriptor(conv, sp.pad, sp.pad, sp.stride, sp.stride,
                                                      1, 1, CUDNN_CROSS_CORRELATION,
                                                      CUDNN_DATA_FLOAT));
      cuda::ConvAccuracyCheck check(
          ctx, kmath::convGeom(c.in[0], c.in[1], c.in[2], c.in[3], sp.outC, sp.kernel, sp.stride, sp.pad),
          type, wDesc, conv);
      const std::string what = std::string(c.name) + " " + precisionName(p);
      auto report = [&](const char* dir, int count, const std::function<double(int)>& err,
                        const std::vector<int>& direct) {
        std::cout << "[ check    ] " << what << " " << dir << " (bound " << bound << "):";
        bool anyPasses = false;
        for (int a = 0; a < count; ++a) {
          const double e = err(a);
          std::cout << " " << a << "=" << e;
          anyPasses |= e <= bound;
          if (p == Precision::kFp32 &&
              std::find(direct.begin(), direct.end(), a) != direct.end()) {
            EXPECT_LE(e, bound / 10) << what << " " << dir << " direct algorithm " << a;
          }
        }
        std::cout << "\n";
        EXPECT_TRUE(anyPasses) << what << " " << dir << ": no algorithm within the bound";
      };
      // The direct sums that run for every geometry: IMPLICIT_GEMM, ALGO_1.
      report("forward", CUDNN_CONVOLUTION_FWD_ALGO_COUNT, [&](int a) {
        return check.error(static_cast<cudnnConvolutionFwdAlgo_t>(a), math);
      }, {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM});
      report("backward-data", CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, [&](int a) {
        return check.error(static_cast<cudnnConvolutionBwdDataAlgo_t>(a), math);
      }, {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1});
      report("backward-filter", CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, [&](int a) {
        return check.error(static_cast<cudnnConvolutionBwdFilterAlgo_t>(a), math);
      }, {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1});
    }
  }
}

// ----------------------------------------------------------------- pooling
TEST_F(CudaBackendTest, MaxPool2x2) { checkPool({2, 2, 0}, {2, 3, 8, 10}); }
TEST_F(CudaBackendTest, MaxPool2x2OddInput) { checkPool({2, 0, 0}, {2, 3, 9, 7}); }
TEST_F(CudaBackendTest, MaxPool3x3Stride2Pad1) { checkPool({3, 2, 1}, {2, 4, 11, 12}); }

TEST_F(CudaBackendTest, GlobalAvgPool) {
  auto ref = reference([&] { return cpu_->globalAvgPool("gap"); },
                       [&] { return std::make_unique<RefAvgPool>(); });
  auto gpu = gpu_->globalAvgPool("gap");
  checkLayer(*ref, *gpu, {3, 5, 7, 7}, true, 1e-5);
  checkLayer(*ref, *gpu, {2, 3, 33, 2}, true, 1e-5, 2);
}

// ---------------------------------------------------------- element layers
TEST_F(CudaBackendTest, Relu) {
  auto ref = cpu_->relu("relu");
  auto gpu = gpu_->relu("relu");
  checkLayer(*ref, *gpu, {4, 3, 5, 6}, true, 0.0);
}

TEST_F(CudaBackendTest, FlattenIsAView) {
  auto gpu = gpu_->flatten("flat");
  const Tensor xg = toGpu(hostTensor({2, 3, 4, 5}, 1));
  Tensor y, dx;
  gpu->forward(xg, y, true);
  EXPECT_EQ(y.shape(), (Shape{2, 60}));
  EXPECT_EQ(y.data(), xg.data());
  gpu->backward(xg, y, y, &dx);
  EXPECT_EQ(dx.shape(), xg.shape());
}

// ---------------------------------------------------------------- NHWC
// Every layer whose work depends on the layout, on an NHWC backend against
// the CPU (or the float64 reference), activations transposed on the host.
TEST_F(CudaBackendTest, NhwcConvolutions) {
  withNhwc(Precision::kFp32, [&] {
    checkConv({3, 8, 3, 1, 1, true}, {2, 3, 10, 9});
    checkConv({1, 6, 5, 1, 2, true}, {3, 1, 28, 28});
    checkConv({4, 8, 3, 2, 1, false}, {2, 4, 11, 12});
    checkConv({8, 16, 1, 2, 0, false}, {2, 8, 8, 8});
    checkConv({3, 8, 7, 2, 3, false}, {2, 3, 20, 20});
    checkConv({3, 5, 3, 2, 1, true}, {2, 3, 9, 9});
  });
}

TEST_F(CudaBackendTest, NhwcPoolingNormsAndElementLayers) {
  withNhwc(Precision::kFp32, [&] {
    checkPool({2, 2, 0}, {2, 3, 8, 10});
    checkPool({3, 2, 1}, {2, 4, 11, 12});
    {
      auto ref = cpu_->batchNorm2d("bn", 6, nullptr);
      auto gpu = gpu_->batchNorm2d("bn", 6, nullptr);
      checkLayer(*ref, *gpu, {4, 6, 5, 7}, true, 1e-4);
      checkLayer(*ref, *gpu, {4, 6, 5, 7}, true, 1e-4, 2);
      checkLayer(*ref, *gpu, {3, 6, 5, 7}, false, 1e-4, 3);
    }
    {
      // Mean 100, standard deviation about 1: the variance must not cancel.
      auto ref = cpu_->batchNorm2d("bn", 4, nullptr);
      auto gpu = gpu_->batchNorm2d("bn", 4, nullptr);
      Tensor x = hostTensor({8, 4, 6, 6}, 41, 98.3f, 101.7f);
      Tensor yr, yg;
      ref->forward(x, yr, true);
      gpu->forward(toGpuAct(x), yg, true);
      expectClose(fromGpuAct(yg), hostValues(yr), 1e-3, "bn mean 100 forward");
    }
    testing::runRanks(1, [&](runtime::ProcessGroup& pg) {
      auto ref = cpu_->batchNorm2d("bn", 5, nullptr);
      auto gpu = gpu_->batchNorm2d("bn", 5, &pg);
      checkLayer(*ref, *gpu, {4, 5, 6, 3}, true, 1e-4);
      checkLayer(*ref, *gpu, {2, 5, 6, 3}, false, 1e-4, 3);
    });
    auto gapRef = reference([&] { return cpu_->globalAvgPool("gap"); },
                            [&] { return std::make_unique<RefAvgPool>(); });
    auto gap = gpu_->globalAvgPool("gap");
    checkLayer(*gapRef, *gap, {3, 5, 7, 7}, true, 1e-5);
    checkLayer(*gapRef, *gap, {2, 3, 33, 2}, true, 1e-5, 2);
    auto relu = cpu_->relu("relu"), gpuRelu = gpu_->relu("relu");
    checkLayer(*relu, *gpuRelu, {4, 3, 5, 6}, true, 0.0);
  });
}

// Flatten gives PyTorch's (c, h, w) order, which the next linear layer's
// weights are in; a 1x1 map (ResNet's) stays a view.
TEST_F(CudaBackendTest, NhwcFlattenGivesPyTorchOrder) {
  withNhwc(Precision::kFp32, [&] {
    auto gpu = gpu_->flatten("flat");
    const Tensor x = hostTensor({2, 3, 4, 5}, 1);
    const Tensor xg = toGpuAct(x);
    Tensor y, dx;
    gpu->forward(xg, y, true);
    EXPECT_EQ(y.shape(), (Shape{2, 60}));
    EXPECT_EQ(fromGpu(y), hostValues(x));
    const Tensor dy = hostTensor({2, 60}, 2);
    gpu->backward(xg, y, toGpu(dy), &dx);
    EXPECT_EQ(dx.shape(), xg.shape());
    EXPECT_EQ(fromGpuAct(dx), hostValues(dy));
    const Tensor one = toGpuAct(hostTensor({2, 7, 1, 1}, 3));
    gpu->forward(one, y, true);
    EXPECT_EQ(y.data(), one.data());
  });
}

// Batch norm + ReLU (+ the residual add) as one layer, on NHWC with cuDNN's
// fused kernels (CudaBackendOptions::cudnnBnFusion; where cuDNN refuses them the layer
// says so on stderr and runs the layers apart): against the CPU's
// composition, inputs around 0 and around 100 (the variance must not
// cancel), two steps (running statistics, accumulated gradients).
TEST_F(CudaBackendTest, NhwcBatchNormActMatchesCpu) {
  withBackend({.device = 0, .precision = Precision::kFp32, .deterministic = true, .nhwc = true,
               .cudnnBnFusion = true},
              [&] {
                checkBatchNormAct([](float centre) {
                  const double r = centre != 0.0f ? 1e-3 : 1e-4;
                  return BnTol{r, r, r};
                });
              });
}

// Our NHWC batch norm kernels on float activations (CudaBackendOptions::
// ourBatchNorm, the A/B against cuDNN's): batch norm alone (training, running
// statistics, evaluation), SyncBatchNorm over one rank, and fused with the
// ReLU and the residual add, against the CPU within float's rounding.
TEST_F(CudaBackendTest, OurBatchNormOnFloatMatchesCpu) {
  withBackend({.device = 0, .precision = Precision::kFp32, .deterministic = true, .nhwc = true,
               .ourBatchNorm = true},
              [&] {
                EXPECT_NE(gpu_->describe().find("our batch norm"), std::string::npos);
                auto ref = cpu_->batchNorm2d("bn", 6, nullptr);
                auto gpu = gpu_->batchNorm2d("bn", 6, nullptr);
                checkLayer(*ref, *gpu, {4, 6, 5, 7}, true, 1e-4);
                checkLayer(*ref, *gpu, {4, 6, 5, 7}, true, 1e-4, 2);
                checkLayer(*ref, *gpu, {3, 6, 5, 7}, false, 1e-4, 3);
                testing::runRanks(1, [&](runtime::ProcessGroup& pg) {
                  auto r = cpu_->batchNorm2d("bn", 5, nullptr);
                  auto g = gpu_->batchNorm2d("bn", 5, &pg);
                  checkLayer(*r, *g, {4, 5, 6, 3}, true, 1e-4);
                });
                checkBatchNormAct([](float centre) {
                  const double r = centre != 0.0f ? 1e-3 : 1e-4;
                  return BnTol{r, r, r};
                });
              });
}

TEST_F(CudaBackendTest, NhwcModelInputTransposes) {
  const Tensor x = hostTensor({3, 3, 9, 7}, 5);
  const Tensor plain = toGpu(x);
  EXPECT_EQ(gpu_->modelInput(plain).data(), plain.data());  // NCHW: the tensor itself
  withNhwc(Precision::kFp32, [&] {
    const Tensor in = toGpu(x);
    const Tensor m = gpu_->modelInput(in);
    EXPECT_EQ(m.shape(), x.shape());
    EXPECT_EQ(fromGpuAct(m), hostValues(x));
  });
}

TEST_F(CudaBackendTest, Linear) {
  auto ref = cpu_->linear("fc", 33, 17);
  auto gpu = gpu_->linear("fc", 33, 17);
  checkLayer(*ref, *gpu, {5, 33}, true, 1e-4);
  checkLayer(*ref, *gpu, {64, 33}, true, 1e-4, 3);  // another batch size: another plan
}

TEST_F(CudaBackendTest, LinearTf32) {
  auto tf32 = makeCudaBackend({.device = 0, .precision = Precision::kTf32});
  std::swap(gpu_, tf32);
  auto ref = cpu_->linear("fc", 256, 64);
  auto gpu = gpu_->linear("fc", 256, 64);
  checkLayer(*ref, *gpu, {32, 256}, true, 1e-2);
  std::swap(gpu_, tf32);
}

// ----------------------------------------------------- bf16 / fp16 (autocast)
// A convolution in each 16-bit precision against the float64 reference
// (forward, dx, the accumulated dW and db); a second layer on the same
// inputs gives bitwise the same gradients (deterministic algorithms).
class CudaAutocastTest : public CudaBackendTest {
 protected:
  void checkConv16(const Conv2dSpec& s, const Shape& in) {
    for (const Precision p : k16Bit)
      withPrecision(p, [&] {
        RefConv2d ref(s), ref2(s);
        auto a = gpu_->conv2d("conv", s), b = gpu_->conv2d("conv", s);
        checkLayer(ref, *a, in, true, tolerance16(p));
        checkLayer(ref2, *b, in, true, tolerance16(p));
        for (size_t i = 0; i < a->params().size(); ++i)
          EXPECT_EQ(fromGpu(a->params()[i]->grad), fromGpu(b->params()[i]->grad))
              << precisionName(p) << " " << a->params()[i]->name << " not deterministic";
        checkLayer(ref, *a, in, false, tolerance16(p), 3);  // eval forward
      });
  }
};

TEST_F(CudaAutocastTest, ConvStride1Pad1Bias) { checkConv16({3, 8, 3, 1, 1, true}, {2, 3, 10, 9}); }
TEST_F(CudaAutocastTest, ConvStride2Pad1NoBias) {
  checkConv16({4, 8, 3, 2, 1, false}, {2, 4, 11, 12});
}
TEST_F(CudaAutocastTest, ConvStride2Pad1OddChannelsBias) {
  checkConv16({3, 5, 3, 2, 1, true}, {2, 3, 9, 9});
}
TEST_F(CudaAutocastTest, ConvResNetStem7x7) { checkConv16({3, 8, 7, 2, 3, false}, {2, 3, 20, 20}); }
TEST_F(CudaAutocastTest, Conv16Channels) { checkConv16({16, 16, 3, 1, 1, true}, {4, 16, 12, 12}); }
// NHWC: the filter's cast fused with its transpose to KRSC, the bias added
// by channel in NHWC order, the 16-bit KRSC weight gradient added into the
// OIHW one.
TEST_F(CudaAutocastTest, NhwcConv) {
  for (const Precision p : k16Bit)
    withNhwc(p, [&] {
      for (const auto& [s, in] : {std::pair<Conv2dSpec, Shape>{{3, 8, 3, 1, 1, true}, {2, 3, 10, 9}},
                                  {{3, 8, 7, 2, 3, false}, {2, 3, 20, 20}},
                                  {{16, 16, 3, 1, 1, true}, {4, 16, 12, 12}}}) {
        RefConv2d ref(s);
        auto a = gpu_->conv2d("conv", s);
        checkLayer(ref, *a, in, true, tolerance16(p));
        checkLayer(ref, *a, in, false, tolerance16(p), 3);
      }
    });
}

// The linear layer (16-bit A/B, float C/D) against the CPU backend, whose
// fp32 error is far below these tolerances; odd sizes (ld 33) too.
TEST_F(CudaAutocastTest, Linear) {
  for (const Precision p : k16Bit)
    withPrecision(p, [&] {
      auto ref = cpu_->linear("fc", 33, 17);
      auto gpu = gpu_->linear("fc", 33, 17);
      checkLayer(*ref, *gpu, {5, 33}, true, tolerance16(p));
      checkLayer(*ref, *gpu, {64, 33}, true, tolerance16(p), 3);
      checkLayer(*ref, *gpu, {7, 33}, false, tolerance16(p), 4);  // eval forward
      auto ref2 = cpu_->linear("fc", 256, 64);
      auto gpu2 = gpu_->linear("fc", 256, 64);
      checkLayer(*ref2, *gpu2, {32, 256}, true, tolerance16(p), 5);
    });
}

// A small CNN: conv + batch norm + ReLU + max pool + flatten + linear, on one
// backend, trained with momentum SGD on a fixed batch (its parameters drawn
// on the host, so every backend starts from the same values).
class TinyNet {
 public:
  explicit TinyNet(Backend& be) : be_(be) {
    layers_.push_back(be.conv2d("conv", Conv2dSpec{3, 8, 3, 1, 1, false}));
    layers_.push_back(be.batchNorm2d("bn", 8, nullptr));
    layers_.push_back(be.relu("relu"));
    layers_.push_back(be.maxPool2d("pool", 2));
    layers_.push_back(be.flatten("flat"));
    layers_.push_back(be.linear("fc", 8 * 8 * 8, 10));
    uint64_t seed = 500;
    for (Param* p : params()) {
      momentum_.emplace_back(p->value.shape(), be.allocator());
      if (p->name.starts_with("bn.")) continue;  // 1 and 0, as PyTorch
      const double bound = p->value.rank() == 1 ? 0.1 : 1.0 / std::sqrt(static_cast<double>(
                                                            p->value.numel() / p->value.dim(0)));
      const auto v = randomVector(static_cast<size_t>(p->value.numel()), seed++,
                                  static_cast<float>(-bound), static_cast<float>(bound));
      be.upload(v.data(), p->value.data(), v.size());
    }
  }
  std::vector<Param*> params() {
    std::vector<Param*> all;
    for (auto& l : layers_)
      for (Param* p : l->params()) all.push_back(p);
    return all;
  }
  // Zero the gradients, forward, loss (dlogits times gradScale), backward.
  double forwardBackward(const Tensor& x, const std::vector<int32_t>& labels, float gradScale) {
    for (Param* p : params()) be_.zero(p->grad);
    acts_.resize(layers_.size());
    grads_.resize(layers_.size());
    for (size_t i = 0; i < layers_.size(); ++i)
      layers_[i]->forward(i ? acts_[i - 1] : x, acts_[i], true);
    Tensor dlogits;
    const double loss = be_.crossEntropy(acts_.back(), labels.data(), &dlogits, nullptr, gradScale);
    const Tensor* dy = &dlogits;
    for (size_t i = layers_.size(); i-- > 0;) {
      layers_[i]->backward(i ? acts_[i - 1] : x, acts_[i], *dy, i ? &grads_[i] : nullptr);
      dy = &grads_[i];
    }
    return loss;
  }
  // Unscale by 1/gradScale (the fp16 loss scaler's check); true when every
  // gradient is finite.
  bool unscale(float gradScale) {
    bool finite = true;
    for (Param* p : params())
      finite &= be_.scaleAndCheckFinite(p->grad.data(), static_cast<size_t>(p->grad.numel()),
                                        1.0f / gradScale);
    return finite;
  }
  void sgd(bool first) {
    size_t i = 0;
    for (Param* p : params())
      be_.sgdUpdate(p->value.data(), p->grad.data(), momentum_[i++].data(),
                    static_cast<size_t>(p->value.numel()), 0.05f, 0.9f, 0.0f, first);
  }

 private:
  Backend& be_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Tensor> acts_, grads_, momentum_;
};

// Five SGD steps in bf16 and in fp16 (loss scale 1024, unscaled before the
// step, as the trainer does), with float activations (autocast's casts) and
// with 16-bit NHWC activations (CudaBackendOptions::activations16; the input
// through modelInput), stay close to the same steps in fp32: the loss
// of every step within 2e-2 (bf16) / 5e-3 (fp16) of fp32's, relative, each
// final parameter within 5e-2 / 2e-2 normwise; and the loss goes down. (On an
// H100: losses within 5e-3 / 1.4e-3; parameters within 1.4e-2 / 7.4e-3, the
// largest for the batch norm bias, which starts at zero, so its norm is small.)
TEST_F(CudaAutocastTest, SmallModelTrainsCloseToFp32) {
  const Tensor x = hostTensor({16, 3, 16, 16}, 71);
  std::vector<int32_t> labels(16);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int32_t>((i * 3) % 10);
  auto train = [&](Backend& be, float scale, std::vector<double>& losses) {
    TinyNet net(be);
    const Tensor xg = be.modelInput(toGpu(x, &be));
    for (int step = 0; step < 5; ++step) {
      losses.push_back(net.forwardBackward(xg, labels, scale));
      EXPECT_TRUE(net.unscale(scale)) << be.describe() << " step " << step;
      net.sgd(step == 0);
    }
    std::vector<std::vector<float>> values;
    for (Param* p : net.params()) values.push_back(fromGpu(p->value, &be));
    return values;
  };
  std::vector<double> l32;
  const auto w32 = train(*gpu_, 1.0f, l32);
  EXPECT_LT(l32.back(), l32.front());
  for (const bool act16 : {false, true})
    for (const Precision p : k16Bit) {
      const double tol = p == Precision::kBf16 ? 2e-2 : 5e-3;
      const double paramTol = p == Precision::kBf16 ? 5e-2 : 2e-2;
      auto be = makeCudaBackend({.device = 0, .precision = p, .nhwc = act16,
                                 .activations16 = act16});
      std::cout << "[ training ] " << be->describe() << "\n";
      std::vector<double> l16;
      const auto w16 = train(*be, p == Precision::kFp16 ? 1024.0f : 1.0f, l16);
      ASSERT_EQ(l16.size(), l32.size());
      std::cout << "[ training ] " << precisionName(p) << " loss";
      for (size_t i = 0; i < l16.size(); ++i) {
        std::cout << " " << l16[i] << " (fp32 " << l32[i] << ")";
        EXPECT_NEAR(l16[i], l32[i], tol * l32[i]) << precisionName(p) << " step " << i;
      }
      std::cout << "\n";
      EXPECT_LT(l16.back(), l16.front()) << precisionName(p);
      for (size_t i = 0; i < w16.size(); ++i) {
        const double e = normwiseError(w16[i], w32[i]);
        std::cout << "[ training ] " << precisionName(p) << " parameter " << i
                  << " normwise error against fp32 " << e << "\n";
        EXPECT_LE(e, paramTol) << precisionName(p) << " parameter " << i;
      }
    }
}

// ------------------------------------ 16-bit activations (bf16 / fp16)
// CudaBackendOptions::activations16: each layer on 16-bit NHWC activations
// against the CPU backend (or the float64 reference) on the same inputs,
// rounded to 16 bits as the backend stores them. Layers that compute in float
// and store once are within one rounding of the output's type plus float's
// noise (oneRounding: 2 units of roundoff, u = 2^-8 bf16, 2^-11 fp16); the
// convolutions and linear layers, which also round their weights, within
// tolerance16; ReLU, max pooling and flatten move values exactly.
double oneRounding(Precision p) { return p == Precision::kBf16 ? 2.0 / 256 : 2.0 / 2048; }

TEST_F(CudaBackendTest, Act16LayersMatchCpu) {
  for (const Precision p : k16Bit)
    withAct16(p, [&] {
      auto relu = cpu_->relu("relu");
      auto reluG = gpu_->relu("relu");
      checkLayer(*relu, *reluG, {2, 6, 5, 7}, true, 0.0);
      auto flat = cpu_->flatten("flat");
      auto flatG = gpu_->flatten("flat");
      checkLayer(*flat, *flatG, {2, 3, 4, 5}, true, 0.0);
      auto bn = cpu_->batchNorm2d("bn", 6, nullptr);
      auto bnG = gpu_->batchNorm2d("bn", 6, nullptr);
      checkLayer(*bn, *bnG, {4, 6, 5, 7}, true, oneRounding(p));
      checkLayer(*bn, *bnG, {4, 6, 5, 7}, true, oneRounding(p), 2);  // running stats
      checkLayer(*bn, *bnG, {3, 6, 5, 7}, false, oneRounding(p), 3);  // eval
      auto gap = reference([&] { return cpu_->globalAvgPool("gap"); },
                           [&] { return std::make_unique<RefAvgPool>(); });
      auto gapG = gpu_->globalAvgPool("gap");
      checkLayer(*gap, *gapG, {3, 8, 5, 4}, true, oneRounding(p));
      auto fc = cpu_->linear("fc", 33, 17);
      auto fcG = gpu_->linear("fc", 33, 17);
      checkLayer(*fc, *fcG, {5, 33}, true, tolerance16(p));  // 16-bit x, float y
      for (const auto& [spec, in] :
           {std::pair<Conv2dSpec, Shape>{{3, 8, 3, 1, 1, true}, {2, 3, 10, 9}},
            {{8, 8, 3, 2, 1, false}, {2, 8, 11, 12}},
            {{3, 8, 7, 2, 3, false}, {2, 3, 20, 20}}}) {
        RefConv2d ref(spec);
        auto conv = gpu_->conv2d("conv", spec);
        checkLayer(ref, *conv, in, true, tolerance16(p));
      }
      testing::runRanks(1, [&](runtime::ProcessGroup& pg) {
        auto ref = cpu_->batchNorm2d("bn", 5, nullptr);
        auto sync = gpu_->batchNorm2d("bn", 5, &pg);
        checkLayer(*ref, *sync, {4, 5, 6, 3}, true, oneRounding(p));
        checkLayer(*ref, *sync, {2, 5, 6, 3}, false, oneRounding(p), 3);
      });
    });
}

// Max pooling moves 16-bit values exactly: inputs all distinct and exact in
// bf16 and fp16 (consecutive bf16 values, 8 significant bits), so the window
// maxima and where dy goes are those of the CPU's; dy is k/16 with |k| <= 64,
// so the up to four windows' gradients that meet at one input sum exactly in
// any order and in 16 bits (|sum| <= 16, a multiple of 1/16). Through cuDNN (where it takes the 16-bit
// configuration) and through our NHWC kernels (CudaBackendOptions::ownPool, which
// run where cuDNN refuses), also on float activations.
TEST_F(CudaBackendTest, NhwcMaxPoolIsExactThroughCudnnAndOurs) {
  const Pool2dSpec spec{3, 2, 1};
  auto check = [&](const std::string& what) {
    const Shape in{2, 4, 9, 8};
    Tensor x(in);
    std::vector<float> v(static_cast<size_t>(x.numel()));
    for (size_t i = 0; i < v.size(); ++i)  // 0.125, then each next bf16 value up
      v[i] = (i % 2 ? -1.0f : 1.0f) * runtime::bf16ToFloat(static_cast<uint16_t>(0x3E00 + i));
    std::shuffle(v.begin(), v.end(), std::mt19937(7));
    std::copy(v.begin(), v.end(), x.data());
    ASSERT_EQ(hostValues(roundAct(x)), v) << what << ": the inputs must be exact in 16 bits";
    auto ref = reference([&] { return cpu_->maxPool2d("pool", spec); },
                         [&] { return std::make_unique<RefMaxPool>(spec); });
    const Tensor xg = toGpuAct(x);
    {
      auto pool = gpu_->maxPool2d("pool", spec);
      const std::string label = what + (opts_.ownPool ? " (our kernels)" : " (cuDNN)");
      for (uint64_t step = 0; step < 2; ++step) {
        Tensor yr, yg, dxr, dxg;
        ref->forward(x, yr, true);
        pool->forward(xg, yg, true);
        EXPECT_EQ(yg.dtype(), act_) << label;
        EXPECT_EQ(fromGpuAct(yg), hostValues(yr)) << label;
        Tensor dy(yr.shape());
        std::mt19937 gen(static_cast<uint32_t>(8 + step));
        std::uniform_int_distribution<int> pick(-64, 64);
        for (int64_t i = 0; i < dy.numel(); ++i) dy.data()[i] = static_cast<float>(pick(gen)) / 16.0f;
        ref->backward(x, yr, dy, &dxr);
        pool->backward(xg, yg, toGpuAct(dy), &dxg);
        EXPECT_EQ(fromGpuAct(dxg), hostValues(dxr)) << label;
      }
      Tensor ye, yr;
      pool->forward(xg, ye, false);  // evaluation keeps no winners
      ref->forward(x, yr, false);
      EXPECT_EQ(fromGpuAct(ye), hostValues(yr)) << label << " eval";
    }
  };
  for (const bool own : {false, true}) {
    withBackend({.device = 0, .precision = Precision::kFp32, .deterministic = true,
                 .nhwc = true, .ownPool = own},
                [&] { check("fp32 nhwc"); });
    for (const Precision p : k16Bit)
      withBackend({.device = 0, .precision = p, .deterministic = true, .nhwc = true,
                   .activations16 = true, .ownPool = own},
                  [&] { check(std::string(precisionName(p)) + " 16-bit"); });
  }
}

// Residual gradients added by the convolution itself (backwardAccumulate:
// cuDNN's backward-data with beta = 1) against backward() then our add: fp32
// bit for bit (the blend adds once, as the add kernel does), 16-bit
// activations within one rounding of the sum (one rounding instead of two);
// also through the graph API's plans (which overwrite: a temporary and an add).
TEST_F(CudaBackendTest, ConvolutionAddsIntoTheResidualGradient) {
  struct Case {
    CudaBackendOptions o;
    double tol;
  };
  const Case cases[] = {
      {{.device = 0, .precision = Precision::kFp32, .deterministic = true, .nhwc = true}, 0.0},
      {{.device = 0, .precision = Precision::kFp32, .deterministic = true}, 0.0},
      {{.device = 0, .precision = Precision::kBf16, .deterministic = true, .nhwc = true,
        .activations16 = true}, 1.0 / 128},
      {{.device = 0, .precision = Precision::kTf32, .nhwc = true,
        .graphConv = CudaBackendOptions::GraphConv::kPrecompiled}, 0.0},
  };
  for (const Case& k : cases)
    withBackend(k.o, [&] {
      auto conv = gpu_->conv2d("conv", Conv2dSpec{8, 16, 3, 2, 1, false});
      ASSERT_TRUE(conv->accumulatesDx());
      const Tensor hx = hostTensor({2, 8, 9, 10}, 61), hp = hostTensor({2, 8, 9, 10}, 62);
      Tensor x = toGpuAct(hx), prior = toGpuAct(hp), y, dx;
      conv->forward(x, y, true);
      const Tensor dy = toGpuAct(hostTensor(y.shape(), 63));
      conv->backward(x, y, dy, &dx);
      Tensor sum = toGpuAct(hp);
      gpu_->add(prior, dx, sum);
      conv->backwardAccumulate(x, y, dy, prior);
      const std::vector<float> a = fromGpuAct(prior), b = fromGpuAct(sum);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i)
        ASSERT_NEAR(a[i], b[i], k.tol * (std::fabs(b[i]) + 1e-3) + (k.tol > 0 ? 1e-3 : 0.0))
            << gpu_->describe() << " element " << i;
    });
}

// The fused stem (CudaBackendOptions::fusedStem: bn1 + ReLU + the 3x3/2 max
// pool as one layer) against the same layers apart on our kernels (our
// batch norm, our NHWC pooling): the pooled output, dx and the parameter
// gradients bit for bit over two training steps, then an evaluation forward
// (kernel_math_test's FusedStem test is the same claim on the host).
TEST_F(CudaBackendTest, FusedStemMatchesTheLayersApartBitForBit) {
  for (const Precision p : {Precision::kTf32, Precision::kBf16}) {
    CudaBackendOptions o{.device = 0, .precision = p, .deterministic = true, .nhwc = true,
                         .activations16 = p == Precision::kBf16, .ourBatchNorm = true,
                         .ownPool = true};
    withBackend(o, [&] {
      SCOPED_TRACE(precisionName(p));
      o.fusedStem = true;
      auto fusedBe = makeCudaBackend(o);
      const Pool2dSpec pool{3, 2, 1};
      EXPECT_EQ(gpu_->batchNormActPool("bn1", "maxpool", 8, nullptr, pool), nullptr);  // opt-in
      auto stem = fusedBe->batchNormActPool("bn1", "maxpool", 8, nullptr, pool);
      ASSERT_NE(stem, nullptr);
      EXPECT_NE(fusedBe->describe().find("ours-nhwc+relu+maxpool x1"), std::string::npos)
          << fusedBe->describe();
      auto bn = gpu_->batchNormAct("bn1", 8, nullptr, false);
      auto mp = gpu_->maxPool2d("maxpool", pool);
      for (size_t i = 0; i < 2; ++i) {  // the same random gamma and beta on both
        const Tensor v = hostTensor({8}, 70 + i, i == 0 ? -1.0f : -0.5f, i == 0 ? 1.5f : 0.5f);
        gpu_->upload(v.data(), bn->params()[i]->value.data(), 8);
        fusedBe->upload(v.data(), stem->params()[i]->value.data(), 8);
      }
      auto bits = [](const std::vector<float>& v) {
        std::vector<uint32_t> b(v.size());
        std::memcpy(b.data(), v.data(), v.size() * 4);
        return b;
      };
      for (int step = 0; step < 3; ++step) {
        const bool training = step < 2;
        const Tensor hx = hostTensor({2, 8, 9, 11}, 80 + step, -2.0f, 2.0f);
        Tensor xa = toGpuAct(hx), xb = toGpuAct(hx, fusedBe.get());
        Tensor act, ya, yb;
        bn->forward(xa, act, training);
        mp->forward(act, ya, training);
        stem->forward(xb, yb, training);
        ASSERT_EQ(ya.shape(), yb.shape());
        EXPECT_EQ(bits(fromGpuAct(ya)), bits(fromGpuAct(yb, fusedBe.get()))) << "y, step " << step;
        if (!training) break;
        const Tensor hdy = hostTensor(ya.shape(), 90 + step);
        Tensor dya = toGpuAct(hdy), dyb = toGpuAct(hdy, fusedBe.get()), dpool, dxa, dxb;
        for (Param* q : bn->params()) q->overwriteGrad = true;
        for (Param* q : stem->params()) q->overwriteGrad = true;
        mp->backward(act, ya, dya, &dpool);
        bn->backward(xa, act, dpool, &dxa);
        stem->backward(xb, yb, dyb, &dxb);
        EXPECT_EQ(bits(fromGpuAct(dxa)), bits(fromGpuAct(dxb, fusedBe.get()))) << "dx " << step;
        for (size_t i = 0; i < 2; ++i)
          EXPECT_EQ(bits(fromGpu(bn->params()[i]->grad)),
                    bits(fromGpu(stem->params()[i]->grad, fusedBe.get())))
              << bn->params()[i]->name << " step " << step;
      }
      for (size_t i = 0; i < 3; ++i)  // running mean, var, num_batches_tracked
        EXPECT_EQ(bits(fromGpu(bn->buffers()[i]->value)),
                  bits(fromGpu(stem->buffers()[i]->value, fusedBe.get())))
            << bn->buffers()[i]->name;
    });
  }
}

// Batch norm + ReLU (+ the residual add) as one layer on 16-bit activations
// (our fused NHWC kernels) against the CPU's composition on the same rounded
// inputs: around 0 and around 100, two steps, then evaluation.
TEST_F(CudaBackendTest, Act16BatchNormActMatchesCpu) {
  for (const Precision p : k16Bit)
    withAct16(p, [&] {
      checkBatchNormAct([p](float) { return BnTol{oneRounding(p), 1e-3, 1e-4}; });
    });
}

// What keeps 16 bits: the model input (transposed and rounded in one pass),
// every layer's output up to the linear layer, whose logits are float; the
// option is ignored where it does not apply (fp32, tf32, NCHW).
TEST_F(CudaBackendTest, Act16TensorTypes) {
  auto be = makeCudaBackend({.device = 0, .precision = Precision::kBf16, .nhwc = true,
                             .activations16 = true});
  EXPECT_NE(be->describe().find("16-bit activations"), std::string::npos) << be->describe();
  const Tensor host = hostTensor({2, 3, 8, 8}, 11);
  const Tensor in = be->modelInput(toGpu(host, be.get()));
  EXPECT_EQ(in.dtype(), DType::kBFloat16);
  auto conv = be->conv2d("conv", Conv2dSpec{3, 4, 3, 1, 1, false});
  auto gap = be->globalAvgPool("gap");
  auto fc = be->linear("fc", 4, 3);
  Tensor c, g, logits;
  conv->forward(in, c, true);
  gap->forward(c, g, true);
  fc->forward(g, logits, true);
  EXPECT_EQ(c.dtype(), DType::kBFloat16);
  EXPECT_EQ(g.dtype(), DType::kBFloat16);
  EXPECT_EQ(logits.dtype(), DType::kFloat32);
  for (const auto& o : {CudaBackendOptions{.device = 0, .precision = Precision::kTf32,
                                           .nhwc = true, .activations16 = true},
                        CudaBackendOptions{.device = 0, .precision = Precision::kBf16,
                                           .nhwc = false, .activations16 = true}}) {
    auto other = makeCudaBackend(o);
    EXPECT_EQ(other->describe().find("16-bit activations"), std::string::npos)
        << other->describe();
    EXPECT_EQ(other->modelInput(toGpu(host, other.get())).dtype(), DType::kFloat32);
  }
}

// fp16's overflow reaches the float gradients as inf/NaN: with a loss scale
// of 2^40, dL/dlogits (about 2^40 / batch, finite in float) is inf once the
// linear layer casts it to fp16, and so is every gradient computed from it;
// scaleAndCheckFinite reports it. bf16 (float's range) and a moderate scale
// stay finite.
TEST_F(CudaAutocastTest, Fp16OverflowGivesNonFiniteGradients) {
  const Tensor x = hostTensor({4, 3, 16, 16}, 81);
  const std::vector<int32_t> labels = {1, 7, 3, 0};
  // Also with 16-bit NHWC activations, where the overflow travels in the
  // fp16 activations' gradients through our batch norm kernels.
  for (const bool act16 : {false, true})
    for (const Precision p : k16Bit) {
      auto be = makeCudaBackend({.device = 0, .precision = p, .nhwc = act16,
                                 .activations16 = act16});
      TinyNet net(*be);
      const Tensor xg = be->modelInput(toGpu(x, be.get()));
      const std::string what = be->describe();
      for (const float scale : {1024.0f, 1099511627776.0f}) {
        net.forwardBackward(xg, labels, scale);
        const bool overflow = p == Precision::kFp16 && scale > 1e6f;
        std::vector<Param*> ps = net.params();
        for (Param* q : ps) {
          // conv.weight (cuDNN's 16-bit dW) and fc.weight (cuBLASLt's float
          // dW from fp16 dy) must show it; the biases come from the float dy.
          if (q->name != "conv.weight" && q->name != "fc.weight") continue;
          const bool finite = be->scaleAndCheckFinite(
              q->grad.data(), static_cast<size_t>(q->grad.numel()), 1.0f / scale);
          EXPECT_EQ(finite, !overflow) << what << " scale " << scale << " " << q->name;
        }
        EXPECT_EQ(net.unscale(1.0f), !overflow) << what << " scale " << scale;
      }
    }
}

// -------------------------------------------------------------- batch norm
// The input pipeline: the host buffer is reusable at once, two uploads are
// live together (double-buffered), a later smaller batch reuses a slot.
TEST_F(CudaBackendTest, UploadInputIsDoubleBuffered) {
  std::vector<float> a(1000), b(1000), c(600);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = -static_cast<float>(i);
  for (size_t i = 0; i < c.size(); ++i) c[i] = 0.5f * static_cast<float>(i);
  const std::vector<float> keepA = a;
  const Tensor ta = gpu_->uploadInput(a.data(), {10, 100});
  std::fill(a.begin(), a.end(), 7.0f);  // the host copy may be reused on return
  const Tensor tb = gpu_->uploadInput(b.data(), {10, 100});
  EXPECT_EQ(ta.device(), Device::kCuda);
  EXPECT_EQ(ta.shape(), (Shape{10, 100}));
  EXPECT_EQ(fromGpu(ta), keepA);
  EXPECT_EQ(fromGpu(tb), b);
  const Tensor tc = gpu_->uploadInput(c.data(), {6, 100});
  EXPECT_EQ(tc.shape(), (Shape{6, 100}));
  EXPECT_EQ(fromGpu(tc), c);
  EXPECT_EQ(fromGpu(tb), b);  // the other slot is untouched
}

TEST_F(CudaBackendTest, BatchNormTrainThenEval) {
  auto ref = cpu_->batchNorm2d("bn", 6, nullptr);
  auto gpu = gpu_->batchNorm2d("bn", 6, nullptr);
  checkLayer(*ref, *gpu, {4, 6, 5, 7}, true, 1e-4);
  checkLayer(*ref, *gpu, {4, 6, 5, 7}, true, 1e-4, 2);  // running stats over two steps
  checkLayer(*ref, *gpu, {3, 6, 5, 7}, false, 1e-4, 3);  // eval: running statistics
  EXPECT_EQ(fromGpu(gpu->buffers()[2]->value), std::vector<float>{2.0f});
}

// SyncBatchNorm over a group of one: the own-kernel path against the CPU.
TEST_F(CudaBackendTest, SyncBatchNormOneRank) {
  testing::runRanks(1, [&](runtime::ProcessGroup& pg) {
    auto ref = cpu_->batchNorm2d("bn", 5, nullptr);
    auto gpu = gpu_->batchNorm2d("bn", 5, &pg);
    checkLayer(*ref, *gpu, {4, 5, 6, 3}, true, 1e-4);
    checkLayer(*ref, *gpu, {4, 5, 6, 3}, true, 1e-4, 2);
    checkLayer(*ref, *gpu, {2, 5, 6, 3}, false, 1e-4, 3);
  });
}

// Two ranks sharing the GPU (staged transport), half the batch each: the
// same outputs, dx and running statistics as one batch norm over the whole
// batch; the ranks' local dgamma/dbeta add up to the whole batch's; and the
// ranks hold bitwise the same running statistics (the same all-reduced
// sums). Through each path SyncBatchNorm has: cuDNN's (NCHW fp32), our NHWC
// kernels on float activations (DDPRUN_CUDA_OUR_BN's), and our kernels on
// bf16 activations (the reference then reads the same rounded inputs, and y
// and dx carry bf16's rounding).
TEST_F(CudaBackendTest, SyncBatchNormTwoRanksEqualsWholeBatch) {
  const int64_t c = 4;
  const Shape whole{6, c, 5, 5}, half{3, c, 5, 5};
  const int64_t halfN = numelOf(half);
  struct Path {
    const char* name;
    CudaBackendOptions o;
    double tol;  // y and dx
  };
  const Path paths[] = {
      {"cuDNN nchw fp32", {.device = 0, .precision = Precision::kFp32}, 1e-4},
      {"ours nhwc fp32",
       {.device = 0, .precision = Precision::kFp32, .nhwc = true, .ourBatchNorm = true}, 1e-4},
      {"ours nhwc bf16 activations",
       {.device = 0, .precision = Precision::kBf16, .nhwc = true, .activations16 = true}, 1e-2},
  };
  for (const Path& path : paths) {
    // The fixture's activation layout and type for toGpuAct/fromGpuAct.
    withBackend(path.o, [&] {
      const Tensor x = roundAct(hostTensor(whole, 21, -1.0f, 3.0f));
      const Tensor dy = roundAct(hostTensor(whole, 22));
      auto ref = cpu_->batchNorm2d("bn", c, nullptr);
      Tensor y, dx;
      ref->forward(x, y, true);
      ref->backward(x, y, dy, &dx);
      std::vector<std::vector<float>> ys(2), dxs(2), dgs(2), dbs(2), rms(2), rvs(2);
      setenv("DDPRUN_CUDA_TRANSPORT", "staged", 1);
      testing::runRanks(2, [&](runtime::ProcessGroup& pg) {
        const int r = pg.rank();
        auto be = makeCudaBackend(path.o);
        auto bn = be->batchNorm2d("bn", c, &pg);
        Tensor xh(half), dyh(half);
        std::copy_n(x.data() + r * halfN, halfN, xh.data());
        std::copy_n(dy.data() + r * halfN, halfN, dyh.data());
        Tensor xg = toGpuAct(xh, be.get()), dyg = toGpuAct(dyh, be.get()), yg, dxg;
        bn->forward(xg, yg, true);
        bn->backward(xg, yg, dyg, &dxg);
        ys[r] = fromGpuAct(yg, be.get());
        dxs[r] = fromGpuAct(dxg, be.get());
        dgs[r] = fromGpu(bn->params()[0]->grad, be.get());
        dbs[r] = fromGpu(bn->params()[1]->grad, be.get());
        rms[r] = fromGpu(bn->buffers()[0]->value, be.get());
        rvs[r] = fromGpu(bn->buffers()[1]->value, be.get());
      });
      unsetenv("DDPRUN_CUDA_TRANSPORT");
      const std::string what = path.name;
      const auto yw = hostValues(y), dxw = hostValues(dx);
      for (int r = 0; r < 2; ++r) {
        const std::string rank = what + " rank " + std::to_string(r);
        expectClose(ys[r],
                    std::vector<float>(yw.begin() + r * halfN, yw.begin() + (r + 1) * halfN),
                    path.tol, rank + " y");
        expectClose(dxs[r],
                    std::vector<float>(dxw.begin() + r * halfN, dxw.begin() + (r + 1) * halfN),
                    path.tol, rank + " dx");
        expectClose(rms[r], hostValues(ref->buffers()[0]->value), 1e-5, rank + " running_mean");
        expectClose(rvs[r], hostValues(ref->buffers()[1]->value), 1e-5, rank + " running_var");
      }
      EXPECT_EQ(rms[0], rms[1]) << what << ": the ranks' running means differ";
      EXPECT_EQ(rvs[0], rvs[1]) << what << ": the ranks' running variances differ";
      std::vector<float> dg(c), db(c);
      for (int64_t k = 0; k < c; ++k) {
        dg[k] = dgs[0][k] + dgs[1][k];
        db[k] = dbs[0][k] + dbs[1][k];
      }
      expectClose(dg, hostValues(ref->params()[0]->grad), 1e-4, what + " dgamma summed over ranks");
      expectClose(db, hostValues(ref->params()[1]->grad), 1e-4, what + " dbeta summed over ranks");
    });
  }
}

// --------------------------------------------------------- loss, optimizers
TEST_F(CudaBackendTest, CrossEntropy) {
  const int64_t n = 37, k = 10;
  const Tensor z = hostTensor({n, k}, 5, -5.0f, 5.0f);
  std::vector<int32_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = static_cast<int32_t>((i * 7) % k);
  Tensor dr, dg;
  int64_t cr = -1, cg = -2;
  const double lr = cpu_->crossEntropy(z, labels.data(), &dr, &cr, 64.0f);
  const Tensor zg = toGpu(z);
  const double lg = gpu_->crossEntropy(zg, labels.data(), &dg, &cg, 64.0f);
  EXPECT_NEAR(lg, lr, 1e-9 * std::fabs(lr));
  EXPECT_EQ(cg, cr);
  expectClose(fromGpu(dg), hostValues(dr), 1e-6, "dlogits");
  // Without the gradient, and a label out of range is refused.
  int64_t c2 = -1;
  EXPECT_NEAR(gpu_->crossEntropy(zg, labels.data(), nullptr, &c2), lr, 1e-9 * std::fabs(lr));
  EXPECT_EQ(c2, cr);
  labels[3] = 10;
  EXPECT_THROW(gpu_->crossEntropy(zg, labels.data(), nullptr, nullptr), InvalidArgument);
}

// CUDA graphs of the step (Backend::capture, src/train/cuda/step_graph.h):
// off without the switch (saying so); a captured body runs only on replay,
// and each replay runs it again (the deferred loss summed twice); a body
// that needs memory the caching allocator has not cached fails its capture
// with the allocator's message, no cudaMalloc inside it, and the backend
// works on; the staged-labels loss equals crossEntropyDeferred's.
TEST_F(CudaBackendTest, StepGraphCapturesReplaysAndRefusesAllocation) {
  std::string why;
  EXPECT_EQ(gpu_->capture([] {}, &why), nullptr);
  EXPECT_NE(why.find("DDPRUN_CUDA_GRAPH=1"), std::string::npos) << why;
  auto be = makeCudaBackend({.device = 0, .precision = Precision::kFp32, .deterministic = true,
                             .cudaGraph = true});
  EXPECT_EQ(be->captureRefusal(), "");
  const int64_t n = 16, k = 10;
  const Tensor z = hostTensor({n, k}, 7, -3.0f, 3.0f);
  std::vector<int32_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = static_cast<int32_t>((i * 3) % k);
  const Tensor zg = toGpu(z, be.get());
  Tensor dz;
  // The eager step first: the loss's buffers exist before any capture.
  be->stageLabels(labels.data(), n, k);
  be->crossEntropyStaged(zg, &dz, 1.0f);
  const double once = be->takeLossSum();
  be->crossEntropyDeferred(zg, labels.data(), &dz, 1.0f);
  EXPECT_EQ(be->takeLossSum(), once);
  be->stageLabels(labels.data(), n, k);
  std::unique_ptr<Backend::StepGraph> g =
      be->capture([&] { be->crossEntropyStaged(zg, &dz, 1.0f); }, &why);
  ASSERT_NE(g, nullptr) << why;
  EXPECT_EQ(be->takeLossSum(), 0.0) << "a capture runs nothing";
  g->replay();
  g->replay();
  EXPECT_EQ(be->takeLossSum(), 2 * once);
  g.reset();
  // A fresh size inside a capture: refused, nothing ran, the backend goes on.
  const auto mallocs = [&] {
    return dynamic_cast<cuda::CachingAllocator&>(be->allocator()).stats();
  };
  const cuda::AllocatorStats before = mallocs();
  g = be->capture([&] { Tensor big({123457}, be->allocator()); }, &why);
  EXPECT_EQ(g, nullptr);
  EXPECT_NE(why.find("may not call cudaMalloc"), std::string::npos) << why;
  EXPECT_EQ(mallocs().mallocs, before.mallocs);
  EXPECT_EQ(mallocs().captureMisses, before.captureMisses + 1);
  be->crossEntropyDeferred(zg, labels.data(), &dz, 1.0f);
  EXPECT_EQ(be->takeLossSum(), once);
}

// Label smoothing (setLabelSmoothing) in the CUDA loss kernel: the CPU
// backend's loss and gradient, the same arg-max count; back at 0 the plain
// loss again.
TEST_F(CudaBackendTest, CrossEntropyWithLabelSmoothing) {
  const int64_t n = 37, k = 10;
  const Tensor z = hostTensor({n, k}, 6, -5.0f, 5.0f);
  std::vector<int32_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = static_cast<int32_t>((i * 3) % k);
  const Tensor zg = toGpu(z);
  int64_t c0 = -1;
  const double plain = cpu_->crossEntropy(z, labels.data(), nullptr, &c0);
  for (const float eps : {0.1f, 1.0f}) {
    cpu_->setLabelSmoothing(eps);
    gpu_->setLabelSmoothing(eps);
    Tensor dr, dg;
    int64_t cr = -1, cg = -2;
    const double lr = cpu_->crossEntropy(z, labels.data(), &dr, &cr, 64.0f);
    const double lg = gpu_->crossEntropy(zg, labels.data(), &dg, &cg, 64.0f);
    EXPECT_NEAR(lg, lr, 1e-9 * std::fabs(lr)) << "eps " << eps;
    EXPECT_NE(lr, plain);
    EXPECT_EQ(cg, cr);
    EXPECT_EQ(cr, c0);
    expectClose(fromGpu(dg), hostValues(dr), 1e-6, "smoothed dlogits");
    Tensor dd;
    gpu_->crossEntropyDeferred(zg, labels.data(), &dd, 64.0f);
    EXPECT_NEAR(gpu_->takeLossSum(), n * lr, 1e-9 * std::fabs(n * lr));
    expectClose(fromGpu(dd), hostValues(dr), 1e-6, "smoothed dlogits (deferred)");
  }
  cpu_->setLabelSmoothing(0.0f);
  gpu_->setLabelSmoothing(0.0f);
  EXPECT_NEAR(gpu_->crossEntropy(zg, labels.data(), nullptr, nullptr), plain,
              1e-9 * std::fabs(plain));
}

// Nesterov's SGD step: the CUDA kernel against the CPU backend over a few
// steps (first step included), with weight decay.
TEST_F(CudaBackendTest, SgdNesterovMatchesCpu) {
  const size_t n = 1000;
  const Tensor w0 = hostTensor({1000}, 11), g = hostTensor({1000}, 12), b0 = hostTensor({1000}, 13);
  Tensor w = copyOf(w0), buf = copyOf(b0);
  Tensor wg = toGpu(w0), gg = toGpu(g), bg = toGpu(b0);
  for (int s = 0; s < 3; ++s) {
    cpu_->sgdUpdate(w.data(), g.data(), buf.data(), n, 0.1f, 0.9f, 1e-4f, s == 0, true);
    gpu_->sgdUpdate(wg.data(), gg.data(), bg.data(), n, 0.1f, 0.9f, 1e-4f, s == 0, true);
  }
  expectClose(fromGpu(wg), hostValues(w), 1e-6, "nesterov w");
  expectClose(fromGpu(bg), hostValues(buf), 1e-6, "nesterov buf");
}

TEST_F(CudaBackendTest, SgdAndAdamMatchCpu) {
  const size_t n = 1000;
  const Tensor w0 = hostTensor({1000}, 1), g = hostTensor({1000}, 2), b0 = hostTensor({1000}, 3);
  Tensor w = copyOf(w0), buf = copyOf(b0);
  Tensor wg = toGpu(w0), gg = toGpu(g), bg = toGpu(b0);
  for (const bool first : {true, false}) {
    cpu_->sgdUpdate(w.data(), g.data(), buf.data(), n, 0.1f, 0.9f, 1e-4f, first);
    gpu_->sgdUpdate(wg.data(), gg.data(), bg.data(), n, 0.1f, 0.9f, 1e-4f, first);
  }
  expectClose(fromGpu(wg), hostValues(w), 1e-6, "sgd w");
  expectClose(fromGpu(bg), hostValues(buf), 1e-6, "sgd buf");

  Tensor m({1000}), v({1000});
  Tensor mg(Shape{1000}, gpu_->allocator()), vg(Shape{1000}, gpu_->allocator());
  for (int64_t step = 1; step <= 3; ++step) {
    cpu_->adamUpdate(w.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f,
                     step);
    gpu_->adamUpdate(wg.data(), gg.data(), mg.data(), vg.data(), n, 1e-3f, 0.9f, 0.999f, 1e-8f,
                     0.01f, step);
  }
  expectClose(fromGpu(wg), hostValues(w), 1e-6, "adam w");
  expectClose(fromGpu(mg), hostValues(m), 1e-6, "adam m");
  expectClose(fromGpu(vg), hostValues(v), 1e-6, "adam v");
}

// ------------------------------------------------------------ element-wise
TEST_F(CudaBackendTest, AddZeroCopy) {
  const Tensor a = hostTensor({3, 50}, 1), b = hostTensor({3, 50}, 2);
  Tensor ag = toGpu(a), bg = toGpu(b), out(Shape{150}, gpu_->allocator());
  gpu_->add(ag, bg, out);
  std::vector<float> want(150);
  for (int i = 0; i < 150; ++i) want[i] = a.data()[i] + b.data()[i];
  EXPECT_EQ(fromGpu(out), want);
  gpu_->add(ag, bg, ag);  // in place
  EXPECT_EQ(fromGpu(ag), want);
  gpu_->copy(bg, ag);
  EXPECT_EQ(fromGpu(ag), hostValues(b));
  gpu_->zero(ag);
  EXPECT_EQ(fromGpu(ag), std::vector<float>(150, 0.0f));
  Tensor wrong(Shape{7}, gpu_->allocator());
  EXPECT_THROW(gpu_->add(ag, bg, wrong), InvalidArgument);
  EXPECT_THROW(gpu_->copy(ag, wrong), InvalidArgument);
}

TEST_F(CudaBackendTest, ResizeBilinear) {
  for (const auto& [h, w] : {std::pair<int64_t, int64_t>{17, 9}, {4, 4}, {3, 11}}) {
    const Tensor x = hostTensor({2, 3, 7, 5}, 9);
    Tensor yr, yg;
    std::string note;
    try {
      cpu_->resizeBilinear(x, h, w, yr);
    } catch (const InvalidArgument& e) {
      if (!cpuLacks(e)) throw;
      note = e.message();
      yr.ensure({2, 3, h, w});
      for (int64_t p = 0; p < 6; ++p)
        for (int64_t i = 0; i < h; ++i)
          for (int64_t j = 0; j < w; ++j)
            yr.data()[(p * h + i) * w + j] =
                kmath::bilinearAt(x.data() + p * 35, 5, kmath::bilinearIndex(i, 7, h),
                                  kmath::bilinearIndex(j, 5, w));
    }
    if (!note.empty())
      std::cout << "[ note     ] " << note << ": checked against kernel_math on the host\n";
    gpu_->resizeBilinear(toGpu(x), h, w, yg);
    EXPECT_EQ(yg.shape(), (Shape{2, 3, h, w}));
    expectClose(fromGpu(yg), hostValues(yr), 1e-5, "resize");
  }
}

TEST_F(CudaBackendTest, ScaleAndCheckFinite) {
  Tensor h = hostTensor({4097}, 3);
  Tensor g = toGpu(h);
  EXPECT_TRUE(gpu_->scaleAndCheckFinite(g.data(), 4097, 0.25f));
  std::vector<float> want = hostValues(h);
  for (auto& v : want) v *= 0.25f;
  EXPECT_EQ(fromGpu(g), want);
  h.data()[4000] = 1e38f;
  g = toGpu(h);
  EXPECT_FALSE(gpu_->scaleAndCheckFinite(g.data(), 4097, 1e3f));  // overflows to inf
  h.data()[4000] = std::nanf("");
  g = toGpu(h);
  EXPECT_FALSE(gpu_->scaleAndCheckFinite(g.data(), 4097, 1.0f));
}

TEST_F(CudaBackendTest, UploadDownloadLarge) {
  // More than the 32 MiB pinned staging buffer: chunked both ways.
  const size_t n = (size_t{40} << 20) / 4 + 3;
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 100003);
  Tensor t(Shape{static_cast<int64_t>(n)}, gpu_->allocator());
  gpu_->upload(host.data(), t.data(), n);
  std::vector<float> back(n);
  gpu_->download(t.data(), back.data(), n);
  EXPECT_EQ(back, host);
}

// --------------------------------------------------------------- memory
TEST_F(CudaBackendTest, CachingAllocatorReusesBlocks) {
  auto* a = dynamic_cast<cuda::CachingAllocator*>(&gpu_->allocator());
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(cuda::CachingAllocator::sizeClass(1), 512u);
  EXPECT_EQ(cuda::CachingAllocator::sizeClass((size_t{1} << 20) + 1), size_t{17} << 16);
  {
    Tensor t(Shape{1000, 1000}, *a);
    EXPECT_GE(a->stats().inUse, size_t{4000000});
  }
  const auto before = a->stats();
  EXPECT_GE(before.cached, size_t{4000000});
  {
    Tensor t(Shape{999, 1001}, *a);  // the same size class: no cudaMalloc
    EXPECT_EQ(fromGpu(t), std::vector<float>(999 * 1001, 0.0f));  // zero-filled on reuse
  }
  EXPECT_EQ(a->stats().mallocs, before.mallocs);
  EXPECT_GE(a->stats().peak, before.inUse);
}

TEST_F(CudaBackendTest, TensorsMayOutliveTheBackend) {
  Tensor t(Shape{100}, gpu_->allocator());
  gpu_.reset();  // the allocator stays until t goes
  // The memory is still the tensor's device memory: written and read back
  // through the runtime, with no backend left.
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, t.raw()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
  ASSERT_EQ(cudaMemset(t.raw(), 0x3f, t.bytes()), cudaSuccess);
  std::vector<unsigned char> host(t.bytes());
  ASSERT_EQ(cudaMemcpy(host.data(), t.raw(), host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host, std::vector<unsigned char>(host.size(), 0x3f));
  t = Tensor();  // freed through the allocator the backend left behind
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  gpu_ = makeCudaBackend({.device = 0, .precision = Precision::kFp32});
  Tensor u(Shape{100}, gpu_->allocator());
  EXPECT_NE(u.raw(), nullptr);
}

TEST_F(CudaBackendTest, GradientMemory) {
  testing::runRanks(1, [&](runtime::ProcessGroup& pg) {
    auto mem = gpu_->gradientMemory(pg);
    EXPECT_EQ(mem->device(), runtime::Device::kCuda);
    const size_t n = 3001;
    float* a = static_cast<float*>(mem->alloc(n * 4));
    float* b = static_cast<float*>(mem->alloc(n * 4));
    void* h = mem->alloc(n * 2);
    EXPECT_EQ(fromGpu(Tensor::view(a, {static_cast<int64_t>(n)}, Device::kCuda)),
              std::vector<float>(n, 0.0f));
    const auto v = randomVector(n, 4, -100.0f, 100.0f);
    gpu_->upload(v.data(), a, n);
    mem->copy(b, a, n * 4);
    for (const auto t : {runtime::DType::kFloat16, runtime::DType::kBFloat16}) {
      mem->compress(b, h, n, 0.5f, t);
      mem->decompress(h, a, n, t);
      // Ordered on streams: the reducer's collectives wait on this stream's
      // events (the backend's compute stream), not on a host fence.
      ASSERT_NE(mem->stream(), nullptr);
      std::vector<float> got(n);
      gpu_->download(a, got.data(), n);
      for (size_t i = 0; i < n; ++i) {
        const float want = t == runtime::DType::kFloat16
                               ? runtime::halfToFloat(runtime::floatToHalf(v[i] * 0.5f))
                               : runtime::bf16ToFloat(runtime::floatToBf16(v[i] * 0.5f));
        ASSERT_EQ(got[i], want) << runtime::dtypeName(t) << " at " << i;
      }
    }
    mem->zero(b, n * 4);
    EXPECT_EQ(fromGpu(Tensor::view(b, {static_cast<int64_t>(n)}, Device::kCuda)),
              std::vector<float>(n, 0.0f));
    mem->free(a);
    mem->free(b);
    mem->free(h);
  });
}

// The reducer over two ranks on one GPU (staged transport) with device
// buckets: the fence orders each bucket's all-reduce after the kernels that
// wrote it; every gradient ends as the ranks' average.
TEST_F(CudaBackendTest, ReducerAveragesDeviceGradients) {
  setenv("DDPRUN_CUDA_TRANSPORT", "staged", 1);
  testing::runRanks(2, [&](runtime::ProcessGroup& pg) {
    auto be = makeCudaBackend({.device = 0, .precision = Precision::kFp32});
    std::vector<runtime::ParamInfo> params = {{"a", 300000}, {"b", 5000}, {"c", 70}};
    runtime::ReducerOptions opts;
    opts.bucketCapBytes = 600000;  // several buckets
    opts.firstBucketBytes = 20000;
    runtime::Reducer red(pg, params, opts, be->gradientMemory(pg));
    for (int iter = 0; iter < 3; ++iter) {
      red.zeroGrad();
      for (size_t i = params.size(); i-- > 0;) {
        const size_t n = params[i].count;
        std::vector<float> g(n, static_cast<float>((pg.rank() + 1) * (i + 1) + iter));
        Tensor t = Tensor::view(red.grad(i), {static_cast<int64_t>(n)}, Device::kCuda);
        Tensor src(Shape{static_cast<int64_t>(n)}, be->allocator());
        be->upload(g.data(), src.data(), n);
        be->add(src, t, t);  // a kernel on the compute stream writes the gradient
        red.markReady(i);
      }
      red.finalize();
      for (size_t i = 0; i < params.size(); ++i) {
        std::vector<float> got(params[i].count);
        be->download(red.grad(i), got.data(), got.size());
        const float want = (1.0f * (i + 1) + 2.0f * (i + 1)) / 2.0f + iter;
        ASSERT_EQ(got.front(), want) << "param " << i << " iteration " << iter;
        ASSERT_EQ(got.back(), want) << "param " << i << " iteration " << iter;
      }
    }
  });
  unsetenv("DDPRUN_CUDA_TRANSPORT");
}

// ResNet-18-sized layers (the stem and a stage-1 block's shapes at batch 32),
// in deterministic and in fast mode: they run in every precision (an
// algorithm exists within the workspace cap); in deterministic mode a
// repeated step is bitwise the same and tf32 stays within 1e-2 of fp32
// (elementwise); in fast mode tf32 is within 1e-2 of fp32 normwise; in both,
// bf16/fp16 within 3e-2/4e-3 (normwise) of the mode's fp32 on dx. Prints the
// time of one forward + backward per precision and mode (mean of 10 after
// warm-up) and the allocator's figures, to tell what the fast algorithms and
// the per-call workspaces give. Deterministic mode on an H100 with cuDNN
// 9.14 (before the per-call workspace): fp32 3.4 ms, tf32 1.8 ms, bf16
// 2.1 ms, fp16 1.9-2.3 ms (the fp16 pick varied between runs), casts
// included (cuDNN's tensor-core kernels prefer NHWC).
TEST_F(CudaBackendTest, ResNetSizedConvolutions) {
  const Shape in{32, 64, 56, 56};
  const Tensor x = hostTensor(in, 31), dy = hostTensor(in, 32);
  for (const bool deterministic : {true, false}) {
    std::vector<float> dx32;
    for (const Precision p : {Precision::kFp32, Precision::kTf32, Precision::kBf16,
                              Precision::kFp16}) {
      const std::string what =
          std::string(precisionName(p)) + (deterministic ? " deterministic" : " fast");
      auto be = makeCudaBackend({.device = 0, .precision = p, .deterministic = deterministic});
      auto conv = be->conv2d("conv", Conv2dSpec{64, 64, 3, 1, 1, false});
      auto bn = be->batchNorm2d("bn", 64, nullptr);
      auto stem = be->conv2d("stem", Conv2dSpec{3, 64, 7, 2, 3, false});
      auto pool = be->maxPool2d("pool", Pool2dSpec{3, 2, 1});
      const std::vector<float> w = randomVector(64 * 64 * 9, 33, -0.05f, 0.05f);
      be->upload(w.data(), conv->params()[0]->value.data(), w.size());
      const std::vector<float> ws = randomVector(64 * 3 * 49, 35, -0.1f, 0.1f);
      be->upload(ws.data(), stem->params()[0]->value.data(), ws.size());
      Tensor xg = toGpu(x, be.get()), dyg = toGpu(dy, be.get()), y, z, dz, dx;
      Tensor img = toGpu(hostTensor({32, 3, 224, 224}, 34), be.get()), s, sp, dsp, ds;
      auto step = [&] {
        for (Layer* l : {conv.get(), stem.get()})
          for (Param* q : l->params()) q->overwriteGrad = true;  // no zeroing launch
        conv->forward(xg, y, true);
        bn->forward(y, z, true);
        bn->backward(y, z, dyg, &dz);
        conv->backward(xg, y, dz, &dx);
        stem->forward(img, s, true);
        pool->forward(s, sp, true);
        dsp.ensure(sp.shape(), be->allocator());
        be->copy(sp, dsp);  // some gradient for the pool
        pool->backward(s, sp, dsp, &ds);
        stem->backward(img, s, ds, nullptr);
      };
      step();  // algorithm search
      step();
      be->synchronize();
      constexpr int kIters = 10;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kIters; ++i) step();
      be->synchronize();
      const double ms = std::chrono::duration<double, std::milli>(
                            std::chrono::steady_clock::now() - t0).count() / kIters;
      const auto g1 = fromGpu(conv->params()[0]->grad, be.get());
      step();
      if (deterministic) {
        EXPECT_EQ(fromGpu(conv->params()[0]->grad, be.get()), g1) << what;
      }
      for (float v : g1) ASSERT_TRUE(std::isfinite(v)) << what;
      const auto dxp = fromGpu(dx, be.get());
      const auto st = dynamic_cast<cuda::CachingAllocator&>(be->allocator()).stats();
      std::cout << "[ timing   ] " << what << ": conv3x3 64ch 56x56 + bn + stem 7x7/2 + "
                << "maxpool 3/2, batch 32, forward+backward " << ms << " ms/iteration; "
                << "allocator in use " << (st.inUse >> 20) << " MiB, peak " << (st.peak >> 20)
                << " MiB, cached " << (st.cached >> 20) << " MiB, " << st.mallocs
                << " cudaMalloc calls";
      if (p == Precision::kFp32) {
        dx32 = dxp;
      } else {
        const double e = normwiseError(dxp, dx32);
        std::cout << "; dx normwise error against fp32 " << e;
        if (p == Precision::kTf32 && deterministic) {
          expectClose(dxp, dx32, 1e-2, what + " dx against fp32");
        } else {
          EXPECT_LE(e, p == Precision::kTf32 ? 1e-2 : p == Precision::kBf16 ? 3e-2 : 4e-3)
              << what << " dx";
        }
      }
      std::cout << "\n";
    }
  }
}

// ------------------------------------------------------- errors, describe
TEST_F(CudaBackendTest, DescribeNamesDeviceLibraryAndPrecision) {
  const std::string d = gpu_->describe();
  EXPECT_EQ(d.rfind("cuda:0 (", 0), 0u) << d;
  EXPECT_NE(d.find("cuDNN 9."), std::string::npos) << d;
  EXPECT_NE(d.find("fp32, nchw)"), std::string::npos) << d;
  const std::string n = makeCudaBackend({.device = 0, .nhwc = true})->describe();
  EXPECT_NE(n.find("fp32, nhwc)"), std::string::npos) << n;
  // The graph-API search applies in NHWC fast mode only.
  using GraphConv = CudaBackendOptions::GraphConv;
  const auto graph = [](bool nhwc, bool deterministic, GraphConv g) {
    return makeCudaBackend({.device = 0, .precision = Precision::kTf32,
                            .deterministic = deterministic, .nhwc = nhwc, .graphConv = g})
        ->describe();
  };
  EXPECT_NE(graph(true, false, GraphConv::kPrecompiled).find(", cuDNN graph convolutions)"),
            std::string::npos);
  EXPECT_NE(graph(true, false, GraphConv::kAll).find("with runtime-compiled engines)"),
            std::string::npos);
  for (const auto& [nhwc, det] : {std::pair{false, false}, std::pair{true, true}})
    EXPECT_EQ(graph(nhwc, det, GraphConv::kAll).find("graph"), std::string::npos)
        << "nhwc " << nhwc << ", deterministic " << det;
  std::cout << "[ describe ] " << d << "\n";
}

TEST_F(CudaBackendTest, BadDeviceAndPrecisionAreClearErrors) {
  const int count = runtime::cudaDeviceCount();
  try {
    makeCudaBackend({.device = count, .precision = Precision::kFp32});
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(e.message().find("cuda:" + std::to_string(count) + " does not exist"),
              std::string::npos) << e.message();
    EXPECT_NE(e.message().find("has " + std::to_string(count) + " CUDA device"),
              std::string::npos) << e.message();
  }
  // Every precision is available (bf16/fp16 were refused before autocast).
  for (const Precision p : k16Bit) {
    const std::string d = makeCudaBackend({.device = 0, .precision = p})->describe();
    EXPECT_NE(d.find(std::string(", ") + precisionName(p) + ", "), std::string::npos) << d;
  }
}

TEST_F(CudaBackendTest, CudaErrorsNameTheCallAndDevice) {
  try {
    DDPRUN_CUDA_OK(cudaSetDevice(runtime::cudaDeviceCount() + 3));
    FAIL() << "no exception";
  } catch (const runtime::CudaError& e) {
    EXPECT_EQ(e.message().rfind("cudaSetDevice failed on cuda:", 0), 0u) << e.message();
    EXPECT_NE(e.message().find("cudaErrorInvalidDevice"), std::string::npos) << e.message();
    EXPECT_EQ(e.message().find(".cc"), std::string::npos) << e.message();
  }
  // The deliberate failure is also this thread's pending "last error": clear
  // it, or the next kernel launch's cudaGetLastError check (a later test on
  // this thread) would report it as its own.
  (void)cudaGetLastError();
  cudnnTensorDescriptor_t desc = nullptr;
  ASSERT_EQ(cudnnCreateTensorDescriptor(&desc), CUDNN_STATUS_SUCCESS);
  try {
    DDPRUN_CUDNN_OK(cudnnSetTensor4dDescriptor(desc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, -1, 2, 3, 4));
    FAIL() << "no exception";
  } catch (const IoError& e) {
    EXPECT_EQ(e.message().rfind("cudnnSetTensor4dDescriptor failed on cuda:", 0), 0u)
        << e.message();
    EXPECT_NE(e.message().find("CUDNN_STATUS_BAD_PARAM"), std::string::npos) << e.message();
  }
  cudnnDestroyTensorDescriptor(desc);
}

}  // namespace

// Batch norm paths are chosen once per layer at model build (bn_path.h) and
// named in describe(): ResNet-18 on the trainer's defaults (bf16, NHWC,
// 16-bit activations) runs every batch norm on our fused NHWC kernels; the
// stem's and each block's bn1 with the ReLU, each bn2 with the add and the
// ReLU, the downsample ones alone. fp32 NCHW composes cuDNN's with the ReLU.
TEST(CudaBnPaths, ChosenAtBuildAndNamedInDescribe) {
  DDPRUN_REQUIRE_GPU("batch norm path");
  auto bf16 = makeCudaBackend({.device = 0, .precision = Precision::kBf16, .nhwc = true,
                               .activations16 = true});
  auto m = Model::create("resnet18", *bf16);
  const std::string d = bf16->describe();
  EXPECT_NE(d.find(", batch norm ours-nhwc+relu x9, ours-nhwc+add+relu x8, ours-nhwc x3"),
            std::string::npos)
      << d;
  auto fp32 = makeCudaBackend({.device = 0, .precision = Precision::kFp32});
  auto r32 = Model::create("resnet18", *fp32);
  const std::string d32 = fp32->describe();
  EXPECT_NE(d32.find(", batch norm cudnn-nchw then relu x9, cudnn-nchw then add+relu x8, "
                     "cudnn-nchw x3"),
            std::string::npos)
      << d32;
}

}  // namespace ddprun::train

