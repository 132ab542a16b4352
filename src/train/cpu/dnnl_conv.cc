#include "dnnl_conv.h"

#include <omp.h>

#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <unordered_map>

#include "ddprun/common/error.h"

namespace ddprun::train {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// Everything that depends on the input shape: primitives and the internal
// buffers in oneDNN's layouts.
struct Plan {
  dnnl::convolution_forward::primitive_desc fpd;  // the backward's hint
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_weights bww;  // once trained at this shape
  dnnl::convolution_backward_data bwd;     // once dL/dx is needed
  bool hasBww = false, hasBwd = false;
  memory::dims strides, pad;
  memory::desc srcMd, dstMd, wMd;               // oneDNN's (NHWC, any)
  memory::desc userSrc, userDst, userW, userB;  // NCHW / OIHW / [OC] (zero: no bias)
  memory src, dst, wFwd, diffDst, diffW, diffB, wBwd, diffSrc;
};

// y = conv(x, W) (+ b). Forward: reorder x (NCHW) to NHWC, W (OIHW) to the
// forward's layout, convolve, reorder y back. Backward: dy to NHWC; weights
// gradient (oneDNN layout) reordered to OIHW and added to the parameter's
// gradient (gradients accumulate); bias gradient added likewise; dx through
// backward-data and a reorder to NCHW.
class DnnlConv2d final : public Layer {
 public:
  DnnlConv2d(std::string name, const Conv2dSpec& spec) : Layer(name), s_(spec) {
    DDPRUN_CHECK(s_.inC > 0 && s_.outC > 0 && s_.kernel > 0 && s_.stride > 0 && s_.pad >= 0,
                 name, ": convolution ", s_.inC, "->", s_.outC, " kernel ", s_.kernel,
                 " stride ", s_.stride, " padding ", s_.pad, " (sizes must be positive)");
    const Shape ws = {s_.outC, s_.inC, s_.kernel, s_.kernel};
    w_ = {name + ".weight", Tensor(ws), Tensor(ws)};
    if (s_.bias) b_ = {name + ".bias", Tensor({s_.outC}), Tensor({s_.outC})};
  }
  Shape outputShape(const Shape& s) const override {
    DDPRUN_CHECK(s.size() == 4 && s[1] == s_.inC, name(), " expects [N, ", s_.inC,
                 ", H, W], got ", shapeString(s));
    const int64_t span = s_.kernel - 2 * s_.pad;
    DDPRUN_CHECK(s[2] >= span && s[3] >= span, name(), ": input ", shapeString(s),
                 " smaller than the kernel");
    return {s[0], s_.outC, (s[2] - span) / s_.stride + 1, (s[3] - span) / s_.stride + 1};
  }
  void forward(const Tensor& x, Tensor& y, bool training) override {
    y.ensure(outputShape(x.shape()));
    Plan& p = plan(x.shape(), training, training);
    auto& s = stream();
    reorderIn(p.userSrc, x.data(), p.src, s);
    reorderIn(p.userW, w_.value.data(), p.wFwd, s);
    std::unordered_map<int, memory> args = {
        {DNNL_ARG_SRC, p.src}, {DNNL_ARG_WEIGHTS, p.wFwd}, {DNNL_ARG_DST, p.dst}};
    if (s_.bias) args[DNNL_ARG_BIAS] = memory(p.userB, engine(), b_.value.data());  // read only
    p.fwd.execute(s, args);
    reorderOut(p.dst, p.userDst, y.data(), s);
    s.wait();
  }
  bool backwardReadsOutput() const override { return false; }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) override {
    if (x.dim(0) == 0) return emptyBackward(x, dx);
    Plan& p = plan(x.shape(), true, dx != nullptr);
    auto& s = stream();
    reorderIn(p.userDst, dy.data(), p.diffDst, s);
    std::unordered_map<int, memory> args = {
        {DNNL_ARG_SRC, p.src}, {DNNL_ARG_DIFF_DST, p.diffDst}, {DNNL_ARG_DIFF_WEIGHTS, p.diffW}};
    if (s_.bias) args[DNNL_ARG_DIFF_BIAS] = p.diffB;
    p.bww.execute(s, args);
    wTmp_.resize(static_cast<size_t>(w_.value.numel()));
    reorderOut(p.diffW, p.userW, wTmp_.data(), s);
    if (dx) {
      dx->ensure(x.shape());
      reorderIn(p.userW, w_.value.data(), p.wBwd, s);
      p.bwd.execute(s, {{DNNL_ARG_DIFF_DST, p.diffDst}, {DNNL_ARG_WEIGHTS, p.wBwd},
                        {DNNL_ARG_DIFF_SRC, p.diffSrc}});
      reorderOut(p.diffSrc, p.userSrc, dx->data(), s);
    }
    s.wait();
    putGrad(w_, wTmp_.data());
    if (s_.bias) putGrad(b_, static_cast<const float*>(p.diffB.get_data_handle()));
  }
  // dx += dL/dx: backward into a temporary, then added element by element
  // (dx + v: the sum a separate add of the two gradients gives, in either order).
  bool accumulatesDx() const override { return true; }
  void backwardAccumulate(const Tensor& x, const Tensor& y, const Tensor& dy,
                          Tensor& dx) override {
    DDPRUN_CHECK(dx.shape() == x.shape(), name(), ": backwardAccumulate adds into a gradient of ",
                 shapeString(x.shape()), ", got ", shapeString(dx.shape()));
    Tensor v;
    backward(x, y, dy, &v);
    float* d = dx.data();
    const float* s = v.data();
    for (int64_t i = 0, n = dx.numel(); i < n; ++i) d[i] = d[i] + s[i];
  }
  std::vector<Param*> params() override {
    if (s_.bias) return {&w_, &b_};
    return {&w_};
  }

 private:
  // The gradient contract (Param::overwriteGrad): the first writer of a step
  // stores 0 + v (a -0 from oneDNN becomes +0, bitwise what a zeroed gradient
  // plus v gives), later ones add.
  static void putGrad(Param& p, const float* v) {
    float* g = p.grad.data();
    const int64_t n = p.grad.numel();
    if (p.overwriteGrad) {
      for (int64_t i = 0; i < n; ++i) g[i] = 0.0f + v[i];
    } else {
      for (int64_t i = 0; i < n; ++i) g[i] += v[i];
    }
    p.overwriteGrad = false;
  }
  // An empty batch contributes nothing: a gradient to be overwritten becomes 0.
  void emptyBackward(const Tensor& x, Tensor* dx) {
    if (dx) dx->ensure(x.shape());
    for (Param* p : params()) {
      if (p->overwriteGrad) p->grad.zero();
      p->overwriteGrad = false;
    }
  }
  static dnnl::stream& stream() {
    thread_local dnnl::stream s(engine());
    return s;
  }
  // Copies user memory (plain layout) into `dst`'s layout.
  // (oneDNN's handles are non-const; a reorder only reads its source.)
  static void reorderIn(const memory::desc& user, const float* data, memory& dst,
                        dnnl::stream& s) {
    memory src(user, engine(), const_cast<float*>(data));
    dnnl::reorder(src, dst).execute(s, src, dst);
  }
  static void reorderOut(memory& src, const memory::desc& user, float* data, dnnl::stream& s) {
    memory dst(user, engine(), data);
    dnnl::reorder(src, dst).execute(s, src, dst);
  }

  // The plan for input shape `in`, built in parts as they are first needed:
  // forward always; backward-weights for training; backward-data once dL/dx
  // is asked for. An evaluation-only shape (a larger evaluation batch) so
  // holds no gradient buffers.
  Plan& plan(const Shape& in, bool backward, bool needDx) {
    auto [it, fresh] = plans_.try_emplace(in);
    Plan& p = it->second;
    if (fresh) buildForward(p, in);
    if (backward && !p.hasBww) buildBackwardWeights(p);
    if (backward && needDx && !p.hasBwd) buildBackwardData(p);
    return p;
  }

  void buildForward(Plan& p, const Shape& in) {
    const Shape os = outputShape(in);
    const memory::dims sd{in[0], s_.inC, in[2], in[3]}, dd{os[0], s_.outC, os[2], os[3]},
        wd{s_.outC, s_.inC, s_.kernel, s_.kernel}, bd{s_.outC};
    p.strides = {s_.stride, s_.stride};
    p.pad = {s_.pad, s_.pad};
    // NHWC activations chosen explicitly (oneDNN's own choice is slower for
    // conv1's backward-weights, see docs/conv_backend.md); weights as it likes.
    // A zero bias descriptor is oneDNN's "no bias". Right padding = left
    // padding: oneDNN floors the output size as PyTorch does, and the rows a
    // stride leaves over on the right are never read.
    p.srcMd = memory::desc(sd, dt::f32, tag::nhwc);
    p.dstMd = memory::desc(dd, dt::f32, tag::nhwc);
    p.wMd = memory::desc(wd, dt::f32, tag::any);
    p.userB = s_.bias ? memory::desc(bd, dt::f32, tag::x) : memory::desc();
    p.userSrc = memory::desc(sd, dt::f32, tag::nchw);
    p.userDst = memory::desc(dd, dt::f32, tag::nchw);
    p.userW = memory::desc(wd, dt::f32, tag::oihw);
    using namespace dnnl;
    // oneDNN 2.x: an operation descriptor, then a primitive descriptor.
    p.fpd = convolution_forward::primitive_desc(
        {prop_kind::forward_training, algorithm::convolution_direct, p.srcMd, p.wMd, p.userB,
         p.dstMd, p.strides, p.pad, p.pad},
        engine());
    p.fwd = convolution_forward(p.fpd);
    p.src = memory(p.fpd.src_desc(), engine());
    p.dst = memory(p.fpd.dst_desc(), engine());
    p.wFwd = memory(p.fpd.weights_desc(), engine());
  }

  void buildBackwardWeights(Plan& p) {
    using namespace dnnl;
    convolution_backward_weights::primitive_desc wpd(
        {algorithm::convolution_direct, p.srcMd, p.wMd, p.userB, p.dstMd, p.strides, p.pad,
         p.pad},
        engine(), p.fpd);
    p.bww = convolution_backward_weights(wpd);
    p.diffDst = memory(wpd.diff_dst_desc(), engine());
    p.diffW = memory(wpd.diff_weights_desc(), engine());
    if (s_.bias) p.diffB = memory(wpd.diff_bias_desc(), engine());
    p.hasBww = true;
  }

  void buildBackwardData(Plan& p) {
    using namespace dnnl;
    convolution_backward_data::primitive_desc dpd(
        {algorithm::convolution_direct, p.srcMd, p.wMd, p.dstMd, p.strides, p.pad, p.pad},
        engine(), p.fpd);
    DDPRUN_CHECK(dpd.diff_dst_desc() == p.diffDst.get_desc(),
                 "oneDNN chose different diff_dst layouts for ", name());
    p.bwd = convolution_backward_data(dpd);
    p.wBwd = memory(dpd.weights_desc(), engine());
    p.diffSrc = memory(dpd.diff_src_desc(), engine());
    p.hasBwd = true;
  }

  Conv2dSpec s_;
  Param w_, b_;  // b_ unused without a bias
  std::map<Shape, Plan> plans_;
  std::vector<float> wTmp_;
};

}  // namespace

std::unique_ptr<Layer> makeDnnlConv2d(std::string name, const Conv2dSpec& spec) {
  return std::make_unique<DnnlConv2d>(std::move(name), spec);
}

void setDnnlThreads(int threads) { omp_set_num_threads(threads); }

}  // namespace ddprun::train
