// kernel_math.h (the element math of the CUDA kernels) on the CPU, against the
// CPU backend's results for the same inputs.
#include "kernel_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ddprun/common/error.h"
#include "ddprun/train/layers.h"

namespace ddprun::train {
namespace {

std::vector<float> randomVector(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

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
  Tensor dlogits;
  int64_t correct = -1;
  const double loss = be->crossEntropy(logits, labels.data(), &dlogits, &correct, 128.0f);

  double total = 0.0;
  int64_t hits = 0;
  std::vector<float> d(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < n; ++i) {
    const float* row = z.data() + i * k;
    const kmath::CeRow r = kmath::crossEntropyRow(row, k);
    total += kmath::crossEntropyLoss(row, r, labels[i]);
    hits += r.arg == labels[i];
    for (int64_t j = 0; j < k; ++j)
      d[i * k + j] = kmath::crossEntropyGrad(row[j], r.lse, j == labels[i], n, 128.0f);
  }
  EXPECT_NEAR(total / n, loss, 1e-12);
  EXPECT_EQ(hits, correct);
  expectNear(d, std::vector<float>(dlogits.data(), dlogits.data() + n * k), 1e-6f, "dlogits");
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

}  // namespace
}  // namespace ddprun::train
