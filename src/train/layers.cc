#include "ddprun/train/layers.h"

#include <chrono>
#include <cmath>
#include <sstream>

#include "ddprun/common/error.h"

namespace ddprun::train {

// 24 random bits -> a float in [0, 1): exact and library-independent.
float Rng::uniform(float lo, float hi) {
  const float u = static_cast<float>(gen_() >> 40) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * u;
}

float Rng::normal() {
  const double u1 = (static_cast<double>(gen_() >> 11) + 1.0) * (1.0 / 9007199254740993.0);
  const double u2 = static_cast<double>(gen_() >> 11) * (1.0 / 9007199254740992.0);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

std::string Rng::state() const {
  std::ostringstream os;
  os << gen_;
  return os.str();
}

void Rng::restore(const std::string& s) {
  std::istringstream is(s);
  std::mt19937_64 g;
  is >> g;
  if (is.fail()) DDPRUN_THROW(InvalidArgument, "malformed random generator state");
  gen_ = g;
}

void Layer::backwardAccumulate(const Tensor&, const Tensor&, const Tensor&, Tensor&) {
  DDPRUN_THROW(InvalidArgument, name(), ": this layer does not add into a gradient "
               "(accumulatesDx() is false); run backward() and add");
}

void Backend::crossEntropyDeferred(const Tensor& logits, const int32_t* labels, Tensor* dlogits,
                                   float gradScale) {
  const double mean = crossEntropy(logits, labels, dlogits, nullptr, gradScale);
  deferredLoss_ += mean * static_cast<double>(logits.dim(0));
}

void BatchNormAct::recompute(const Tensor&, Tensor&) {
  DDPRUN_THROW(InvalidArgument, name(), ": this batch norm does not recompute its output "
               "(recomputes() is false)");
}

void Backend::stageLabels(const int32_t* labels, int64_t n, int64_t classes) {
  DDPRUN_CHECK(n >= 0, "stageLabels: ", n, " labels");
  for (int64_t i = 0; i < n; ++i)
    DDPRUN_CHECK(labels[i] >= 0 && labels[i] < classes, "label ", labels[i], " outside [0, ",
                 classes, ")");
  stagedLabels_.assign(labels, labels + n);
}

void Backend::crossEntropyStaged(const Tensor& logits, Tensor* dlogits, float gradScale) {
  DDPRUN_CHECK(logits.rank() == 2 && logits.dim(0) == static_cast<int64_t>(stagedLabels_.size()),
               "crossEntropyStaged: logits ", shapeString(logits.shape()), " for ",
               stagedLabels_.size(), " staged labels");
  crossEntropyDeferred(logits, stagedLabels_.data(), dlogits, gradScale);
}

std::string Backend::captureRefusal() const {
  return "the " + std::string(runtime::deviceName(device())) + " backend runs its steps eagerly";
}

std::unique_ptr<Backend::StepGraph> Backend::capture(const std::function<void()>&,
                                                     std::string* why) {
  if (why) *why = captureRefusal();
  return nullptr;
}

void Backend::setLabelSmoothing(float eps) {
  if (!(eps >= 0.0f && eps <= 1.0f))
    DDPRUN_THROW(InvalidArgument, "label smoothing ", eps, " outside [0, 1]");
  labelSmoothing_ = eps;
}

double Backend::takeLossSum() {
  const double s = deferredLoss_;
  deferredLoss_ = 0;
  return s;
}

namespace {
// A reshaped view forward and backward: no element is touched, so one class
// serves every device.
class Flatten final : public Layer {
 public:
  explicit Flatten(std::string name) : Layer(std::move(name)) {}
  Shape outputShape(const Shape& s) const override {
    DDPRUN_CHECK(!s.empty(), name(), " needs a batch dimension");
    return {s[0], s[0] ? numelOf(s) / s[0] : 0};
  }
  void forward(const Tensor& x, Tensor& y, bool) override { y = x.reshaped(outputShape(x.shape())); }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) override {
    if (dx) *dx = dy.reshaped(x.shape());
  }
};
}  // namespace

std::unique_ptr<Layer> Backend::flatten(std::string name) {
  return std::make_unique<Flatten>(std::move(name));
}

void BatchNormAct::checkResidual(const Tensor* z) const {
  DDPRUN_CHECK((z != nullptr) == residual_, name(), residual_
               ? ": the residual is missing" : ": a residual was given to a batch norm "
               "without one");
}
void BatchNormAct::checkResidualGrad(const Tensor* dz) const {
  DDPRUN_CHECK(!residual_ || dz, name(), ": the residual's gradient needs somewhere to go");
}

void BatchNormAct::forward(const Tensor& x, Tensor& y, bool training) {
  DDPRUN_CHECK(!residual(), name(), ": a batch norm with a residual add needs the residual "
               "(forward(x, z, y))");
  forward(x, nullptr, y, training);
}
void BatchNormAct::backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) {
  DDPRUN_CHECK(!residual(), name(), ": a batch norm with a residual add gives the residual's "
               "gradient (backward(x, y, dy, dx, dz))");
  backward(x, y, dy, dx, nullptr);
}

namespace {
// The default BatchNormAct: the backend's batch norm, add() and ReLU, as
// ResNet's block ran them apart: the sum and the ReLU in place in y (the
// batch norm's backward reads its input, not y; the ReLU's reads y).
class ComposedBatchNormAct final : public BatchNormAct {
 public:
  ComposedBatchNormAct(Backend& be, std::string name, int64_t c, runtime::ProcessGroup* sync,
                       bool residual)
      : BatchNormAct(name, residual), be_(be), bn_(be.batchNorm2d(name, c, sync)),
        relu_(be.relu(name + ".relu")) {}
  using BatchNormAct::backward;
  using BatchNormAct::forward;
  void forward(const Tensor& x, const Tensor* z, Tensor& y, bool training) override {
    checkResidual(z);
    y.ensureLike(x, be_.allocator());
    bn_->forward(x, y, training);
    if (z) be_.add(y, *z, y);
    relu_->forward(y, y, training);
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx,
                Tensor* dz) override {
    checkResidualGrad(dz);
    Tensor& g = residual() ? *dz : g_;
    g.ensureLike(y, be_.allocator());
    relu_->backward(y, y, dy, &g);
    if (dx) dx->ensureLike(x, be_.allocator());
    bn_->backward(x, y, g, dx);
    if (be_.releasesActivations()) g_ = Tensor();
  }
  std::vector<Param*> params() override { return bn_->params(); }
  std::vector<Buffer*> buffers() override { return bn_->buffers(); }

 private:
  Backend& be_;
  std::unique_ptr<Layer> bn_, relu_;
  Tensor g_;  // dL/d(bn's output) without a residual
};
}  // namespace

std::unique_ptr<BatchNormAct> Backend::batchNormAct(std::string name, int64_t channels,
                                                    runtime::ProcessGroup* sync, bool residual) {
  return std::make_unique<ComposedBatchNormAct>(*this, std::move(name), channels, sync, residual);
}

void Backend::sgdStep(const std::vector<OptimChunk>& chunks, float lr, float momentum,
                      float weightDecay, bool firstStep, bool nesterov) {
  for (const OptimChunk& c : chunks)
    sgdUpdate(c.w, c.g, c.s1, c.n, lr, momentum, weightDecay, firstStep, nesterov);
}

void Backend::adamStep(const std::vector<OptimChunk>& chunks, float lr, float beta1, float beta2,
                       float eps, float weightDecay, int64_t step) {
  for (const OptimChunk& c : chunks)
    adamUpdate(c.w, c.g, c.s1, c.s2, c.n, lr, beta1, beta2, eps, weightDecay, step);
}

void Backend::stageOptimizerStep(float, bool, int64_t, float, float) {}

size_t Backend::mark() {
  markTimes_.push_back(
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count());
  return markTimes_.size() - 1;
}

std::vector<double> Backend::markTimesMs() {
  std::vector<double> out;
  out.reserve(markTimes_.size());
  for (double t : markTimes_) out.push_back((t - markTimes_.front()) * 1e3);
  return out;
}

void Backend::clearMarks() { markTimes_.clear(); }

Tensor Backend::uploadInput(const float* host, const Shape& shape) {
  Tensor t(shape, allocator());
  upload(host, t.data(), static_cast<size_t>(t.numel()));
  return t;
}

}  // namespace ddprun::train
