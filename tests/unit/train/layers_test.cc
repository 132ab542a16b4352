// Every layer's backward against central finite differences of
// L = sum(y * r) for a fixed random r (so dL/dy = r), for the input and for
// every parameter; the loss against finite differences of the mean
// cross-entropy; the optimizers against torch.optim's update rules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "ddprun/common/error.h"
#include "ddprun/train/layers.h"
#include "ddprun/train/models.h"
#include "ddprun/train/optim.h"
#include "resnet.h"

namespace ddprun::train {
namespace {

void fillRandom(Tensor& t, Rng& rng, float lo = -1.0f, float hi = 1.0f, float avoid = 0.0f) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    float v;
    do v = rng.uniform(lo, hi);
    while (std::fabs(v) < avoid);
    t.data()[i] = v;
  }
}

double weightedSum(const Tensor& y, const Tensor& r) {
  double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i) s += static_cast<double>(y.data()[i]) * r.data()[i];
  return s;
}

// Compares analytic gradients with central differences on `values`.
void expectGradient(const char* what, Tensor& values, const Tensor& analytic,
                    const std::function<double()>& loss, float eps = 1e-2f) {
  ASSERT_EQ(values.numel(), analytic.numel()) << what;
  for (int64_t i = 0; i < values.numel(); ++i) {
    const float keep = values.data()[i];
    values.data()[i] = keep + eps;
    const double up = loss();
    values.data()[i] = keep - eps;
    const double down = loss();
    values.data()[i] = keep;
    const double numeric = (up - down) / (2.0 * eps);
    const double a = analytic.data()[i];
    EXPECT_NEAR(a, numeric, 2e-2 * std::max(1.0, std::fabs(numeric)))
        << what << " element " << i;
  }
}

// Checks dL/dx and dL/dparams of `layer` for input shape `in`.
void checkLayer(Layer& layer, const Shape& in, bool training, float avoid = 0.0f,
                float eps = 1e-2f) {
  Rng rng(7);
  Tensor x(in);
  fillRandom(x, rng, -1.0f, 1.0f, avoid);
  for (Param* p : layer.params()) {
    if (p->name.ends_with("weight") && p->value.rank() == 1) {
      for (int64_t i = 0; i < p->value.numel(); ++i) p->value.data()[i] = rng.uniform(0.5f, 1.5f);
    } else {
      fillRandom(p->value, rng, -0.5f, 0.5f);
    }
    p->grad.zero();
  }
  Tensor y;
  layer.forward(x, y, training);
  Tensor r(y.shape());
  fillRandom(r, rng);
  Tensor dx;
  layer.backward(x, y, r, &dx);
  // Parameter grads are accumulated; copy them before the loss probes run
  // more forwards.
  std::vector<Tensor> grads;
  for (Param* p : layer.params()) {
    Tensor g(p->grad.shape());
    std::copy(p->grad.data(), p->grad.data() + g.numel(), g.data());
    grads.push_back(g);
  }
  auto loss = [&] {
    Tensor out;
    layer.forward(x, out, training);
    return weightedSum(out, r);
  };
  expectGradient((layer.name() + " input").c_str(), x, dx, loss, eps);
  auto ps = layer.params();
  for (size_t i = 0; i < ps.size(); ++i) expectGradient(ps[i]->name.c_str(), ps[i]->value, grads[i], loss, eps);
}

class LayersTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = makeCpuBackend(1);
};

Tensor filled(const Shape& s, std::initializer_list<float> v) {
  Tensor t(s);
  EXPECT_EQ(static_cast<size_t>(t.numel()), v.size());
  std::copy(v.begin(), v.end(), t.data());
  return t;
}

std::vector<float> values(const Tensor& t) { return {t.data(), t.data() + t.numel()}; }

// PyTorch's Conv2d by definition (double sums): the reference for strides,
// padding and the missing bias.
Tensor naiveConv(const Tensor& x, const Tensor& w, const float* bias, int stride, int pad) {
  const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), wd = x.dim(3), oc = w.dim(0),
                k = w.dim(2);
  const int64_t oh = (h + 2 * pad - k) / stride + 1, ow = (wd + 2 * pad - k) / stride + 1;
  Tensor y({n, oc, oh, ow});
  for (int64_t b = 0; b < n; ++b)
    for (int64_t o = 0; o < oc; ++o)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double s = bias ? bias[o] : 0.0;
          for (int64_t ci = 0; ci < c; ++ci)
            for (int64_t a = 0; a < k; ++a)
              for (int64_t q = 0; q < k; ++q) {
                const int64_t r = i * stride - pad + a, col = j * stride - pad + q;
                if (r < 0 || r >= h || col < 0 || col >= wd) continue;
                s += static_cast<double>(x.data()[((b * c + ci) * h + r) * wd + col]) *
                     w.data()[((o * c + ci) * k + a) * k + q];
              }
          y.data()[((b * oc + o) * oh + i) * ow + j] = static_cast<float>(s);
        }
  return y;
}

TEST_F(LayersTest, LinearGradients) {
  auto l = be->linear("fc", 7, 5);
  checkLayer(*l, {3, 7}, true);
}

TEST_F(LayersTest, Conv2dGradientsWithAndWithoutPadding) {
  auto c1 = be->conv2d("conv1", 2, 3, 3, 1);
  checkLayer(*c1, {2, 2, 5, 6}, true);
  auto c2 = be->conv2d("conv2", 3, 2, 5, 0);
  checkLayer(*c2, {2, 3, 7, 7}, true);
}

// Layer::backwardAccumulate: a convolution adds dL/dx into the gradient dx
// holds (a residual block's other branch), bitwise what backward() then a
// separate add give, and the same parameter gradients; a layer that does not
// accumulate says so.
TEST_F(LayersTest, ConvolutionAddsIntoAGradientAsASeparateAddWould) {
  auto conv = be->conv2d("conv", Conv2dSpec{3, 4, 3, 2, 1, false});
  ASSERT_TRUE(conv->accumulatesDx());
  Rng rng(5);
  Tensor x({2, 3, 7, 6}), prior({2, 3, 7, 6});
  for (Tensor* t : {&x, &prior})
    for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] = rng.uniform(-1.0f, 1.0f);
  for (Param* p : conv->params())
    for (int64_t i = 0; i < p->value.numel(); ++i) p->value.data()[i] = rng.uniform(-0.5f, 0.5f);
  Tensor y, dx;
  conv->forward(x, y, true);
  Tensor dy(y.shape());
  for (int64_t i = 0; i < dy.numel(); ++i) dy.data()[i] = rng.uniform(-1.0f, 1.0f);
  conv->params()[0]->overwriteGrad = true;
  conv->backward(x, y, dy, &dx);
  const std::vector<float> grad = values(conv->params()[0]->grad);
  Tensor sum(x.shape());
  be->add(prior, dx, sum);
  Tensor acc(x.shape());
  std::copy(prior.data(), prior.data() + prior.numel(), acc.data());
  conv->params()[0]->overwriteGrad = true;
  conv->backwardAccumulate(x, y, dy, acc);
  const std::vector<float> a = values(acc), b = values(sum);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  EXPECT_EQ(values(conv->params()[0]->grad), grad);
  Tensor wrong({2, 3, 7, 5});
  EXPECT_THROW(conv->backwardAccumulate(x, y, dy, wrong), InvalidArgument);
  auto relu = be->relu("relu");
  EXPECT_FALSE(relu->accumulatesDx());
  EXPECT_THROW(relu->backwardAccumulate(x, x, x, acc), InvalidArgument);
}

TEST_F(LayersTest, StridedConvolutionsWithoutBiasMatchTheDefinition) {
  Rng rng(5);
  // ResNet's shapes in small: 7x7/2 pad 3 (imagenet stem), 3x3/2 pad 1, 1x1/2
  // (downsample), on odd sizes where the floor of the output size matters.
  for (const Conv2dSpec& spec : {Conv2dSpec{3, 4, 7, 2, 3, false}, Conv2dSpec{2, 3, 3, 2, 1, false},
                                 Conv2dSpec{3, 2, 1, 2, 0, false}, Conv2dSpec{2, 2, 3, 3, 1, true}}) {
    auto conv = be->conv2d("conv", spec);
    ASSERT_EQ(conv->params().size(), spec.bias ? 2u : 1u);
    EXPECT_EQ(conv->params()[0]->name, "conv.weight");
    for (Param* p : conv->params()) fillRandom(p->value, rng);
    Tensor x({2, spec.inC, 9, 8});
    fillRandom(x, rng);
    Tensor y;
    conv->forward(x, y, true);
    const Tensor want = naiveConv(x, conv->params()[0]->value,
                                  spec.bias ? conv->params()[1]->value.data() : nullptr,
                                  spec.stride, spec.pad);
    ASSERT_EQ(y.shape(), want.shape()) << spec.kernel << "/" << spec.stride;
    for (int64_t i = 0; i < y.numel(); ++i)
      ASSERT_NEAR(y.data()[i], want.data()[i], 1e-5) << spec.kernel << "/" << spec.stride
                                                    << " element " << i;
  }
}

TEST_F(LayersTest, StridedConvolutionGradientsWithoutBias) {
  auto c1 = be->conv2d("conv1", Conv2dSpec{2, 3, 3, 2, 1, false});
  checkLayer(*c1, {2, 2, 7, 6}, true);
  auto c2 = be->conv2d("stem", Conv2dSpec{3, 2, 7, 2, 3, false});
  checkLayer(*c2, {1, 3, 9, 9}, true);
  auto c3 = be->conv2d("downsample", Conv2dSpec{3, 2, 1, 2, 0, false});
  checkLayer(*c3, {2, 3, 5, 5}, true);
}

TEST_F(LayersTest, ConvolutionGradientsAccumulateAcrossShapes) {
  auto conv = be->conv2d("conv", Conv2dSpec{2, 2, 3, 2, 1, false});
  Rng rng(9);
  Param* w = conv->params()[0];
  fillRandom(w->value, rng);
  auto gradOnce = [&](const Shape& in) {
    Tensor x(in), y, dx;
    Rng r(1);
    fillRandom(x, r);
    conv->forward(x, y, true);
    Tensor dy(y.shape());
    fillRandom(dy, r);
    conv->backward(x, y, dy, &dx);
  };
  gradOnce({3, 2, 6, 6});
  const std::vector<float> once = values(w->grad);
  gradOnce({1, 2, 5, 5});  // another shape: a second plan
  gradOnce({3, 2, 6, 6});  // the first plan again
  w->grad.zero();
  gradOnce({1, 2, 5, 5});
  const std::vector<float> small = values(w->grad);
  w->grad.zero();
  gradOnce({3, 2, 6, 6});
  gradOnce({1, 2, 5, 5});
  gradOnce({3, 2, 6, 6});
  for (size_t i = 0; i < once.size(); ++i)
    EXPECT_NEAR(w->grad.data()[i], 2 * once[i] + small[i], 1e-5) << i;
}

// A shape first seen in evaluation gets its backward parts when it is
// trained (and dL/dx when asked): the results are those of a fresh layer.
TEST_F(LayersTest, ConvolutionPlansGrowFromEvaluationToTraining) {
  Rng rng(12);
  auto fresh = be->conv2d("conv", Conv2dSpec{2, 3, 3, 2, 1, false});
  auto grown = be->conv2d("conv", Conv2dSpec{2, 3, 3, 2, 1, false});
  fillRandom(fresh->params()[0]->value, rng);
  std::copy_n(fresh->params()[0]->value.data(), fresh->params()[0]->value.numel(),
              grown->params()[0]->value.data());
  Tensor x({2, 2, 6, 5}), y1, y2, dx1, dx2;
  fillRandom(x, rng);
  grown->forward(x, y2, false);
  fresh->forward(x, y1, false);
  EXPECT_EQ(values(y2), values(y1));
  Tensor dy({2, 3, 3, 3});
  fillRandom(dy, rng);
  fresh->forward(x, y1, true);
  fresh->backward(x, y1, dy, &dx1);
  grown->forward(x, y2, false);  // the forward keeps its input for backward
  grown->backward(x, y2, dy, nullptr);  // weights only: no backward-data yet
  grown->params()[0]->grad.zero();
  grown->forward(x, y2, true);
  grown->backward(x, y2, dy, &dx2);
  EXPECT_EQ(values(dx2), values(dx1));
  EXPECT_EQ(values(grown->params()[0]->grad), values(fresh->params()[0]->grad));
}

TEST_F(LayersTest, MaxPoolGradients) {
  auto p = be->maxPool2d("pool", 2);
  // Distinct values far apart: the perturbation never changes the arg-max.
  checkLayer(*p, {2, 3, 4, 6}, true, 0.0f, 1e-4f);
}

TEST_F(LayersTest, MaxPoolForwardPicksWindowMaximaAndFloorsOddSizes) {
  auto p = be->maxPool2d("pool", 2);
  Tensor x({1, 1, 3, 5});
  for (int i = 0; i < 15; ++i) x.data()[i] = static_cast<float>((i * 7) % 15);
  Tensor y;
  p->forward(x, y, true);
  ASSERT_EQ(y.shape(), (Shape{1, 1, 1, 2}));
  // rows 0-1, cols 0-1: {0,7,5,12} -> 12; cols 2-3: {14,6,4,11} -> 14
  EXPECT_EQ(y.data()[0], 12.0f);
  EXPECT_EQ(y.data()[1], 14.0f);
}

// F.max_pool2d(x, 3, 2, 1) in PyTorch 1.13 and 2.x: outputs and the input
// gradient for dy = 1..6, ties included (3 appears in several windows; window
// (1, 1) holds two 5s: the first in scan order takes the gradient).
TEST_F(LayersTest, MaxPoolWithStrideAndPaddingMatchesPyTorch) {
  auto p = be->maxPool2d("maxpool", Pool2dSpec{3, 2, 1});
  Tensor x = filled({1, 1, 4, 5}, {3, 1, 3, 2, 3,  //
                                   0, 3, -1, 3, 1,  //
                                   2, 2, 5, 0, -4,  //
                                   -1, 5, 1, 1, 5});
  Tensor y;
  p->forward(x, y, true);
  ASSERT_EQ(y.shape(), (Shape{1, 1, 2, 3}));
  EXPECT_EQ(values(y), (std::vector<float>{3, 3, 3, 5, 5, 5}));
  Tensor dy = filled({1, 1, 2, 3}, {1, 2, 3, 4, 5, 6}), dx;
  p->backward(x, y, dy, &dx);
  EXPECT_EQ(values(dx), (std::vector<float>{1, 0, 2, 0, 3,  //
                                            0, 0, 0, 0, 0,  //
                                            0, 0, 5, 0, 0,  //
                                            0, 4, 0, 0, 6}));
}

TEST_F(LayersTest, MaxPoolPaddingNeverWins) {
  auto p = be->maxPool2d("maxpool", Pool2dSpec{3, 2, 1});
  Tensor x = filled({1, 1, 3, 3}, {-1, -2, -3, -4, -5, -6, -7, -8, -9});
  Tensor y;
  p->forward(x, y, true);
  EXPECT_EQ(values(y), (std::vector<float>{-1, -2, -4, -5}));  // PyTorch's
}

TEST_F(LayersTest, OverlappingMaxPoolGradientsAddUp) {
  auto p = be->maxPool2d("maxpool", Pool2dSpec{3, 1, 1});
  // One maximum in the middle of a 3x3 image: every window holds it.
  Tensor x = filled({1, 1, 3, 3}, {0, 0, 0, 0, 1, 0, 0, 0, 0}), y, dx;
  p->forward(x, y, true);
  Tensor dy({1, 1, 3, 3});
  for (int i = 0; i < 9; ++i) dy.data()[i] = 1.0f;
  p->backward(x, y, dy, &dx);
  EXPECT_EQ(values(dx), (std::vector<float>{0, 0, 0, 0, 9, 0, 0, 0, 0}));
}

TEST_F(LayersTest, StridedMaxPoolGradientsAndShapes) {
  auto p = be->maxPool2d("maxpool", Pool2dSpec{3, 2, 1});
  // Distinct values: the perturbation never changes the arg-max.
  checkLayer(*p, {2, 2, 7, 6}, true, 0.0f, 1e-4f);
  EXPECT_EQ(p->outputShape({2, 3, 112, 112}), (Shape{2, 3, 56, 56}));  // torchvision's stem
  EXPECT_EQ(p->outputShape({1, 1, 16, 15}), (Shape{1, 1, 8, 8}));
  auto q = be->maxPool2d("pool", Pool2dSpec{2, 3, 0});
  EXPECT_EQ(q->outputShape({1, 1, 8, 7}), (Shape{1, 1, 3, 2}));
  checkLayer(*q, {1, 2, 8, 7}, true, 0.0f, 1e-4f);
  EXPECT_THROW(be->maxPool2d("bad", Pool2dSpec{3, 2, 2}), InvalidArgument);  // pad > k/2
}

TEST_F(LayersTest, GlobalAveragePoolingIsTheMeanOfEachPlane) {
  auto g = be->globalAvgPool("avgpool");
  Tensor x({1, 2, 2, 3});
  for (int i = 0; i < 12; ++i) x.data()[i] = static_cast<float>(i);
  Tensor y;
  g->forward(x, y, true);
  ASSERT_EQ(y.shape(), (Shape{1, 2}));
  EXPECT_EQ(values(y), (std::vector<float>{2.5f, 8.5f}));
  Tensor dy = filled({1, 2}, {6, -3}), dx;
  g->backward(x, y, dy, &dx);
  EXPECT_EQ(values(dx), (std::vector<float>{1, 1, 1, 1, 1, 1, -0.5, -0.5, -0.5, -0.5, -0.5, -0.5}));
  checkLayer(*g, {3, 4, 3, 2}, true);
  EXPECT_THROW(g->outputShape({2, 3}), InvalidArgument);
}

// F.interpolate(x, size, mode="bilinear", align_corners=False): values from
// PyTorch. A dyadic case is exact; the others agree with PyTorch 1.13 and
// 2.x within 2e-6 (the two versions differ from each other by that much:
// float rounding of the same formula).
TEST_F(LayersTest, BilinearResizeMatchesPyTorch) {
  Tensor y;
  be->resizeBilinear(filled({1, 1, 2, 2}, {1, 2, 3, 4}), 4, 4, y);
  ASSERT_EQ(y.shape(), (Shape{1, 1, 4, 4}));
  EXPECT_EQ(values(y), (std::vector<float>{1, 1.25, 1.75, 2, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75,
                                           3.25, 3.5, 3, 3.25, 3.75, 4}));
  // 5x3 -> 3x7: down in height, up in width (non-integer ratios, clamped ends).
  Tensor x({1, 1, 5, 3});
  for (int i = 0; i < 15; ++i) x.data()[i] = static_cast<float>(i) * 0.37f - 1.1f;
  be->resizeBilinear(x, 3, 7, y);
  const std::vector<float> want = {
      -0.73f,     -0.6771429f, -0.5185714f, -0.36f,     -0.2014286f, -0.04285716f, 0.00999998f,
      1.12f,      1.1728571f,  1.3314286f,  1.4900001f, 1.6485714f,  1.8071429f,   1.86f,
      2.97f,      3.0228570f,  3.1814284f,  3.34f,      3.4985714f,  3.6571431f,   3.7100001f};
  ASSERT_EQ(y.shape(), (Shape{1, 1, 3, 7}));
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(y.data()[i], want[i], 2e-6) << i;
  // 4x4 -> 2x2 (x = i^1.5 / 7).
  Tensor z({1, 1, 4, 4});
  for (int i = 0; i < 16; ++i) z.data()[i] = std::pow(static_cast<float>(i), 1.5f) / 7.0f;
  be->resizeBilinear(z, 2, 2, y);
  const std::vector<float> down = {0.7207264f, 1.4729207f, 4.9310284f, 6.3779855f};
  for (size_t i = 0; i < down.size(); ++i) EXPECT_NEAR(y.data()[i], down[i], 2e-6) << i;
  // The same size is a copy; several planes are resized independently.
  Tensor two({2, 1, 1, 3});
  for (int i = 0; i < 6; ++i) two.data()[i] = static_cast<float>(i * i) - 2.5f;
  be->resizeBilinear(two, 1, 3, y);
  EXPECT_EQ(values(y), values(two));
  be->resizeBilinear(two, 2, 1, y);
  EXPECT_EQ(values(y), (std::vector<float>{-1.5f, -1.5f, 13.5f, 13.5f}));  // the middle column
  EXPECT_THROW(be->resizeBilinear(two, 0, 3, y), InvalidArgument);
}

TEST_F(LayersTest, ReluGradients) {
  auto r = be->relu("relu");
  checkLayer(*r, {4, 9}, true, 0.05f, 1e-3f);
}

TEST_F(LayersTest, FlattenIsAViewBothWays) {
  auto f = be->flatten("flatten");
  checkLayer(*f, {2, 3, 2, 2}, true);
}

TEST_F(LayersTest, BatchNormGradientsInTrainingMode) {
  auto bn = be->batchNorm2d("bn", 3, nullptr);
  checkLayer(*bn, {4, 3, 3, 2}, true, 0.0f, 1e-2f);
}

TEST_F(LayersTest, BatchNormTracksRunningStatisticsLikePyTorch) {
  auto bn = be->batchNorm2d("bn", 1, nullptr);
  Tensor x({2, 1, 1, 2});
  const float v[4] = {1, 2, 3, 6};  // mean 3, biased var 3.5, unbiased 14/3
  std::copy(v, v + 4, x.data());
  Tensor y;
  bn->forward(x, y, true);
  auto bufs = bn->buffers();
  EXPECT_NEAR(bufs[0]->value.data()[0], 0.3, 1e-6);                 // 0.9*0 + 0.1*3
  EXPECT_NEAR(bufs[1]->value.data()[0], 0.9 + 0.1 * 14.0 / 3, 1e-6);  // unbiased
  EXPECT_EQ(bufs[2]->value.data()[0], 1.0f);
  EXPECT_NEAR(y.data()[0], (1 - 3) / std::sqrt(3.5 + 1e-5), 1e-5);
  bn->forward(x, y, false);  // eval: running statistics
  EXPECT_NEAR(y.data()[0], (1 - 0.3) / std::sqrt(bufs[1]->value.data()[0] + 1e-5), 1e-5);
}

// The deferred loss (what training uses): the same gradient, the batches'
// summed row losses accumulated until takeLossSum(), which resets.
TEST_F(LayersTest, DeferredCrossEntropyAccumulatesUntilTaken) {
  Rng rng(5);
  Tensor z({3, 4});
  fillRandom(z, rng, -2.0f, 2.0f);
  const int32_t labels[3] = {1, 0, 3};
  Tensor dz, dzDeferred;
  const double mean = be->crossEntropy(z, labels, &dz, nullptr, 8.0f);
  EXPECT_EQ(be->takeLossSum(), 0.0);
  be->crossEntropyDeferred(z, labels, &dzDeferred, 8.0f);
  be->crossEntropyDeferred(z, labels, &dzDeferred, 8.0f);
  EXPECT_DOUBLE_EQ(be->takeLossSum(), 2 * 3 * mean);
  EXPECT_EQ(be->takeLossSum(), 0.0);
  ASSERT_EQ(dz.numel(), dzDeferred.numel());
  for (int64_t i = 0; i < dz.numel(); ++i) EXPECT_EQ(dz.data()[i], dzDeferred.data()[i]);
}

TEST_F(LayersTest, CrossEntropyGradientAndAccuracy) {
  Rng rng(3);
  Tensor z({4, 5});
  fillRandom(z, rng, -2.0f, 2.0f);
  const int32_t labels[4] = {0, 4, 2, 2};
  Tensor dz;
  int64_t correct = -1;
  const double loss = be->crossEntropy(z, labels, &dz, &correct);
  int64_t expectHits = 0;
  double expectLoss = 0;
  for (int i = 0; i < 4; ++i) {
    const float* row = z.data() + i * 5;
    int arg = 0;
    double se = 0;
    for (int j = 0; j < 5; ++j) {
      if (row[j] > row[arg]) arg = j;
      se += std::exp(static_cast<double>(row[j]));
    }
    expectHits += arg == labels[i];
    expectLoss += std::log(se) - row[labels[i]];
  }
  EXPECT_EQ(correct, expectHits);
  EXPECT_NEAR(loss, expectLoss / 4, 1e-6);
  expectGradient("logits", z, dz, [&] { return be->crossEntropy(z, labels, nullptr, nullptr); },
                 1e-2f);
}

// torch.nn.CrossEntropyLoss(label_smoothing=eps): the loss against a float64
// computation ((1 - eps) nll + eps/K sum_j -log p_j, mean over rows), the
// gradient against central differences of that loss, the deferred form
// alike, the arg-max count unchanged; eps back to 0 gives the plain loss bit
// for bit; eps outside [0, 1] is refused.
TEST_F(LayersTest, CrossEntropyWithLabelSmoothing) {
  Rng rng(13);
  const int64_t n = 4, k = 6;
  Tensor z({n, k});
  fillRandom(z, rng, -3.0f, 3.0f);
  const int32_t labels[n] = {0, 5, 2, 2};
  Tensor plainDz;
  int64_t plainHits = -1;
  const double plain = be->crossEntropy(z, labels, &plainDz, &plainHits);
  for (const float eps : {0.1f, 0.3f}) {
    be->setLabelSmoothing(eps);
    EXPECT_EQ(be->labelSmoothing(), eps);
    Tensor dz;
    int64_t hits = -1;
    const double loss = be->crossEntropy(z, labels, &dz, &hits);
    double want = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float* row = z.data() + i * k;
      double se = 0;
      for (int64_t j = 0; j < k; ++j) se += std::exp(static_cast<double>(row[j]));
      const double lse = std::log(se);
      double smooth = 0;
      for (int64_t j = 0; j < k; ++j) smooth += lse - row[j];
      want += (1.0 - eps) * (lse - row[labels[i]]) + static_cast<double>(eps) / k * smooth;
      for (int64_t j = 0; j < k; ++j) {
        const double target = (j == labels[i] ? 1.0 - eps : 0.0) + static_cast<double>(eps) / k;
        EXPECT_NEAR(dz.data()[i * k + j], (std::exp(row[j] - lse) - target) / n, 4e-8)
            << "eps " << eps << " row " << i << " class " << j;
      }
    }
    // Not to double rounding: the kernel rounds each z_j - max to float.
    EXPECT_NEAR(loss, want / n, 1e-8 * want);
    EXPECT_GT(loss, plain) << "smoothing puts weight on the wrong classes";
    EXPECT_EQ(hits, plainHits);
    expectGradient("smoothed logits", z, dz,
                   [&] { return be->crossEntropy(z, labels, nullptr, nullptr); }, 1e-2f);
    Tensor dzDeferred;
    be->crossEntropyDeferred(z, labels, &dzDeferred, 1.0f);
    EXPECT_DOUBLE_EQ(be->takeLossSum(), n * loss);
    EXPECT_EQ(std::memcmp(dz.data(), dzDeferred.data(), dz.bytes()), 0);
  }
  be->setLabelSmoothing(0.0f);
  Tensor again;
  const double back = be->crossEntropy(z, labels, &again, nullptr);
  EXPECT_EQ(std::memcmp(&back, &plain, sizeof back), 0);
  EXPECT_EQ(std::memcmp(again.data(), plainDz.data(), again.bytes()), 0);
  EXPECT_THROW(be->setLabelSmoothing(-0.1f), InvalidArgument);
  EXPECT_THROW(be->setLabelSmoothing(1.5f), InvalidArgument);
  EXPECT_THROW(be->setLabelSmoothing(std::numeric_limits<float>::quiet_NaN()), InvalidArgument);
  EXPECT_EQ(be->labelSmoothing(), 0.0f);
}

TEST_F(LayersTest, BasicBlockGradientsWithAndWithoutDownsample) {
  // Identity shortcut, then stride 2 with a channel change (downsample).
  auto same = makeBasicBlock(*be, "layer1.0", 2, 2, 1, nullptr);
  checkLayer(*same, {2, 2, 4, 4}, true, 0.0f, 1e-3f);
  auto down = makeBasicBlock(*be, "layer2.0", 2, 3, 2, nullptr);
  checkLayer(*down, {2, 2, 5, 5}, true, 0.0f, 1e-3f);
  EXPECT_EQ(down->outputShape({2, 2, 5, 5}), (Shape{2, 3, 3, 3}));
}

// The block's output is relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)),
// composed here from separately made layers with the same parameters.
TEST_F(LayersTest, BasicBlockComputesTheResidualFormula) {
  auto block = makeBasicBlock(*be, "b", 2, 3, 2, nullptr);
  auto conv1 = be->conv2d("c1", Conv2dSpec{2, 3, 3, 2, 1, false});
  auto bn1 = be->batchNorm2d("n1", 3, nullptr);
  auto conv2 = be->conv2d("c2", Conv2dSpec{3, 3, 3, 1, 1, false});
  auto bn2 = be->batchNorm2d("n2", 3, nullptr);
  auto ds = be->conv2d("d0", Conv2dSpec{2, 3, 1, 2, 0, false});
  auto dsBn = be->batchNorm2d("d1", 3, nullptr);
  auto relu = be->relu("r");
  std::vector<Param*> mine;
  for (Layer* l : {conv1.get(), bn1.get(), conv2.get(), bn2.get(), ds.get(), dsBn.get()})
    for (Param* p : l->params()) mine.push_back(p);
  auto theirs = block->params();
  ASSERT_EQ(theirs.size(), mine.size());
  Rng rng(4);
  for (size_t i = 0; i < mine.size(); ++i) {
    fillRandom(theirs[i]->value, rng, 0.2f, 1.0f);
    std::copy(theirs[i]->value.data(), theirs[i]->value.data() + mine[i]->value.numel(),
              mine[i]->value.data());
  }
  Tensor x({2, 2, 6, 6});
  fillRandom(x, rng);
  Tensor y, a, b, c, d, e, f, g, sum, want;
  block->forward(x, y, true);
  conv1->forward(x, a, true);
  bn1->forward(a, b, true);
  relu->forward(b, c, true);
  conv2->forward(c, d, true);
  bn2->forward(d, e, true);
  ds->forward(x, f, true);
  dsBn->forward(f, g, true);
  sum = Tensor(e.shape());
  be->add(e, g, sum);
  relu->forward(sum, want, true);
  ASSERT_EQ(y.shape(), want.shape());
  EXPECT_EQ(values(y), values(want));
}

TEST_F(LayersTest, ResNet18HasTorchvisionsNamesAndShapes) {
  auto m = Model::create("resnet18", *be, nullptr, {.numClasses = 7, .stem = "imagenet"});
  EXPECT_EQ(m->inputShape(), (Shape{3, 32, 32}));
  // torchvision.models.resnet18(num_classes=7): 62 parameters, 11.18 M elements
  // (11,689,512 with 1000 classes minus 993 x 513 for the smaller fc).
  EXPECT_EQ(m->params().size(), 62u);
  EXPECT_EQ(m->numParameters(), 11689512u - 993u * 513u);
  EXPECT_EQ(m->buffers().size(), 60u);  // 20 batch norms x 3
  std::vector<std::string> names;
  for (Param* p : m->params()) names.push_back(p->name);
  const std::vector<std::string> head = {"conv1.weight", "bn1.weight", "bn1.bias",
                                         "layer1.0.conv1.weight", "layer1.0.bn1.weight",
                                         "layer1.0.bn1.bias", "layer1.0.conv2.weight",
                                         "layer1.0.bn2.weight", "layer1.0.bn2.bias"};
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + 9), head);
  const auto at = std::find(names.begin(), names.end(), "layer2.0.downsample.0.weight");
  ASSERT_NE(at, names.end());
  EXPECT_EQ(*(at + 1), "layer2.0.downsample.1.weight");
  EXPECT_EQ(*(at - 1), "layer2.0.bn2.bias");
  EXPECT_EQ(std::count_if(names.begin(), names.end(),
                          [](const std::string& n) { return n.find("downsample") != n.npos; }),
            9);  // layer2..4: conv weight, bn weight and bias
  EXPECT_EQ(names.back(), "fc.bias");
  EXPECT_EQ(m->params()[names.size() - 2]->value.shape(), (Shape{7, 512}));
  EXPECT_EQ(m->params()[0]->value.shape(), (Shape{64, 3, 7, 7}));
  EXPECT_EQ(m->buffers()[2]->name, "bn1.num_batches_tracked");
  EXPECT_EQ(m->buffers()[5]->name, "layer1.0.bn1.num_batches_tracked");
  auto cifar = Model::create("resnet18", *be, nullptr, {.stem = "cifar", .imageSize = 24});
  EXPECT_EQ(cifar->params()[0]->value.shape(), (Shape{64, 3, 3, 3}));
  EXPECT_EQ(cifar->inputShape(), (Shape{3, 24, 24}));
}

TEST_F(LayersTest, ResNet18TrainsEndToEndWithBothStems) {
  for (const char* stem : {"imagenet", "cifar"}) {
    auto m = Model::create("resnet18", *be, nullptr, {.numClasses = 3, .stem = stem});
    Rng rng(2);
    m->initialize(rng);
    Tensor x({2, 3, 32, 32});
    fillRandom(x, rng);
    const int32_t y[2] = {2, 0};
    Tensor dz;
    const Tensor& logits = m->forward(x, true);
    ASSERT_EQ(logits.shape(), (Shape{2, 3})) << stem;
    const double loss = be->crossEntropy(logits, y, &dz, nullptr);
    EXPECT_TRUE(std::isfinite(loss)) << stem;
    std::vector<int> seen(m->params().size(), 0);
    m->backward(dz, [&](size_t i) { seen[i]++; });
    for (size_t i = 0; i < seen.size(); ++i) {
      EXPECT_EQ(seen[i], 1) << stem << " " << m->params()[i]->name;
      double norm = 0;
      const Tensor& g = m->params()[i]->grad;
      for (int64_t k = 0; k < g.numel(); ++k) norm += std::fabs(g.data()[k]);
      EXPECT_GT(norm, 0.0) << stem << " " << m->params()[i]->name << " got no gradient";
    }
    // Every batch norm ran once in training mode.
    for (Buffer* b : m->buffers())
      if (b->isCount) {
        EXPECT_EQ(b->value.data()[0], 1.0f) << b->name;
      }
  }
}

// torchvision's initialisation: kaiming_normal_(fan_out, relu) convolutions,
// batch norm 1 and 0, fc U(+-1/sqrt(512)).
TEST_F(LayersTest, ResNet18InitialisationFollowsTorchvision) {
  auto m = Model::create("resnet18", *be);
  Rng rng(0);
  m->initialize(rng);
  for (Param* p : m->params()) {
    const Shape& s = p->value.shape();
    const float* d = p->value.data();
    const int64_t n = p->value.numel();
    if (s.size() == 4) {
      double sq = 0, mean = 0;
      for (int64_t i = 0; i < n; ++i) {
        mean += d[i];
        sq += double(d[i]) * d[i];
      }
      mean /= n;
      const double sd = std::sqrt(sq / n - mean * mean);
      const double want = std::sqrt(2.0 / static_cast<double>(s[0] * s[2] * s[3]));
      // Standard error of a standard deviation over n draws: sd / sqrt(2n).
      EXPECT_NEAR(sd, want, 5 * want / std::sqrt(2.0 * n) + 1e-6) << p->name;
      EXPECT_NEAR(mean, 0.0, 5 * want / std::sqrt(double(n))) << p->name;
    } else if (p->name.starts_with("fc")) {
      const float bound = 1.0f / std::sqrt(512.0f);
      for (int64_t i = 0; i < n; ++i) ASSERT_LE(std::fabs(d[i]), bound) << p->name;
    } else {
      const float want = p->name.ends_with(".weight") ? 1.0f : 0.0f;
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(d[i], want) << p->name;
    }
  }
}

TEST_F(LayersTest, ModelOptionsAreChecked) {
  EXPECT_THROW(Model::create("resnet18", *be, nullptr, {.stem = "tiny"}), InvalidArgument);
  EXPECT_THROW(Model::create("resnet18", *be, nullptr, {.numClasses = 1}), InvalidArgument);
  EXPECT_THROW(Model::create("lenet", *be, nullptr, {.imageSize = 32}), InvalidArgument);
  auto lenet = Model::create("lenet", *be, nullptr, {.numClasses = 4, .imageSize = 28});
  EXPECT_EQ(lenet->params().back()->value.shape(), (Shape{4}));
  EXPECT_THROW(Model::create("resnet18", *be, nullptr, {.imageSize = -32}), InvalidArgument);
  // Padding carries even a tiny image through every layer (1x1 from layer3 on).
  auto tiny = Model::create("resnet18", *be, nullptr, {.stem = "imagenet", .imageSize = 5});
  Tensor x({1, 3, 5, 5});
  EXPECT_EQ(tiny->forward(x, false).shape(), (Shape{1, 10}));
}

TEST_F(LayersTest, WholeModelsBackpropagateToEveryParameter) {
  for (const std::string name : {"mlp", "lenet", "lenet-bn"}) {
    auto m = Model::create(name, *be);
    Rng rng(1);
    m->initialize(rng);
    Tensor x({2, 1, 28, 28});
    fillRandom(x, rng);
    const int32_t y[2] = {3, 7};
    Tensor dz;
    be->crossEntropy(m->forward(x, true), y, &dz, nullptr);
    std::vector<int> seen(m->params().size(), 0);
    m->backward(dz, [&](size_t i) { seen[i]++; });
    for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << name << " param " << i;
    // Reported in reverse registration order: the last layer's first.
    EXPECT_EQ(m->params().back()->name, "fc3.bias");
  }
}

TEST_F(LayersTest, UnknownModelListsTheChoices) {
  try {
    Model::create("resnet", *be);
    FAIL() << "no exception";
  } catch (const ddprun::InvalidArgument& e) {
    EXPECT_NE(e.message().find("mlp, lenet, lenet-bn"), std::string::npos) << e.message();
  }
}

TEST_F(LayersTest, DefaultInitialisationBoundsFollowFanIn) {
  auto m = Model::create("lenet", *be);
  Rng rng(0);
  m->initialize(rng);
  for (Param* p : m->params()) {
    const int64_t fanIn = p->name.starts_with("conv1") ? 25 : p->name.starts_with("conv2") ? 150
                          : p->name.starts_with("fc1") ? 400 : p->name.starts_with("fc2") ? 120 : 84;
    const float bound = 1.0f / std::sqrt(static_cast<float>(fanIn));
    float mx = 0;
    for (int64_t i = 0; i < p->value.numel(); ++i) mx = std::max(mx, std::fabs(p->value.data()[i]));
    EXPECT_LE(mx, bound) << p->name;
    EXPECT_GT(mx, 0.5f * bound) << p->name;
  }
}

// torch.optim.SGD(momentum=0.9, weight_decay=0.1) and Adam on one element,
// computed by hand from the documented update rules.
TEST_F(LayersTest, OptimizersFollowTorchOptimRules) {
  Param p;
  p.name = "w";
  p.value = Tensor({1});
  p.grad = Tensor({1});
  std::vector<Param*> ps = {&p};
  p.value.data()[0] = 1.0f;
  auto sgd = Optimizer::create({.kind = "sgd", .lr = 0.1f, .momentum = 0.9f, .weightDecay = 0.1f},
                               *be, ps);
  p.grad.data()[0] = 0.5f;
  sgd->step();  // d = 0.5 + 0.1*1 = 0.6; buf = 0.6; w = 1 - 0.06 = 0.94
  EXPECT_FLOAT_EQ(p.value.data()[0], 0.94f);
  sgd->step();  // d = 0.5 + 0.094 = 0.594; buf = 0.54 + 0.594 = 1.134; w = 0.94 - 0.1134
  EXPECT_NEAR(p.value.data()[0], 0.8266f, 1e-6);
  EXPECT_EQ(sgd->state().size(), 1u);
  EXPECT_EQ(sgd->state()[0].first, "optim.w.momentum_buffer");

  p.value.data()[0] = 1.0f;
  auto adam = Optimizer::create({.kind = "adam", .lr = 0.01f}, *be, ps);
  adam->step();  // first step moves by lr * sign(g) (up to eps)
  EXPECT_NEAR(p.value.data()[0], 0.99f, 1e-6);
  EXPECT_THROW(Optimizer::create({.kind = "lbfgs"}, *be, ps), ddprun::InvalidArgument);
}

// ------------------------------------------------------------ BatchNormAct
// relu(bn(x) + z) and its gradients in float64, batch statistics (biased
// variance, eps 1e-5), gamma/beta per channel.
struct BnActRef {
  std::vector<double> y, dx, dz, dgamma, dbeta;
};
BnActRef bnActReference(const Tensor& x, const Tensor* z, const std::vector<float>& gamma,
                        const std::vector<float>& beta, const Tensor& dy) {
  const int64_t n = x.dim(0), c = x.dim(1), hw = x.dim(2) * x.dim(3);
  const double m = static_cast<double>(n * hw);
  auto at = [&](int64_t i, int64_t ch, int64_t q) { return (i * c + ch) * hw + q; };
  BnActRef r;
  r.y.resize(x.numel());
  r.dx.resize(x.numel());
  r.dz.resize(x.numel());
  r.dgamma.assign(c, 0.0);
  r.dbeta.assign(c, 0.0);
  for (int64_t ch = 0; ch < c; ++ch) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t q = 0; q < hw; ++q) mean += x.data()[at(i, ch, q)];
    mean /= m;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t q = 0; q < hw; ++q) var += std::pow(x.data()[at(i, ch, q)] - mean, 2);
    var /= m;
    const double invstd = 1.0 / std::sqrt(var + 1e-5);
    double sg = 0, sgx = 0;
    std::vector<double> xhat(n * hw), g(n * hw);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t q = 0; q < hw; ++q) {
        const int64_t e = at(i, ch, q), k = i * hw + q;
        xhat[k] = (x.data()[e] - mean) * invstd;
        const double s = gamma[ch] * xhat[k] + beta[ch] + (z ? z->data()[e] : 0.0);
        r.y[e] = std::max(s, 0.0);
        g[k] = s > 0 ? dy.data()[e] : 0.0;
        r.dz[e] = g[k];
        sg += g[k];
        sgx += g[k] * xhat[k];
      }
    r.dbeta[ch] = sg;
    r.dgamma[ch] = sgx;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t q = 0; q < hw; ++q) {
        const int64_t k = i * hw + q;
        r.dx[at(i, ch, q)] = gamma[ch] * invstd / m * (m * g[k] - sg - xhat[k] * sgx);
      }
  }
  return r;
}

void expectNear(const std::vector<float>& got, const std::vector<double>& want, double rtol,
                const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], rtol * (std::fabs(want[i]) + 0.1 * scale) + 1e-12)
        << what << "[" << i << "]";
}

// The default BatchNormAct (the backend's batch norm, add and ReLU) against
// float64, with and without the residual, on inputs around 0 and around 100
// (standard deviation about 1: the variance must not cancel).
TEST_F(LayersTest, BatchNormActMatchesFloat64) {
  for (const bool residual : {false, true})
    for (const float centre : {0.0f, 100.0f}) {
      SCOPED_TRACE(std::string(residual ? "residual" : "no residual") + ", mean " +
                   std::to_string(centre));
      auto l = be->batchNormAct("bn", 3, nullptr, residual);
      EXPECT_EQ(l->residual(), residual);
      ASSERT_EQ(l->params().size(), 2u);
      EXPECT_EQ(l->params()[0]->name, "bn.weight");
      EXPECT_EQ(l->buffers().size(), 3u);
      Rng rng(11);
      const std::vector<float> gamma = {0.7f, 1.3f, 1.0f}, beta = {0.2f, -0.1f, 0.0f};
      for (int ch = 0; ch < 3; ++ch) {
        l->params()[0]->value.data()[ch] = gamma[ch];
        l->params()[1]->value.data()[ch] = beta[ch];
      }
      Tensor x({4, 3, 5, 3}), z({4, 3, 5, 3}), dy({4, 3, 5, 3});
      fillRandom(x, rng, centre - 1.7f, centre + 1.7f);
      fillRandom(z, rng);
      fillRandom(dy, rng);
      Tensor y, dx, dz;
      l->forward(x, residual ? &z : nullptr, y, true);
      l->backward(x, y, dy, &dx, residual ? &dz : nullptr);
      const BnActRef r = bnActReference(x, residual ? &z : nullptr, gamma, beta, dy);
      const double tol = centre == 0.0f ? 1e-5 : 1e-3;  // float x near 100: 2^-17 per unit
      expectNear(values(y), r.y, tol, "y");
      expectNear(values(dx), r.dx, tol, "dx");
      if (residual) expectNear(values(dz), r.dz, 0.0, "dz");
      expectNear(values(l->params()[0]->grad), r.dgamma, tol, "dgamma");
      expectNear(values(l->params()[1]->grad), r.dbeta, tol, "dbeta");
    }
}

TEST_F(LayersTest, BatchNormActWithAResidualIsNoPlainLayer) {
  auto l = be->batchNormAct("bn", 2, nullptr, true);
  Tensor x({2, 2, 2, 2}), y;
  EXPECT_THROW(l->forward(x, y, true), InvalidArgument);
  EXPECT_THROW(l->forward(x, nullptr, y, true), InvalidArgument);
  auto plain = be->batchNormAct("bn", 2, nullptr, false);
  Rng rng(3);
  fillRandom(x, rng);
  plain->forward(x, y, true);  // as a Layer: relu(bn(x))
  for (int64_t i = 0; i < y.numel(); ++i) EXPECT_GE(y.data()[i], 0.0f);
  EXPECT_THROW(plain->forward(x, &x, y, true), InvalidArgument);
}

}  // namespace
}  // namespace ddprun::train
