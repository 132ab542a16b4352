// The batch norm layer's shared parts (batch_norm.h): construction, shapes,
// the dispatch to the path chosen at build (bn_path.h), the shared
// num_batches_tracked counter, and BatchNormAct. The paths themselves are in
// bn_cudnn.cc and bn_ours.cc.
#include "batch_norm.h"

#include <map>
#include <mutex>
#include <set>

#include "cuda_layers.h"
#include "ddprun/common/error.h"
#include "ddprun/runtime/cuda.h"
#include "elementwise.h"

namespace ddprun::train::cuda {

// --------------------------------------------------- num_batches_tracked
// Every batch norm of a model runs once per training forward, so their
// num_batches_tracked counts are always equal. They share one device element
// (each one's Buffer a handle to the same one-element tensor), which the
// group's first batch norm (its leader) alone increments: one launch per
// training step instead of one per batch norm. Checkpoints read and write
// each Buffer, so every batch norm still shows (and loads) the count.
// A group belongs to one Context; a batch norm whose name its context's
// current group already has (a second model on the same backend) starts a
// new group. A batch norm that trains out of step with its leader is an error
// (its count would be wrong): see BatchNorm2d::countStep.
struct BnStepCounter {
  Tensor count;  // one float on the device
  std::string leader;
  std::set<std::string> names;
  int64_t leaderForwards = 0;  // the leader's training forwards (host)
};

namespace {
std::shared_ptr<BnStepCounter> joinStepCounter(const std::shared_ptr<Context>& ctx,
                                               const std::string& name) {
  static std::mutex mu;
  static std::map<const Context*, std::weak_ptr<BnStepCounter>> groups;
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = groups.begin(); it != groups.end();)
    it = it->second.expired() ? groups.erase(it) : std::next(it);
  std::shared_ptr<BnStepCounter> g = groups[ctx.get()].lock();
  if (!g || g->names.count(name)) {
    g = std::make_shared<BnStepCounter>();
    g->count = Tensor({1}, ctx->allocator());  // zero
    g->leader = name;
    groups[ctx.get()] = g;
  }
  g->names.insert(name);
  return g;
}
}  // namespace

BatchNorm2d::BatchNorm2d(std::shared_ptr<Context> ctx, std::string name, int64_t c,
                         runtime::ProcessGroup* sync, BnPath path)
    : Layer(name), ctx_(std::move(ctx)), c_(c), sync_(sync), path_(path),
      w_(makeDeviceParam(*ctx_, name + ".weight", {c})),
      b_(makeDeviceParam(*ctx_, name + ".bias", {c})), sums_(ctx_), sqdev_(ctx_),
      foldCounters_(ctx_), reserve_(ctx_) {
  DDPRUN_CHECK(c > 0, name, ": batch norm needs at least one channel");
  DDPRUN_CHECK((path.kernels == BnKernels::kOursSync) == (sync && !ctx_->ourBatchNorm()) &&
                   (path.kernels != BnKernels::kOursNhwc || ctx_->nhwc()),
               name, ": batch norm path ", bnPathName(path, BnFusedWith::kNone),
               " does not fit this backend (", ctx_->nhwc() ? "NHWC" : "NCHW",
               sync ? ", SyncBatchNorm" : "", "): choose it with chooseBnPath");
  if (sync_ && runtime::cudaSelectedDevice() != ctx_->device())
    DDPRUN_THROW(InvalidArgument, name, ": SyncBatchNorm on cuda:", ctx_->device(),
                 " but the runtime's CUDA collectives use cuda:", runtime::cudaSelectedDevice(),
                 " (LOCAL_RANK modulo the GPU count, or DDPRUN_CUDA_DEVICE); make the backend "
                 "on that device");
  rm_ = {name + ".running_mean", Tensor({c}, ctx_->allocator()), false};
  rv_ = {name + ".running_var", Tensor({c}, ctx_->allocator()), false};
  counter_ = joinStepCounter(ctx_, name);
  leader_ = counter_->leader == name;
  nbt_ = {name + ".num_batches_tracked", counter_->count, true};  // a shared handle
  const std::vector<float> ones(static_cast<size_t>(c), 1.0f);
  ctx_->upload(ones.data(), w_.value.data(), ones.size() * sizeof(float));
  ctx_->upload(ones.data(), rv_.value.data(), ones.size() * sizeof(float));
  xDesc_ = TensorDesc::create();
  bnDesc_ = TensorDesc::create();
  setTensor4d(bnDesc_, 1, c, 1, 1);
  saveMean_ = Tensor({c}, ctx_->allocator());
  saveInvStd_ = Tensor({c}, ctx_->allocator());
  evalInvStd_ = Tensor({c}, ctx_->allocator());
  ex_ = path.kernels == BnKernels::kCudnnNhwc || path.kernels == BnKernels::kCudnnNhwcFused;
  fuse_ = path.kernels == BnKernels::kCudnnNhwcFused;
}

Shape BatchNorm2d::outputShape(const Shape& s) const {
  DDPRUN_CHECK(s.size() == 4 && s[1] == c_, name(), " expects [N, ", c_, ", H, W], got ",
               shapeString(s));
  return s;
}

bool BatchNorm2d::ours(const Tensor& x) const {
  const bool own = path_.kernels == BnKernels::kOursNhwc;
  DDPRUN_CHECK(own || !x.is16(), name(), ": a ", runtime::dtypeName(x.dtype()),
               " input, but this batch norm runs ", bnPathName(path_, BnFusedWith::kNone),
               ", on float activations (16-bit activations are CudaBackendOptions::"
               "activations16 with nhwc)");
  return own;
}

void BatchNorm2d::forward(const Tensor& x, Tensor& y, bool training) {
  if (ours(x)) return ownForward(x, nullptr, y, false, training);
  ctx_->bind();
  y.ensure(outputShape(x.shape()), ctx_->allocator());
  trained_ = training;
  if (!training) {
    if (x.numel() == 0) return;
    return cudnnForward(x, y, false);  // the running statistics, every float path
  }
  if (sync_)
    syncForward(x, y);
  else
    cudnnForward(x, y, true);
  countStep();
}

void BatchNorm2d::backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) {
  if (ours(x)) return ownBackward(x, nullptr, dy, dx, nullptr, false);
  DDPRUN_CHECK(trained_, name(), ": backward after an eval-mode forward (batch norm keeps "
               "batch statistics only in training)");
  ctx_->bind();
  if (sync_) return syncBackward(x, dy, dx);
  Tensor* out = dx;
  if (!out) out = &scratch_;
  out->ensure(x.shape(), ctx_->allocator());
  if (x.numel() == 0) return zeroFlaggedGrads(true);
  cudnnBackward(x, dy, *out);
}

// One training forward: the leader advances the shared counter; every
// other member checks that it keeps step with the leader (its forwards
// equal the leader's, or one ahead within a step the leader has not reached
// yet), since its count is the leader's.
void BatchNorm2d::countStep() {
  if (leader_) {
    launchAddScalar(nbt_.value.data(), 1.0f, ctx_->stream());
    if (!ctx_->capturing()) ++counter_->leaderForwards;
    return;
  }
  // A capture records the leader's device count; its replays run no host
  // code, so neither side counts it (and a failed capture leaves both as
  // they were).
  if (ctx_->capturing()) return;
  ++forwards_;
  const int64_t lead = counter_->leaderForwards;
  if (forwards_ < lead || forwards_ > lead + 1)
    DDPRUN_THROW(InvalidArgument, name(), ": the batch norm layers of a model share one "
                 "num_batches_tracked counter, advanced by its first batch norm '",
                 counter_->leader, "', but this one has run ", forwards_, " training "
                 "forwards and that one ", lead, ": train every batch norm of a model in every "
                 "step, or build other models on their own backend");
}

// Zeroes each gradient whose overwriteGrad is set; `clear`: and clears the
// flags (their gradient is then final for this backward).
void BatchNorm2d::zeroFlaggedGrads(bool clear) {
  for (Param* p : {&w_, &b_}) {
    if (p->overwriteGrad)
      DDPRUN_CUDA_OK(cudaMemsetAsync(p->grad.data(), 0, p->grad.bytes(), ctx_->stream()));
    if (clear) p->overwriteGrad = false;
  }
}

namespace {
// ------------------------------------------------- batch norm + ReLU (+ add)
// BatchNormAct on a fused path: kOursNhwc (our kernels, forward and back) or
// kCudnnNhwcFused (BatchNorm2d::fusedForward/fusedBackward where cuDNN
// accepts them; else, and in evaluation, the batch norm, our add and our
// ReLU apart, the composition Backend::batchNormAct would make), so every
// path keeps the contract: y = relu(bn(x) + z), dz = the ReLU's masked dy.
class FusedBatchNormAct final : public BatchNormAct {
 public:
  FusedBatchNormAct(std::shared_ptr<Context> ctx, std::string name, int64_t c,
                    runtime::ProcessGroup* sync, bool residual, BnPath path)
      : BatchNormAct(name, residual), ctx_(ctx), bn_(std::move(ctx), name, c, sync, path) {}
  using BatchNormAct::backward;
  using BatchNormAct::forward;
  void forward(const Tensor& x, const Tensor* z, Tensor& y, bool training) override {
    checkResidual(z);
    own_ = bn_.ours(x);
    if (own_) return bn_.ownForward(x, z, y, true, training);
    fused_ = training && bn_.fusedForward(x, z, y);
    if (fused_) return;
    ctx_->bind();
    y.ensure(x.shape(), ctx_->allocator());
    bn_.forward(x, y, training);
    const size_t n = static_cast<size_t>(y.numel());
    if (z) launchAdd(y.data(), z->data(), y.data(), n, ctx_->stream());
    launchRelu(y.data(), y.data(), n, ctx_->stream());
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx,
                Tensor* dz) override {
    checkResidualGrad(dz);
    if (own_) return bn_.ownBackward(x, &y, dy, dx, dz, true);
    ctx_->bind();
    Tensor& out = dx ? *dx : scratch_;
    if (fused_) return bn_.fusedBackward(x, y, dy, out, dz);
    Tensor& g = dz ? *dz : g_;
    g.ensure(y.shape(), ctx_->allocator());
    launchReluBackward(y.data(), dy.data(), g.data(), static_cast<size_t>(y.numel()),
                       ctx_->stream());
    out.ensure(x.shape(), ctx_->allocator());
    bn_.backward(x, y, g, &out);
    g_ = Tensor();
  }
  // Our kernels' apply with the saved statistics (launchBnNhwcForward, the
  // forward's own last pass: the same bits), where the context asks for it.
  bool recomputes() const override {
    return ctx_->recompute() && !residual() && bn_.path().kernels == BnKernels::kOursNhwc;
  }
  void recompute(const Tensor& x, Tensor& y) override {
    if (!recomputes() || !own_) BatchNormAct::recompute(x, y);  // throws
    bn_.ownRecompute(x, y);
  }
  std::vector<Param*> params() override { return bn_.params(); }
  std::vector<Buffer*> buffers() override { return bn_.buffers(); }

 private:
  std::shared_ptr<Context> ctx_;
  BatchNorm2d bn_;
  bool fused_ = false;  // the last forward ran cuDNN's fused kernels (its backward must too)
  bool own_ = false;    // the last forward ran ours
  Tensor g_, scratch_;  // apart: dL/d(bn's output) without a residual; dx nobody wants
};
// ------------------------------------------ batch norm + ReLU + max pool
// ResNet's stem as one layer on our kernels (Backend::batchNormActPool): the
// batch norm's statistics, then one pass that pools the recomputed
// activations; backward gathers the pooled gradient through the kept taps
// and the recomputed ReLU mask (bn_nhwc.h's fused stem). The same arithmetic
// as BatchNormAct then max pooling, without the unpooled activation.
class FusedBnActPool final : public Layer {
 public:
  FusedBnActPool(std::shared_ptr<Context> ctx, const std::string& bnName,
                 const std::string& poolName, int64_t c, runtime::ProcessGroup* sync,
                 const Pool2dSpec& pool, BnPath path)
      : Layer(bnName + "+" + poolName), bn_(ctx, bnName, c, sync, path), pool_(pool),
        arg_(std::move(ctx)) {
    if (pool_.stride == 0) pool_.stride = pool_.kernel;
    DDPRUN_CHECK(pool_.kernel > 0 && pool_.kernel <= 16 && pool_.stride > 0 && pool_.pad >= 0 &&
                     pool_.pad <= pool_.kernel / 2,
                 name(), ": max pooling window ", pool_.kernel, ", stride ", pool_.stride,
                 ", pad ", pool_.pad, ": the fused stem takes windows up to 16 with pad <= "
                 "kernel / 2");
  }
  Shape outputShape(const Shape& x) const override {
    const Shape s = bn_.outputShape(x);
    DDPRUN_CHECK(s[2] + 2 * pool_.pad >= pool_.kernel && s[3] + 2 * pool_.pad >= pool_.kernel,
                 name(), " expects H, W + 2*", pool_.pad, " >= ", pool_.kernel, ", got ",
                 shapeString(x));
    return {s[0], s[1], (s[2] + 2 * pool_.pad - pool_.kernel) / pool_.stride + 1,
            (s[3] + 2 * pool_.pad - pool_.kernel) / pool_.stride + 1};
  }
  void forward(const Tensor& x, Tensor& y, bool training) override {
    const PoolShape g = geometry(x);
    uint8_t* arg = training ? arg_.ensure(static_cast<size_t>(g.n * g.oh * g.ow * g.c)) : nullptr;
    bn_.ownPoolForward(x, y, g, arg, training);
    trained_ = training;
  }
  bool backwardReadsOutput() const override { return false; }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) override {
    DDPRUN_CHECK(trained_, name(), ": backward after an eval-mode forward");
    bn_.ownPoolBackward(x, dy, arg_.get(), geometry(x), dx);
    arg_.reset();  // one backward per training forward
    trained_ = false;
  }
  std::vector<Param*> params() override { return bn_.params(); }
  std::vector<Buffer*> buffers() override { return bn_.buffers(); }

 private:
  PoolShape geometry(const Tensor& x) const {
    const Shape y = outputShape(x.shape());
    return {.n = x.dim(0), .h = x.dim(2), .w = x.dim(3), .c = x.dim(1), .oh = y[2], .ow = y[3],
            .k = pool_.kernel, .s = pool_.stride, .p = pool_.pad};
  }
  BatchNorm2d bn_;
  Pool2dSpec pool_;
  DeviceArray<uint8_t> arg_;  // the last training forward's winning taps
  bool trained_ = false;
};
}  // namespace

BnPath chooseBnPath(const Context& ctx, bool sync, BnFusedWith fusedWith) {
  return chooseBnPath(BnChoice{.nhwc = ctx.nhwc(),
                               .ours = ctx.ourBatchNorm(),
                               .cudnnFusion = ctx.cudnnBnFusion(),
                               .sync = sync,
                               .fusedWith = fusedWith});
}

std::unique_ptr<Layer> makeBatchNorm2d(std::shared_ptr<Context> ctx, std::string name,
                                       int64_t channels, runtime::ProcessGroup* sync,
                                       BnPath path) {
  return std::make_unique<BatchNorm2d>(std::move(ctx), std::move(name), channels, sync, path);
}

std::unique_ptr<Layer> makeBatchNormActPool(std::shared_ptr<Context> ctx,
                                            const std::string& bnName,
                                            const std::string& poolName, int64_t channels,
                                            runtime::ProcessGroup* sync, const Pool2dSpec& pool,
                                            BnPath path) {
  DDPRUN_CHECK(path.kernels == BnKernels::kOursNhwc && path.fused, bnName,
               ": the fused stem runs on our NHWC kernels with the ReLU fused, not ",
               bnPathName(path, BnFusedWith::kRelu));
  return std::make_unique<FusedBnActPool>(std::move(ctx), bnName, poolName, channels, sync, pool,
                                          path);
}

std::unique_ptr<BatchNormAct> makeBatchNormAct(std::shared_ptr<Context> ctx, std::string name,
                                               int64_t channels, runtime::ProcessGroup* sync,
                                               bool residual, BnPath path) {
  DDPRUN_CHECK(path.fused, name, ": BatchNormAct's own layer runs a fused path only (",
               bnPathName(path, residual ? BnFusedWith::kReluAdd : BnFusedWith::kRelu),
               "); compose the layers apart (Backend::batchNormAct)");
  return std::make_unique<FusedBatchNormAct>(std::move(ctx), std::move(name), channels, sync,
                                             residual, path);
}

}  // namespace ddprun::train::cuda
