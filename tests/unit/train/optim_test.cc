// The optimizer's flat layout (Optimizer::adoptLayout) on the CPU backend:
// SGD and Adam over several steps bitwise equal to the per-parameter updates,
// one backend call per step with one chunk per bucket, a re-layout (the
// reducer's rebuild) keeping values and state, stale layouts and padded
// buckets still correct, state() names and shapes unchanged, a checkpoint
// round trip resuming bitwise, the destructor handing the values back, and
// the whole trainer glue (a real Reducer, gradients overwritten instead of
// zeroed) against the plain loop.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <cstring>
#include <limits>

#include "ddprun/common/error.h"
#include "ddprun/runtime/reducer.h"
#include "ddprun/train/checkpoint.h"
#include "ddprun/train/layers.h"
#include "ddprun/train/model_state.h"
#include "ddprun/train/models.h"
#include "ddprun/train/optim.h"
#include "cpu/dnnl_conv.h"
#include "rank_threads.h"
#include "temp_dir.h"

namespace ddprun::train {
namespace {

// The CPU backend, recording the chunks of every sgdStep/adamStep call.
// With `capturing` set it also plays a CUDA graph's part for the optimizer
// (Backend::stageOptimizerStep's contract): an sgdStep/adamStep is recorded,
// not run, and replay() runs it again with the arguments it was recorded
// with, except the learning rate, SGD's first-step flag and Adam's step,
// which it reads from what stageOptimizerStep staged last.
class RecordingBackend final : public Backend {
 public:
  std::vector<std::vector<OptimChunk>> calls;
  bool capturing = false;
  struct Staged {
    float lr = 0;
    bool first = false;
    int64_t step = 0;
    float b1 = 0, b2 = 0;
  } staged;
  int stagedCount = 0;
  std::function<void()> recorded;

  void stageOptimizerStep(float lr, bool first, int64_t step, float b1, float b2) override {
    staged = {lr, first, step, b1, b2};
    ++stagedCount;
  }
  void replay() {
    ASSERT_TRUE(recorded) << "nothing recorded";
    recorded();
  }

  Device device() const override { return cpu_->device(); }
  Allocator& allocator() override { return cpu_->allocator(); }
  std::string describe() const override { return "recording " + cpu_->describe(); }
  std::unique_ptr<Layer> linear(std::string n, int64_t in, int64_t out) override {
    return cpu_->linear(std::move(n), in, out);
  }
  std::unique_ptr<Layer> conv2d(std::string n, const Conv2dSpec& s) override {
    return cpu_->conv2d(std::move(n), s);
  }
  std::unique_ptr<Layer> maxPool2d(std::string n, const Pool2dSpec& s) override {
    return cpu_->maxPool2d(std::move(n), s);
  }
  std::unique_ptr<Layer> globalAvgPool(std::string n) override {
    return cpu_->globalAvgPool(std::move(n));
  }
  std::unique_ptr<Layer> relu(std::string n) override { return cpu_->relu(std::move(n)); }
  std::unique_ptr<Layer> batchNorm2d(std::string n, int64_t c,
                                     runtime::ProcessGroup* s) override {
    return cpu_->batchNorm2d(std::move(n), c, s);
  }
  double crossEntropy(const Tensor& logits, const int32_t* labels, Tensor* dlogits,
                      int64_t* correct, float gradScale) override {
    return cpu_->crossEntropy(logits, labels, dlogits, correct, gradScale);
  }
  void sgdUpdate(float* w, const float* g, float* buf, size_t n, float lr, float momentum,
                 float wd, bool first, bool nesterov) override {
    cpu_->sgdUpdate(w, g, buf, n, lr, momentum, wd, first, nesterov);
  }
  void adamUpdate(float* w, const float* g, float* m, float* v, size_t n, float lr, float b1,
                  float b2, float eps, float wd, int64_t step) override {
    cpu_->adamUpdate(w, g, m, v, n, lr, b1, b2, eps, wd, step);
  }
  void sgdStep(const std::vector<OptimChunk>& chunks, float lr, float momentum, float wd,
               bool first, bool nesterov) override {
    calls.push_back(chunks);
    if (capturing) {
      recorded = [this, chunks, momentum, wd, nesterov] {
        Backend::sgdStep(chunks, staged.lr, momentum, wd, staged.first, nesterov);
      };
      return;
    }
    Backend::sgdStep(chunks, lr, momentum, wd, first, nesterov);
  }
  void adamStep(const std::vector<OptimChunk>& chunks, float lr, float b1, float b2, float eps,
                float wd, int64_t step) override {
    calls.push_back(chunks);
    if (capturing) {
      // The staged betas are the ones the device's scalars were computed with.
      recorded = [this, chunks, b1, b2, eps, wd] {
        EXPECT_EQ(staged.b1, b1);
        EXPECT_EQ(staged.b2, b2);
        Backend::adamStep(chunks, staged.lr, b1, b2, eps, wd, staged.step);
      };
      return;
    }
    Backend::adamStep(chunks, lr, b1, b2, eps, wd, step);
  }
  void add(const Tensor& a, const Tensor& b, Tensor& out) override { cpu_->add(a, b, out); }
  void zero(Tensor& t) override { cpu_->zero(t); }
  void copy(const Tensor& src, Tensor& dst) override { cpu_->copy(src, dst); }
  void resizeBilinear(const Tensor& x, int64_t h, int64_t w, Tensor& y) override {
    cpu_->resizeBilinear(x, h, w, y);
  }
  bool scaleAndCheckFinite(float* data, size_t n, float scale) override {
    return cpu_->scaleAndCheckFinite(data, n, scale);
  }
  void upload(const float* host, float* dst, size_t n) override { cpu_->upload(host, dst, n); }
  void download(const float* src, float* host, size_t n) override {
    cpu_->download(src, host, n);
  }
  void synchronize() override {}
  std::unique_ptr<runtime::GradientMemory> gradientMemory(runtime::ProcessGroup& pg) override {
    return cpu_->gradientMemory(pg);
  }

 private:
  std::unique_ptr<Backend> cpu_ = makeCpuBackend(1);
};

std::vector<float> values(const Tensor& t) { return {t.data(), t.data() + t.numel()}; }

// Bitwise comparison (NaN-safe, -0 != +0).
bool sameBits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

// A handful of parameters of awkward sizes (odd counts: no chunk is aligned).
const std::vector<Shape> kShapes = {{3, 5}, {7}, {2, 2, 3}, {1}, {130}, {64}, {5, 9}};

std::vector<Param> makeParams(uint64_t seed) {
  std::vector<Param> ps;
  Rng rng(seed);
  for (size_t i = 0; i < kShapes.size(); ++i) {
    Param p;
    p.name = "p" + std::to_string(i) + ".weight";
    p.value = Tensor(kShapes[i]);
    p.grad = Tensor(kShapes[i]);
    for (int64_t k = 0; k < p.value.numel(); ++k) p.value.data()[k] = rng.uniform(-1, 1);
    ps.push_back(std::move(p));
  }
  return ps;
}

std::vector<Param*> pointers(std::vector<Param>& ps) {
  std::vector<Param*> out;
  for (Param& p : ps) out.push_back(&p);
  return out;
}

// The reducer's "gradient as bucket view": each bucket one allocation, its
// parameters' gradients views into it in the listed order, each starting at
// a multiple of `align` elements (1: packed, as today's reducer). Returns the
// bucket storage (keep it alive).
std::vector<Tensor> bindBuckets(std::vector<Param>& ps,
                                const std::vector<std::vector<size_t>>& buckets,
                                size_t align = 1) {
  std::vector<Tensor> storage;
  for (const auto& b : buckets) {
    std::vector<size_t> off;
    size_t n = 0;
    for (size_t i : b) {
      n = (n + align - 1) / align * align;
      off.push_back(n);
      n += static_cast<size_t>(ps[i].value.numel());
    }
    Tensor mem({static_cast<int64_t>(n)});
    for (size_t k = 0; k < b.size(); ++k)
      ps[b[k]].grad = Tensor::view(mem.data() + off[k], ps[b[k]].value.shape());
    storage.push_back(mem);
  }
  return storage;
}

// Step `s`'s gradient of parameter i (NaN-free, both signs, some zeros).
void writeGrads(std::vector<Param>& ps, int s) {
  for (size_t i = 0; i < ps.size(); ++i)
    for (int64_t k = 0; k < ps[i].grad.numel(); ++k)
      ps[i].grad.data()[k] =
          (k + static_cast<int64_t>(i) + s) % 7 == 0
              ? 0.0f
              : std::sin(0.37f * static_cast<float>(k + 1) + static_cast<float>(i * 13 + s));
}

void expectSameState(std::vector<Param>& a, Optimizer& oa, std::vector<Param>& b, Optimizer& ob,
                     const std::string& when) {
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(sameBits(a[i].value, b[i].value)) << a[i].name << " " << when;
  auto sa = oa.state(), sb = ob.state();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t k = 0; k < sa.size(); ++k) {
    EXPECT_EQ(sa[k].first, sb[k].first);
    EXPECT_EQ(sa[k].second->shape(), sb[k].second->shape()) << sa[k].first;
    EXPECT_TRUE(sameBits(*sa[k].second, *sb[k].second)) << sa[k].first << " " << when;
  }
}

const std::vector<std::vector<size_t>> kBuckets = {{4, 2}, {0, 5, 1}, {6, 3}};
const std::vector<std::vector<size_t>> kRebuilt = {{6, 5, 4}, {3, 2, 1, 0}};

class OptimLayoutTest : public ::testing::TestWithParam<std::string> {
 protected:
  OptimizerOptions opts() const {
    OptimizerOptions o{.kind = GetParam(), .lr = 0.05f, .momentum = 0.9f, .weightDecay = 0.01f};
    if (o.kind == "adam") o.lr = 1e-2f;
    if (o.kind == "nesterov") o.kind = "sgd", o.nesterov = true;
    return o;
  }
  RecordingBackend be;
};

// Several steps in the flat layout equal the per-parameter updates bit for
// bit; each step is one backend call with one chunk per bucket, whose
// pointers are the bucket's first value and gradient.
TEST_P(OptimLayoutTest, FlatStepsEqualPerParameterSteps) {
  auto ref = makeParams(1), flat = makeParams(1);
  auto refOpt = Optimizer::create(opts(), be, pointers(ref));
  auto flatOpt = Optimizer::create(opts(), be, pointers(flat));
  const auto storage = bindBuckets(flat, kBuckets);
  flatOpt->adoptLayout(kBuckets);
  EXPECT_TRUE(flatOpt->flatLayout());
  EXPECT_FALSE(refOpt->flatLayout());
  for (int s = 0; s < 4; ++s) {
    writeGrads(ref, s);
    writeGrads(flat, s);
    be.calls.clear();
    refOpt->step();
    ASSERT_EQ(be.calls.size(), 1u) << "one backend call per step, per-parameter chunks";
    EXPECT_EQ(be.calls[0].size(), ref.size());
    flatOpt->step();
    ASSERT_EQ(be.calls.size(), 2u);
    const auto& chunks = be.calls[1];
    ASSERT_EQ(chunks.size(), kBuckets.size()) << "one chunk per bucket";
    for (size_t b = 0; b < kBuckets.size(); ++b) {
      const size_t first = kBuckets[b].front();
      size_t n = 0;
      for (size_t i : kBuckets[b]) n += static_cast<size_t>(flat[i].value.numel());
      EXPECT_EQ(chunks[b].w, flat[first].value.data());
      EXPECT_EQ(chunks[b].g, storage[b].data());
      EXPECT_EQ(chunks[b].n, n);
      EXPECT_NE(chunks[b].s1, nullptr);
      EXPECT_EQ(chunks[b].s2 != nullptr, GetParam() == "adam");
      EXPECT_EQ(chunks[b].w16, nullptr);
    }
    expectSameState(ref, *refOpt, flat, *flatOpt, "after step " + std::to_string(s));
  }
  EXPECT_EQ(flatOpt->steps(), 4);
}

// A re-layout (the reducer rebuilt its buckets in another order) moves values
// and state without changing a bit; the steps after it still match, again
// one chunk per (new) bucket; values of one bucket are adjacent in memory.
TEST_P(OptimLayoutTest, RelayoutKeepsValuesAndState) {
  auto ref = makeParams(2), flat = makeParams(2);
  auto refOpt = Optimizer::create(opts(), be, pointers(ref));
  auto flatOpt = Optimizer::create(opts(), be, pointers(flat));
  auto storage = bindBuckets(flat, kBuckets);
  flatOpt->adoptLayout(kBuckets);
  for (int s = 0; s < 2; ++s) {
    writeGrads(ref, s);
    writeGrads(flat, s);
    refOpt->step();
    flatOpt->step();
  }
  storage = bindBuckets(flat, kRebuilt);
  const float* before = flat[6].value.data();
  flatOpt->adoptLayout(kRebuilt);
  EXPECT_NE(flat[6].value.data(), before) << "the values moved into the new buffers";
  expectSameState(ref, *refOpt, flat, *flatOpt, "after the re-layout");
  for (const auto& b : kRebuilt)
    for (size_t k = 1; k < b.size(); ++k)
      EXPECT_EQ(flat[b[k - 1]].value.data() + flat[b[k - 1]].value.numel(),
                flat[b[k]].value.data());
  for (int s = 2; s < 5; ++s) {
    writeGrads(ref, s);
    writeGrads(flat, s);
    refOpt->step();
    be.calls.clear();
    flatOpt->step();
    ASSERT_EQ(be.calls.size(), 1u);
    EXPECT_EQ(be.calls[0].size(), kRebuilt.size());
    expectSameState(ref, *refOpt, flat, *flatOpt, "after step " + std::to_string(s));
  }
}

// Gradients re-bound without telling the optimizer (a rebuild not followed by
// adoptLayout): the step notices that the gradients no longer run parallel to
// the values and falls back to per-parameter chunks, still exact.
TEST_P(OptimLayoutTest, StaleLayoutStaysCorrect) {
  auto ref = makeParams(3), flat = makeParams(3);
  auto refOpt = Optimizer::create(opts(), be, pointers(ref));
  auto flatOpt = Optimizer::create(opts(), be, pointers(flat));
  auto storage = bindBuckets(flat, kBuckets);
  flatOpt->adoptLayout(kBuckets);
  storage = bindBuckets(flat, kRebuilt);
  for (int s = 0; s < 3; ++s) {
    writeGrads(ref, s);
    writeGrads(flat, s);
    refOpt->step();
    be.calls.clear();
    flatOpt->step();
    ASSERT_EQ(be.calls.size(), 1u);
    EXPECT_GT(be.calls[0].size(), kBuckets.size());
    expectSameState(ref, *refOpt, flat, *flatOpt, "after step " + std::to_string(s));
  }
}

// A value replaced from outside is updated where it now lives.
TEST_P(OptimLayoutTest, ReplacedValueIsUpdatedWhereItLives) {
  auto ref = makeParams(4), flat = makeParams(4);
  auto refOpt = Optimizer::create(opts(), be, pointers(ref));
  auto flatOpt = Optimizer::create(opts(), be, pointers(flat));
  const auto storage = bindBuckets(flat, kBuckets);
  flatOpt->adoptLayout(kBuckets);
  Tensor own(flat[5].value.shape());
  std::copy(flat[5].value.data(), flat[5].value.data() + own.numel(), own.data());
  flat[5].value = own;
  for (int s = 0; s < 3; ++s) {
    writeGrads(ref, s);
    writeGrads(flat, s);
    refOpt->step();
    flatOpt->step();
    expectSameState(ref, *refOpt, flat, *flatOpt, "after step " + std::to_string(s));
  }
  EXPECT_EQ(flat[5].value.data(), own.data());
}

// Buckets whose gradients are padded to 16-element boundaries (an aligning
// reducer): the flat values mirror the padding, so each value is exactly as
// aligned as its gradient; chunks split at the gaps; the results are exact.
TEST_P(OptimLayoutTest, PaddedBucketsAreMirrored) {
  auto ref = makeParams(5), flat = makeParams(5);
  auto refOpt = Optimizer::create(opts(), be, pointers(ref));
  auto flatOpt = Optimizer::create(opts(), be, pointers(flat));
  const auto storage = bindBuckets(flat, kBuckets, 16);
  flatOpt->adoptLayout(kBuckets);
  for (const auto& b : kBuckets) {
    const float* v0 = flat[b.front()].value.data();
    const float* g0 = flat[b.front()].grad.data();
    // The CPU allocator aligns to 64 bytes (a device allocator to more); a
    // bucket starts at a multiple of 256 bytes from the buffer's start.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v0) % 64, 0u) << "a bucket starts aligned";
    for (size_t i : b) EXPECT_EQ(flat[i].value.data() - v0, flat[i].grad.data() - g0);
  }
  for (int s = 0; s < 3; ++s) {
    writeGrads(ref, s);
    writeGrads(flat, s);
    refOpt->step();
    be.calls.clear();
    flatOpt->step();
    ASSERT_EQ(be.calls.size(), 1u);
    expectSameState(ref, *refOpt, flat, *flatOpt, "after step " + std::to_string(s));
  }
}

// The destructor gives every parameter its own copy: the model outlives the
// optimizer.
TEST_P(OptimLayoutTest, DestructorHandsTheValuesBack) {
  auto flat = makeParams(6);
  const auto storage = bindBuckets(flat, kBuckets);
  std::vector<std::vector<float>> want;
  {
    auto opt = Optimizer::create(opts(), be, pointers(flat));
    opt->adoptLayout(kBuckets);
    writeGrads(flat, 0);
    opt->step();
    for (Param& p : flat) want.push_back(values(p.value));
  }
  for (size_t i = 0; i < flat.size(); ++i) {
    EXPECT_EQ(values(flat[i].value), want[i]) << flat[i].name;
    EXPECT_EQ(flat[i].value.shape(), kShapes[i]);
  }
  for (size_t i = 1; i < flat.size(); ++i)  // separate allocations again
    EXPECT_NE(flat[i - 1].value.data() + flat[i - 1].value.numel(), flat[i].value.data());
}

// The optimizer inside a CUDA graph of the step (Optimizer::stageStep,
// stepReplayed): a step recorded once (at the first step, where SGD's
// momentum buffer starts as the gradient, or later) and replayed with a new
// learning rate each step gives bitwise the eager optimizer's values and
// state and the same step count (Adam's bias corrections follow the count).
TEST_P(OptimLayoutTest, RecordedStepReplaysWithStagedScalars) {
  for (const int captureAt : {0, 2}) {
    SCOPED_TRACE("captured at step " + std::to_string(captureAt));
    auto ref = makeParams(5), rec = makeParams(5);
    auto refOpt = Optimizer::create(opts(), be, pointers(ref));
    auto recOpt = Optimizer::create(opts(), be, pointers(rec));
    const auto refStorage = bindBuckets(ref, kBuckets);
    const auto recStorage = bindBuckets(rec, kBuckets);
    refOpt->adoptLayout(kBuckets);
    recOpt->adoptLayout(kBuckets);
    be.recorded = nullptr;
    be.stagedCount = 0;
    for (int s = 0; s < 7; ++s) {
      const float lr = opts().lr * (1.0f + 0.25f * static_cast<float>(s % 3));
      writeGrads(ref, s);
      writeGrads(rec, s);
      refOpt->setLr(lr);
      refOpt->step();
      recOpt->setLr(lr);
      if (s < captureAt) {
        recOpt->step();  // eager steps before the capture
      } else if (s == captureAt) {
        recOpt->stageStep();
        be.capturing = true;
        recOpt->step();  // recorded, not run; counts the step
        be.capturing = false;
        EXPECT_EQ(recOpt->steps(), s + 1);
        be.replay();
      } else {
        recOpt->stageStep();
        be.replay();
        recOpt->stepReplayed();
      }
      EXPECT_EQ(recOpt->steps(), refOpt->steps());
      expectSameState(ref, *refOpt, rec, *recOpt, "after step " + std::to_string(s));
    }
    EXPECT_EQ(be.stagedCount, 7 - captureAt) << "one staging per recorded or replayed step";
  }
}

INSTANTIATE_TEST_SUITE_P(SgdAndAdam, OptimLayoutTest, ::testing::Values("sgd", "adam", "nesterov"),
                         [](const auto& info) { return info.param; });

// torch.optim.SGD(nesterov=True, dampening 0) over several steps on the CPU
// backend against the same recurrence in float64: g' = g + wd w;
// buf = g' (step 1) or m buf + g'; w -= lr (g' + m buf). Each float step
// rounds a handful of times (relative 2^-24 each) and the rounding of earlier
// steps carries through buf, so after 6 steps the values agree within about
// 1e-6 relative to the magnitudes involved. Without nesterov the same
// parameters take another path (the option reaches the kernel).
TEST(Optim, NesterovSgdFollowsFloat64Reference) {
  auto be = makeCpuBackend(1);
  const float lr = 0.05f, m = 0.9f, wd = 1e-2f;
  auto ps = makeParams(7), plain = makeParams(7);
  auto opt = Optimizer::create({.kind = "sgd", .lr = lr, .momentum = m, .weightDecay = wd,
                                .nesterov = true},
                               *be, pointers(ps));
  auto plainOpt = Optimizer::create({.kind = "sgd", .lr = lr, .momentum = m, .weightDecay = wd},
                                    *be, pointers(plain));
  std::vector<std::vector<double>> w(ps.size()), buf(ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    w[i].assign(ps[i].value.data(), ps[i].value.data() + ps[i].value.numel());
    buf[i].assign(w[i].size(), 0.0);
  }
  for (int s = 0; s < 6; ++s) {
    writeGrads(ps, s);
    writeGrads(plain, s);
    opt->step();
    plainOpt->step();
    for (size_t i = 0; i < ps.size(); ++i)
      for (size_t k = 0; k < w[i].size(); ++k) {
        const double d = ps[i].grad.data()[k] + static_cast<double>(wd) * w[i][k];
        buf[i][k] = s == 0 ? d : static_cast<double>(m) * buf[i][k] + d;
        w[i][k] -= static_cast<double>(lr) * (d + static_cast<double>(m) * buf[i][k]);
      }
  }
  auto state = opt->state();
  ASSERT_EQ(state.size(), ps.size());
  bool differs = false;
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(state[i].first, "optim." + ps[i].name + ".momentum_buffer");
    for (size_t k = 0; k < w[i].size(); ++k) {
      EXPECT_NEAR(ps[i].value.data()[k], w[i][k], 2e-6 * (1.0 + std::fabs(w[i][k])))
          << ps[i].name << "[" << k << "]";
      EXPECT_NEAR(state[i].second->data()[k], buf[i][k], 2e-6 * (1.0 + std::fabs(buf[i][k])))
          << ps[i].name << "[" << k << "] momentum buffer";
      differs |= std::fabs(plain[i].value.data()[k] - w[i][k]) > 1e-4;
    }
  }
  EXPECT_TRUE(differs) << "plain momentum should not follow Nesterov's recurrence";
}

// Nesterov needs momentum and SGD, as torch.optim.SGD refuses
// nesterov=True with momentum 0; create() throws what the check says.
TEST(Optim, NesterovWithoutMomentumIsRefused) {
  auto be = makeCpuBackend(1);
  auto ps = makeParams(1);
  EXPECT_EQ(optimizerOptionsProblem({}), "");
  EXPECT_EQ(optimizerOptionsProblem({.kind = "sgd", .momentum = 0.5f, .nesterov = true}), "");
  EXPECT_EQ(optimizerOptionsProblem({.kind = "sgd", .momentum = 0.0f}), "");
  const OptimizerOptions noMomentum{.kind = "sgd", .momentum = 0.0f, .nesterov = true};
  EXPECT_NE(optimizerOptionsProblem(noMomentum).find("momentum"), std::string::npos)
      << optimizerOptionsProblem(noMomentum);
  EXPECT_THROW(Optimizer::create(noMomentum, *be, pointers(ps)), InvalidArgument);
  const OptimizerOptions adam{.kind = "adam", .nesterov = true};
  EXPECT_NE(optimizerOptionsProblem(adam).find("nesterov"), std::string::npos);
  EXPECT_THROW(Optimizer::create(adam, *be, pointers(ps)), InvalidArgument);
  EXPECT_NE(optimizerOptionsProblem({.kind = "lamb"}).find("unknown optimizer"),
            std::string::npos);
  EXPECT_THROW(Optimizer::create({.kind = "lamb"}, *be, pointers(ps)), InvalidArgument);
}

TEST(OptimLayout, StateNamesShapesAndOrderDoNotChange) {
  RecordingBackend be;
  for (const std::string kind : {"sgd", "adam"}) {
    auto a = makeParams(7), b = makeParams(7);
    auto plain = Optimizer::create({.kind = kind}, be, pointers(a));
    auto flat = Optimizer::create({.kind = kind}, be, pointers(b));
    const auto storage = bindBuckets(b, kBuckets);
    flat->adoptLayout(kBuckets);
    const auto sa = plain->state(), sb = flat->state();
    ASSERT_EQ(sa.size(), kind == "sgd" ? a.size() : 2 * a.size());
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t k = 0; k < sa.size(); ++k) {
      EXPECT_EQ(sa[k].first, sb[k].first);
      EXPECT_EQ(sa[k].second->shape(), sb[k].second->shape());
    }
    EXPECT_EQ(sb[0].first, kind == "sgd" ? "optim.p0.weight.momentum_buffer"
                                         : "optim.p0.weight.exp_avg");
  }
  // SGD without momentum keeps no state, in either layout.
  auto c = makeParams(8);
  auto none = Optimizer::create({.kind = "sgd", .momentum = 0.0f}, be, pointers(c));
  const auto storage = bindBuckets(c, kBuckets);
  none->adoptLayout(kBuckets);
  EXPECT_TRUE(none->state().empty());
  writeGrads(c, 0);
  be.calls.clear();
  none->step();
  ASSERT_EQ(be.calls.size(), 1u);
  for (const auto& ch : be.calls[0]) EXPECT_EQ(ch.s1, nullptr);
}

TEST(OptimLayout, BucketsMustPartitionTheParameters) {
  RecordingBackend be;
  auto ps = makeParams(9);
  auto opt = Optimizer::create({.kind = "sgd"}, be, pointers(ps));
  EXPECT_THROW(opt->adoptLayout({{0, 1, 2}, {3, 4, 5}}), InvalidArgument);        // 6 missing
  EXPECT_THROW(opt->adoptLayout({{0, 1, 2, 6}, {3, 4, 5, 1}}), InvalidArgument);  // 1 twice
  EXPECT_THROW(opt->adoptLayout({{0, 1, 2, 6}, {3, 4, 5, 7}}), InvalidArgument);  // 7 unknown
  EXPECT_FALSE(opt->flatLayout());
  try {
    opt->adoptLayout({{0, 1, 2}, {3, 4, 5}});
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'p6.weight' is in no bucket"), std::string::npos)
        << e.what();
  }
  // The CPU backend has no 16-bit weights.
  EXPECT_THROW(opt->adoptLayout(kBuckets, /*weights16=*/true), InvalidArgument);
  EXPECT_EQ(opt->weights16(0), nullptr);
  opt->refreshWeights16();  // nothing to do
}

// A checkpoint written from the flat layout and loaded into another flat
// optimizer (through the state() pointers, as the trainer does) resumes bit
// for bit.
TEST(OptimLayout, CheckpointRoundTripResumesBitwise) {
  auto be = makeCpuBackend(1);
  testing::TempDir dir;
  Rng rng(11);
  Tensor x({6, 1, 28, 28});
  for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = rng.uniform(0, 1);
  const std::vector<int32_t> labels = {1, 3, 5, 7, 9, 0};
  for (const std::string kind : {"sgd", "adam"}) {
    auto run = [&](Model& m, Optimizer& o, int steps) {
      for (int s = 0; s < steps; ++s) {
        for (Param* p : m.params()) p->overwriteGrad = true;
        Tensor dl;
        be->crossEntropy(m.forward(x, true), labels.data(), &dl, nullptr);
        m.backward(dl, [](size_t) {});
        o.step();
      }
    };
    auto layoutOf = [](Model& m) {  // two buckets, in reverse order
      std::vector<std::vector<size_t>> b(2);
      const size_t n = m.params().size();
      for (size_t i = n; i-- > 0;) b[i < n / 2 ? 1 : 0].push_back(i);
      return b;
    };
    auto a = Model::create("lenet-bn", *be);
    Rng ra(5);
    a->initialize(ra);
    auto oa = Optimizer::create({.kind = kind}, *be, a->params());
    oa->adoptLayout(layoutOf(*a));
    run(*a, *oa, 3);
    const std::string path = dir.file(kind + ".safetensors");
    {
      HostSnapshot snap(*be);
      std::vector<std::vector<int64_t>> counts;
      saveSafetensors(path, modelTensors(*a, oa.get(), snap, counts), {});
    }
    auto b = Model::create("lenet-bn", *be);
    auto ob = Optimizer::create({.kind = kind}, *be, b->params());
    ob->adoptLayout(layoutOf(*b));
    std::string why;
    ASSERT_TRUE(copyInto(loadSafetensors(path), path, *b, ob.get(), *be, &why)) << why;
    ob->setSteps(oa->steps());
    run(*a, *oa, 2);
    run(*b, *ob, 2);
    for (size_t i = 0; i < a->params().size(); ++i)
      EXPECT_TRUE(sameBits(a->params()[i]->value, b->params()[i]->value))
          << kind << " " << a->params()[i]->name;
    auto sa = oa->state(), sb = ob->state();
    for (size_t k = 0; k < sa.size(); ++k)
      EXPECT_TRUE(sameBits(*sa[k].second, *sb[k].second)) << kind << " " << sa[k].first;
  }
}

// The trainer's glue, end to end on one rank: a real Reducer (small buckets,
// rebuilt after the first iteration), gradients bound into its buckets, the
// optimizer's layout adopted at setup and after the rebuild, and
// Param::overwriteGrad set after each step instead of Reducer::zeroGrad. The
// parameters after several steps are bitwise those of the plain loop
// (per-parameter optimizer, owned gradients zeroed every step).
TEST(OptimLayout, TrainerGlueEqualsThePlainLoop) {
  for (const std::string model : {"mlp", "lenet-bn"}) {
    for (const std::string kind : {"sgd", "adam"}) {
      auto be = makeCpuBackend(1);
      Rng rng(21);
      Tensor x({8, 1, 28, 28});
      for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = rng.uniform(0, 1);
      const std::vector<int32_t> labels = {0, 1, 2, 3, 4, 5, 6, 7};
      constexpr int kSteps = 4;
      auto plain = Model::create(model, *be);
      Rng r1(3);
      plain->initialize(r1);
      auto po = Optimizer::create({.kind = kind, .weightDecay = 1e-3f}, *be, plain->params());
      for (int s = 0; s < kSteps; ++s) {
        for (Param* p : plain->params()) p->grad.zero();
        Tensor dl;
        be->crossEntropy(plain->forward(x, true), labels.data(), &dl, nullptr);
        plain->backward(dl, [](size_t) {});
        po->step();
      }
      testing::runRanks(1, [&](runtime::ProcessGroup& pg) {
        // OpenMP's thread count is per thread: oneDNN must use one thread
        // here too, as on the test's thread, for bitwise equal convolutions.
        setDnnlThreads(1);
        auto m = Model::create(model, *be);
        Rng r2(3);
        m->initialize(r2);
        std::vector<runtime::ParamInfo> infos;
        for (Param* p : m->params())
          infos.push_back({p->name, static_cast<size_t>(p->value.numel())});
        runtime::ReducerOptions ro;
        ro.bucketCapBytes = 64 << 10;
        ro.firstBucketBytes = 8 << 10;
        runtime::Reducer reducer(pg, infos, ro, be->gradientMemory(pg));
        auto bindGrads = [&] {
          for (size_t i = 0; i < m->params().size(); ++i)
            m->params()[i]->grad =
                Tensor::view(reducer.grad(i), m->params()[i]->value.shape(), be->device());
        };
        auto buckets = [&] {
          std::vector<std::vector<size_t>> b;
          for (size_t k = 0; k < reducer.numBuckets(); ++k) b.push_back(reducer.bucketParams(k));
          return b;
        };
        bindGrads();
        auto o = Optimizer::create({.kind = kind, .weightDecay = 1e-3f}, *be, m->params());
        o->adoptLayout(buckets());
        ASSERT_GT(reducer.numBuckets(), 1u);
        // Garbage in every gradient: only the overwrite contract makes it vanish.
        for (Param* p : m->params()) {
          std::fill(p->grad.data(), p->grad.data() + p->grad.numel(),
                    std::numeric_limits<float>::quiet_NaN());
          p->overwriteGrad = true;
        }
        for (int s = 0; s < kSteps; ++s) {
          Tensor dl;
          be->crossEntropy(m->forward(x, true), labels.data(), &dl, nullptr);
          m->backward(dl, [&](size_t i) { reducer.markReady(i); });
          for (Param* p : m->params()) EXPECT_FALSE(p->overwriteGrad) << p->name;
          const uint64_t layout = reducer.layoutVersion();
          reducer.finalize();
          if (reducer.layoutVersion() != layout) {
            bindGrads();
            o->adoptLayout(buckets());
          }
          o->step();
          for (Param* p : m->params()) p->overwriteGrad = true;
        }
        for (size_t i = 0; i < m->params().size(); ++i)
          EXPECT_TRUE(sameBits(m->params()[i]->value, plain->params()[i]->value))
              << model << " " << kind << " " << m->params()[i]->name;
        for (size_t i = 0; i < m->buffers().size(); ++i)
          EXPECT_TRUE(sameBits(m->buffers()[i]->value, plain->buffers()[i]->value))
              << model << " " << kind << " " << m->buffers()[i]->name;
        o.reset();  // before the reducer and its gradient memory go
      });
    }
  }
}

}  // namespace
}  // namespace ddprun::train
