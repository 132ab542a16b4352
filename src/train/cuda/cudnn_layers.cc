// The cuDNN layers of the CUDA backend besides convolution (cudnn_conv.cc):
// max pooling and batch norm, through cuDNN's legacy descriptor API (see
// cudnn_conv.cc for why that API); batch norm on 16-bit activations through
// our NHWC kernels (bn_nhwc.h: cuDNN has no bf16 batch norm).
#include <cstdio>
#include <map>
#include <mutex>
#include <set>

#include "bn_nhwc.h"
#include "conv_check.h"  // ScopedDeviceBytes
#include "cuda_layers.h"
#include "ddprun/common/error.h"
#include "ddprun/runtime/collectives.h"
#include "ddprun/runtime/cuda.h"
#include "bn_nchw.h"
#include "elementwise.h"
#include "pool_kernels.h"

namespace ddprun::train::cuda {

namespace {
const float kOne = 1.0f, kZero = 0.0f;

// ------------------------------------------------------------ max pooling
class MaxPool2d final : public Layer {
 public:
  MaxPool2d(std::shared_ptr<Context> ctx, std::string name, const Pool2dSpec& s)
      : Layer(std::move(name)), ctx_(std::move(ctx)), k_(s.kernel),
        stride_(s.stride ? s.stride : s.kernel), pad_(s.pad), arg_(ctx_) {
    DDPRUN_CHECK(k_ > 0 && stride_ > 0 && pad_ >= 0 && pad_ <= k_ / 2, this->name(),
                 ": invalid max pooling (kernel ", k_, ", stride ", stride_, ", pad ", pad_,
                 "; PyTorch needs pad <= kernel / 2)");
    desc_ = PoolDesc::create();
    DDPRUN_CUDNN_OK(cudnnSetPooling2dDescriptor(desc_, CUDNN_POOLING_MAX_DETERMINISTIC,
                                                CUDNN_NOT_PROPAGATE_NAN, k_, k_, pad_, pad_,
                                                stride_, stride_));
    xDesc_ = TensorDesc::create();
    yDesc_ = TensorDesc::create();
    own_ = ctx_->nhwc() && k_ <= 16 && ctx_->ownPool();
  }
  Shape outputShape(const Shape& x) const override {
    DDPRUN_CHECK(x.size() == 4 && x[2] + 2 * pad_ >= k_ && x[3] + 2 * pad_ >= k_, name(),
                 " expects [N, C, H, W] with H, W + 2*", pad_, " >= ", k_, ", got ",
                 shapeString(x));
    return {x[0], x[1], (x[2] + 2 * pad_ - k_) / stride_ + 1, (x[3] + 2 * pad_ - k_) / stride_ + 1};
  }
  // Float or 16-bit elements (the output and dx of x's type; the maximum of
  // 16-bit values is one of them, exact). cuDNN's pooling, or on NHWC our
  // kernels (launchMaxPoolNhwc: where cuDNN refuses the configuration, said
  // once, or with DDPRUN_CUDA_OWN_POOL=1); backward runs what forward ran.
  void forward(const Tensor& x, Tensor& y, bool training) override {
    ctx_->bind();
    y.ensure(outputShape(x.shape()), ctx_->allocator(), x.dtype());
    ownLast_ = false;
    if (y.numel() == 0) return;
    if (!own_) {
      setShapes(x, y.shape());
      const cudnnStatus_t st = cudnnPoolingForward(ctx_->cudnn(), desc_, &kOne, xDesc_, x.raw(),
                                                   &kZero, yDesc_, y.raw());
      if (st == CUDNN_STATUS_SUCCESS) return;
      if (!ctx_->nhwc() || (st != CUDNN_STATUS_NOT_SUPPORTED && st != CUDNN_STATUS_BAD_PARAM))
        DDPRUN_CUDNN_OK(st);
      own_ = true;
      std::fprintf(stderr, "ddprun: %s: cuDNN refused %s max pooling (%s); using our NHWC "
                   "kernels\n", name().c_str(), runtime::dtypeName(x.dtype()),
                   cudnnGetErrorString(st));
    }
    uint8_t* arg = training ? arg_.ensure(static_cast<size_t>(y.numel())) : nullptr;
    launchMaxPoolNhwc(x.raw(), y.raw(), arg, x.dtype(), x.dim(0), x.dim(1), x.dim(2), x.dim(3),
                      y.dim(2), y.dim(3), k_, stride_, pad_, ctx_->stream());
    ownLast_ = training;
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override {
    if (!dx) return;
    ctx_->bind();
    checkType(dy, y, name().c_str());
    dx->ensureLike(x, ctx_->allocator());
    if (y.numel() == 0) return;
    if (ownLast_) {
      launchMaxPoolNhwcBackward(dy.raw(), arg_.get(), dx->raw(), x.dtype(), x.dim(0), x.dim(1),
                                x.dim(2), x.dim(3), y.dim(2), y.dim(3), k_, stride_, pad_,
                                ctx_->stream());
      arg_.reset();  // one backward per training forward
      ownLast_ = false;
      return;
    }
    DDPRUN_CHECK(!own_, name(), ": backward after an evaluation forward of our pooling kernels "
                 "(they keep the winners only in training)");
    setShapes(x, y.shape());
    DDPRUN_CUDNN_OK(cudnnPoolingBackward(ctx_->cudnn(), desc_, &kOne, yDesc_, y.raw(), yDesc_,
                                         dy.raw(), xDesc_, x.raw(), &kZero, xDesc_, dx->raw()));
  }

 private:
  void setShapes(const Tensor& x, const Shape& y) {
    const cudnnDataType_t t = cudnnType(x.dtype());
    setTensor4d(xDesc_, x.dim(0), x.dim(1), x.dim(2), x.dim(3), t, ctx_->nhwc());
    setTensor4d(yDesc_, y[0], y[1], y[2], y[3], t, ctx_->nhwc());
  }
  std::shared_ptr<Context> ctx_;
  int k_, stride_, pad_;
  PoolDesc desc_;
  TensorDesc xDesc_, yDesc_;
  // Our NHWC kernels: in use (from the start with DDPRUN_CUDA_OWN_POOL=1, or
  // once cuDNN refused), the last forward ran them in training, and the
  // winning taps it kept for backward.
  bool own_ = false, ownLast_ = false;
  DeviceArray<uint8_t> arg_;
};

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
struct StepCounter {
  Tensor count;  // one float on the device
  std::string leader;
  std::set<std::string> names;
  int64_t leaderForwards = 0;  // the leader's training forwards (host)
};

std::shared_ptr<StepCounter> joinStepCounter(const std::shared_ptr<Context>& ctx,
                                             const std::string& name) {
  static std::mutex mu;
  static std::map<const Context*, std::weak_ptr<StepCounter>> groups;
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = groups.begin(); it != groups.end();)
    it = it->second.expired() ? groups.erase(it) : std::next(it);
  std::shared_ptr<StepCounter> g = groups[ctx.get()].lock();
  if (!g || g->names.count(name)) {
    g = std::make_shared<StepCounter>();
    g->count = Tensor({1}, ctx->allocator());  // zero
    g->leader = name;
    groups[ctx.get()] = g;
  }
  g->names.insert(name);
  return g;
}

// ------------------------------------------------------------- batch norm
// Without `sync`: cuDNN's spatial batch norm (training: batch statistics,
// running mean/var updated with factor 0.1 and the unbiased variance, as
// PyTorch; backward accumulates dgamma/dbeta with beta = 1).
// With `sync` (SyncBatchNorm): the CPU backend's algorithm on our kernels:
// per-channel sums in double, all-reduced (with the element count) over the
// group on device buffers; then the squared deviations likewise; backward
// all-reduces S1 = sum dy, S2 = sum dy*xhat and the count. dgamma/dbeta are
// the local sums (the reducer averages them like every gradient). Each
// all-reduce waits for the stream first: SyncBN is synchronous by nature.
// Eval mode uses cuDNN's inference kernel with the running statistics either way.
// Gradients follow Param::overwriteGrad (cuDNN's betaParamDiff 0, or the
// kernel's "=" form); num_batches_tracked is the shared counter above.
class BatchNorm2d final : public Layer {
 public:
  BatchNorm2d(std::shared_ptr<Context> ctx, std::string name, int64_t c,
              runtime::ProcessGroup* sync)
      : Layer(name), ctx_(std::move(ctx)), c_(c), sync_(sync),
        w_(makeDeviceParam(*ctx_, name + ".weight", {c})),
        b_(makeDeviceParam(*ctx_, name + ".bias", {c})), sums_(ctx_), sqdev_(ctx_),
        reserve_(ctx_) {
    DDPRUN_CHECK(c > 0, name, ": batch norm needs at least one channel");
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
    ex_ = ctx_->nhwc();
  }
  Shape outputShape(const Shape& s) const override {
    DDPRUN_CHECK(s.size() == 4 && s[1] == c_, name(), " expects [N, ", c_, ", H, W], got ",
                 shapeString(s));
    return s;
  }
  void forward(const Tensor& x, Tensor& y, bool training) override {
    if (ours(x)) return ownForward(x, nullptr, y, false, training);
    ctx_->bind();
    y.ensure(outputShape(x.shape()), ctx_->allocator());
    trained_ = training;
    if (!training) {
      if (x.numel() == 0) return;
      setInput(x);
      DDPRUN_CUDNN_OK(cudnnBatchNormalizationForwardInference(
          ctx_->cudnn(), CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, xDesc_, x.data(), xDesc_,
          y.data(), bnDesc_, w_.value.data(), b_.value.data(), rm_.value.data(),
          rv_.value.data(), kEps));
      return;
    }
    if (sync_) {
      syncForward(x, y);
    } else {
      DDPRUN_CHECK(x.dim(0) * x.dim(2) * x.dim(3) > 1, name(), ": batch norm in training needs "
                   "more than one value per channel, got input ", shapeString(x.shape()));
      setInput(x);
      if (!ex_ || !forwardEx(x, y)) {
        DDPRUN_CUDNN_OK(cudnnBatchNormalizationForwardTraining(
            ctx_->cudnn(), CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, xDesc_, x.data(), xDesc_,
            y.data(), bnDesc_, w_.value.data(), b_.value.data(), kMomentum, rm_.value.data(),
            rv_.value.data(), kEps, saveMean_.data(), saveInvStd_.data()));
      }
    }
    countStep();
  }
  bool backwardReadsOutput() const override { return false; }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) override {
    if (ours(x)) return ownBackward(x, nullptr, dy, dx, nullptr, false);
    DDPRUN_CHECK(trained_, name(), ": backward after an eval-mode forward (batch norm keeps "
                 "batch statistics only in training)");
    ctx_->bind();
    if (sync_) return syncBackward(x, dy, dx);
    Tensor* out = dx;
    if (!out) out = &scratch_;
    out->ensure(x.shape(), ctx_->allocator());
    if (x.numel() == 0) return zeroFlaggedGrads(true);
    // One betaParamDiff serves both gradients: 0 when both are to be
    // overwritten; a lone flagged one is zeroed first and accumulated into.
    const bool overwrite = w_.overwriteGrad && b_.overwriteGrad;
    if (!overwrite) zeroFlaggedGrads(false);
    setInput(x);
    if (ex_) {
      exBackward(x, nullptr, dy, *out, nullptr, CUDNN_BATCHNORM_OPS_BN, overwrite);
    } else {
      DDPRUN_CUDNN_OK(cudnnBatchNormalizationBackward(
          ctx_->cudnn(), CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, &kOne,
          overwrite ? &kZero : &kOne, xDesc_, x.data(), xDesc_, dy.data(), xDesc_, out->data(),
          bnDesc_, w_.value.data(), w_.grad.data(), b_.grad.data(), kEps, saveMean_.data(),
          saveInvStd_.data()));
    }
    w_.overwriteGrad = b_.overwriteGrad = false;
  }
  std::vector<Param*> params() override { return {&w_, &b_}; }
  std::vector<Buffer*> buffers() override { return {&rm_, &rv_, &nbt_}; }

  // Whether x goes through our kernels (ownForward/ownBackward): 16-bit x,
  // or Context::ourBatchNorm.
  bool ours(const Tensor& x) const { return x.is16() || ctx_->ourBatchNorm(); }
  // Our NHWC kernels (bn_nhwc.h), for x of any element type (16-bit
  // activations take this path, and float ones with Context::ourBatchNorm;
  // SyncBatchNorm included): y = bn(x), plus z
  // (not null) and then the ReLU (`relu`) in the same pass; training with
  // the batch's statistics (sums in double, all-reduced with sync_),
  // evaluation with the running ones. Statistics, parameters and running
  // stats are float; y has x's element type.
  void ownForward(const Tensor& x, const Tensor* z, Tensor& y, bool relu, bool training) {
    ctx_->bind();
    DDPRUN_CHECK(ctx_->nhwc(), name(), ": the batch norm kernels of 16-bit activations are "
                 "NHWC kernels, but this backend's activations are NCHW");
    if (z) checkSame16(*z, x, "the residual");
    y.ensure(outputShape(x.shape()), ctx_->allocator(), x.dtype());
    trained_ = training;
    const int64_t rows = rowsOf(x);
    const void* zp = z ? z->raw() : nullptr;
    if (!training) {
      if (x.numel() == 0) return;
      launchBnNhwcInvStd(rv_.value.data(), c_, kEps, evalInvStd_.data(), ctx_->stream());
      launchBnNhwcForward(x.raw(), zp, y.raw(), x.dtype(), rows, c_, rm_.value.data(),
                          evalInvStd_.data(), w_.value.data(), b_.value.data(), relu,
                          ctx_->stream());
      return;
    }
    if (!sync_)
      DDPRUN_CHECK(rows > 1, name(), ": batch norm in training needs more than one value per "
                   "channel, got input ", shapeString(x.shape()));
    double* s = sums_.ensure(static_cast<size_t>(2 * c_ + 1));
    {
      ScopedDeviceBytes ws(*ctx_, bnNhwcWorkspaceBytes(rows, c_));
      launchBnNhwcStats(x.raw(), x.dtype(), rows, c_, ws.get(), s, ctx_->stream());
    }
    if (sync_) {
      allReduce(s, static_cast<size_t>(2 * c_ + 1));
      double count = 0;
      ctx_->readBack(s + 2 * c_, &count, sizeof(count));
      DDPRUN_CHECK(count > 0, name(), ": empty batch");
    }
    launchBnNhwcFinish(s, c_, kEps, kMomentum, saveMean_.data(), saveInvStd_.data(),
                       rm_.value.data(), rv_.value.data(), ctx_->stream());
    launchBnNhwcForward(x.raw(), zp, y.raw(), x.dtype(), rows, c_, saveMean_.data(),
                        saveInvStd_.data(), w_.value.data(), b_.value.data(), relu,
                        ctx_->stream());
    countStep();
  }
  // Its backward from dL/dy: with `relu`, the ReLU's mask from y (forward's
  // output) folded in; dz (not null: the residual's gradient, the masked dy)
  // written in the same pass as the sums; dx (not null) from the (global)
  // sums. dgamma/dbeta are the local sums (written or added, overwriteGrad).
  void ownBackward(const Tensor& x, const Tensor* y, const Tensor& dy, Tensor* dx, Tensor* dz,
                   bool relu) {
    DDPRUN_CHECK(trained_, name(), ": backward after an eval-mode forward (batch norm keeps "
                 "batch statistics only in training)");
    DDPRUN_CHECK(!relu || y, name(), ": the fused ReLU's backward needs forward's output");
    ctx_->bind();
    checkSame16(dy, x, "dL/dy");
    if (dz) dz->ensureLike(x, ctx_->allocator());
    if (dx) dx->ensureLike(x, ctx_->allocator());
    const int64_t rows = rowsOf(x);
    double* s = sums_.ensure(static_cast<size_t>(2 * c_ + 1));
    const void* yp = y ? y->raw() : nullptr;
    {
      ScopedDeviceBytes ws(*ctx_, bnNhwcWorkspaceBytes(rows, c_));
      launchBnNhwcBackwardSums(x.raw(), yp, dy.raw(), dz ? dz->raw() : nullptr, x.dtype(), rows,
                               c_, saveMean_.data(), saveInvStd_.data(), relu, ws.get(), s,
                               ctx_->stream());
    }
    launchBnParamGrads(s, c_, w_.grad.data(), b_.grad.data(), w_.overwriteGrad,
                       b_.overwriteGrad, ctx_->stream());
    w_.overwriteGrad = b_.overwriteGrad = false;
    if (sync_) allReduce(s, static_cast<size_t>(2 * c_ + 1));
    if (!dx || rows == 0) return;
    launchBnNhwcBackwardData(x.raw(), yp, dy.raw(), dz ? dz->raw() : nullptr, dx->raw(),
                             x.dtype(), rows, c_, s, w_.value.data(), saveMean_.data(),
                             saveInvStd_.data(), relu, ctx_->stream());
  }

  // BatchNormAct in one cuDNN call each way (NHWC, not SyncBatchNorm): the
  // training forward y = relu(bn(x) + z) (z null: relu(bn(x))), false where
  // cuDNN refuses the fused configuration (nothing done; the caller runs the
  // layers apart, and this layer does not try again).
  bool fusedForward(const Tensor& x, const Tensor* z, Tensor& y) {
    if (!ex_ || sync_ || !fuse_) return false;
    ctx_->bind();
    y.ensure(outputShape(x.shape()), ctx_->allocator());
    DDPRUN_CHECK(x.dim(0) * x.dim(2) * x.dim(3) > 1, name(), ": batch norm in training needs "
                 "more than one value per channel, got input ", shapeString(x.shape()));
    setInput(x);
    const cudnnBatchNormOps_t ops =
        z ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION : CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
    const cudnnStatus_t st = exForward(x, z, y, ops);
    if (st != CUDNN_STATUS_SUCCESS) {
      fuse_ = false;
      std::fprintf(stderr, "ddprun: %s: cuDNN refused batch norm fused with the ReLU%s (%s); "
                   "running them apart\n", name().c_str(), z ? " and the residual add" : "",
                   cudnnGetErrorString(st));
      return false;
    }
    trained_ = true;
    fusedOps_ = ops;
    countStep();
    return true;
  }
  // The backward of the last fusedForward: dx, and dz (required with a
  // residual) the ReLU's masked dy.
  void fusedBackward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx, Tensor* dz) {
    DDPRUN_CHECK(trained_ && fusedOps_ != CUDNN_BATCHNORM_OPS_BN, name(),
                 ": fused backward without a fused training forward");
    DDPRUN_CHECK((dz != nullptr) == (fusedOps_ == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION), name(),
                 ": the residual's gradient is given exactly when forward added a residual");
    ctx_->bind();
    dx.ensure(x.shape(), ctx_->allocator());
    if (dz) dz->ensure(x.shape(), ctx_->allocator());
    if (x.numel() == 0) return zeroFlaggedGrads(true);
    const bool overwrite = w_.overwriteGrad && b_.overwriteGrad;
    if (!overwrite) zeroFlaggedGrads(false);
    setInput(x);
    exBackward(x, &y, dy, dx, dz, fusedOps_, overwrite);
    w_.overwriteGrad = b_.overwriteGrad = false;
    fusedOps_ = CUDNN_BATCHNORM_OPS_BN;
  }

 private:
  static constexpr double kEps = 1e-5, kMomentum = 0.1;

  // NHWC training: cuDNN's Ex API in SPATIAL_PERSISTENT mode, which runs its
  // NHWC kernels (what PyTorch calls for channels_last; the plain API runs
  // the NCHW kernels over NHWC data, 5x slower on an H200). Its reserve space
  // goes from forward to backward (exBackward). False (and ex_ off for good):
  // cuDNN refused the configuration; the caller runs the plain API.
  static constexpr cudnnBatchNormMode_t kExMode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
  bool forwardEx(const Tensor& x, Tensor& y) {
    const cudnnStatus_t st = exForward(x, nullptr, y, CUDNN_BATCHNORM_OPS_BN);
    if (st == CUDNN_STATUS_SUCCESS) return true;
    ex_ = false;
    std::fprintf(stderr, "ddprun: %s: cuDNN refused its NHWC batch norm (%s); using the "
                 "plain kernels\n", name().c_str(), cudnnGetErrorString(st));
    return false;
  }
  // The Ex API's training forward with `ops` (the ReLU, and the add of z,
  // where ops say so): SUCCESS, or the status with which cuDNN refused the
  // configuration (NOT_SUPPORTED, BAD_PARAM: nothing was done); other
  // failures throw.
  cudnnStatus_t exForward(const Tensor& x, const Tensor* z, Tensor& y, cudnnBatchNormOps_t ops) {
    const cudnnActivationDescriptor_t act = activation(ops);
    const cudnnTensorDescriptor_t zDesc = z ? xDesc_.get() : nullptr;
    size_t wsBytes = 0, rsBytes = 0;
    cudnnStatus_t st = cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
        ctx_->cudnn(), kExMode, ops, xDesc_, xDesc_, xDesc_, bnDesc_, act, &wsBytes);
    if (st == CUDNN_STATUS_SUCCESS)
      st = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(ctx_->cudnn(), kExMode, ops, act,
                                                                xDesc_, &rsBytes);
    if (st == CUDNN_STATUS_SUCCESS) {
      ScopedDeviceBytes ws(*ctx_, wsBytes);
      reserve_.reset();
      reserveBytes_ = rsBytes;
      st = cudnnBatchNormalizationForwardTrainingEx(
          ctx_->cudnn(), kExMode, ops, &kOne, &kZero, xDesc_, x.data(), zDesc,
          z ? z->data() : nullptr, xDesc_, y.data(), bnDesc_, w_.value.data(), b_.value.data(),
          kMomentum, rm_.value.data(), rv_.value.data(), kEps, saveMean_.data(),
          saveInvStd_.data(), act, ws.get(), wsBytes,
          rsBytes ? reserve_.ensure(rsBytes) : nullptr, rsBytes);
    }
    if (st == CUDNN_STATUS_NOT_SUPPORTED || st == CUDNN_STATUS_BAD_PARAM) {
      reserve_.reset();
      return st;
    }
    DDPRUN_CUDNN_OK(st);
    return st;
  }
  // Its backward: dx, and dz where ops add a residual; y (forward's output)
  // where ops have the ReLU.
  void exBackward(const Tensor& x, const Tensor* y, const Tensor& dy, Tensor& dx, Tensor* dz,
                  cudnnBatchNormOps_t ops, bool overwrite) {
    const cudnnActivationDescriptor_t act = activation(ops);
    const cudnnTensorDescriptor_t yDesc = y ? xDesc_.get() : nullptr;
    const cudnnTensorDescriptor_t dzDesc = dz ? xDesc_.get() : nullptr;
    size_t wsBytes = 0;
    DDPRUN_CUDNN_OK(cudnnGetBatchNormalizationBackwardExWorkspaceSize(
        ctx_->cudnn(), kExMode, ops, xDesc_, xDesc_, xDesc_, dzDesc, xDesc_, bnDesc_, act,
        &wsBytes));
    ScopedDeviceBytes ws(*ctx_, wsBytes);
    DDPRUN_CUDNN_OK(cudnnBatchNormalizationBackwardEx(
        ctx_->cudnn(), kExMode, ops, &kOne, &kZero, &kOne, overwrite ? &kZero : &kOne, xDesc_,
        x.data(), yDesc, y ? y->data() : nullptr, xDesc_, dy.data(), dzDesc,
        dz ? dz->data() : nullptr, xDesc_, dx.data(), bnDesc_, w_.value.data(),
        act ? b_.value.data() : nullptr, w_.grad.data(), b_.grad.data(), kEps, saveMean_.data(),
        saveInvStd_.data(), act, ws.get(), wsBytes, reserve_.get(), reserveBytes_));
    reserve_.reset();  // one backward per training forward
  }
  // The ReLU's descriptor for ops with an activation, else null.
  cudnnActivationDescriptor_t activation(cudnnBatchNormOps_t ops) {
    if (ops == CUDNN_BATCHNORM_OPS_BN) return nullptr;
    if (!relu_) {
      relu_ = ActivationDesc::create();
      DDPRUN_CUDNN_OK(cudnnSetActivationDescriptor(relu_, CUDNN_ACTIVATION_RELU,
                                                   CUDNN_NOT_PROPAGATE_NAN, 0.0));
    }
    return relu_;
  }

  // InvalidArgument unless t has x's shape and element type.
  void checkSame16(const Tensor& t, const Tensor& x, const char* what) const {
    DDPRUN_CHECK(t.shape() == x.shape(), name(), ": ", what, " is ", shapeString(t.shape()),
                 ", the input ", shapeString(x.shape()));
    checkType(t, x, name().c_str());
  }
  // x's descriptor (the context's layout) and, NHWC, the parameters' derived
  // from it.
  void setInput(const Tensor& x) {
    setTensor4d(xDesc_, x.dim(0), x.dim(1), x.dim(2), x.dim(3), CUDNN_DATA_FLOAT, ctx_->nhwc());
    if (ctx_->nhwc())
      DDPRUN_CUDNN_OK(cudnnDeriveBNTensorDescriptor(bnDesc_, xDesc_, CUDNN_BATCHNORM_SPATIAL));
  }
  // The per-channel kernels' view of x: NCHW as [N, C, H*W], NHWC as
  // [N*H*W, C, 1] (bn_nchw.h).
  int64_t rowsOf(const Tensor& x) const {
    return ctx_->nhwc() ? x.dim(0) * x.dim(2) * x.dim(3) : x.dim(0);
  }
  int64_t planeOf(const Tensor& x) const { return ctx_->nhwc() ? 1 : x.dim(2) * x.dim(3); }

  // One training forward: the leader advances the shared counter; every
  // other member checks that it keeps step with the leader (its forwards
  // equal the leader's, or one ahead within a step the leader has not reached
  // yet), since its count is the leader's.
  void countStep() {
    if (leader_) {
      launchAddScalar(nbt_.value.data(), 1.0f, ctx_->stream());
      ++counter_->leaderForwards;
      return;
    }
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
  void zeroFlaggedGrads(bool clear) {
    for (Param* p : {&w_, &b_}) {
      if (p->overwriteGrad)
        DDPRUN_CUDA_OK(cudaMemsetAsync(p->grad.data(), 0, p->grad.bytes(), ctx_->stream()));
      if (clear) p->overwriteGrad = false;
    }
  }

  void allReduce(double* buf, size_t count) {
    ctx_->synchronize();  // the group's stream does not wait for ours
    runtime::allReduce(*sync_, {.output = buf, .count = count, .dtype = runtime::DType::kFloat64,
                                .device = runtime::Device::kCuda});
  }
  void syncForward(const Tensor& x, Tensor& y) {
    const int64_t n = rowsOf(x), hw = planeOf(x);
    double* s = sums_.ensure(static_cast<size_t>(2 * c_ + 1));
    double* q = sqdev_.ensure(static_cast<size_t>(c_));
    launchChannelSum(x.data(), n, c_, hw, s, ctx_->stream());
    allReduce(s, static_cast<size_t>(c_ + 1));
    double count = 0;
    ctx_->readBack(s + c_, &count, sizeof(count));
    DDPRUN_CHECK(count > 0, name(), ": empty batch");
    launchChannelSquaredDeviation(x.data(), n, c_, hw, s, q, ctx_->stream());
    allReduce(q, static_cast<size_t>(c_));
    launchBnFinishStats(s, q, c_, kEps, kMomentum, saveMean_.data(), saveInvStd_.data(),
                        rm_.value.data(), rv_.value.data(), ctx_->stream());
    xhat_.ensure(x.shape(), ctx_->allocator());
    launchBnNormalize(x.data(), saveMean_.data(), saveInvStd_.data(), w_.value.data(),
                      b_.value.data(), xhat_.data(), y.data(), n, c_, hw, ctx_->stream());
  }
  void syncBackward(const Tensor& x, const Tensor& dy, Tensor* dx) {
    const int64_t n = rowsOf(x), hw = planeOf(x);
    double* s = sums_.ensure(static_cast<size_t>(2 * c_ + 1));
    launchBnBackwardSums(dy.data(), xhat_.data(), n, c_, hw, s, ctx_->stream());
    launchBnParamGrads(s, c_, w_.grad.data(), b_.grad.data(), w_.overwriteGrad,
                       b_.overwriteGrad, ctx_->stream());
    w_.overwriteGrad = b_.overwriteGrad = false;
    allReduce(s, static_cast<size_t>(2 * c_ + 1));
    if (!dx) return;
    dx->ensure(x.shape(), ctx_->allocator());
    launchBnBackwardData(dy.data(), xhat_.data(), s, w_.value.data(), saveInvStd_.data(),
                         dx->data(), n, c_, hw, ctx_->stream());
  }

  std::shared_ptr<Context> ctx_;
  int64_t c_;
  runtime::ProcessGroup* sync_;
  Param w_, b_;
  Buffer rm_, rv_, nbt_;
  TensorDesc xDesc_, bnDesc_;
  Tensor saveMean_, saveInvStd_, scratch_, xhat_;
  Tensor evalInvStd_;  // ownForward's in evaluation, from the running variance
  DeviceArray<double> sums_, sqdev_;
  bool trained_ = false;
  // NHWC: training through forwardEx/backwardEx (cuDNN's persistent NHWC
  // kernels; deterministic, cuDNN's documentation says, through a scaled
  // integer reduction), off where cuDNN refuses them.
  bool ex_ = false;
  DeviceArray<uint8_t> reserve_;  // the Ex API's, forward to backward
  size_t reserveBytes_ = 0;
  ActivationDesc relu_;  // the fused ReLU's (activation())
  // BatchNormAct: cuDNN's fused forward may still be tried (off once refused),
  // and the ops the last training forward ran with (BN: not fused).
  bool fuse_ = true;
  cudnnBatchNormOps_t fusedOps_ = CUDNN_BATCHNORM_OPS_BN;
  std::shared_ptr<StepCounter> counter_;
  bool leader_ = false;
  int64_t forwards_ = 0;  // a follower's training forwards (host)
};

// ------------------------------------------------- batch norm + ReLU (+ add)
// BatchNormAct on NHWC: cuDNN's fused training forward and backward
// (BatchNorm2d::fusedForward/fusedBackward) where cuDNN accepts them; else,
// and in evaluation, the batch norm, our add and our ReLU apart (the
// composition Backend::batchNormAct would make), so both paths keep the
// contract: y = relu(bn(x) + z), dz = the ReLU's masked dy.
class FusedBatchNormAct final : public BatchNormAct {
 public:
  FusedBatchNormAct(std::shared_ptr<Context> ctx, std::string name, int64_t c,
                    runtime::ProcessGroup* sync, bool residual)
      : BatchNormAct(name, residual), ctx_(ctx), bn_(std::move(ctx), name, c, sync) {}
  using BatchNormAct::backward;
  using BatchNormAct::forward;
  void forward(const Tensor& x, const Tensor* z, Tensor& y, bool training) override {
    checkResidual(z);
    own_ = bn_.ours(x);  // our fused kernels, forward and back
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
  std::vector<Param*> params() override { return bn_.params(); }
  std::vector<Buffer*> buffers() override { return bn_.buffers(); }

 private:
  std::shared_ptr<Context> ctx_;
  BatchNorm2d bn_;
  bool fused_ = false;  // the last forward ran cuDNN's fused kernels (its backward must too)
  bool own_ = false;    // the last forward ran ours (16-bit activations)
  Tensor g_, scratch_;  // apart: dL/d(bn's output) without a residual; dx nobody wants
};

}  // namespace

std::unique_ptr<BatchNormAct> makeBatchNormAct(std::shared_ptr<Context> ctx, std::string name,
                                               int64_t channels, runtime::ProcessGroup* sync,
                                               bool residual) {
  return std::make_unique<FusedBatchNormAct>(std::move(ctx), std::move(name), channels, sync,
                                             residual);
}

std::unique_ptr<Layer> makeMaxPool2d(std::shared_ptr<Context> ctx, std::string name,
                                     const Pool2dSpec& spec) {
  return std::make_unique<MaxPool2d>(std::move(ctx), std::move(name), spec);
}
std::unique_ptr<Layer> makeBatchNorm2d(std::shared_ptr<Context> ctx, std::string name,
                                       int64_t channels, runtime::ProcessGroup* sync) {
  return std::make_unique<BatchNorm2d>(std::move(ctx), std::move(name), channels, sync);
}

}  // namespace ddprun::train::cuda
