// The batch norm layer's paths on our kernels (batch_norm.h, bn_path.h):
// kOursNhwc, bn_nhwc.h's fused NHWC kernels for activations of any element
// type (16-bit activations always take it; float ones with ourBatchNorm),
// SyncBatchNorm included; and kOursSync, SyncBatchNorm on float activations
// with the CPU backend's algorithm on bn_nchw.h's kernels: per-channel sums
// in double, all-reduced (with the element count) over the group on device
// buffers, then the squared deviations likewise; backward all-reduces
// S1 = sum dy, S2 = sum dy*xhat and the count. Each all-reduce waits for the
// stream first: SyncBatchNorm is synchronous by nature.
#include "batch_norm.h"
#include "bn_nchw.h"
#include "bn_nhwc.h"
#include "conv_check.h"  // ScopedDeviceBytes
#include "cuda_layers.h"
#include "ddprun/common/error.h"
#include "ddprun/runtime/collectives.h"

namespace ddprun::train::cuda {

void BatchNorm2d::ownForward(const Tensor& x, const Tensor* z, Tensor& y, bool relu,
                             bool training) {
  ctx_->bind();
  DDPRUN_CHECK(ctx_->nhwc(), name(), ": the batch norm kernels of 16-bit activations are "
               "NHWC kernels, but this backend's activations are NCHW");
  if (z) checkSame16(*z, x, "the residual");
  y.ensure(outputShape(x.shape()), ctx_->allocator(), x.dtype());
  trained_ = training;
  if (!training && x.numel() == 0) return;
  const auto [mean, invstd] = ownStatistics(x, training);
  launchBnNhwcForward(x.raw(), z ? z->raw() : nullptr, y.raw(), x.dtype(), rowsOf(x), c_, mean,
                      invstd, w_.value.data(), b_.value.data(), relu, ctx_->kernelStream());
  if (training) countStep();
}

void BatchNorm2d::ownRecompute(const Tensor& x, Tensor& y) {
  DDPRUN_CHECK(trained_, name(), ": recompute after an eval-mode forward (batch norm keeps "
               "batch statistics only in training)");
  ctx_->bind();
  y.ensure(outputShape(x.shape()), ctx_->allocator(), x.dtype());
  launchBnNhwcForward(x.raw(), nullptr, y.raw(), x.dtype(), rowsOf(x), c_, saveMean_.data(),
                      saveInvStd_.data(), w_.value.data(), b_.value.data(), true,
                      ctx_->kernelStream());
}

std::pair<const float*, const float*> BatchNorm2d::ownStatistics(const Tensor& x,
                                                                 bool training) {
  if (!training) {
    launchBnNhwcInvStd(rv_.value.data(), c_, kEps, evalInvStd_.data(), ctx_->kernelStream());
    return {rm_.value.data(), evalInvStd_.data()};
  }
  const int64_t rows = rowsOf(x);
  if (!sync_)
    DDPRUN_CHECK(rows > 1, name(), ": batch norm in training needs more than one value per "
                 "channel, got input ", shapeString(x.shape()));
  double* s = sums_.ensure(static_cast<size_t>(2 * c_ + 1));
  // The finish from the local sums with them (SyncBatchNorm: after the all-reduce).
  BnFold f = fold();
  const BnFold::Finish finish{kEps, kMomentum, saveMean_.data(), saveInvStd_.data(),
                              rm_.value.data(), rv_.value.data()};
  if (!sync_) f.finish = finish;
  {
    ScopedDeviceBytes ws(*ctx_, bnNhwcWorkspaceBytes(rows, c_));
    launchBnNhwcStats(x.raw(), x.dtype(), rows, c_, ws.get(), s, ctx_->kernelStream(), &f);
  }
  if (sync_) {
    allReduce(s, static_cast<size_t>(2 * c_ + 1));
    double count = 0;
    ctx_->readBack(s + 2 * c_, &count, sizeof(count));
    DDPRUN_CHECK(count > 0, name(), ": empty batch");
    launchBnNhwcFinish(s, c_, kEps, kMomentum, saveMean_.data(), saveInvStd_.data(),
                       rm_.value.data(), rv_.value.data(), ctx_->kernelStream());
  }
  return {saveMean_.data(), saveInvStd_.data()};
}

void BatchNorm2d::ownPoolForward(const Tensor& x, Tensor& y, const PoolShape& g,
                                 uint8_t* arg, bool training) {
  ctx_->bind();
  DDPRUN_CHECK(ctx_->nhwc() && path_.kernels == BnKernels::kOursNhwc, name(),
               ": the fused stem runs our NHWC batch norm kernels only");
  outputShape(x.shape());
  y.ensure({g.n, g.c, g.oh, g.ow}, ctx_->allocator(), x.dtype());
  trained_ = training;
  if (!training && x.numel() == 0) return;
  const auto [mean, invstd] = ownStatistics(x, training);
  launchBnActPoolForward(x.raw(), y.raw(), training ? arg : nullptr, x.dtype(), g, mean, invstd,
                         w_.value.data(), b_.value.data(), ctx_->stream());
  if (training) countStep();
}

void BatchNorm2d::ownPoolBackward(const Tensor& x, const Tensor& dy, const uint8_t* arg,
                                  const PoolShape& g, Tensor* dx) {
  DDPRUN_CHECK(trained_ && arg, name(), ": backward after an eval-mode forward (batch norm "
               "keeps batch statistics only in training)");
  ctx_->bind();
  checkType(dy, x, name().c_str());
  DDPRUN_CHECK(dy.shape() == Shape({g.n, g.c, g.oh, g.ow}), name(), ": dL/dy is ",
               shapeString(dy.shape()), ", the pooled output [", g.n, ", ", g.c, ", ", g.oh,
               ", ", g.ow, "]");
  if (dx) dx->ensureLike(x, ctx_->allocator());
  const int64_t rows = rowsOf(x);
  double* s = sums_.ensure(static_cast<size_t>(2 * c_ + 1));
  {  // the masked gradient into dx's buffer (none without dx: the sums alone)
    ScopedDeviceBytes ws(*ctx_, bnNhwcWorkspaceBytes(rows, c_));
    const BnFold f = gradsFold();
    launchBnActPoolBackwardSums(x.raw(), dy.raw(), arg, dx ? dx->raw() : nullptr, x.dtype(), g,
                                saveMean_.data(), saveInvStd_.data(), w_.value.data(),
                                b_.value.data(), ws.get(), s, ctx_->kernelStream(), &f);
  }
  if (sync_) allReduce(s, static_cast<size_t>(2 * c_ + 1));
  if (!dx || rows == 0) return;
  // g (written into dx's buffer) to dx, in place.
  launchBnNhwcBackwardData(x.raw(), nullptr, nullptr, dx->raw(), dx->raw(), x.dtype(), rows, c_,
                           s, w_.value.data(), saveMean_.data(), saveInvStd_.data(), false,
                           ctx_->kernelStream());
}

void BatchNorm2d::ownBackward(const Tensor& x, const Tensor* y, const Tensor& dy, Tensor* dx,
                              Tensor* dz, bool relu) {
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
    const BnFold f = gradsFold();
    launchBnNhwcBackwardSums(x.raw(), yp, dy.raw(), dz ? dz->raw() : nullptr, x.dtype(), rows,
                             c_, saveMean_.data(), saveInvStd_.data(), relu, ws.get(), s,
                             ctx_->kernelStream(), &f);
  }
  if (sync_) allReduce(s, static_cast<size_t>(2 * c_ + 1));
  if (!dx || rows == 0) return;
  launchBnNhwcBackwardData(x.raw(), yp, dy.raw(), dz ? dz->raw() : nullptr, dx->raw(),
                           x.dtype(), rows, c_, s, w_.value.data(), saveMean_.data(),
                           saveInvStd_.data(), relu, ctx_->kernelStream());
}

BnFold BatchNorm2d::fold() {
  BnFold f;
  if (!ctx_->bnFold()) return f;
  if (!foldCounters_.get()) {
    const size_t n = bnNhwcFoldCounters(c_);
    foldCounters_.ensure(n);
    DDPRUN_CUDA_OK(cudaMemsetAsync(foldCounters_.get(), 0, n * sizeof(unsigned), ctx_->stream()));
  }
  f.counters = foldCounters_.get();
  return f;
}

// The backward sums' fold: the parameter gradients from the local sums (as
// PyTorch's SyncBatchNorm, before any all-reduce), this step's first
// contribution overwriting (Param::overwriteGrad).
BnFold BatchNorm2d::gradsFold() {
  BnFold f = fold();
  f.grads = {w_.grad.data(), b_.grad.data(), w_.overwriteGrad, b_.overwriteGrad};
  w_.overwriteGrad = b_.overwriteGrad = false;
  return f;
}

// InvalidArgument unless t has x's shape and element type.
void BatchNorm2d::checkSame16(const Tensor& t, const Tensor& x, const char* what) const {
  DDPRUN_CHECK(t.shape() == x.shape(), name(), ": ", what, " is ", shapeString(t.shape()),
               ", the input ", shapeString(x.shape()));
  checkType(t, x, name().c_str());
}

void BatchNorm2d::allReduce(double* buf, size_t count) {
  ctx_->synchronize();  // the group's stream does not wait for ours
  runtime::allReduce(*sync_, {.output = buf, .count = count, .dtype = runtime::DType::kFloat64,
                              .device = runtime::Device::kCuda});
}

void BatchNorm2d::syncForward(const Tensor& x, Tensor& y) {
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

void BatchNorm2d::syncBackward(const Tensor& x, const Tensor& dy, Tensor* dx) {
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

}  // namespace ddprun::train::cuda
