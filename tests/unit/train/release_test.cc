// The activation release contract of Model and BasicBlock
// (Backend::releasesActivations): on a backend that releases, backward gives
// every activation and gradient back as soon as its last reader ran, and
// evaluation keeps only the logits; on one that does not (the CPU), they stay
// for the next step. Checked by the bytes a counting allocator has handed
// out, through a fake backend whose layers keep nothing of their own (so
// every byte counted is the model's or the block's bookkeeping).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>

#include "ddprun/common/error.h"
#include "ddprun/runtime/reducer.h"
#include "ddprun/train/models.h"

namespace ddprun::train {
namespace {

class CountingAllocator final : public Allocator {
 public:
  Device device() const override { return Device::kCpu; }
  float* alloc(size_t n) override {
    const size_t bytes = std::max<size_t>(n, 1) * sizeof(float);
    auto* p = static_cast<float*>(std::calloc(1, bytes));
    live_ += bytes;
    peak_ = std::max(peak_, live_);
    sizes_[p] = bytes;
    return p;
  }
  void free(float* p) override {
    live_ -= sizes_.at(p);
    sizes_.erase(p);
    std::free(p);
  }
  size_t live() const { return live_; }
  size_t peak() const { return peak_; }
  void resetPeak() { peak_ = live_; }

 private:
  size_t live_ = 0, peak_ = 0;
  std::map<float*, size_t> sizes_;
};

// A layer that only shapes and allocates: y and dx from the backend's
// allocator, parameters too, nothing kept between calls.
class FakeLayer final : public Layer {
 public:
  using ShapeFn = std::function<Shape(const Shape&)>;
  FakeLayer(std::string name, Allocator& a, ShapeFn shape, std::vector<Shape> paramShapes,
            bool inPlace = false)
      : Layer(name), a_(a), shape_(std::move(shape)), inPlace_(inPlace) {
    for (size_t i = 0; i < paramShapes.size(); ++i)
      params_.push_back({name + ".p" + std::to_string(i), Tensor(paramShapes[i], a),
                         Tensor(paramShapes[i], a)});
  }
  Shape outputShape(const Shape& in) const override { return shape_(in); }
  void forward(const Tensor& x, Tensor& y, bool) override {
    DDPRUN_CHECK(x.defined() && x.data(), name(), ": forward of a released input");
    y.ensure(outputShape(x.shape()), a_);
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override {
    DDPRUN_CHECK(x.data() && dy.data(), name(), ": backward read a released tensor");
    DDPRUN_CHECK(dy.shape() == outputShape(x.shape()), name(), ": dy of the wrong shape");
    if (dx) dx->ensure(x.shape(), a_);
  }
  std::vector<Param*> params() override {
    std::vector<Param*> out;
    for (auto& p : params_) out.push_back(&p);
    return out;
  }
  bool backwardReadsOutput() const override { return inPlace_; }
  bool worksInPlace() const override { return inPlace_; }

 private:
  Allocator& a_;
  ShapeFn shape_;
  bool inPlace_;
  std::vector<Param> params_;
};

// A batch norm + ReLU without parameters that may recompute its output
// (BatchNormAct::recomputes), counting the recomputations; its backward
// checks that y is there.
class FakeBnAct final : public BatchNormAct {
 public:
  FakeBnAct(std::string name, Allocator& a, bool residual, bool canRecompute, int* recomputed)
      : BatchNormAct(std::move(name), residual), a_(a), can_(canRecompute),
        recomputed_(recomputed) {}
  using BatchNormAct::backward;
  using BatchNormAct::forward;
  void forward(const Tensor& x, const Tensor*, Tensor& y, bool) override {
    y.ensure(x.shape(), a_);
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx,
                Tensor* dz) override {
    DDPRUN_CHECK(x.data() && y.data() && dy.data(), name(), ": backward read a released tensor");
    if (dx) dx->ensure(x.shape(), a_);
    if (dz) dz->ensure(x.shape(), a_);
  }
  bool recomputes() const override { return can_ && !residual(); }
  void recompute(const Tensor& x, Tensor& y) override {
    ++*recomputed_;
    y.ensure(x.shape(), a_);
  }

 private:
  Allocator& a_;
  bool can_;
  int* recomputed_;
};

class FakeBackend final : public Backend {
 public:
  // bnAct: the default composed batch norm + ReLU (kComposed), or FakeBnAct
  // without or with recomputation.
  enum BnAct { kComposed, kKeeps, kRecomputes };
  explicit FakeBackend(bool release, BnAct bnAct = kComposed)
      : release_(release), bnAct_(bnAct) {}
  int recomputed = 0;  // FakeBnAct's recomputations
  std::unique_ptr<BatchNormAct> batchNormAct(std::string n, int64_t c, runtime::ProcessGroup* s,
                                             bool residual) override {
    if (bnAct_ == kComposed) return Backend::batchNormAct(std::move(n), c, s, residual);
    return std::make_unique<FakeBnAct>(std::move(n), alloc_, residual, bnAct_ == kRecomputes,
                                       &recomputed);
  }
  Device device() const override { return Device::kCpu; }
  Allocator& allocator() override { return alloc_; }
  CountingAllocator& counter() { return alloc_; }
  std::string describe() const override { return "fake"; }
  bool releasesActivations() const override { return release_; }

  std::unique_ptr<Layer> linear(std::string n, int64_t in, int64_t out) override {
    return make(n, [out](const Shape& s) { return Shape{s[0], out}; }, {{out, in}, {out}});
  }
  std::unique_ptr<Layer> conv2d(std::string n, const Conv2dSpec& c) override {
    auto shape = [c](const Shape& s) {
      return Shape{s[0], c.outC, (s[2] + 2 * c.pad - c.kernel) / c.stride + 1,
                   (s[3] + 2 * c.pad - c.kernel) / c.stride + 1};
    };
    return make(n, shape, {{c.outC, c.inC, c.kernel, c.kernel}});
  }
  std::unique_ptr<Layer> maxPool2d(std::string n, const Pool2dSpec& p) override {
    const int st = p.stride ? p.stride : p.kernel;
    return make(n, [p, st](const Shape& s) {
      return Shape{s[0], s[1], (s[2] + 2 * p.pad - p.kernel) / st + 1,
                   (s[3] + 2 * p.pad - p.kernel) / st + 1};
    }, {});
  }
  std::unique_ptr<Layer> globalAvgPool(std::string n) override {
    return make(n, [](const Shape& s) { return Shape{s[0], s[1]}; }, {});
  }
  std::unique_ptr<Layer> relu(std::string n) override {
    return std::make_unique<FakeLayer>(n, alloc_, [](const Shape& s) { return s; },
                                       std::vector<Shape>{}, true);
  }
  std::unique_ptr<Layer> batchNorm2d(std::string n, int64_t c, runtime::ProcessGroup*) override {
    return make(n, [](const Shape& s) { return s; }, {{c}, {c}});
  }
  double crossEntropy(const Tensor&, const int32_t*, Tensor*, int64_t*, float) override {
    return 0;
  }
  void sgdUpdate(float*, const float*, float*, size_t, float, float, float, bool, bool) override {}
  void adamUpdate(float*, const float*, float*, float*, size_t, float, float, float, float, float,
                  int64_t) override {}
  void add(const Tensor& a, const Tensor& b, Tensor& out) override {
    DDPRUN_CHECK(a.data() && b.data() && out.data(), "add of a released tensor");
  }
  void zero(Tensor&) override {}
  void copy(const Tensor&, Tensor&) override {}
  void resizeBilinear(const Tensor&, int64_t, int64_t, Tensor&) override {}
  bool scaleAndCheckFinite(float*, size_t, float) override { return true; }
  void upload(const float*, float*, size_t) override {}
  void download(const float*, float*, size_t) override {}
  void synchronize() override {}
  std::unique_ptr<runtime::GradientMemory> gradientMemory(runtime::ProcessGroup&) override {
    return nullptr;
  }

 private:
  std::unique_ptr<Layer> make(const std::string& n, FakeLayer::ShapeFn f,
                              std::vector<Shape> params) {
    return std::make_unique<FakeLayer>(n, alloc_, std::move(f), std::move(params));
  }
  bool release_;
  BnAct bnAct_;
  CountingAllocator alloc_;
};

struct Fixture {
  explicit Fixture(bool release, const std::string& model = "resnet18",
                   FakeBackend::BnAct bnAct = FakeBackend::kComposed)
      : be(release, bnAct) {
    ModelOptions o;
    o.stem = "cifar";
    o.imageSize = 8;
    m = Model::create(model, be, nullptr, o);
    Shape in = {2};
    for (int64_t d : m->inputShape()) in.push_back(d);
    x = Tensor(in, be.allocator());
    params = be.counter().live();  // parameters, gradients and the input
  }
  FakeBackend be;
  std::unique_ptr<Model> m;
  Tensor x;
  size_t params = 0;
};

TEST(ReleaseContract, BackwardGivesEveryActivationBack) {
  Fixture f(/*release=*/true);
  const Tensor logits = f.m->forward(f.x, true);
  const size_t afterForward = f.be.counter().live();
  ASSERT_GT(afterForward, f.params) << "forward allocated no activation";
  Tensor dlogits(logits.shape(), f.be.allocator());
  const size_t dlogitsBytes = dlogits.bytes();
  f.m->backward(dlogits, nullptr);
  // The model and its blocks keep nothing: what is left is what existed
  // before forward, the caller's dlogits and the logits handle it holds.
  EXPECT_EQ(f.be.counter().live(), f.params + dlogitsBytes + logits.bytes());
}

TEST(ReleaseContract, BackwardHoldsLessAsItProceeds) {
  Fixture f(true);
  const Tensor logits = f.m->forward(f.x, true);
  const size_t afterForward = f.be.counter().live();
  Tensor dlogits(logits.shape(), f.be.allocator());
  // Sample the bytes held when each layer's backward starts: they only go
  // down, give or take the two gradients in flight.
  std::vector<size_t> held;
  f.m->setObserver([&](size_t, bool backward, bool end) {
    if (backward && !end) held.push_back(f.be.counter().live());
  });
  f.be.counter().resetPeak();
  f.m->backward(dlogits, nullptr);
  ASSERT_EQ(held.size(), f.m->numLayers());
  // Before the stem's backward (the last sampled), only the stem's
  // activations, the input and the gradients flowing are held: far below the
  // whole forward.
  EXPECT_LT(held.back() - f.params, (afterForward - f.params) / 2);
  // The peak during backward is not above the end of forward plus the
  // gradients of the largest layer (PyTorch's shape: the peak sits at the
  // start of backward, not at the stem).
  EXPECT_LE(f.be.counter().peak(), afterForward + dlogits.bytes() + 4 * f.x.bytes() * 64);
}

TEST(ReleaseContract, CpuStyleBackendKeepsActivationsForTheNextStep) {
  Fixture f(/*release=*/false);
  const Tensor logits = f.m->forward(f.x, true);
  const size_t afterForward = f.be.counter().live();
  Tensor dlogits(logits.shape(), f.be.allocator());
  f.m->backward(dlogits, nullptr);
  EXPECT_GE(f.be.counter().live(), afterForward) << "kept for reuse: no reallocation per step";
  const size_t kept = f.be.counter().live();
  f.m->forward(f.x, true);  // the second step reuses every buffer
  f.m->backward(dlogits, nullptr);
  EXPECT_EQ(f.be.counter().live(), kept);
}

TEST(ReleaseContract, EvaluationKeepsOnlyTheLogits) {
  Fixture f(true);
  const Tensor& logits = f.m->forward(f.x, false);
  EXPECT_EQ(f.be.counter().live(), f.params + logits.bytes());
}

TEST(ReleaseContract, RepeatedStepsDoNotGrow) {
  Fixture f(true);
  Tensor dlogits;
  size_t first = 0;
  for (int step = 0; step < 3; ++step) {
    const Tensor& logits = f.m->forward(f.x, true);
    dlogits.ensure(logits.shape(), f.be.allocator());
    f.m->backward(dlogits, nullptr);
    if (step == 0) first = f.be.counter().live();
    EXPECT_EQ(f.be.counter().live(), first) << "step " << step;
  }
}

// ResNet's blocks with a batch norm that recomputes (issue 44 item 5): each
// block gives conv2's input back after forward (one activation less held at
// the end of forward per block) and recomputes it once in backward, before
// conv2's backward reads it; everything is still given back, and steps do
// not grow. On a backend that keeps activations nothing is recomputed.
TEST(ReleaseContract, BlocksRecomputeConv2sInputInsteadOfKeepingIt) {
  Fixture keep(true, "resnet18", FakeBackend::kKeeps);
  Fixture re(true, "resnet18", FakeBackend::kRecomputes);
  ASSERT_EQ(keep.params, re.params);
  Tensor dlogits, dk;  // each held across steps by its own backend
  size_t first = 0;
  for (int step = 0; step < 2; ++step) {
    const Tensor& logits = re.m->forward(re.x, true);
    const Tensor& logitsKept = keep.m->forward(keep.x, true);
    dlogits.ensure(logits.shape(), re.be.allocator());
    dk.ensure(logitsKept.shape(), keep.be.allocator());
    const size_t heldKept = keep.be.counter().live(), held = re.be.counter().live();
    // Exactly each block's relu(bn1(c1)), one tensor of the block's output
    // shape: ResNet-18's 8 blocks at a 2x8x8 input (cifar stem), 2 blocks a
    // stage at 64x8x8, 128x4x4, 256x2x2, 512x1x1 floats a sample.
    const size_t b = sizeof(float) * 2;
    EXPECT_EQ(heldKept - held, 2 * b * (64 * 64 + 128 * 16 + 256 * 4 + 512 * 1));
    re.m->backward(dlogits, nullptr);
    EXPECT_EQ(re.be.recomputed, 8 * (step + 1)) << "once per block per step";
    if (step == 0) first = re.be.counter().live();
    EXPECT_EQ(re.be.counter().live(), first) << "step " << step;
    keep.m->backward(dk, nullptr);
  }
  Fixture cpu(false, "resnet18", FakeBackend::kRecomputes);
  const Tensor& logits = cpu.m->forward(cpu.x, true);
  Tensor d(logits.shape(), cpu.be.allocator());
  cpu.m->backward(d, nullptr);
  EXPECT_EQ(cpu.be.recomputed, 0) << "a backend that keeps activations recomputes nothing";
}

TEST(ReleaseContract, SmallModelsFollowTheSameRule) {
  for (const char* name : {"lenet", "lenet-bn", "mlp"}) {
    FakeBackend be(true);
    auto m = Model::create(name, be, nullptr, {});
    Tensor x({3, 1, 28, 28}, be.allocator());
    const size_t before = be.counter().live();
    const Tensor logits = m->forward(x, true);
    Tensor dlogits(logits.shape(), be.allocator());
    m->backward(dlogits, nullptr);
    EXPECT_EQ(be.counter().live(), before + dlogits.bytes() + logits.bytes()) << name;
  }
}

}  // namespace
}  // namespace ddprun::train
