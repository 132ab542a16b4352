// Every layer's backward against central finite differences of
// L = sum(y * r) for a fixed random r (so dL/dy = r), for the input and for
// every parameter; the loss against finite differences of the mean
// cross-entropy; the optimizers against torch.optim's update rules.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "ddprun/common/error.h"
#include "ddprun/train/layers.h"
#include "ddprun/train/models.h"
#include "ddprun/train/optim.h"

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

}  // namespace
}  // namespace ddprun::train
