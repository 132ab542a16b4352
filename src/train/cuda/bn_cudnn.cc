// The batch norm layer's cuDNN paths (batch_norm.h, bn_path.h): kCudnnNchw
// (cuDNN's spatial batch norm: cudnnBatchNormalizationForwardTraining /
// Backward, inference with the running statistics), kCudnnNhwc (the Ex API's
// NHWC persistent kernels, with the plain API where cuDNN refuses them) and
// kCudnnNhwcFused (the Ex API with the ReLU and the residual add in its
// kernels). cuDNN's legacy descriptor API, as the convolution (conv.cc).
// Training updates the running statistics with factor 0.1 and the unbiased
// variance, as PyTorch; one betaParamDiff serves both parameter gradients.
#include <cstdio>

#include "batch_norm.h"
#include "conv_check.h"  // ScopedDeviceBytes
#include "ddprun/common/error.h"

namespace ddprun::train::cuda {


// Training or evaluation forward on float x (y sized by the caller).
void BatchNorm2d::cudnnForward(const Tensor& x, Tensor& y, bool training) {
  setInput(x);
  if (!training) {
    DDPRUN_CUDNN_OK(cudnnBatchNormalizationForwardInference(
        ctx_->cudnn(), CUDNN_BATCHNORM_SPATIAL, &kCudnnOne, &kCudnnZero, xDesc_, x.data(), xDesc_,
        y.data(), bnDesc_, w_.value.data(), b_.value.data(), rm_.value.data(),
        rv_.value.data(), kEps));
    return;
  }
  DDPRUN_CHECK(x.dim(0) * x.dim(2) * x.dim(3) > 1, name(), ": batch norm in training needs "
               "more than one value per channel, got input ", shapeString(x.shape()));
  if (ex_ && forwardEx(x, y)) return;
  DDPRUN_CUDNN_OK(cudnnBatchNormalizationForwardTraining(
      ctx_->cudnn(), CUDNN_BATCHNORM_SPATIAL, &kCudnnOne, &kCudnnZero, xDesc_, x.data(), xDesc_,
      y.data(), bnDesc_, w_.value.data(), b_.value.data(), kMomentum, rm_.value.data(),
      rv_.value.data(), kEps, saveMean_.data(), saveInvStd_.data()));
}

// The backward of a training forward into out (sized, x not empty).
void BatchNorm2d::cudnnBackward(const Tensor& x, const Tensor& dy, Tensor& out) {
  // One betaParamDiff serves both gradients: 0 when both are to be
  // overwritten; a lone flagged one is zeroed first and accumulated into.
  const bool overwrite = w_.overwriteGrad && b_.overwriteGrad;
  if (!overwrite) zeroFlaggedGrads(false);
  setInput(x);
  if (ex_) {
    exBackward(x, nullptr, dy, out, nullptr, CUDNN_BATCHNORM_OPS_BN, overwrite);
  } else {
    DDPRUN_CUDNN_OK(cudnnBatchNormalizationBackward(
        ctx_->cudnn(), CUDNN_BATCHNORM_SPATIAL, &kCudnnOne, &kCudnnZero, &kCudnnOne,
        overwrite ? &kCudnnZero : &kCudnnOne, xDesc_, x.data(), xDesc_, dy.data(), xDesc_, out.data(),
        bnDesc_, w_.value.data(), w_.grad.data(), b_.grad.data(), kEps, saveMean_.data(),
        saveInvStd_.data()));
  }
  w_.overwriteGrad = b_.overwriteGrad = false;
}

bool BatchNorm2d::fusedForward(const Tensor& x, const Tensor* z, Tensor& y) {
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

void BatchNorm2d::fusedBackward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx,
                                Tensor* dz) {
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

// The Ex API's training forward; false (and ex_ off for good): cuDNN refused
// the configuration, and the caller runs the plain API. Its reserve space
// goes from forward to backward (exBackward).
bool BatchNorm2d::forwardEx(const Tensor& x, Tensor& y) {
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
cudnnStatus_t BatchNorm2d::exForward(const Tensor& x, const Tensor* z, Tensor& y,
                                     cudnnBatchNormOps_t ops) {
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
        ctx_->cudnn(), kExMode, ops, &kCudnnOne, &kCudnnZero, xDesc_, x.data(), zDesc,
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
void BatchNorm2d::exBackward(const Tensor& x, const Tensor* y, const Tensor& dy, Tensor& dx,
                             Tensor* dz, cudnnBatchNormOps_t ops, bool overwrite) {
  const cudnnActivationDescriptor_t act = activation(ops);
  const cudnnTensorDescriptor_t yDesc = y ? xDesc_.get() : nullptr;
  const cudnnTensorDescriptor_t dzDesc = dz ? xDesc_.get() : nullptr;
  size_t wsBytes = 0;
  DDPRUN_CUDNN_OK(cudnnGetBatchNormalizationBackwardExWorkspaceSize(
      ctx_->cudnn(), kExMode, ops, xDesc_, xDesc_, xDesc_, dzDesc, xDesc_, bnDesc_, act,
      &wsBytes));
  ScopedDeviceBytes ws(*ctx_, wsBytes);
  DDPRUN_CUDNN_OK(cudnnBatchNormalizationBackwardEx(
      ctx_->cudnn(), kExMode, ops, &kCudnnOne, &kCudnnZero, &kCudnnOne, overwrite ? &kCudnnZero : &kCudnnOne,
      xDesc_, x.data(), yDesc, y ? y->data() : nullptr, xDesc_, dy.data(), dzDesc,
      dz ? dz->data() : nullptr, xDesc_, dx.data(), bnDesc_, w_.value.data(),
      act ? b_.value.data() : nullptr, w_.grad.data(), b_.grad.data(), kEps, saveMean_.data(),
      saveInvStd_.data(), act, ws.get(), wsBytes, reserve_.get(), reserveBytes_));
  reserve_.reset();  // one backward per training forward
}

// The ReLU's descriptor for ops with an activation, else null.
cudnnActivationDescriptor_t BatchNorm2d::activation(cudnnBatchNormOps_t ops) {
  if (ops == CUDNN_BATCHNORM_OPS_BN) return nullptr;
  if (!relu_) {
    relu_ = ActivationDesc::create();
    DDPRUN_CUDNN_OK(cudnnSetActivationDescriptor(relu_, CUDNN_ACTIVATION_RELU,
                                                 CUDNN_NOT_PROPAGATE_NAN, 0.0));
  }
  return relu_;
}

// x's descriptor (the context's layout) and, NHWC, the parameters' derived
// from it.
void BatchNorm2d::setInput(const Tensor& x) {
  setTensor4d(xDesc_, x.dim(0), x.dim(1), x.dim(2), x.dim(3), CUDNN_DATA_FLOAT, ctx_->nhwc());
  if (ctx_->nhwc())
    DDPRUN_CUDNN_OK(cudnnDeriveBNTensorDescriptor(bnDesc_, xDesc_, CUDNN_BATCHNORM_SPATIAL));
}

}  // namespace ddprun::train::cuda
