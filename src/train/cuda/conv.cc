// The CUDA backend's convolution layer (cuDNN); its algorithm search is in
// conv_search.h, pooling in pooling.cc, batch norm in batch_norm.h.
//
// The algorithm search (API choice, deterministic and fast modes, the
// workspace cap, DDPRUN_CONV_LOG) is in conv_search.h; this file is the layer.
//
// Precision: fp32 sets CUDNN_FMA_MATH on every convolution (no tensor cores,
// no TF32, whatever the algorithm: fp32 stays true fp32); tf32, bf16 and fp16
// search with CUDNN_TENSOR_OP_MATH (tensor cores) and use the math type
// cuDNN's search reports for the chosen algorithm.
//
// Gradients: Param::overwriteGrad set means the gradient is logically zero:
// backward writes it (beta = 0 in cudnnConvolutionBackwardFilter/Bias, whose
// output is then not read) and clears the flag; otherwise backward adds to it
// (beta = 1). An empty batch zeroes a flagged gradient.
//
// bf16/fp16 with 16-bit activations (CudaBackendOptions::activations16): x,
// y, dy and dx are 16-bit tensors that cuDNN reads and writes directly; only
// the filter is cast (once per forward) and the weight gradient cast back;
// the bias is added to the 16-bit output by our kernel and its gradient is
// dy's column sums in double. Otherwise, as follows.
// bf16/fp16 (torch.autocast semantics): activations between layers, weights,
// gradients and batch norm stay float; a convolution casts its input and its
// weights to 16 bits (our kernel, into allocator memory; the weights once per
// forward, reused by backward, the input kept from forward to backward, as
// autocast saves the 16-bit input) and runs cuDNN on 16-bit tensors with
// float compute (CUDNN_DATA_FLOAT in the convolution descriptor: cuDNN's
// PSEUDO_HALF / PSEUDO_BFLOAT16 configurations). The legacy API wants x, w
// and y (dx, dw, dy) of one data type (a float output from 16-bit inputs is
// not a supported configuration), so:
//   forward   y16 = conv(x16, w16), then y = float(y16) + bias in one kernel;
//   dW        dw16 = conv_bwd_filter(x16, dy16) with beta = 0, then our kernel
//             adds float(dw16) into the float gradient (or writes it, for
//             overwriteGrad); as in PyTorch, where the 16-bit weight's
//             gradient is 16-bit before the cast back to float accumulates it;
//   dx        dx16 = conv_bwd_data(w16, dy16), cast into the float dx;
//   db        cudnnConvolutionBackwardBias on the float dy.
// Nothing is clamped: in fp16 a value beyond 65504 becomes inf in a cast or
// a cuDNN output, and inf/NaN flows into the float gradients, which is what
// the fp16 loss scaler (Backend::scaleAndCheckFinite) detects.
#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "conv_check.h"
#include "conv_search.h"
#include "cuda_layers.h"
#include "ddprun/common/error.h"
#include "ddprun/runtime/cuda.h"
#include "elementwise.h"
#include "transpose.h"

namespace ddprun::train::cuda {

namespace {

// ------------------------------------------------------------ convolution
class Conv2d final : public Layer {
 public:
  Conv2d(std::shared_ptr<Context> ctx, std::string name, const Conv2dSpec& s)
      : Layer(name), ctx_(std::move(ctx)), s_(s),
        w_(makeDeviceParam(*ctx_, name + ".weight", {s.outC, s.inC, s.kernel, s.kernel})),
        type_(!ctx_->autocast() ? CUDNN_DATA_FLOAT
                                : (ctx_->bf16() ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF)),
        xDesc_(TensorDesc::create()), yDesc_(TensorDesc::create()),
        dyDesc_(TensorDesc::create()), biasDesc_(TensorDesc::create()),
        wDesc_(FilterDesc::create()), conv_(ConvDesc::create()),
        search_(ctx_, name, s, type_, xDesc_, yDesc_, wDesc_, conv_),
        x16_(ctx_), w16_(ctx_), wK_(ctx_) {
    DDPRUN_CHECK(s.inC > 0 && s.outC > 0 && s.kernel > 0 && s.stride > 0 && s.pad >= 0, name,
                 ": invalid convolution (in ", s.inC, ", out ", s.outC, ", kernel ", s.kernel,
                 ", stride ", s.stride, ", pad ", s.pad, ")");
    if (s.bias) b_ = makeDeviceParam(*ctx_, name + ".bias", {s.outC});
    setTensor4d(biasDesc_, 1, s.outC, 1, 1, CUDNN_DATA_FLOAT, ctx_->nhwc());
    // NHWC: the filter in KRSC (filterForCudnn()), as cuDNN's NHWC kernels read it.
    DDPRUN_CUDNN_OK(cudnnSetFilter4dDescriptor(wDesc_, type_,
                                               ctx_->nhwc() ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                               static_cast<int>(s.outC), static_cast<int>(s.inC),
                                               s.kernel, s.kernel));
    // Float compute in every precision (16-bit data: cuDNN's "pseudo" half
    // and bfloat16 configurations, fp32 accumulation).
    DDPRUN_CUDNN_OK(cudnnSetConvolution2dDescriptor(conv_, s.pad, s.pad, s.stride, s.stride, 1, 1,
                                                    CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  }
  Shape outputShape(const Shape& x) const override {
    DDPRUN_CHECK(x.size() == 4 && x[1] == s_.inC && x[2] + 2 * s_.pad >= s_.kernel &&
                     x[3] + 2 * s_.pad >= s_.kernel,
                 name(), " expects [N, ", s_.inC, ", H, W] with H, W + 2*", s_.pad, " >= ",
                 s_.kernel, ", got ", shapeString(x));
    return {x[0], s_.outC, (x[2] + 2 * s_.pad - s_.kernel) / s_.stride + 1,
            (x[3] + 2 * s_.pad - s_.kernel) / s_.stride + 1};
  }
  void forward(const Tensor& x, Tensor& y, bool training) override {
    ctx_->bind();
    checkInput(x);
    y.ensure(outputShape(x.shape()), ctx_->allocator(), ctx_->actType());
    if (x.dim(0) == 0) return;
    setShapes(x.shape(), y.shape());
    ConvAlgos& a = algos(x.shape());
    search_.findForward(a, x.shape());
    if (ctx_->autocast()) return forward16(x, y, training, a);
    runForward(x.data(), filterForCudnn(), y.data(), a);
    if (s_.bias)
      DDPRUN_CUDNN_OK(cudnnAddTensor(ctx_->cudnn(), &kCudnnOne, biasDesc_, b_.value.data(), &kCudnnOne,
                                     yDesc_, y.data()));
  }
  bool backwardReadsOutput() const override { return false; }
  // dx += dL/dx in cuDNN's backward-data call itself (beta = 1; its blend in
  // float, one rounding into a 16-bit dx); a graph-API plan, which only
  // overwrites, goes through a temporary and our add kernel.
  bool accumulatesDx() const override { return true; }
  void backwardAccumulate(const Tensor& x, const Tensor& y, const Tensor& dy,
                          Tensor& dx) override {
    DDPRUN_CHECK(dx.shape() == x.shape() && dx.dtype() == x.dtype(), name(),
                 ": backwardAccumulate adds into a gradient of x's shape and type (",
                 shapeString(x.shape()), " ", runtime::dtypeName(x.dtype()), "), got ",
                 shapeString(dx.shape()), " ", runtime::dtypeName(dx.dtype()));
    backwardInto(x, y, dy, &dx, true);
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override {
    backwardInto(x, y, dy, dx, false);
  }
  std::vector<Param*> params() override {
    if (s_.bias) return {&w_, &b_};
    return {&w_};
  }

 private:
  // backward, dL/dx written into *dx or (add) added to it.
  void backwardInto(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx, bool add) {
    ctx_->bind();
    checkType(dy, y, name().c_str());
    if (dx && !add) dx->ensureLike(x, ctx_->allocator());
    if (x.dim(0) == 0) return zeroFlaggedGrads();
    setShapes(x.shape(), y.shape());
    ConvAlgos& a = algos(x.shape());
    // cuDNN adds into dx itself (beta = 1) unless autocast computes a 16-bit
    // dx for a float one (then a cast adds it: backward16).
    const bool cudnnAdds = add && !(ctx_->autocast() && dx && !dx->is16());
    search_.findBackward(a, x.shape(), dx != nullptr, cudnnAdds);
    if (s_.bias && dy.is16()) {  // 16-bit activations (NHWC): dy's column sums in double
      launchColumnSum(dy.raw(), dy.dtype(), b_.grad.data(), dy.numel() / s_.outC, s_.outC,
                      !b_.overwriteGrad, ctx_->stream());
      b_.overwriteGrad = false;
    } else if (s_.bias) {  // from the float dy in every precision
      DDPRUN_CUDNN_OK(cudnnConvolutionBackwardBias(ctx_->cudnn(), &kCudnnOne, dyDesc_, dy.data(),
                                                   beta(b_), biasDesc_, b_.grad.data()));
      b_.overwriteGrad = false;
    }
    if (ctx_->autocast()) return backward16(x, dy, dx, add, a);
    if (ctx_->nhwc()) {  // KRSC from cuDNN, transposed into (or added to) the OIHW gradient
      DeviceArray<float> dwK(ctx_);
      runBackwardFilter(x.data(), dy.data(), dwK.ensure(weightCount()), &kCudnnZero, a);
      launchTranspose(dwK.get(), w_.grad.data(), s_.outC, kernelArea(), s_.inC, !w_.overwriteGrad,
                      ctx_->stream());
    } else {
      runBackwardFilter(x.data(), dy.data(), w_.grad.data(), beta(w_), a);
    }
    w_.overwriteGrad = false;
    if (dx)
      runBackwardData(ctx_->nhwc() ? wK_.get() : w_.value.data(), dy.data(), dx->data(), a,
                      {add, dx->dtype(), static_cast<size_t>(dx->numel())});
  }
  size_t weightCount() const { return static_cast<size_t>(w_.value.numel()); }
  // x is float, or of the context's 16-bit activation type.
  void checkInput(const Tensor& x) const {
    DDPRUN_CHECK(!x.is16() || x.dtype() == ctx_->actType(), name(), ": a ",
                 runtime::dtypeName(x.dtype()), " input, but this backend's activations are ",
                 runtime::dtypeName(ctx_->actType()));
  }
  int64_t kernelArea() const { return static_cast<int64_t>(s_.kernel) * s_.kernel; }
  // The filter as cuDNN reads it: the OIHW parameter itself, or (NHWC) its
  // KRSC copy, made here and kept for backward (one transpose per forward:
  // the parameters keep PyTorch's layout for checkpoints and the optimizer).
  const float* filterForCudnn() {
    if (!ctx_->nhwc()) return w_.value.data();
    float* k = wK_.ensure(weightCount());
    launchTranspose(w_.value.data(), k, s_.outC, s_.inC, kernelArea(), false, ctx_->stream());
    return k;
  }
  // Autocast: the filter's 16-bit copy in cuDNN's layout (KRSC with NHWC:
  // cast and transpose in one pass), kept in w16_.
  const void* filter16() {
    void* p = w16_.ensure(weightCount());
    if (ctx_->nhwc())
      launchTransposeTo16(w_.value.data(), p, s_.outC, s_.inC, kernelArea(), ctx_->bf16(),
                          ctx_->stream());
    else
      launchTo16(w_.value.data(), p, weightCount(), ctx_->bf16(), ctx_->stream());
    return p;
  }
  // The blending factor of a gradient's output: 0 writes it (overwriteGrad),
  // 1 adds to it.
  static const float* beta(const Param& p) { return p.overwriteGrad ? &kCudnnZero : &kCudnnOne; }
  // An empty batch produces no gradient: a gradient due to be overwritten
  // becomes zero (the contract of Param::overwriteGrad), others stay.
  void zeroFlaggedGrads() {
    for (Param* p : params()) {
      if (!p->overwriteGrad) continue;
      DDPRUN_CUDA_OK(cudaMemsetAsync(p->grad.data(), 0, p->grad.bytes(), ctx_->stream()));
      p->overwriteGrad = false;
    }
  }
  void setShapes(const Shape& x, const Shape& y) {
    const bool nhwc = ctx_->nhwc();
    setTensor4d(xDesc_, x[0], x[1], x[2], x[3], type_, nhwc);
    setTensor4d(yDesc_, y[0], y[1], y[2], y[3], type_, nhwc);
    setTensor4d(dyDesc_, y[0], y[1], y[2], y[3], CUDNN_DATA_FLOAT, nhwc);  // the bias gradient's input
  }
  ConvAlgos& algos(const Shape& x) {
    return cache_[{static_cast<int64_t>(type_), x[0], x[2], x[3]}];
  }

  // --------------------------------------------------- the cuDNN calls
  // Each with its own workspace from the allocator, returned once enqueued;
  // the direction's graph plan where the search chose one.
  void runForward(const void* x, const void* w, void* y, const ConvAlgos& a) {
    if (a.graphFwd) return runPlan(*a.graphFwd, x, w, y);
    const cudnnConvolutionFwdAlgoPerf_t& f = *a.fwd;
    DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, f.mathType));
    ScopedDeviceBytes ws(*ctx_, f.memory);
    DDPRUN_CUDNN_OK(cudnnConvolutionForward(ctx_->cudnn(), &kCudnnOne, xDesc_, x, wDesc_, w, conv_,
                                            f.algo, ws.get(), f.memory, &kCudnnZero, yDesc_, y));
  }
  void runBackwardFilter(const void* x, const void* dy, void* dw, const float* beta,
                         const ConvAlgos& a) {
    if (a.graphFilter) {
      // Graph plans overwrite (beta 0): only NHWC searches them, and NHWC
      // writes dW into a KRSC temporary first.
      DDPRUN_CHECK(*beta == 0.0f, name(), ": a graph-API backward-filter plan cannot accumulate");
      return runPlan(*a.graphFilter, x, dy, dw);
    }
    const cudnnConvolutionBwdFilterAlgoPerf_t& f = *a.filter;
    DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, f.mathType));
    ScopedDeviceBytes ws(*ctx_, f.memory);
    DDPRUN_CUDNN_OK(cudnnConvolutionBackwardFilter(ctx_->cudnn(), &kCudnnOne, xDesc_, x, yDesc_, dy,
                                                   conv_, f.algo, ws.get(), f.memory, beta,
                                                   wDesc_, dw));
  }
  // How backward-data writes dx: overwritten, or (add) added to, dx being
  // `count` elements of `type`.
  struct DxWrite {
    bool add = false;
    runtime::DType type = runtime::DType::kFloat32;
    size_t count = 0;
  };
  void runBackwardData(const void* w, const void* dy, void* dx, const ConvAlgos& a,
                       const DxWrite& to) {
    if (a.graphData) {
      if (!to.add) return runPlan(*a.graphData, w, dy, dx);
      ScopedDeviceBytes tmp(*ctx_, to.count * runtime::dtypeSize(to.type));
      runPlan(*a.graphData, w, dy, tmp.get());
      return launchAdd(dx, tmp.get(), dx, to.count, to.type, ctx_->stream());
    }
    const cudnnConvolutionBwdDataAlgoPerf_t& f = *a.data;
    DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, f.mathType));
    ScopedDeviceBytes ws(*ctx_, f.memory);
    DDPRUN_CUDNN_OK(cudnnConvolutionBackwardData(ctx_->cudnn(), &kCudnnOne, wDesc_, w, yDesc_, dy,
                                                 conv_, f.algo, ws.get(), f.memory,
                                                 to.add ? &kCudnnOne : &kCudnnZero, xDesc_, dx));
  }
  void runPlan(const GraphPlan& plan, const void* in1, const void* in2, void* out) {
    ScopedDeviceBytes ws(*ctx_, plan.workspace());
    DDPRUN_CUDNN_OK(plan.execute(ctx_->cudnn(), in1, in2, out, ws.get()));
  }

  // ------------------------------------------------------- autocast
  // 16-bit x and w (kept for backward: x until then, w until the next
  // forward), 16-bit output cast to float with the bias added. With 16-bit
  // activations x is read and y written as they are (no casts; the bias
  // added in place), and the model keeps x for backward.
  void forward16(const Tensor& x, Tensor& y, bool training, const ConvAlgos& a) {
    const void* w16 = filter16();
    const void* x16 = x.is16() ? x.raw()
                               : castTo16(*ctx_, x.data(), static_cast<size_t>(x.numel()), x16_);
    if (y.is16()) {
      runForward(x16, w16, y.raw(), a);
      if (s_.bias)
        launchAddChannelBias(y.raw(), y.dtype(), b_.value.data(), y.numel() / s_.outC, s_.outC,
                             ctx_->stream());
      if (x.is16() || !training)
        releaseInput16();  // the model keeps a 16-bit x; no backward follows evaluation
      else
        x16Of_ = x.data();
      return;
    }
    DeviceArray<uint16_t> y16(ctx_);
    runForward(x16, w16, y16.ensure(static_cast<size_t>(y.numel())), a);
    // The bias by channel: NCHW as [N, C, H*W], NHWC as [N*H*W, C, 1].
    const int64_t hw = y.dim(2) * y.dim(3);
    if (ctx_->nhwc())
      launchFrom16(y16.get(), s_.bias ? b_.value.data() : nullptr, y.data(), y.dim(0) * hw,
                   y.dim(1), 1, ctx_->bf16(), ctx_->stream());
    else
      launchFrom16(y16.get(), s_.bias ? b_.value.data() : nullptr, y.data(), y.dim(0), y.dim(1),
                   hw, ctx_->bf16(), ctx_->stream());
    x16Of_ = x.data();
    if (!training) releaseInput16();  // no backward follows: do not hold the memory
  }
  // dy to 16 bits; dW in 16 bits (cuDNN's legacy API wants dw in x's type)
  // added into, or written over, the float gradient; dx in 16 bits cast
  // into (add: added to) *dx.
  // 16-bit x, dy and dx (16-bit activations) are used as they are.
  void backward16(const Tensor& x, const Tensor& dy, Tensor* dx, bool add, const ConvAlgos& a) {
    const bool bf16 = ctx_->bf16();
    const void* x16 = x.is16() ? x.raw()
                      : x16Of_ == x.data() && x16_.get()
                          ? x16_.get()
                          : castTo16(*ctx_, x.data(), static_cast<size_t>(x.numel()), x16_);
    const void* w16 = w16_.get() ? w16_.get() : filter16();
    DeviceArray<uint16_t> dy16(ctx_), dw16(ctx_);
    const void* g16 = dy.is16() ? dy.raw()
                                : castTo16(*ctx_, dy.data(), static_cast<size_t>(dy.numel()), dy16);
    runBackwardFilter(x16, g16, dw16.ensure(weightCount()), &kCudnnZero, a);
    if (ctx_->nhwc())
      launchTransposeFrom16(dw16.get(), w_.grad.data(), s_.outC, kernelArea(), s_.inC, bf16,
                            !w_.overwriteGrad, ctx_->stream());
    else if (w_.overwriteGrad)
      launchFrom16(dw16.get(), nullptr, w_.grad.data(), static_cast<int64_t>(weightCount()), 1, 1,
                   bf16, ctx_->stream());
    else
      launchAccumulate16(dw16.get(), w_.grad.data(), weightCount(), bf16, ctx_->stream());
    w_.overwriteGrad = false;
    const size_t n = static_cast<size_t>(x.numel());
    if (dx && dx->is16()) {
      runBackwardData(w16, g16, dx->raw(), a, {add, dx->dtype(), n});
    } else if (dx) {  // into 16 bits, then cast into (or added to) the float dx
      DeviceArray<uint16_t> dx16(ctx_);
      runBackwardData(w16, g16, dx16.ensure(n), a, {false, ctx_->actType(), n});
      if (add)
        launchAccumulate16(dx16.get(), dx->data(), n, bf16, ctx_->stream());
      else
        launchFrom16(dx16.get(), nullptr, dx->data(), x.numel(), 1, 1, bf16, ctx_->stream());
    }
    releaseInput16();  // one backward per forward
  }
  void releaseInput16() {
    x16_.reset();
    x16Of_ = nullptr;
  }

  std::shared_ptr<Context> ctx_;
  Conv2dSpec s_;
  Param w_, b_;
  cudnnDataType_t type_;  // of x, w, y in the cuDNN calls: float, or bf16/fp16 (autocast)
  TensorDesc xDesc_, yDesc_, dyDesc_, biasDesc_;
  FilterDesc wDesc_;
  ConvDesc conv_;
  ConvSearch search_;  // borrows the descriptors above
  // (data type, N, H, W) -> algorithms
  std::map<std::array<int64_t, 4>, ConvAlgos> cache_;
  // Autocast: the 16-bit input of the last training forward (and the float
  // tensor it came from) and weights of the last forward.
  DeviceArray<uint16_t> x16_, w16_;
  const float* x16Of_ = nullptr;
  DeviceArray<float> wK_;  // NHWC: the float filter in KRSC (filterForCudnn)
};
}  // namespace

std::unique_ptr<Layer> makeConv2d(std::shared_ptr<Context> ctx, std::string name,
                                  const Conv2dSpec& spec) {
  return std::make_unique<Conv2d>(std::move(ctx), std::move(name), spec);
}

}  // namespace ddprun::train::cuda
