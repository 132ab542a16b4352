// The gradient contract of the CPU backend's layers (Param::overwriteGrad):
// with the flag set, a backward writes its parameter gradients (garbage in
// them ends bitwise equal to a fresh gradient) and clears the flag; without
// it, it adds; an empty batch with the flag set zeroes the gradient. And whole
// models trained with the flags instead of zeroing end bitwise where the
// zeroing loop ends.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "ddprun/train/layers.h"
#include "ddprun/train/models.h"
#include "ddprun/train/optim.h"

namespace ddprun::train {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

void fillRandom(Tensor& t, Rng& rng, float lo = -1.0f, float hi = 1.0f) {
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = rng.uniform(lo, hi);
}
void fill(Tensor& t, float v) { std::fill(t.data(), t.data() + t.numel(), v); }
Tensor copyOf(const Tensor& t) {
  Tensor c(t.shape());
  std::copy(t.data(), t.data() + t.numel(), c.data());
  return c;
}
bool sameBits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

// One forward (training) and backward of `layer` on fixed x and dy.
void pass(Layer& layer, const Tensor& x, const Tensor& dy) {
  Tensor y, dx;
  layer.forward(x, y, true);
  layer.backward(x, y, dy, &dx);
}

void checkContract(Layer& layer, const Shape& in) {
  Rng rng(3);
  for (Param* p : layer.params()) fillRandom(p->value, rng, 0.5f, 1.5f);
  Tensor x(in);
  fillRandom(x, rng);
  Tensor y;
  layer.forward(x, y, true);
  Tensor dy(y.shape());
  fillRandom(dy, rng);
  const auto ps = layer.params();
  ASSERT_FALSE(ps.empty());

  // A fresh (zero) gradient, accumulated into: the reference.
  for (Param* p : ps) p->grad.zero();
  pass(layer, x, dy);
  std::vector<Tensor> fresh;
  for (Param* p : ps) fresh.push_back(copyOf(p->grad));

  // Garbage, flag set: overwritten, bitwise the fresh gradient; flag cleared.
  for (Param* p : ps) {
    fill(p->grad, kNaN);
    p->overwriteGrad = true;
  }
  pass(layer, x, dy);
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_TRUE(sameBits(ps[i]->grad, fresh[i])) << layer.name() << " " << ps[i]->name;
    EXPECT_FALSE(ps[i]->overwriteGrad) << ps[i]->name;
  }

  // No flag: added.
  pass(layer, x, dy);
  for (size_t i = 0; i < ps.size(); ++i)
    for (int64_t k = 0; k < fresh[i].numel(); ++k) {
      const float want = 2.0f * fresh[i].data()[k];
      ASSERT_NEAR(ps[i]->grad.data()[k], want, 1e-6f * (1.0f + std::fabs(want)))
          << ps[i]->name << "[" << k << "]";
    }

  // An empty batch: a flagged gradient becomes zero (+0), an unflagged one
  // stays as it is.
  Shape none = in;
  none[0] = 0;
  const Tensor x0(none);
  Shape yNone = y.shape();
  yNone[0] = 0;
  const Tensor dy0(yNone);
  Tensor dx0;
  const Tensor kept = copyOf(ps[0]->grad);
  for (size_t i = 1; i < ps.size(); ++i) {
    fill(ps[i]->grad, kNaN);
    ps[i]->overwriteGrad = true;
  }
  layer.backward(x0, y, dy0, &dx0);
  EXPECT_EQ(dx0.shape(), none);
  EXPECT_TRUE(sameBits(ps[0]->grad, kept)) << ps[0]->name << ": unflagged, untouched";
  for (size_t i = 1; i < ps.size(); ++i) {
    const Tensor zero(ps[i]->grad.shape());
    EXPECT_TRUE(sameBits(ps[i]->grad, zero)) << ps[i]->name << ": an empty batch writes zeros";
    EXPECT_FALSE(ps[i]->overwriteGrad);
  }
}

class GradOverwriteTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = makeCpuBackend(1);
};

TEST_F(GradOverwriteTest, Linear) {
  auto l = be->linear("fc", 7, 5);
  checkContract(*l, {4, 7});
}

TEST_F(GradOverwriteTest, ConvolutionWithBias) {
  auto c = be->conv2d("conv", Conv2dSpec{2, 3, 3, 1, 1, true});
  checkContract(*c, {2, 2, 6, 5});
}

TEST_F(GradOverwriteTest, StridedConvolutionWithoutBias) {
  auto c = be->conv2d("conv", Conv2dSpec{3, 4, 3, 2, 1, false});
  checkContract(*c, {2, 3, 7, 8});
}

TEST_F(GradOverwriteTest, BatchNorm) {
  auto bn = be->batchNorm2d("bn", 3, nullptr);
  checkContract(*bn, {4, 3, 3, 2});
}

// Whole models, a few SGD and Adam steps: gradients overwritten (flags set,
// NaN left in them beforehand) instead of zeroed end bitwise where the
// zeroing loop ends, parameters and buffers.
TEST_F(GradOverwriteTest, TrainingWithFlagsEqualsTrainingWithZeroing) {
  struct Case {
    std::string model;
    ModelOptions opts;
    Shape input;
  };
  ModelOptions small;  // resnet18 on 8x8 images: every block, little work
  small.stem = "cifar";
  small.imageSize = 8;
  std::vector<Case> cases(3);
  cases[0] = {"mlp", ModelOptions(), {6, 1, 28, 28}};
  cases[1] = {"lenet-bn", ModelOptions(), {6, 1, 28, 28}};
  cases[2] = {"resnet18", small, {2, 3, 8, 8}};
  for (const Case& c : cases)
    for (const std::string kind : {"sgd", "adam"}) {
      if (c.model == "resnet18" && kind == "adam") continue;  // 11M parameters: one is enough
      Rng data(9);
      Tensor x(c.input);
      fillRandom(x, data, 0.0f, 1.0f);
      std::vector<int32_t> labels;
      for (int64_t i = 0; i < c.input[0]; ++i) labels.push_back(static_cast<int32_t>(i % 10));
      auto train = [&](bool flags) {
        auto m = Model::create(c.model, *be, nullptr, c.opts);
        Rng init(4);
        m->initialize(init);
        auto o = Optimizer::create({.kind = kind, .weightDecay = 1e-3f}, *be, m->params());
        if (flags)
          for (Param* p : m->params()) fill(p->grad, kNaN);
        for (int s = 0; s < (c.model == "resnet18" ? 2 : 3); ++s) {
          for (Param* p : m->params()) {
            if (flags)
              p->overwriteGrad = true;
            else
              p->grad.zero();
          }
          Tensor dl;
          be->crossEntropy(m->forward(x, true), labels.data(), &dl, nullptr);
          m->backward(dl, [](size_t) {});
          o->step();
        }
        return m;
      };
      auto zeroed = train(false), flagged = train(true);
      for (size_t i = 0; i < zeroed->params().size(); ++i)
        EXPECT_TRUE(sameBits(flagged->params()[i]->value, zeroed->params()[i]->value))
            << c.model << " " << kind << " " << zeroed->params()[i]->name;
      for (size_t i = 0; i < zeroed->buffers().size(); ++i)
        EXPECT_TRUE(sameBits(flagged->buffers()[i]->value, zeroed->buffers()[i]->value))
            << c.model << " " << kind << " " << zeroed->buffers()[i]->name;
    }
}

}  // namespace
}  // namespace ddprun::train
