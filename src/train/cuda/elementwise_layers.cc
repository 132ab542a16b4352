// The CUDA backend's element-wise and layout layers: ReLU (elementwise.h's
// kernels) and the flatten of NHWC activations (a transpose: transpose.h).
#include "cuda_layers.h"
#include "ddprun/common/error.h"
#include "elementwise.h"
#include "transpose.h"

namespace ddprun::train::cuda {

namespace {
class Relu final : public Layer {
 public:
  Relu(std::shared_ptr<Context> ctx, std::string name)
      : Layer(std::move(name)), ctx_(std::move(ctx)) {}
  Shape outputShape(const Shape& s) const override { return s; }
  // Float or 16-bit elements alike (the output and dx of x's type).
  void forward(const Tensor& x, Tensor& y, bool) override {
    ctx_->bind();
    y.ensureLike(x, ctx_->allocator());
    launchRelu(x.raw(), y.raw(), static_cast<size_t>(x.numel()), x.dtype(), ctx_->stream());
  }
  bool worksInPlace() const override { return true; }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override {
    if (!dx) return;
    ctx_->bind();
    checkType(dy, y, name().c_str());
    dx->ensureLike(x, ctx_->allocator());
    launchReluBackward(y.raw(), dy.raw(), dx->raw(), static_cast<size_t>(x.numel()), x.dtype(),
                       ctx_->stream());
  }

 private:
  std::shared_ptr<Context> ctx_;
};

// Flatten of NHWC activations: [N, C, H, W] to [N, C*H*W] in PyTorch's
// order (c, h, w), which the next linear layer's weights are in: a transpose
// forward and back; the shared view (Backend::flatten) where the orders
// agree (H*W == 1 or C == 1, or a tensor that is not 4-d).
class FlattenNhwc final : public Layer {
 public:
  FlattenNhwc(std::shared_ptr<Context> ctx, std::unique_ptr<Layer> view)
      : Layer(view->name()), ctx_(std::move(ctx)), view_(std::move(view)) {}
  Shape outputShape(const Shape& s) const override { return view_->outputShape(s); }
  void forward(const Tensor& x, Tensor& y, bool training) override {
    if (!transposes(x)) return view_->forward(x, y, training);
    ctx_->bind();
    y.ensure(outputShape(x.shape()), ctx_->allocator(), x.dtype());
    launchTranspose(x.raw(), y.raw(), x.dtype(), x.dim(0), x.dim(2) * x.dim(3), x.dim(1),
                    ctx_->stream());
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override {
    if (!transposes(x)) return view_->backward(x, y, dy, dx);
    if (!dx) return;
    ctx_->bind();
    dx->ensureLike(x, ctx_->allocator());
    launchTranspose(dy.raw(), dx->raw(), x.dtype(), x.dim(0), x.dim(1), x.dim(2) * x.dim(3),
                    ctx_->stream());
  }

 private:
  static bool transposes(const Tensor& x) {
    return x.rank() == 4 && x.dim(2) * x.dim(3) > 1 && x.dim(1) > 1;
  }
  std::shared_ptr<Context> ctx_;
  std::unique_ptr<Layer> view_;
};
}  // namespace

std::unique_ptr<Layer> makeRelu(std::shared_ptr<Context> ctx, std::string name) {
  return std::make_unique<Relu>(std::move(ctx), std::move(name));
}
std::unique_ptr<Layer> makeFlattenNhwc(std::shared_ptr<Context> ctx, std::unique_ptr<Layer> view) {
  return std::make_unique<FlattenNhwc>(std::move(ctx), std::move(view));
}

}  // namespace ddprun::train::cuda
