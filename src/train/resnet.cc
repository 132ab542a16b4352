#include "resnet.h"

#include "ddprun/common/error.h"

namespace ddprun::train {
namespace {

// Forward keeps the intermediates some backward reads (each child's input;
// outputs for their shapes; conv2's input not, where bn1 recomputes it);
// backward walks the main branch back from
// dL/dsum, then the shortcut, and adds the two contributions to dL/dx.
// Each batch norm runs with the ReLU after it as one BatchNormAct (bn2 with
// the residual add too), which a device may fuse.
class BasicBlock final : public Layer {
 public:
  BasicBlock(Backend& be, std::string name, int64_t inC, int64_t outC, int stride,
             runtime::ProcessGroup* sync)
      : Layer(name), be_(be) {
    const std::string p = name + ".";
    conv1_ = be.conv2d(p + "conv1", Conv2dSpec{inC, outC, 3, stride, 1, false});
    bn1_ = be.batchNormAct(p + "bn1", outC, sync, false);
    conv2_ = be.conv2d(p + "conv2", Conv2dSpec{outC, outC, 3, 1, 1, false});
    bn2_ = be.batchNormAct(p + "bn2", outC, sync, true);
    // conv2's input, relu(bn1(c1)), given back after forward and recomputed
    // for backward where bn1 can (BatchNormAct::recomputes) and activations
    // are given back at all.
    recompute_ = be.releasesActivations() && bn1_->recomputes();
    if (stride != 1 || inC != outC) {
      dsConv_ = be.conv2d(p + "downsample.0", Conv2dSpec{inC, outC, 1, stride, 0, false});
      dsBn_ = be.batchNorm2d(p + "downsample.1", outC, sync);
    }
  }

  Shape outputShape(const Shape& in) const override {
    const Shape out = conv2_->outputShape(conv1_->outputShape(in));
    const Shape shortcut = dsConv_ ? dsConv_->outputShape(in) : in;
    DDPRUN_CHECK(out == shortcut, name(), ": the residual ", shapeString(out),
                 " and the shortcut ", shapeString(shortcut), " differ");
    return out;
  }

  void forward(const Tensor& x, Tensor& y, bool training) override {
    run(*conv1_, x, c1_, training);
    bn1_->forward(c1_, nullptr, b1_, training);  // relu(bn1(c1))
    if (!training) done(c1_);  // no backward follows evaluation
    run(*conv2_, b1_, c2_, training);
    if (!training || recompute_) done(b1_);
    const Tensor* shortcut = &x;
    if (dsConv_) {
      run(*dsConv_, x, dc_, training);
      run(*dsBn_, dc_, db_, training);
      if (!training) done(dc_);
      shortcut = &db_;
    }
    // relu(bn2(c2) + shortcut) into b2_, the block's output y: torchvision's
    // `out = bn2(out); out += identity; out = relu(out)`.
    bn2_->forward(c2_, shortcut, b2_, training);
    if (!training) done(c2_);
    // The downsample's batch norm output was read by the sum only: its
    // backward reads its input (dc_), so nothing keeps it.
    done(db_);
    y = b2_;
    if (!training) done(b2_);  // y (the caller's handle) keeps the output alone
  }

  // Walks back from dL/dsum, giving every intermediate back as soon as its
  // last reader ran (done(); kept on the CPU): backward holds the block's
  // input and a few gradients at a time, not the whole forward.
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override {
    if (dx && conv1_->accumulatesDx()) return backwardAdding(x, y, dy, *dx);
    // dL/dc2 and dL/dsum (the ReLU's masked dy: the shortcut's gradient).
    gC2_.ensureLike(c2_, be_.allocator());
    gSum_.ensureLike(y, be_.allocator());
    bn2_->backward(c2_, y, dy, &gC2_, &gSum_);
    done(b2_);  // the output (y) is read by nothing below
    backToC1();
    back(*conv1_, x, c1_, gC1_, dx);
    done(gC1_);
    done(c1_);
    if (dsConv_) {
      downsampleBack(x, dx ? &gX_ : nullptr);
      if (dx) be_.add(*dx, gX_, *dx);
      done(gX_);
    } else if (dx) {
      be_.add(*dx, gSum_, *dx);
    }
    done(gSum_);
  }

  // The same where conv1 adds into a gradient (Layer::accumulatesDx): the
  // shortcut's gradient is written into dx first (bn2's dz itself, or the
  // downsample's dx), then conv1's backward adds the main branch's to it in
  // its own pass: no separate add (dx = shortcut + main, the sum the other
  // order gives).
  void backwardAdding(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
    gC2_.ensureLike(c2_, be_.allocator());
    Tensor& shortcut = dsConv_ ? gSum_ : dx;
    shortcut.ensureLike(y, be_.allocator());
    bn2_->backward(c2_, y, dy, &gC2_, &shortcut);
    done(b2_);
    if (dsConv_) {
      downsampleBack(x, &dx);
      done(gSum_);
    }
    backToC1();
    conv1_->backwardAccumulate(x, c1_, gC1_, dx);
    done(gC1_);
    done(c1_);
  }

  // The main branch from dL/dc2 (gC2_) down to dL/dc1 (gC1_): conv2's
  // backward, then bn1's (with its ReLU).
  void backToC1() {
    if (recompute_) bn1_->recompute(c1_, b1_);
    back(*conv2_, b1_, c2_, gC2_, &gR1_);
    done(gC2_);
    done(c2_);
    gC1_.ensureLike(c1_, be_.allocator());
    bn1_->backward(c1_, b1_, gR1_, &gC1_, nullptr);
    done(gR1_);
    done(b1_);
  }
  // The downsample's backward from dL/dsum (gSum_): its parameters'
  // gradients, and the shortcut's dL/dx into `into` (null: none wanted). The
  // batch norm's backward reads its input (dc_) and the shapes only.
  void downsampleBack(const Tensor& x, Tensor* into) {
    back(*dsBn_, dc_, dc_, gSum_, &gDc_);
    back(*dsConv_, x, dc_, gDc_, into);
    done(gDc_);
    done(dc_);
  }

  std::vector<Param*> params() override {
    std::vector<Param*> out;
    for (Layer* l : children())
      for (Param* p : l->params()) out.push_back(p);
    return out;
  }
  std::vector<Buffer*> buffers() override {
    std::vector<Buffer*> out;
    for (Layer* l : children())
      for (Buffer* b : l->buffers()) out.push_back(b);
    return out;
  }

 private:
  // torchvision's module order (the state_dict's).
  std::vector<Layer*> children() const {
    std::vector<Layer*> v = {conv1_.get(), bn1_.get(), conv2_.get(), bn2_.get()};
    if (dsConv_) v.insert(v.end(), {dsConv_.get(), dsBn_.get()});
    return v;
  }
  // Outputs and gradients live in this backend's memory; a layer gives its
  // output the shape and element type it makes (16-bit activations on a
  // device that keeps them so), and a gradient has its activation's type.
  void run(Layer& l, const Tensor& in, Tensor& out, bool training) {
    l.forward(in, out, training);
  }
  // An intermediate is given back to the backend's allocator once its last
  // reader ran, on backends that release activations (a device's caching
  // allocator); the CPU keeps it for the next step (host allocations are not
  // cached).
  void done(Tensor& t) {
    if (be_.releasesActivations()) t = Tensor();
  }
  void back(Layer& l, const Tensor& in, const Tensor& out, const Tensor& dout, Tensor* din) {
    if (din) din->ensureLike(in, be_.allocator());
    l.backward(in, out, dout, din);
  }

  Backend& be_;
  std::unique_ptr<Layer> conv1_, conv2_, dsConv_, dsBn_;
  std::unique_ptr<BatchNormAct> bn1_, bn2_;
  // Forward: conv1 output; relu(bn1(.)); conv2 output; relu(bn2(.) +
  // shortcut) (shared with the block's output); downsample conv, bn outputs.
  Tensor c1_, b1_, c2_, b2_, dc_, db_;
  // Backward: dL/d of the tensors above (gSum_: of the sum before the last
  // ReLU; gX_: the shortcut's share of dL/dx).
  Tensor gSum_, gC2_, gR1_, gC1_, gDc_, gX_;
  bool recompute_ = false;
};

}  // namespace

std::unique_ptr<Layer> makeBasicBlock(Backend& backend, std::string name, int64_t inC,
                                      int64_t outC, int stride, runtime::ProcessGroup* sync) {
  DDPRUN_CHECK(inC > 0 && outC > 0 && stride > 0, name, ": block ", inC, "->", outC,
               " stride ", stride);
  return std::make_unique<BasicBlock>(backend, std::move(name), inC, outC, stride, sync);
}

}  // namespace ddprun::train
