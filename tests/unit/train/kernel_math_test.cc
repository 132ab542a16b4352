// kernel_math.h (the element math of the CUDA kernels) on the CPU, against the
// CPU backend's results for the same inputs.
#include "kernel_math.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ddprun/common/error.h"
#include "ddprun/runtime/types.h"
#include "ddprun/train/layers.h"
#include "train/expect_bounded.h"
#include "train/random_vector.h"

namespace ddprun::train {
namespace {

using ddprun::testing::randomVector;

void expectNear(const std::vector<float>& a, const std::vector<float>& b, float rtol,
                const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], rtol * (std::fabs(b[i]) + 1e-6f)) << what << " at " << i;
}

TEST(KernelMath, SgdMatchesCpuBackend) {
  auto be = makeCpuBackend();
  const size_t n = 257;
  for (const bool first : {true, false})
    for (const float momentum : {0.0f, 0.9f})
      for (const float wd : {0.0f, 1e-2f}) {
        auto w = randomVector(n, 1), g = randomVector(n, 2), buf = randomVector(n, 3);
        auto w2 = w, buf2 = buf;
        be->sgdUpdate(w.data(), g.data(), buf.data(), n, 0.05f, momentum, wd, first);
        for (size_t i = 0; i < n; ++i)
          kmath::sgdStep(w2[i], g[i], buf2[i], 0.05f, momentum, wd, first);
        expectNear(w2, w, 1e-6f, "sgd weights");
        if (momentum != 0.0f) expectNear(buf2, buf, 1e-6f, "sgd momentum buffer");
      }
}

// The SGD step as it was before Nesterov (dampening 0), for the bitwise check
// that nesterov = false kept it.
void sgdBeforeNesterov(float& w, float g, float& buf, float lr, float momentum, float wd,
                       bool first) {
  float d = wd != 0.0f ? g + wd * w : g;
  if (momentum != 0.0f) {
    buf = first ? d : momentum * buf + d;
    d = buf;
  }
  w -= lr * d;
}

bool sameBits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(KernelMath, SgdWithoutNesterovIsBitwiseAsBefore) {
  const size_t n = 1000;
  const auto w0 = randomVector(n, 21, -3.0f, 3.0f), g = randomVector(n, 22),
             b0 = randomVector(n, 23);
  for (const bool first : {true, false})
    for (const float momentum : {0.0f, 0.9f})
      for (const float wd : {0.0f, 5e-4f})
        for (size_t i = 0; i < n; ++i) {
          float w1 = w0[i], b1 = b0[i], w2 = w0[i], b2 = b0[i], w3 = w0[i], b3 = b0[i];
          sgdBeforeNesterov(w1, g[i], b1, 0.05f, momentum, wd, first);
          kmath::sgdStep(w2, g[i], b2, 0.05f, momentum, wd, first);
          kmath::sgdStep(w3, g[i], b3, 0.05f, momentum, wd, first, false);
          ASSERT_TRUE(sameBits(w1, w2) && sameBits(b1, b2) && sameBits(w1, w3) &&
                      sameBits(b1, b3))
              << "element " << i;
        }
}

// Nesterov in PyTorch's op order (torch/optim/sgd.py, _single_tensor_sgd):
// grad = grad.add(param, alpha=wd); buf.mul_(momentum).add_(grad);
// grad = grad.add(buf, alpha=momentum); param.add_(grad, alpha=-lr): one
// float rounding per op, so the result is that sequence bit for bit, and the
// float64 computation within a few float roundings.
TEST(KernelMath, SgdNesterovFollowsPyTorchsOpOrder) {
  const size_t n = 1000;
  const float lr = 0.05f, m = 0.9f;
  const auto w0 = randomVector(n, 31, -3.0f, 3.0f), g = randomVector(n, 32),
             b0 = randomVector(n, 33);
  for (const bool first : {true, false})
    for (const float wd : {0.0f, 5e-4f})
      for (size_t i = 0; i < n; ++i) {
        float w = w0[i], buf = b0[i];
        kmath::sgdStep(w, g[i], buf, lr, m, wd, first, true);
        // The same ops, one at a time (volatile: each result rounded to float).
        volatile float d = wd != 0.0f ? g[i] + wd * w0[i] : g[i];
        volatile float mb = m * b0[i];
        volatile float b = first ? static_cast<float>(d) : mb + d;
        volatile float mbuf = m * b;
        volatile float dir = d + mbuf;
        volatile float step = lr * dir;
        volatile float wExpect = w0[i] - step;
        ASSERT_TRUE(sameBits(buf, b)) << "buffer, element " << i;
        ASSERT_TRUE(sameBits(w, wExpect)) << "weight, element " << i;
        // float64: d = g + wd w; buf = d or m buf + d; w - lr (d + m buf).
        const double dd = static_cast<double>(g[i]) + static_cast<double>(wd) * w0[i];
        const double bd = first ? dd : static_cast<double>(m) * b0[i] + dd;
        const double wd64 = w0[i] - static_cast<double>(lr) * (dd + static_cast<double>(m) * bd);
        EXPECT_NEAR(buf, bd, 4e-7 * (std::fabs(bd) + 1.0)) << "element " << i;
        EXPECT_NEAR(w, wd64, 4e-7 * (std::fabs(wd64) + 1.0)) << "element " << i;
      }
}

// A hand-computed Nesterov step: w = 1, g = 0.5, buf = 0.25, lr 0.1,
// momentum 0.5, wd 0.5 (all exact in binary): g' = 0.5 + 0.5 = 1;
// buf = 0.5 * 0.25 + 1 = 1.125; d = 1 + 0.5 * 1.125 = 1.5625;
// w = 1 - 0.1 * 1.5625 = 0.84375 (to float rounding of 0.1). First step:
// buf = g' = 1, d = 1.5, w = 0.85.
TEST(KernelMath, SgdNesterovHandComputed) {
  float w = 1.0f, buf = 0.25f;
  kmath::sgdStep(w, 0.5f, buf, 0.1f, 0.5f, 0.5f, false, true);
  EXPECT_EQ(buf, 1.125f);
  EXPECT_NEAR(w, 0.84375, 1e-7);
  w = 1.0f, buf = 123.0f;
  kmath::sgdStep(w, 0.5f, buf, 0.1f, 0.5f, 0.5f, true, true);
  EXPECT_EQ(buf, 1.0f);
  EXPECT_NEAR(w, 0.85, 1e-7);
  // Without Nesterov the same numbers step by buf: 1 - 0.1 * 1.125.
  w = 1.0f, buf = 0.25f;
  kmath::sgdStep(w, 0.5f, buf, 0.1f, 0.5f, 0.5f, false, false);
  EXPECT_NEAR(w, 0.8875, 1e-7);
}

TEST(KernelMath, SgdNesterovMatchesCpuBackend) {
  auto be = makeCpuBackend();
  const size_t n = 257;
  for (const bool first : {true, false})
    for (const float wd : {0.0f, 1e-2f}) {
      auto w = randomVector(n, 1), g = randomVector(n, 2), buf = randomVector(n, 3);
      auto w2 = w, buf2 = buf;
      be->sgdUpdate(w.data(), g.data(), buf.data(), n, 0.05f, 0.9f, wd, first, true);
      for (size_t i = 0; i < n; ++i)
        kmath::sgdStep(w2[i], g[i], buf2[i], 0.05f, 0.9f, wd, first, true);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(sameBits(w[i], w2[i])) << "w at " << i;
        ASSERT_TRUE(sameBits(buf[i], buf2[i])) << "buf at " << i;
      }
    }
}

TEST(KernelMath, AdamMatchesCpuBackend) {
  auto be = makeCpuBackend();
  const size_t n = 129;
  auto w = randomVector(n, 4), m = randomVector(n, 5), v = randomVector(n, 6, 0.0f, 1.0f);
  auto w2 = w, m2 = m, v2 = v;
  for (int64_t step = 1; step <= 3; ++step) {
    const auto g = randomVector(n, 10 + step);
    be->adamUpdate(w.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f,
                   step);
    const kmath::AdamScalars s = kmath::adamScalars(1e-3f, 0.9f, 0.999f, step);
    for (size_t i = 0; i < n; ++i)
      kmath::adamStep(w2[i], g[i], m2[i], v2[i], s, 0.9f, 0.999f, 1e-8f, 1e-2f);
  }
  expectNear(w2, w, 1e-6f, "adam weights");
  expectNear(m2, m, 1e-6f, "adam m");
  expectNear(v2, v, 1e-6f, "adam v");
}

TEST(KernelMath, CrossEntropyMatchesCpuBackend) {
  auto be = makeCpuBackend();
  const int64_t n = 7, k = 10;
  Tensor logits({n, k});
  const auto z = randomVector(static_cast<size_t>(n * k), 7, -4.0f, 4.0f);
  std::copy(z.begin(), z.end(), logits.data());
  std::vector<int32_t> labels = {0, 3, 9, 2, 2, 5, 7};
  for (const float eps : {0.0f, 0.1f, 1.0f}) {
    be->setLabelSmoothing(eps);
    Tensor dlogits;
    int64_t correct = -1;
    const double loss = be->crossEntropy(logits, labels.data(), &dlogits, &correct, 128.0f);

    double total = 0.0;
    int64_t hits = 0;
    std::vector<float> d(static_cast<size_t>(n * k));
    for (int64_t i = 0; i < n; ++i) {
      const float* row = z.data() + i * k;
      const kmath::CeRow r = kmath::crossEntropyRow(row, k);
      total += kmath::crossEntropyLoss(row, r, labels[i], eps, k);
      hits += r.arg == labels[i];
      for (int64_t j = 0; j < k; ++j)
        d[i * k + j] =
            kmath::crossEntropyGrad(row[j], r.lse, j == labels[i], n, 128.0f, eps, k);
    }
    EXPECT_NEAR(total / n, loss, 1e-12) << "eps " << eps;
    EXPECT_EQ(hits, correct) << "eps " << eps;
    expectNear(d, std::vector<float>(dlogits.data(), dlogits.data() + n * k), 1e-6f, "dlogits");
  }
}

// Label smoothing eps over k classes: row loss (1 - eps)(lse - z_y) +
// eps/k sum_j (lse - z_j), gradient (softmax_j - (1 - eps)[j == y] - eps/k)/n,
// against a float64 computation from scratch: the loss to double rounding,
// the gradient to its one float rounding (times the exact power-of-2 scale).
TEST(KernelMath, LabelSmoothedCrossEntropyAgainstFloat64) {
  const int64_t n = 5, k = 7;
  // Multiples of 1/64: every difference z_j - max is exact in float, so the
  // reference below (in double throughout) computes what the kernel does.
  auto z = randomVector(static_cast<size_t>(n * k), 17, -6.0f, 6.0f);
  for (float& v : z) v = std::round(v * 64.0f) / 64.0f;
  const int32_t labels[n] = {0, 6, 3, 3, 1};
  for (const float eps : {0.05f, 0.1f, 0.5f, 1.0f})
    for (int64_t i = 0; i < n; ++i) {
      const float* row = z.data() + i * k;
      double mx = row[0];
      for (int64_t j = 1; j < k; ++j) mx = std::max(mx, static_cast<double>(row[j]));
      double se = 0.0;
      for (int64_t j = 0; j < k; ++j) se += std::exp(row[j] - mx);
      const double lse = mx + std::log(se);
      const double e = eps;
      double smooth = 0.0;
      for (int64_t j = 0; j < k; ++j) smooth += lse - row[j];
      const double want = (1.0 - e) * (lse - row[labels[i]]) + e / k * smooth;
      const kmath::CeRow r = kmath::crossEntropyRow(row, k);
      EXPECT_NEAR(kmath::crossEntropyLoss(row, r, labels[i], eps, k), want, 1e-13 * want)
          << "eps " << eps << " row " << i;
      double gsum = 0.0;
      for (int64_t j = 0; j < k; ++j) {
        const double target = (j == labels[i] ? 1.0 - e : 0.0) + e / k;
        const double g = (std::exp(row[j] - lse) - target) / n * 4.0;
        const float ours = kmath::crossEntropyGrad(row[j], r.lse, j == labels[i], n, 4.0f, eps, k);
        EXPECT_NEAR(ours, g, 1.2e-7 * std::fabs(g) + 1e-15) << "eps " << eps << " j " << j;
        gsum += ours;
      }
      EXPECT_NEAR(gsum, 0.0, 1e-6) << "a row's gradient sums to 0 (the target sums to 1)";
    }
}

// eps = 0 is the plain cross-entropy's arithmetic, bit for bit.
TEST(KernelMath, CrossEntropyWithoutSmoothingIsBitwiseAsBefore) {
  const int64_t n = 9, k = 10;
  const auto z = randomVector(static_cast<size_t>(n * k), 19, -8.0f, 8.0f);
  for (int64_t i = 0; i < n; ++i) {
    const float* row = z.data() + i * k;
    const int32_t y = static_cast<int32_t>((i * 3) % k);
    const kmath::CeRow r = kmath::crossEntropyRow(row, k);
    const double plain = r.lse - row[y];
    const double a = kmath::crossEntropyLoss(row, r, y);
    const double b = kmath::crossEntropyLoss(row, r, y, 0.0f, k);
    EXPECT_EQ(std::memcmp(&a, &plain, sizeof a), 0);
    EXPECT_EQ(std::memcmp(&b, &plain, sizeof b), 0);
    for (int64_t j = 0; j < k; ++j) {
      const float before = static_cast<float>(
          (std::exp(row[j] - r.lse) - (j == y ? 1.0 : 0.0)) / static_cast<double>(n)) * 64.0f;
      ASSERT_TRUE(sameBits(kmath::crossEntropyGrad(row[j], r.lse, j == y, n, 64.0f), before));
      ASSERT_TRUE(
          sameBits(kmath::crossEntropyGrad(row[j], r.lse, j == y, n, 64.0f, 0.0f, k), before));
    }
  }
}

TEST(KernelMath, ReluMatchesCpuBackend) {
  auto be = makeCpuBackend();
  auto layer = be->relu("relu");
  Tensor x({3, 17}), y, dx;
  const auto xv = randomVector(51, 8), g = randomVector(51, 9);
  std::copy(xv.begin(), xv.end(), x.data());
  layer->forward(x, y, true);
  Tensor dy({3, 17});
  std::copy(g.begin(), g.end(), dy.data());
  layer->backward(x, y, dy, &dx);
  for (size_t i = 0; i < xv.size(); ++i) {
    EXPECT_EQ(kmath::reluForward(xv[i]), y.data()[i]);
    EXPECT_EQ(kmath::reluBackward(y.data()[i], g[i]), dx.data()[i]);
  }
}

TEST(KernelMath, ScaleAndFiniteCheckMatchesCpuBackend) {
  auto be = makeCpuBackend();
  for (const bool poison : {false, true}) {
    auto a = randomVector(100, 10);
    if (poison) a[37] = std::numeric_limits<float>::infinity();
    auto b = a;
    const bool cpu = be->scaleAndCheckFinite(a.data(), a.size(), 0.5f);
    bool ours = true;
    for (auto& x : b) ours &= kmath::scaleFinite(x, 0.5f);
    EXPECT_EQ(cpu, ours);
    EXPECT_EQ(ours, !poison);
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::isfinite(a[i])) {
        EXPECT_EQ(a[i], b[i]);
      }
    }
  }
  EXPECT_FALSE(kmath::isFiniteF(std::numeric_limits<float>::quiet_NaN()));
  EXPECT_FALSE(kmath::isFiniteF(-std::numeric_limits<float>::infinity()));
  EXPECT_TRUE(kmath::isFiniteF(std::numeric_limits<float>::max()));
}

// Training-mode batch norm from the shared functions (double sums, as the CPU
// backend and the CUDA SyncBN kernels) against the CPU layer.
TEST(KernelMath, BatchNormMatchesCpuBackend) {
  auto be = makeCpuBackend();
  const int64_t n = 3, c = 4, hw = 6;
  auto bn = be->batchNorm2d("bn", c, nullptr);
  Tensor x({n, c, 2, 3}), y, dy({n, c, 2, 3}), dx;
  const auto xv = randomVector(static_cast<size_t>(n * c * hw), 11, -2.0f, 3.0f);
  const auto g = randomVector(xv.size(), 12);
  std::copy(xv.begin(), xv.end(), x.data());
  std::copy(g.begin(), g.end(), dy.data());
  auto params = bn->params();
  const auto gamma = randomVector(c, 13, 0.5f, 1.5f), beta = randomVector(c, 14);
  std::copy(gamma.begin(), gamma.end(), params[0]->value.data());
  std::copy(beta.begin(), beta.end(), params[1]->value.data());
  bn->forward(x, y, true);
  bn->backward(x, y, dy, &dx);

  std::vector<float> yr(xv.size()), dxr(xv.size()), xhat(xv.size());
  const double count = static_cast<double>(n * hw);
  for (int64_t ch = 0; ch < c; ++ch) {
    double s = 0, q = 0, s1 = 0, s2 = 0;
    auto at = [&](int64_t i, int64_t k) { return (i * c + ch) * hw + k; };
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < hw; ++k) s += xv[at(i, k)];
    const double mean = s / count;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < hw; ++k) q += (xv[at(i, k)] - mean) * (xv[at(i, k)] - mean);
    const float invstd = kmath::bnInvStd(q / count, 1e-5);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < hw; ++k) {
        xhat[at(i, k)] = kmath::bnXhat(xv[at(i, k)], static_cast<float>(mean), invstd);
        yr[at(i, k)] = kmath::bnOut(xhat[at(i, k)], gamma[ch], beta[ch]);
        s1 += g[at(i, k)];
        s2 += static_cast<double>(g[at(i, k)]) * xhat[at(i, k)];
      }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < hw; ++k)
        dxr[at(i, k)] = kmath::bnBackward(g[at(i, k)], xhat[at(i, k)], gamma[ch] * invstd,
                                          static_cast<float>(s1 / count),
                                          static_cast<float>(s2 / count));
    float rm = 0.0f, rv = 1.0f;
    kmath::bnRunningUpdate(rm, rv, mean, q / count, count, 0.1);
    EXPECT_FLOAT_EQ(rm, bn->buffers()[0]->value.data()[ch]);
    EXPECT_FLOAT_EQ(rv, bn->buffers()[1]->value.data()[ch]);
    EXPECT_NEAR(static_cast<float>(s2), params[0]->grad.data()[ch], 1e-5);
    EXPECT_NEAR(static_cast<float>(s1), params[1]->grad.data()[ch], 1e-5);
  }
  expectNear(yr, std::vector<float>(y.data(), y.data() + y.numel()), 1e-6f, "bn y");
  expectNear(dxr, std::vector<float>(dx.data(), dx.data() + dx.numel()), 1e-5f, "bn dx");
}

// PyTorch's values: F.interpolate(torch.tensor([[[[0., 1.]]]]), size=(1, 4),
// mode="bilinear", align_corners=False) = [0, 0.25, 0.75, 1]; downsampling
// 4 -> 2 averages neighbours: [0.5, 2.5] from [0, 1, 2, 3].
TEST(KernelMath, BilinearIndexMatchesPyTorch) {
  const float up[2] = {0.0f, 1.0f};
  const float want[4] = {0.0f, 0.25f, 0.75f, 1.0f};
  const kmath::Lerp row = kmath::bilinearIndex(0, 1, 1);
  for (int j = 0; j < 4; ++j)
    EXPECT_FLOAT_EQ(kmath::bilinearAt(up, 2, row, kmath::bilinearIndex(j, 2, 4)), want[j]);
  const float down[4] = {0.0f, 1.0f, 2.0f, 3.0f};
  EXPECT_FLOAT_EQ(kmath::bilinearAt(down, 4, row, kmath::bilinearIndex(0, 4, 2)), 0.5f);
  EXPECT_FLOAT_EQ(kmath::bilinearAt(down, 4, row, kmath::bilinearIndex(1, 4, 2)), 2.5f);
  // Same size: the identity.
  for (int j = 0; j < 4; ++j)
    EXPECT_EQ(kmath::bilinearAt(down, 4, row, kmath::bilinearIndex(j, 4, 4)), down[j]);
}

TEST(KernelMath, BilinearMatchesCpuBackend) {
  auto be = makeCpuBackend();
  const int64_t n = 2, c = 3, h = 5, w = 7, oh = 9, ow = 4;
  Tensor x({n, c, h, w}), y;
  const auto xv = randomVector(static_cast<size_t>(x.numel()), 15);
  std::copy(xv.begin(), xv.end(), x.data());
  be->resizeBilinear(x, oh, ow, y);
  for (int64_t p = 0; p < n * c; ++p)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j)
        EXPECT_NEAR(kmath::bilinearAt(xv.data() + p * h * w, w, kmath::bilinearIndex(i, h, oh),
                                      kmath::bilinearIndex(j, w, ow)),
                    y.data()[(p * oh + i) * ow + j], 1e-6);
}

// ------------------------------------------------------------ convolution
// The float64 convolution reference (run by the CUDA backend's accuracy
// check of cuDNN's algorithms, one GPU thread per element) against the CPU
// backend's convolution (oneDNN, fp32) on the same inputs: forward, dL/dx and
// dL/dW, in the check's measure max|ref - cpu| / max|ref|. fp32 sums of at
// most a few hundred products stay near 1e-7 of the scale; 1e-5 would still
// catch a wrong tap, index or border (errors of order 1).
struct ConvCase {
  Conv2dSpec spec;
  Shape in;
  const char* name;
};

double maxError(const std::vector<double>& ref, const float* got) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err = std::max(err, std::fabs(ref[i] - got[i]));
    scale = std::max(scale, std::fabs(ref[i]));
  }
  return scale > 0 ? err / scale : err;
}

TEST(KernelMath, ConvolutionReferenceMatchesCpuBackend) {
  auto be = makeCpuBackend();
  const ConvCase cases[] = {
      {{3, 8, 3, 2, 1, false}, {2, 3, 11, 12}, "3x3 stride 2 pad 1"},
      {{4, 6, 3, 1, 1, false}, {2, 4, 9, 7}, "3x3 stride 1 pad 1"},
      {{1, 6, 5, 1, 2, false}, {3, 1, 12, 12}, "5x5 pad 2, one input channel (LeNet conv1)"},
      {{8, 16, 1, 2, 0, false}, {2, 8, 8, 9}, "1x1 stride 2 (downsample)"},
      {{3, 4, 7, 2, 3, false}, {2, 3, 20, 17}, "7x7 stride 2 pad 3 (stem)"},
      {{2, 3, 3, 1, 0, false}, {1, 2, 6, 5}, "3x3 unpadded"},
      {{3, 4, 2, 3, 1, false}, {2, 3, 10, 11}, "2x2 stride 3 pad 1 (rows no window reads)"},
  };
  uint64_t seed = 100;
  for (const ConvCase& c : cases) {
    SCOPED_TRACE(c.name);
    auto conv = be->conv2d("conv", c.spec);
    Param& w = *conv->params()[0];
    const auto wv = randomVector(static_cast<size_t>(w.value.numel()), seed++);
    std::copy(wv.begin(), wv.end(), w.value.data());
    Tensor x(c.in), y, dx;
    const auto xv = randomVector(static_cast<size_t>(x.numel()), seed++);
    std::copy(xv.begin(), xv.end(), x.data());
    conv->forward(x, y, true);
    Tensor dy(y.shape());
    const auto dyv = randomVector(static_cast<size_t>(dy.numel()), seed++);
    std::copy(dyv.begin(), dyv.end(), dy.data());
    conv->backward(x, y, dy, &dx);  // w.grad was zero: it holds dW now

    const kmath::ConvGeom g = kmath::convGeom(c.in[0], c.in[1], c.in[2], c.in[3], c.spec.outC,
                                              c.spec.kernel, c.spec.stride, c.spec.pad);
    ASSERT_EQ(y.shape(), (Shape{g.n, g.k, g.oh, g.ow}));
    std::vector<double> yr, dxr, dwr;
    for (int64_t n = 0; n < g.n; ++n)
      for (int64_t o = 0; o < g.k; ++o)
        for (int64_t i = 0; i < g.oh; ++i)
          for (int64_t j = 0; j < g.ow; ++j)
            yr.push_back(kmath::convForwardAt(xv.data(), wv.data(), g, n, o, i, j));
    for (int64_t n = 0; n < g.n; ++n)
      for (int64_t ch = 0; ch < g.c; ++ch)
        for (int64_t i = 0; i < g.h; ++i)
          for (int64_t j = 0; j < g.w; ++j)
            dxr.push_back(kmath::convBackwardDataAt(wv.data(), dyv.data(), g, n, ch, i, j));
    for (int64_t o = 0; o < g.k; ++o)
      for (int64_t ch = 0; ch < g.c; ++ch)
        for (int64_t a = 0; a < g.kernel; ++a)
          for (int64_t b = 0; b < g.kernel; ++b)
            dwr.push_back(kmath::convBackwardFilterAt(xv.data(), dyv.data(), g, o, ch, a, b));
    EXPECT_LE(maxError(yr, y.data()), 1e-5) << "forward";
    EXPECT_LE(maxError(dxr, dx.data()), 1e-5) << "dx";
    EXPECT_LE(maxError(dwr, w.grad.data()), 1e-5) << "dW";
  }
}

// The three references are adjoint, as forward and its two backward
// operators must be: <conv(x, w), dy> = <x, dx(w, dy)> = <w, dW(x, dy)>,
// equal up to double rounding (an independent check of the index math,
// with stride and padding leaving input rows unread).
TEST(KernelMath, ConvolutionReferencesAreAdjoint) {
  const kmath::ConvGeom g = kmath::convGeom(2, 3, 9, 8, 4, 3, 2, 1);
  const auto x = randomVector(static_cast<size_t>(g.n * g.c * g.h * g.w), 21);
  const auto w = randomVector(static_cast<size_t>(g.k * g.c * g.kernel * g.kernel), 22);
  const auto dy = randomVector(static_cast<size_t>(g.n * g.k * g.oh * g.ow), 23);
  double fy = 0, fx = 0, fw = 0;
  size_t e = 0;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t o = 0; o < g.k; ++o)
      for (int64_t i = 0; i < g.oh; ++i)
        for (int64_t j = 0; j < g.ow; ++j) fy += kmath::convForwardAt(x.data(), w.data(), g, n, o, i, j) * dy[e++];
  e = 0;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t i = 0; i < g.h; ++i)
        for (int64_t j = 0; j < g.w; ++j) fx += kmath::convBackwardDataAt(w.data(), dy.data(), g, n, c, i, j) * x[e++];
  e = 0;
  for (int64_t o = 0; o < g.k; ++o)
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t a = 0; a < g.kernel; ++a)
        for (int64_t b = 0; b < g.kernel; ++b) fw += kmath::convBackwardFilterAt(x.data(), dy.data(), g, o, c, a, b) * w[e++];
  EXPECT_NEAR(fx, fy, 1e-10 * std::fabs(fy));
  EXPECT_NEAR(fw, fy, 1e-10 * std::fabs(fy));
  EXPECT_EQ(g.oh, 5);
  EXPECT_EQ(g.ow, 4);
}

// convTapRange gives exactly the output positions whose tap reads inside
// the input (brute force over small sizes, strides and paddings).
TEST(KernelMath, ConvTapRangeMatchesBruteForce) {
  for (int64_t in = 1; in <= 9; ++in)
    for (int64_t k = 1; k <= 5; ++k)
      for (int64_t s = 1; s <= 3; ++s)
        for (int64_t p = 0; p <= 3; ++p) {
          if (in + 2 * p < k) continue;
          const int64_t out = (in + 2 * p - k) / s + 1;
          for (int64_t a = 0; a < k; ++a) {
            const kmath::TapRange r = kmath::convTapRange(a, in, out, s, p);
            for (int64_t i = 0; i < out; ++i) {
              const int64_t row = i * s - p + a;
              EXPECT_EQ(i >= r.lo && i < r.hi, row >= 0 && row < in)
                  << "in " << in << " k " << k << " s " << s << " p " << p << " a " << a
                  << " i " << i;
            }
          }
        }
}

// poolCoverRange gives exactly the output positions whose pooling window
// covers an input position (max pooling's backward gathers over them).
TEST(KernelMath, PoolCoverRangeMatchesBruteForce) {
  for (int64_t in = 1; in <= 9; ++in)
    for (int64_t k = 1; k <= 5; ++k)
      for (int64_t s = 1; s <= 3; ++s)
        for (int64_t p = 0; p <= k / 2; ++p) {
          if (in + 2 * p < k) continue;
          const int64_t out = (in + 2 * p - k) / s + 1;
          for (int64_t h = 0; h < in; ++h) {
            const kmath::TapRange r = kmath::poolCoverRange(h, out, k, s, p);
            for (int64_t i = 0; i < out; ++i) {
              const bool covers = i * s - p <= h && h <= i * s - p + k - 1;
              EXPECT_EQ(i >= r.lo && i < r.hi, covers)
                  << "in " << in << " k " << k << " s " << s << " p " << p << " h " << h
                  << " i " << i;
            }
          }
        }
}

// hashUniform: in [-1, 1), reproducible, different per seed, about uniform.
TEST(KernelMath, HashUniformIsReproducibleAndUniform) {
  double sum = 0;
  float lo = 1, hi = -1;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const float v = kmath::hashUniform(7, static_cast<uint64_t>(i));
    ASSERT_GE(v, -1.0f);
    ASSERT_LT(v, 1.0f);
    ASSERT_EQ(v, kmath::hashUniform(7, static_cast<uint64_t>(i)));
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    sum += v;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_LT(lo, -0.99f);
  EXPECT_GT(hi, 0.99f);
  EXPECT_NE(kmath::hashUniform(7, 0), kmath::hashUniform(8, 0));
}


// ------------------------------------------ fused NHWC batch norm (bn_nhwc.cu)
// The narrow transpose's index math, played block by block on the host as
// the kernel runs it (transpose.cu: one chunk per block, the load pass
// into a tile of pitch n + 1, then the store pass): every output written
// once with its transposed input, the tile within its bounds, and on each
// side the accesses that must be one run for coalescing are one run.
TEST(KernelMath, NarrowTransposeWritesEveryElementOnceInRuns) {
  struct Case {
    int64_t rows, cols;
  };
  // The model's input (C = 3 over H*W), 3x3 and 7x7 filters each way, 1x1
  // filters, partial last chunks, both sides narrow, the widest narrow side.
  for (const Case c : {Case{3, 5000}, Case{5000, 3}, Case{64, 9}, Case{9, 512}, Case{512, 1},
                       Case{1, 512}, Case{3, 49}, Case{49, 3}, Case{32, 33}, Case{33, 32},
                       Case{7, 1}, Case{1, 1}, Case{17, 1000}}) {
    const std::string what = std::to_string(c.rows) + "x" + std::to_string(c.cols);
    const kmath::NarrowTranspose p = kmath::narrowTranspose(c.rows, c.cols);
    ASSERT_EQ(p.narrow, std::min(c.rows, c.cols)) << what;
    ASSERT_LE(p.narrow, kmath::kNarrowMax) << what;
    ASSERT_EQ(p.chunkWidth % 32, 0) << what;
    ASSERT_GE(p.chunkWidth, 128) << what;
    std::vector<float> x(static_cast<size_t>(c.rows * c.cols));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
    std::vector<float> y(x.size(), -1.0f);
    std::vector<int> writes(x.size(), 0);
    std::vector<float> tile(static_cast<size_t>(kmath::kNarrowTile + kmath::kNarrowMax));
    for (int64_t w0 = 0; w0 < p.wide; w0 += p.chunkWidth) {
      const int n = static_cast<int>(std::min(p.chunkWidth, p.wide - w0));
      const int total = static_cast<int>(p.narrow) * n;
      ASSERT_LE(static_cast<int64_t>(p.narrow) * (n + 1), static_cast<int64_t>(tile.size()))
          << what;
      int64_t prevLoad = -1, prevStore = -1;
      for (int e = 0; e < total; ++e) {
        const kmath::NarrowSlot s = kmath::narrowLoadSlot(p, w0, n, e);
        ASSERT_TRUE(s.t >= 0 && s.t < p.narrow && s.j >= 0 && s.j < n) << what;
        tile[static_cast<size_t>(s.t * (n + 1) + s.j)] = x[static_cast<size_t>(s.mem)];
        // x's [wide][narrow] side (narrow columns) is read as one run, its
        // [narrow][wide] side in runs of n.
        if (p.narrowRows ? e % n != 0 : e > 0) {
          ASSERT_EQ(s.mem, prevLoad + 1) << what;
        }
        prevLoad = s.mem;
      }
      for (int e = 0; e < total; ++e) {
        const kmath::NarrowSlot s = kmath::narrowStoreSlot(p, w0, n, e);
        y[static_cast<size_t>(s.mem)] = tile[static_cast<size_t>(s.t * (n + 1) + s.j)];
        ++writes[static_cast<size_t>(s.mem)];
        if (p.narrowRows ? e > 0 : e % n != 0) {
          ASSERT_EQ(s.mem, prevStore + 1) << what;
        }
        prevStore = s.mem;
      }
    }
    for (int64_t i = 0; i < c.rows; ++i)
      for (int64_t j = 0; j < c.cols; ++j) {
        const size_t out = static_cast<size_t>(j * c.rows + i);
        ASSERT_EQ(writes[out], 1) << what << " (" << i << ", " << j << ")";
        ASSERT_EQ(y[out], x[static_cast<size_t>(i * c.cols + j)]) << what;
      }
  }
}

TEST(KernelMath, BnMomentsFromSums) {
  // x = {1, 2, 3, 6}: mean 3, biased var (1 + 4 + 9 + 36) / 4 - 9 = 3.5.
  const kmath::BnMoments m = kmath::bnMomentsFromSums(12.0, 50.0, 4.0);
  EXPECT_DOUBLE_EQ(m.mean, 3.0);
  EXPECT_DOUBLE_EQ(m.var, 3.5);
  // Cancellation below zero is clamped; no elements: zeros.
  EXPECT_EQ(kmath::bnMomentsFromSums(3.0 * 0.1, 3.0 * 0.1 * 0.1 * (1 - 1e-15), 3.0).var, 0.0);
  const kmath::BnMoments none = kmath::bnMomentsFromSums(0.0, 0.0, 0.0);
  EXPECT_EQ(none.mean, 0.0);
  EXPECT_EQ(none.var, 0.0);
}

TEST(KernelMath, BnActForwardAndGrad) {
  // xhat = (3 - 1) * 0.5 = 1; 1 * 2 + 0.25 = 2.25; + z.
  EXPECT_EQ(kmath::bnActForward(3.0f, 1.0f, 0.5f, 2.0f, 0.25f, 0.0f, false), 2.25f);
  EXPECT_EQ(kmath::bnActForward(3.0f, 1.0f, 0.5f, 2.0f, 0.25f, -3.0f, false), -0.75f);
  EXPECT_EQ(kmath::bnActForward(3.0f, 1.0f, 0.5f, 2.0f, 0.25f, -3.0f, true), 0.0f);
  EXPECT_EQ(kmath::bnActForward(3.0f, 1.0f, 0.5f, 2.0f, 0.25f, 1.0f, true), 3.25f);
  EXPECT_EQ(kmath::bnActGrad(0.5f, -2.0f, true), -2.0f);
  EXPECT_EQ(kmath::bnActGrad(0.0f, -2.0f, true), 0.0f);
  EXPECT_EQ(kmath::bnActGrad(-1.0f, -2.0f, false), -2.0f);
  const kmath::BnBackwardCoefs k = kmath::bnBackwardCoefs(2.0, -4.0, 8.0, 2.0f, 0.5f);
  EXPECT_EQ(k.scale, 1.0f);
  EXPECT_EQ(k.k1, 0.25f);
  EXPECT_EQ(k.k2, -0.5f);
  // xhat = 1: 1 * (1 - 0.25 + 0.5) = 1.25.
  EXPECT_EQ(kmath::bnActBackwardData(3.0f, 1.0f, 1.0f, 0.5f, k), 1.25f);
}

// The storage types of the NHWC kernels: values pass through them as the
// kernels' loads and stores do (round to nearest even).
enum class BnStore { kF32, kBf16, kF16 };
const char* bnStoreName(BnStore s) {
  return s == BnStore::kF32 ? "float32" : s == BnStore::kBf16 ? "bfloat16" : "float16";
}
float bnStored(BnStore s, float v) {
  if (s == BnStore::kBf16) return runtime::bf16ToFloat(runtime::floatToBf16(v));
  if (s == BnStore::kF16) return runtime::halfToFloat(runtime::floatToHalf(v));
  return v;
}
// The unit roundoff of the storage, 2^-p for p significand bits (8 for
// bf16, 11 for fp16, 24 for float): a stored result is within u * |v| of the
// float it rounds (normal range; half an ulp at the bottom of a binade).
double bnUnitRoundoff(BnStore s) {
  return s == BnStore::kBf16 ? std::ldexp(1.0, -8) : s == BnStore::kF16 ? std::ldexp(1.0, -11)
                                                                        : std::ldexp(1.0, -24);
}

using ddprun::testing::expectBounded;

// The whole NHWC algorithm on the host, element by element as bn_nhwc.cu
// computes it (the same kmath calls, the same float/double split, storage
// rounding at every load and store), against a float64 reference computed
// from the same stored inputs. Bounds:
//  - mean, invstd, running stats (float from double sums): 1e-6 relative
//    (float rounding is 6e-8; the one-pass variance in double loses ~1e-12
//    at mean 100, std 1).
//  - y and dx: the storage's rounding of the result, u * |want| (u = 2^-24,
//    2^-8, 2^-11 for float, bf16, fp16), plus 1e-5 of the tensor's largest
//    magnitude for the float arithmetic before it (at mean 100 the float mean
//    alone is off by up to 100 * 2^-24 = 6e-6, i.e. 6e-6 in xhat).
//  - dz (the masked dy, stored): exact.
//  - the sums S1 = dbeta, S2 = dgamma (float groups of kBnGradGroup terms
//    added in double; xhat is float): 1e-5 of sum |g| (1 + |xhat|), the
//    condition of the sum (BnGradGroupErrorIsWithinGroupRoundoff is tighter).
// The ReLU's mask follows the stored y in both (as PyTorch's backward does).
struct BnNhwcCase {
  int64_t rows, c;
  BnStore store;
  bool residual, relu;
  float xMean;
};
void checkBnNhwcOnHost(const BnNhwcCase& k) {
  const int64_t rows = k.rows, c = k.c;
  const size_t n = static_cast<size_t>(rows * c);
  const double eps = 1e-5, momentum = 0.1;
  SCOPED_TRACE(std::string(bnStoreName(k.store)) + (k.residual ? " +z" : "") +
               (k.relu ? " relu" : "") + " mean " + std::to_string(k.xMean));
  auto x = randomVector(n, 41, k.xMean - 1.7f, k.xMean + 1.7f);  // std ~1
  auto z = randomVector(n, 42, -1.0f, 1.0f), dy = randomVector(n, 43, -1.0f, 1.0f);
  for (auto* v : {&x, &z, &dy})
    for (float& e : *v) e = bnStored(k.store, e);
  const auto gamma = randomVector(static_cast<size_t>(c), 44, 0.5f, 1.5f);
  const auto beta = randomVector(static_cast<size_t>(c), 45, -0.5f, 0.5f);
  const auto rm0 = randomVector(static_cast<size_t>(c), 46, -1.0f, 1.0f);
  const auto rv0 = randomVector(static_cast<size_t>(c), 47, 0.5f, 2.0f);
  auto at = [c](int64_t r, int64_t ch) { return static_cast<size_t>(r * c + ch); };

  // The kernels' arithmetic.
  std::vector<float> mean(c), invstd(c), rm = rm0, rv = rv0, y(n), g(n), dx(n);
  std::vector<double> s1(c), s2(c);
  for (int64_t ch = 0; ch < c; ++ch) {
    kmath::BnGradGroup group;  // the sums kernel's float groups (of row-order terms here)
    double s = 0, q = 0;
    for (int64_t r = 0; r < rows; ++r) {
      s += x[at(r, ch)];
      q += static_cast<double>(x[at(r, ch)]) * static_cast<double>(x[at(r, ch)]);
    }
    const kmath::BnMoments mo = kmath::bnMomentsFromSums(s, q, static_cast<double>(rows));
    mean[ch] = static_cast<float>(mo.mean);
    invstd[ch] = kmath::bnInvStd(mo.var, eps);
    kmath::bnRunningUpdate(rm[ch], rv[ch], mo.mean, mo.var, static_cast<double>(rows), momentum);
    for (int64_t r = 0; r < rows; ++r) {
      const size_t i = at(r, ch);
      y[i] = bnStored(k.store, kmath::bnActForward(x[i], mean[ch], invstd[ch], gamma[ch],
                                                   beta[ch], k.residual ? z[i] : 0.0f, k.relu));
      g[i] = bnStored(k.store, kmath::bnActGrad(k.relu ? y[i] : 0.0f, dy[i], k.relu));
      group.add(g[i], kmath::bnXhat(x[i], mean[ch], invstd[ch]));
      if ((r + 1) % kmath::kBnGradGroup == 0 || r + 1 == rows) group.flush(s1[ch], s2[ch]);
    }
    const kmath::BnBackwardCoefs co =
        kmath::bnBackwardCoefs(s1[ch], s2[ch], static_cast<double>(rows), gamma[ch], invstd[ch]);
    for (int64_t r = 0; r < rows; ++r) {
      const size_t i = at(r, ch);
      dx[i] = bnStored(k.store, kmath::bnActBackwardData(x[i], g[i], mean[ch], invstd[ch], co));
    }
  }

  // The float64 reference.
  const double m = static_cast<double>(rows), u = bnUnitRoundoff(k.store);
  std::vector<double> yd(n), dxd(n), gd(n);
  for (int64_t ch = 0; ch < c; ++ch) {
    double s = 0, q = 0, t1 = 0, t2 = 0, cond = 0;
    for (int64_t r = 0; r < rows; ++r) s += x[at(r, ch)];
    const double md = s / m;
    for (int64_t r = 0; r < rows; ++r) q += (x[at(r, ch)] - md) * (x[at(r, ch)] - md);
    const double vd = q / m, isd = 1.0 / std::sqrt(vd + eps);
    for (int64_t r = 0; r < rows; ++r) {
      const size_t i = at(r, ch);
      const double xh = (x[i] - md) * isd;
      const double v = xh * gamma[ch] + beta[ch] + (k.residual ? z[i] : 0.0);
      yd[i] = k.relu ? std::max(v, 0.0) : v;
      gd[i] = k.relu && !(y[i] > 0.0f) ? 0.0 : dy[i];
      t1 += gd[i];
      t2 += gd[i] * xh;
      cond += std::fabs(gd[i]) * (1 + std::fabs(xh));
    }
    for (int64_t r = 0; r < rows; ++r) {
      const size_t i = at(r, ch);
      const double xh = (x[i] - md) * isd;
      dxd[i] = gamma[ch] * isd * (gd[i] - t1 / m - xh * t2 / m);
    }
    EXPECT_NEAR(mean[ch], md, 1e-6 * (std::fabs(md) + std::sqrt(vd))) << "mean " << ch;
    EXPECT_NEAR(invstd[ch], isd, 1e-6 * isd) << "invstd " << ch;
    const double rmd = (1 - momentum) * rm0[ch] + momentum * md;
    const double rvd = (1 - momentum) * rv0[ch] + momentum * vd * m / (m - 1);
    EXPECT_NEAR(rm[ch], rmd, 1e-6 * (std::fabs(rmd) + 1)) << "running mean " << ch;
    EXPECT_NEAR(rv[ch], rvd, 1e-6 * rvd) << "running var " << ch;
    EXPECT_NEAR(s1[ch], t1, 1e-5 * cond) << "dbeta " << ch;
    EXPECT_NEAR(s2[ch], t2, 1e-5 * cond) << "dgamma " << ch;
    EXPECT_NEAR(static_cast<float>(s1[ch]), t1, 1e-5 * cond) << "dbeta (float) " << ch;
    EXPECT_NEAR(static_cast<float>(s2[ch]), t2, 1e-5 * cond) << "dgamma (float) " << ch;
  }
  expectBounded(y, yd, u, 1e-5, "y");
  expectBounded(dx, dxd, u, 1e-5, "dx");
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(g[i], gd[i]) << "dz at " << i;
  if (k.relu) {  // the cases exercise both sides of the mask
    const auto zeros = std::count(y.begin(), y.end(), 0.0f);
    EXPECT_GT(zeros, 0);
    EXPECT_LT(static_cast<size_t>(zeros), n);
  }
}

TEST(KernelMath, BnNhwcHostAlgorithmMatchesFloat64) {
  for (const BnStore st : {BnStore::kF32, BnStore::kBf16, BnStore::kF16})
    for (const bool residual : {false, true})
      for (const bool relu : {false, true})
        for (const float xMean : {0.0f, 100.0f})
          checkBnNhwcOnHost({2 * 5 * 7, 6, st, residual, relu, xMean});
  // Odd channel count, a few rows.
  checkBnNhwcOnHost({3 * 4 * 4, 3, BnStore::kBf16, true, true, 0.0f});
}

// The fused stem (batch norm + ReLU + 3x3/2 max pool, bn_nhwc.h) on the host,
// each pass emulated from its kernel: the unfused kernels (forwardKernel's
// stored activation, maxPoolNhwcKernel over it, maxPoolNhwcBackwardKernel's
// stored gradient, BackwardSumsOp with the ReLU's mask from the stored
// activation, backwardDataKernel recomputing g) against the fused ones
// (bnActPoolForwardKernel, PoolGradSumsOp, backwardDataKernel reading g).
// They must agree bit for bit: pooled output, taps, the masked gradient, the
// sums and dx. A channel with a negative gamma clips most activations to 0
// (ties: the first tap wins).
struct StemOut {
  std::vector<float> y, g, dx;
  std::vector<int> arg;
  std::vector<double> s1, s2;
};
StemOut stemOnHost(bool fused, BnStore st, const std::vector<float>& x,
                   const std::vector<float>& dy, int64_t n, int64_t h, int64_t w, int64_t c,
                   const std::vector<float>& mean, const std::vector<float>& invstd,
                   const std::vector<float>& gamma, const std::vector<float>& beta) {
  const int k = 3, s = 2, p = 1;
  const int64_t oh = (h + 2 * p - k) / s + 1, ow = (w + 2 * p - k) / s + 1;
  auto xi = [&](int64_t img, int64_t ii, int64_t jj, int64_t ch) {
    return static_cast<size_t>(((img * h + ii) * w + jj) * c + ch);
  };
  auto oi_ = [&](int64_t img, int64_t oi, int64_t oj, int64_t ch) {
    return static_cast<size_t>(((img * oh + oi) * ow + oj) * c + ch);
  };
  auto act = [&](size_t i, int64_t ch) {
    return bnStored(st, kmath::bnActForward(x[i], mean[ch], invstd[ch], gamma[ch], beta[ch],
                                            0.0f, true));
  };
  StemOut o;
  o.y.resize(static_cast<size_t>(n * oh * ow * c));
  o.arg.resize(o.y.size());
  std::vector<float> stored(x.size());  // the unfused batch norm's output
  for (size_t i = 0; i < x.size(); ++i) stored[i] = act(i, static_cast<int64_t>(i % c));
  for (int64_t img = 0; img < n; ++img)
    for (int64_t oi = 0; oi < oh; ++oi)
      for (int64_t oj = 0; oj < ow; ++oj)
        for (int64_t ch = 0; ch < c; ++ch) {
          float best = 0.0f;
          int tap = -1;
          for (int a = 0; a < k; ++a)
            for (int b = 0; b < k; ++b) {
              const int64_t ii = oi * s - p + a, jj = oj * s - p + b;
              if (ii < 0 || ii >= h || jj < 0 || jj >= w) continue;
              const size_t i = xi(img, ii, jj, ch);
              const float v = fused ? act(i, ch) : stored[i];
              if (tap < 0 || kmath::poolReplaces(v, best)) best = v, tap = a * k + b;
            }
          o.y[oi_(img, oi, oj, ch)] = bnStored(st, best);
          o.arg[oi_(img, oi, oj, ch)] = tap;
        }
  o.g.resize(x.size());
  o.dx.resize(x.size());
  o.s1.assign(static_cast<size_t>(c), 0.0);
  o.s2.assign(static_cast<size_t>(c), 0.0);
  const int64_t rows = n * h * w;
  for (int64_t ch = 0; ch < c; ++ch) {
    kmath::BnGradGroup group;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t img = r / (h * w), ii = (r / w) % h, jj = r % w;
      const size_t i = xi(img, ii, jj, ch);
      const kmath::TapRange ri = kmath::poolCoverRange(ii, oh, k, s, p);
      const kmath::TapRange rj = kmath::poolCoverRange(jj, ow, k, s, p);
      float sum = 0.0f;
      for (int64_t oi = ri.lo; oi < ri.hi; ++oi)
        for (int64_t oj = rj.lo; oj < rj.hi; ++oj) {
          const size_t q = oi_(img, oi, oj, ch);
          if (o.arg[q] == (ii - (oi * s - p)) * k + (jj - (oj * s - p))) sum += dy[q];
        }
      const float pooled = bnStored(st, sum);
      o.g[i] = kmath::bnActGrad(fused ? act(i, ch) : stored[i], pooled, true);
      group.add(o.g[i], kmath::bnXhat(x[i], mean[ch], invstd[ch]));
      if ((r + 1) % kmath::kBnGradGroup == 0 || r + 1 == rows) group.flush(o.s1[ch], o.s2[ch]);
    }
    const kmath::BnBackwardCoefs co = kmath::bnBackwardCoefs(
        o.s1[ch], o.s2[ch], static_cast<double>(rows), gamma[ch], invstd[ch]);
    for (int64_t r = 0; r < rows; ++r) {
      const size_t i = static_cast<size_t>(r * c + ch);
      // Unfused: g recomputed from the stored activation and pooled gradient;
      // fused: g read back from the buffer it was stored in (exactly).
      const float gk = fused ? bnStored(st, o.g[i]) : o.g[i];
      o.dx[i] = bnStored(st, kmath::bnActBackwardData(x[i], gk, mean[ch], invstd[ch], co));
    }
  }
  return o;
}

TEST(KernelMath, FusedStemComputesWhatTheUnfusedLayersDoBitForBit) {
  const int64_t n = 2, h = 9, w = 8, c = 4;  // odd side: the last window is clipped
  const int64_t oh = 5, ow = 4;
  for (const BnStore st : {BnStore::kF32, BnStore::kBf16, BnStore::kF16}) {
    SCOPED_TRACE(bnStoreName(st));
    auto x = randomVector(static_cast<size_t>(n * h * w * c), 51, -2.0f, 2.0f);
    auto dy = randomVector(static_cast<size_t>(n * oh * ow * c), 52, -1.0f, 1.0f);
    for (auto* v : {&x, &dy})
      for (float& e : *v) e = bnStored(st, e);
    const std::vector<float> mean = {0.1f, -0.2f, 0.0f, 0.05f}, invstd = {1.1f, 0.9f, 1.0f, 1.2f};
    const std::vector<float> gamma = {1.0f, -0.7f, 0.8f, 1.3f}, beta = {0.2f, -0.4f, 0.0f, 0.1f};
    const StemOut a = stemOnHost(false, st, x, dy, n, h, w, c, mean, invstd, gamma, beta);
    const StemOut b = stemOnHost(true, st, x, dy, n, h, w, c, mean, invstd, gamma, beta);
    EXPECT_EQ(a.arg, b.arg);
    auto same = [](const std::vector<float>& u, const std::vector<float>& v) {
      return u.size() == v.size() && std::memcmp(u.data(), v.data(), u.size() * 4) == 0;
    };
    EXPECT_TRUE(same(a.y, b.y));
    EXPECT_TRUE(same(a.g, b.g));
    EXPECT_TRUE(same(a.dx, b.dx));
    EXPECT_EQ(a.s1, b.s1);
    EXPECT_EQ(a.s2, b.s2);
    // Channel 1 (gamma < 0) clips most activations: a window of zeros picks
    // its first valid tap.
    int zeros = 0;
    for (size_t q = 0; q < b.y.size(); ++q) {
      if (q % c == 1 && b.y[q] == 0.0f) {
        ++zeros;
        const int64_t oj = static_cast<int64_t>(q / c) % ow, oi = static_cast<int64_t>(q / c / ow) % oh;
        EXPECT_EQ(b.arg[q], (oi == 0 ? 3 : 0) + (oj == 0 ? 1 : 0)) << q;
      }
    }
    EXPECT_GT(zeros, 0);
  }
}

// Max pooling's rule (kmath::poolReplaces, scanned as the kernels and the CPU
// backend scan a window): the first maximum wins ties, a NaN replaces
// anything and is replaced only by a later NaN.
TEST(KernelMath, PoolReplacesKeepsTheFirstMaximumAndPropagatesNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto pick = [](std::vector<float> v) {
    float best = 0.0f;
    int tap = -1;
    for (int i = 0; i < static_cast<int>(v.size()); ++i)
      if (tap < 0 || kmath::poolReplaces(v[static_cast<size_t>(i)], best))
        best = v[static_cast<size_t>(i)], tap = i;
    return tap;
  };
  EXPECT_EQ(pick({0.0f, 0.0f, 0.0f}), 0);
  EXPECT_EQ(pick({1.0f, 3.0f, 3.0f, 2.0f}), 1);
  EXPECT_EQ(pick({1.0f, nan, 5.0f}), 1);
  EXPECT_EQ(pick({nan, 2.0f, nan, 7.0f}), 2);
  EXPECT_EQ(pick({-std::numeric_limits<float>::infinity(), -1.0f}), 1);
}

// The backward sums' float groups (kmath::BnGradGroup) against float64 on
// sequences built to round: g spread over 2^-12 .. 2^12 (bf16 and float
// values, signs mixed), xhat over +-6, groups flushed every kBnGradGroup terms
// as the sums kernel does. Bound: (kBnGradGroup + 1) u of the condition
// sum |g| (1 + |xhat|) with u = 2^-24 (a group of G terms rounds at most G
// times; the double sums add ~n 2^-53). Also: a group is exact where float
// holds every partial sum (integers), and an empty flush adds nothing.
TEST(KernelMath, BnGradGroupErrorIsWithinGroupRoundoff) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> expo(-12.0f, 12.0f), xh(-6.0f, 6.0f), sign(-1.0f, 1.0f);
  const double u = std::ldexp(1.0, -24);
  for (const bool bf16 : {true, false})
    for (const int n : {1, 3, 4, 5, 64, 1001, 100000}) {
      double a = 0, b = 0, t1 = 0, t2 = 0, cond = 0, worst = 0;
      kmath::BnGradGroup group;
      for (int i = 0; i < n; ++i) {
        float g = std::copysign(std::exp2(expo(gen)), sign(gen));
        if (bf16) g = runtime::bf16ToFloat(runtime::floatToBf16(g));
        const float h = xh(gen);
        group.add(g, h);
        if ((i + 1) % kmath::kBnGradGroup == 0 || i + 1 == n) group.flush(a, b);
        t1 += g;
        t2 += static_cast<double>(g) * h;
        cond += std::fabs(g) * (1.0 + std::fabs(h));
      }
      worst = std::max(std::fabs(a - t1), std::fabs(b - t2));
      EXPECT_LE(worst, (kmath::kBnGradGroup + 1) * u * cond)
          << (bf16 ? "bf16" : "float") << " g, n = " << n;
      EXPECT_GT(cond, 0.0);
    }
  kmath::BnGradGroup group;
  double a = 0.5, b = -0.25;
  group.flush(a, b);
  EXPECT_EQ(a, 0.5);
  EXPECT_EQ(b, -0.25);
  for (int i = 1; i <= kmath::kBnGradGroup; ++i) group.add(static_cast<float>(i * 1000), 3.0f);
  group.flush(a, b);
  const double want = 1000.0 * kmath::kBnGradGroup * (kmath::kBnGradGroup + 1) / 2;
  EXPECT_EQ(a, 0.5 + want);
  EXPECT_EQ(b, -0.25 + 3 * want);
}

// The storage bounds are tight: a result rounded to bf16 where fp16 was meant
// is off by up to 2^-8, beyond fp16's 2^-11 and within bf16's own bound.
TEST(KernelMath, BnNhwcStorageBoundsAreTight) {
  const float v = 1.00390625f;  // 1 + 2^-8: exact in fp16, halfway in bf16
  EXPECT_EQ(bnStored(BnStore::kF16, v), v);
  EXPECT_NE(bnStored(BnStore::kBf16, v), v);
  EXPECT_GT(std::fabs(bnStored(BnStore::kBf16, v) - v), bnUnitRoundoff(BnStore::kF16) * v);
  EXPECT_LE(std::fabs(bnStored(BnStore::kBf16, v) - v), bnUnitRoundoff(BnStore::kBf16) * v);
}

}  // namespace
}  // namespace ddprun::train
