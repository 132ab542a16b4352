// The CUDA backend's pooling layers: max pooling (cuDNN's, or our NHWC
// kernels: pool_kernels.h) and global average pooling (our kernels).
#include <cstdio>

#include "cuda_layers.h"
#include "ddprun/common/error.h"
#include "pool_kernels.h"

namespace ddprun::train::cuda {

namespace {

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
      const cudnnStatus_t st = cudnnPoolingForward(ctx_->cudnn(), desc_, &kCudnnOne, xDesc_, x.raw(),
                                                   &kCudnnZero, yDesc_, y.raw());
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
    DDPRUN_CUDNN_OK(cudnnPoolingBackward(ctx_->cudnn(), desc_, &kCudnnOne, yDesc_, y.raw(), yDesc_,
                                         dy.raw(), xDesc_, x.raw(), &kCudnnZero, xDesc_, dx->raw()));
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

// AdaptiveAvgPool2d(1) + flatten: [N, C, H, W] -> [N, C].
class GlobalAvgPool final : public Layer {
 public:
  GlobalAvgPool(std::shared_ptr<Context> ctx, std::string name)
      : Layer(std::move(name)), ctx_(std::move(ctx)) {}
  Shape outputShape(const Shape& s) const override {
    DDPRUN_CHECK(s.size() == 4 && s[2] > 0 && s[3] > 0, name(),
                 " expects [N, C, H, W] with H, W > 0, got ", shapeString(s));
    return {s[0], s[1]};
  }
  // NHWC: float or 16-bit (the output and dx of x's type); NCHW: float.
  void forward(const Tensor& x, Tensor& y, bool) override {
    ctx_->bind();
    y.ensure(outputShape(x.shape()), ctx_->allocator(), x.dtype());
    const int64_t hw = x.dim(2) * x.dim(3);
    if (ctx_->nhwc())
      launchGlobalAvgPoolNhwc(x.raw(), y.raw(), x.dtype(), x.dim(0), x.dim(1), hw,
                              ctx_->stream());
    else
      launchGlobalAvgPool(x.data(), y.data(), x.dim(0) * x.dim(1), hw, ctx_->stream());
  }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) override {
    if (!dx) return;
    ctx_->bind();
    dx->ensureLike(x, ctx_->allocator());
    const int64_t hw = x.dim(2) * x.dim(3);
    if (ctx_->nhwc())
      launchGlobalAvgPoolNhwcBackward(dy.raw(), dx->raw(), x.dtype(), x.dim(0), x.dim(1), hw,
                                      ctx_->stream());
    else
      launchGlobalAvgPoolBackward(dy.data(), dx->data(), x.dim(0) * x.dim(1), hw, ctx_->stream());
  }

 private:
  std::shared_ptr<Context> ctx_;
};
}  // namespace

std::unique_ptr<Layer> makeMaxPool2d(std::shared_ptr<Context> ctx, std::string name,
                                     const Pool2dSpec& spec) {
  return std::make_unique<MaxPool2d>(std::move(ctx), std::move(name), spec);
}
std::unique_ptr<Layer> makeGlobalAvgPool(std::shared_ptr<Context> ctx, std::string name) {
  return std::make_unique<GlobalAvgPool>(std::move(ctx), std::move(name));
}

}  // namespace ddprun::train::cuda
