// The CUDA backend's batch norm layer: one class, whose path (bn_path.h) is
// chosen when the model is built. Internal header of src/train/cuda/.
//
// Where each path lives:
//   batch_norm.cc  the layer's shape, parameters, buffers and dispatch; the
//                  shared num_batches_tracked counter; BatchNormAct (the
//                  batch norm with its ReLU and add)
//   bn_cudnn.cc    kCudnnNchw, kCudnnNhwc, kCudnnNhwcFused: cuDNN's legacy
//                  batch norm API (plain, and the Ex API's NHWC kernels)
//   bn_ours.cc     kOursNhwc (bn_nhwc.h's kernels) and kOursSync (bn_nchw.h's)
//
// Semantics, every path: training normalises with the batch's statistics
// (SyncBatchNorm: the group's, all-reduced as double sums on device buffers)
// and updates the running mean and unbiased variance with momentum 0.1, as
// PyTorch; evaluation uses the running statistics. dgamma/dbeta are the
// local sums (the reducer averages them like every gradient), written or
// added as Param::overwriteGrad says. Statistics, parameters and running
// statistics are float; y has x's element type.
//
// Thread-safety: one training thread, as every Layer. Preconditions: inputs
// in the context's layout (NCHW or NHWC) with C == channels; a 16-bit input
// only on kOursNhwc (the context's 16-bit activations).
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bn_nhwc.h"  // PoolShape
#include "bn_path.h"
#include "context.h"
#include "ddprun/runtime/process_group.h"
#include "ddprun/train/layers.h"

namespace ddprun::train::cuda {

struct BnStepCounter;  // batch_norm.cc

class BatchNorm2d final : public Layer {
 public:
  BatchNorm2d(std::shared_ptr<Context> ctx, std::string name, int64_t c,
              runtime::ProcessGroup* sync, BnPath path);
  Shape outputShape(const Shape& s) const override;
  void forward(const Tensor& x, Tensor& y, bool training) override;
  bool backwardReadsOutput() const override { return false; }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
  std::vector<Param*> params() override { return {&w_, &b_}; }
  std::vector<Buffer*> buffers() override { return {&rm_, &rv_, &nbt_}; }

  const BnPath& path() const { return path_; }
  // Whether x runs our NHWC kernels (ownForward/ownBackward): the path is
  // kOursNhwc. InvalidArgument for a 16-bit x on another path.
  bool ours(const Tensor& x) const;

  // kOursNhwc (bn_ours.cc): y = bn(x), plus z (not null: the residual) and
  // then the ReLU (`relu`) in the same pass; training with the batch's
  // statistics (sums in double, all-reduced with SyncBatchNorm), evaluation
  // with the running ones.
  void ownForward(const Tensor& x, const Tensor* z, Tensor& y, bool relu, bool training);
  // relu(bn(x)) again with the last training forward's saved statistics
  // (no residual): that forward's y, bit for bit; nothing else changes.
  void ownRecompute(const Tensor& x, Tensor& y);
  // Its backward from dL/dy: with `relu`, the ReLU's mask from y (forward's
  // output) folded in; dz (not null: the residual's gradient, the masked dy)
  // written in the same pass as the sums; dx (not null) from the (global) sums.
  void ownBackward(const Tensor& x, const Tensor* y, const Tensor& dy, Tensor* dx, Tensor* dz,
                   bool relu);

  // kOursNhwc with the ReLU and then max pooling `g` (the fused stem,
  // bn_ours.cc): y = the pooled activations; `arg` (training: sized to y's
  // elements) receives the winning taps for ownPoolBackward.
  void ownPoolForward(const Tensor& x, Tensor& y, const PoolShape& g, uint8_t* arg,
                      bool training);
  // Its backward from dL/dy (the pooled gradient) and forward's taps: dx (not
  // null) and the parameter gradients; dx's buffer holds the masked gradient
  // in between.
  void ownPoolBackward(const Tensor& x, const Tensor& dy, const uint8_t* arg,
                       const PoolShape& g, Tensor* dx);

  // kCudnnNhwcFused (bn_cudnn.cc): the training forward y = relu(bn(x) + z)
  // (z null: relu(bn(x))) in one cuDNN call; false where cuDNN refuses the
  // fused configuration (nothing done; the caller runs the layers apart, and
  // this layer does not try again) or the path is another.
  bool fusedForward(const Tensor& x, const Tensor* z, Tensor& y);
  // The backward of the last fusedForward: dx, and dz (required with a
  // residual) the ReLU's masked dy.
  void fusedBackward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx, Tensor* dz);

 private:
  static constexpr double kEps = 1e-5, kMomentum = 0.1;
  // NHWC training through cuDNN's Ex API in SPATIAL_PERSISTENT mode, which
  // runs its NHWC kernels (what PyTorch calls for channels_last; the plain
  // API runs the NCHW kernels over NHWC data, 5x slower on an H200).
  static constexpr cudnnBatchNormMode_t kExMode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;

  // ---- the cuDNN paths (bn_cudnn.cc)
  void cudnnForward(const Tensor& x, Tensor& y, bool training);
  void cudnnBackward(const Tensor& x, const Tensor& dy, Tensor& out);
  bool forwardEx(const Tensor& x, Tensor& y);
  cudnnStatus_t exForward(const Tensor& x, const Tensor* z, Tensor& y, cudnnBatchNormOps_t ops);
  void exBackward(const Tensor& x, const Tensor* y, const Tensor& dy, Tensor& dx, Tensor* dz,
                  cudnnBatchNormOps_t ops, bool overwrite);
  cudnnActivationDescriptor_t activation(cudnnBatchNormOps_t ops);
  void setInput(const Tensor& x);

  // ---- our kernels (bn_ours.cc)
  void syncForward(const Tensor& x, Tensor& y);
  void syncBackward(const Tensor& x, const Tensor& dy, Tensor* dx);
  void allReduce(double* buf, size_t count);
  // Training: the batch's statistics into saveMean_/saveInvStd_ (and the
  // running ones); evaluation: evalInvStd_ from the running variance. The
  // (mean, invstd) pair forward then normalises with.
  std::pair<const float*, const float*> ownStatistics(const Tensor& x, bool training);
  void checkSame16(const Tensor& t, const Tensor& x, const char* what) const;
  // The per-channel kernels' view of x: NCHW as [N, C, H*W], NHWC as
  // [N*H*W, C, 1] (bn_nchw.h).
  int64_t rowsOf(const Tensor& x) const {
    return ctx_->nhwc() ? x.dim(0) * x.dim(2) * x.dim(3) : x.dim(0);
  }
  int64_t planeOf(const Tensor& x) const { return ctx_->nhwc() ? 1 : x.dim(2) * x.dim(3); }

  // ---- shared (batch_norm.cc)
  void countStep();
  void zeroFlaggedGrads(bool clear);

  std::shared_ptr<Context> ctx_;
  int64_t c_;
  runtime::ProcessGroup* sync_;
  BnPath path_;
  Param w_, b_;
  Buffer rm_, rv_, nbt_;
  TensorDesc xDesc_, bnDesc_;
  Tensor saveMean_, saveInvStd_, scratch_, xhat_;
  Tensor evalInvStd_;  // ownForward's in evaluation, from the running variance
  DeviceArray<double> sums_, sqdev_;
  // Our NHWC kernels' launch shape (Context::bnFold): the fold's tile
  // counters (zeroed once; each launch leaves them zero) or none.
  BnFold fold();
  BnFold gradsFold();  // fold() with the parameter gradients, their overwrite flags consumed
  DeviceArray<unsigned> foldCounters_;
  bool trained_ = false;
  // kCudnnNhwc(Fused): training through forwardEx/exBackward (cuDNN's
  // persistent NHWC kernels; deterministic, cuDNN's documentation says,
  // through a scaled integer reduction), off where cuDNN refuses them.
  bool ex_ = false;
  DeviceArray<uint8_t> reserve_;  // the Ex API's, forward to backward
  size_t reserveBytes_ = 0;
  ActivationDesc relu_;  // the fused ReLU's (activation())
  // kCudnnNhwcFused: cuDNN's fused forward may still be tried (off once
  // refused), and the ops the last training forward ran with (BN: not fused).
  bool fuse_ = false;
  cudnnBatchNormOps_t fusedOps_ = CUDNN_BATCHNORM_OPS_BN;
  std::shared_ptr<BnStepCounter> counter_;
  bool leader_ = false;
  int64_t forwards_ = 0;  // a follower's training forwards (host)
};

}  // namespace ddprun::train::cuda
