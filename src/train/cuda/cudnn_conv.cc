// The CUDA backend's convolution (cuDNN); pooling and batch norm are in
// cudnn_layers.cc.
//
// API choice: cuDNN's legacy ("v7") descriptor API (cudnnConvolutionForward,
// cudnnFindConvolution*Algorithm, cudnnPoolingForward,
// cudnnBatchNormalization*), deprecated in cuDNN 9 but present in 9.19,
// rather than the graph API through cudnn-frontend: it covers every
// operation here (NCHW, fixed shapes per model) with a few calls each,
// needs no extra header-only dependency, and its algorithm search is one call
// per direction whose result we cache per input shape. The graph API would pay
// off for fused patterns (conv + bias + ReLU, 16-bit runtime fusion), which
// this backend does not do yet; moving there is local to this file.
//
// Precision: fp32 sets CUDNN_FMA_MATH on every convolution (no tensor cores,
// no TF32); tf32, bf16 and fp16 set CUDNN_TENSOR_OP_MATH (tensor cores) and
// use the math type cuDNN's search reports for the chosen algorithm.
// fp32 also keeps to algorithms that sum products directly (no FFT or
// Winograd transforms, whose rounding error is larger), see sumsDirectly().
// Determinism: only algorithms cuDNN reports as deterministic are chosen, so
// runs repeat bitwise (backward-filter/data have non-deterministic atomics
// algorithms, which we skip). Algorithms are cached per (data type, N, H, W).
//
// bf16/fp16 (torch.autocast semantics): activations between layers, weights,
// gradients and batch norm stay float; a convolution casts its input and its
// weights to 16 bits (our kernel, into allocator memory; the weights once per
// forward, reused by backward, the input kept from forward to backward, as
// autocast saves the 16-bit input) and runs cuDNN on 16-bit tensors with
// float compute (CUDNN_DATA_FLOAT in the convolution descriptor: cuDNN's
// PSEUDO_HALF / PSEUDO_BFLOAT16 configurations) and tensor-op math. The legacy
// API wants x, w and y (dx, dw, dy) of one data type (a float output from
// 16-bit inputs is not a supported configuration), so:
//   forward   y16 = conv(x16, w16), then y = float(y16) + bias in one kernel;
//   dW        dw16 = conv_bwd_filter(x16, dy16) with beta = 0, then our kernel
//             adds float(dw16) into the float gradient (gradients accumulate);
//             as in PyTorch, where the 16-bit weight's gradient is 16-bit
//             before the cast back to float accumulates it;
//   dx        dx16 = conv_bwd_data(w16, dy16), cast into the float dx;
//   db        cudnnConvolutionBackwardBias on the float dy (beta = 1).
// Nothing is clamped: in fp16 a value beyond 65504 becomes inf in a cast or
// a cuDNN output, and inf/NaN flows into the float gradients, which is what
// the fp16 loss scaler (Backend::scaleAndCheckFinite) detects.
#include <array>
#include <map>
#include <optional>

#include "cuda_layers.h"
#include "ddprun/common/env.h"
#include "ddprun/common/error.h"
#include "ddprun/runtime/cuda.h"
#include "kernels.h"

namespace ddprun::train::cuda {

namespace {
const float kOne = 1.0f, kZero = 0.0f;
// cuDNN's algorithm search skips algorithms needing more workspace than this.
constexpr size_t kMaxWorkspace = size_t{512} << 20;

cudnnMathType_t searchMathType(Precision p) {
  return p == Precision::kFp32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
}

// Algorithms that sum the products directly (implicit/explicit GEMM, direct):
// fp32 uses only these. FFT and Winograd transforms trade accuracy for speed
// (on an H100 with cuDNN 9.14, the fastest backward-data for LeNet's 5x5
// conv1 was off by up to 0.9% of the gradient's scale from oneDNN, which
// agrees with a float64 reference; the direct algorithms agree with both);
// tf32 and the 16-bit precisions, already approximate, may use every
// algorithm.
bool sumsDirectly(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
}
bool sumsDirectly(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
}
bool sumsDirectly(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
}

// DDPRUN_CUDNN_DETERMINISTIC=0 also admits cuDNN's non-deterministic
// algorithms (atomics in backward; what PyTorch's cudnn.benchmark may pick):
// runs then no longer repeat bitwise. Default 1.
bool deterministicOnly() {
  static const bool on = env::integer("DDPRUN_CUDNN_DETERMINISTIC", 1, 0, 1) == 1;
  return on;
}

// The first (fastest) deterministic successful result within the workspace
// limit whose math type and algorithm the precision allows. cuDNN returns
// them sorted by time.
template <typename Perf>
Perf choose(const Perf* perfs, int n, Precision p, const std::string& layer, const char* what) {
  for (int i = 0; i < n; ++i) {
    const Perf& r = perfs[i];
    if (r.status != CUDNN_STATUS_SUCCESS ||
        (r.determinism != CUDNN_DETERMINISTIC && deterministicOnly()) ||
        r.memory > kMaxWorkspace || r.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)
      continue;
    if (p == Precision::kFp32 && (r.mathType == CUDNN_TENSOR_OP_MATH || !sumsDirectly(r.algo)))
      continue;
    Perf chosen = r;
    // Strict fp32: call with FMA math whatever the search labelled it.
    if (p == Precision::kFp32) chosen.mathType = CUDNN_FMA_MATH;
    return chosen;
  }
  DDPRUN_THROW(runtime::CudaError, layer, ": cuDNN found no deterministic ", what,
               " algorithm for this shape within ", kMaxWorkspace >> 20, " MiB of workspace (",
               n, " candidates, precision ", precisionName(p), ")");
}

// ------------------------------------------------------------ convolution
class Conv2d final : public Layer {
 public:
  Conv2d(std::shared_ptr<Context> ctx, std::string name, const Conv2dSpec& s)
      : Layer(name), ctx_(std::move(ctx)), s_(s),
        w_(makeDeviceParam(*ctx_, name + ".weight", {s.outC, s.inC, s.kernel, s.kernel})),
        x16_(ctx_), w16_(ctx_) {
    DDPRUN_CHECK(s.inC > 0 && s.outC > 0 && s.kernel > 0 && s.stride > 0 && s.pad >= 0, name,
                 ": invalid convolution (in ", s.inC, ", out ", s.outC, ", kernel ", s.kernel,
                 ", stride ", s.stride, ", pad ", s.pad, ")");
    if (s.bias) b_ = makeDeviceParam(*ctx_, name + ".bias", {s.outC});
    type_ = !ctx_->autocast() ? CUDNN_DATA_FLOAT
                              : (ctx_->bf16() ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF);
    xDesc_ = TensorDesc::create();
    yDesc_ = TensorDesc::create();
    dyDesc_ = TensorDesc::create();
    biasDesc_ = TensorDesc::create();
    wDesc_ = FilterDesc::create();
    conv_ = ConvDesc::create();
    setTensor4d(biasDesc_, 1, s.outC, 1, 1);
    DDPRUN_CUDNN_OK(cudnnSetFilter4dDescriptor(wDesc_, type_, CUDNN_TENSOR_NCHW,
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
    y.ensure(outputShape(x.shape()), ctx_->allocator());
    if (x.dim(0) == 0) return;
    setShapes(x.shape(), y.shape());
    Algos& a = algos(x.shape());
    findForward(a);
    DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, a.fwd->mathType));
    if (ctx_->autocast()) return forward16(x, y, training, *a.fwd);
    DDPRUN_CUDNN_OK(cudnnConvolutionForward(
        ctx_->cudnn(), &kOne, xDesc_, x.data(), wDesc_, w_.value.data(), conv_, a.fwd->algo,
        ctx_->workspace(a.fwd->memory), a.fwd->memory, &kZero, yDesc_, y.data()));
    if (s_.bias)
      DDPRUN_CUDNN_OK(cudnnAddTensor(ctx_->cudnn(), &kOne, biasDesc_, b_.value.data(), &kOne,
                                     yDesc_, y.data()));
  }
  bool backwardReadsOutput() const override { return false; }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override {
    ctx_->bind();
    if (dx) dx->ensure(x.shape(), ctx_->allocator());
    if (x.dim(0) == 0) return;
    setShapes(x.shape(), y.shape());
    Algos& a = algos(x.shape());
    findBackward(a, dx != nullptr);
    if (s_.bias)  // from the float dy in every precision
      DDPRUN_CUDNN_OK(cudnnConvolutionBackwardBias(ctx_->cudnn(), &kOne, dyDesc_, dy.data(), &kOne,
                                                   biasDesc_, b_.grad.data()));
    if (ctx_->autocast()) return backward16(x, dy, dx, a);
    DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, a.filter->mathType));
    DDPRUN_CUDNN_OK(cudnnConvolutionBackwardFilter(
        ctx_->cudnn(), &kOne, xDesc_, x.data(), yDesc_, dy.data(), conv_, a.filter->algo,
        ctx_->workspace(a.filter->memory), a.filter->memory, &kOne, wDesc_, w_.grad.data()));
    if (!dx) return;
    DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, a.data->mathType));
    DDPRUN_CUDNN_OK(cudnnConvolutionBackwardData(
        ctx_->cudnn(), &kOne, wDesc_, w_.value.data(), yDesc_, dy.data(), conv_, a.data->algo,
        ctx_->workspace(a.data->memory), a.data->memory, &kZero, xDesc_, dx->data()));
  }
  std::vector<Param*> params() override {
    if (s_.bias) return {&w_, &b_};
    return {&w_};
  }

 private:
  struct Algos {
    std::optional<cudnnConvolutionFwdAlgoPerf_t> fwd;
    std::optional<cudnnConvolutionBwdDataAlgoPerf_t> data;
    std::optional<cudnnConvolutionBwdFilterAlgoPerf_t> filter;
  };
  size_t weightCount() const { return static_cast<size_t>(w_.value.numel()); }
  void setShapes(const Shape& x, const Shape& y) {
    setTensor4d(xDesc_, x[0], x[1], x[2], x[3], type_);
    setTensor4d(yDesc_, y[0], y[1], y[2], y[3], type_);
    setTensor4d(dyDesc_, y[0], y[1], y[2], y[3]);  // float: the bias gradient's input
  }
  Algos& algos(const Shape& x) { return cache_[{static_cast<int64_t>(type_), x[0], x[2], x[3]}]; }
  void findForward(Algos& a) {
    if (a.fwd) return;
    std::array<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT> perfs{};
    int n = 0;
    DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, searchMathType(ctx_->precision())));
    DDPRUN_CUDNN_OK(cudnnFindConvolutionForwardAlgorithm(ctx_->cudnn(), xDesc_, wDesc_, conv_,
                                                         yDesc_, perfs.size(), &n, perfs.data()));
    a.fwd = choose(perfs.data(), n, ctx_->precision(), name(), "forward");
  }
  void findBackward(Algos& a, bool needData) {
    const cudnnMathType_t m = searchMathType(ctx_->precision());
    if (!a.filter) {
      std::array<cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT> p{};
      int n = 0;
      DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, m));
      DDPRUN_CUDNN_OK(cudnnFindConvolutionBackwardFilterAlgorithm(
          ctx_->cudnn(), xDesc_, yDesc_, conv_, wDesc_, p.size(), &n, p.data()));
      a.filter = choose(p.data(), n, ctx_->precision(), name(), "backward-filter");
    }
    if (needData && !a.data) {
      std::array<cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT> p{};
      int n = 0;
      DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, m));
      DDPRUN_CUDNN_OK(cudnnFindConvolutionBackwardDataAlgorithm(
          ctx_->cudnn(), wDesc_, yDesc_, conv_, xDesc_, p.size(), &n, p.data()));
      a.data = choose(p.data(), n, ctx_->precision(), name(), "backward-data");
    }
  }

  // Autocast: 16-bit x and w (kept for backward: x until then, w until the
  // next forward), 16-bit output cast to float with the bias added.
  void forward16(const Tensor& x, Tensor& y, bool training,
                 const cudnnConvolutionFwdAlgoPerf_t& f) {
    const void* w16 = castTo16(*ctx_, w_.value.data(), weightCount(), w16_);
    const void* x16 = castTo16(*ctx_, x.data(), static_cast<size_t>(x.numel()), x16_);
    DeviceArray<uint16_t> y16(ctx_);
    DDPRUN_CUDNN_OK(cudnnConvolutionForward(
        ctx_->cudnn(), &kOne, xDesc_, x16, wDesc_, w16, conv_, f.algo,
        ctx_->workspace(f.memory), f.memory, &kZero, yDesc_,
        y16.ensure(static_cast<size_t>(y.numel()))));
    launchFrom16(y16.get(), s_.bias ? b_.value.data() : nullptr, y.data(), y.dim(0), y.dim(1),
                 y.dim(2) * y.dim(3), ctx_->bf16(), ctx_->stream());
    x16Of_ = x.data();
    if (!training) releaseInput16();  // no backward follows: do not hold the memory
  }
  // dy to 16 bits; dW in 16 bits (cuDNN's legacy API wants dw in x's type)
  // added into the float gradient; dx in 16 bits cast into *dx.
  void backward16(const Tensor& x, const Tensor& dy, Tensor* dx, const Algos& a) {
    const bool bf16 = ctx_->bf16();
    const void* x16 = x16Of_ == x.data() && x16_.get()
                          ? x16_.get()
                          : castTo16(*ctx_, x.data(), static_cast<size_t>(x.numel()), x16_);
    const void* w16 = w16_.get() ? w16_.get() : castTo16(*ctx_, w_.value.data(), weightCount(), w16_);
    DeviceArray<uint16_t> dy16(ctx_), dw16(ctx_);
    castTo16(*ctx_, dy.data(), static_cast<size_t>(dy.numel()), dy16);
    DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, a.filter->mathType));
    DDPRUN_CUDNN_OK(cudnnConvolutionBackwardFilter(
        ctx_->cudnn(), &kOne, xDesc_, x16, yDesc_, dy16.get(), conv_, a.filter->algo,
        ctx_->workspace(a.filter->memory), a.filter->memory, &kZero, wDesc_,
        dw16.ensure(weightCount())));
    launchAccumulate16(dw16.get(), w_.grad.data(), weightCount(), bf16, ctx_->stream());
    if (dx) {
      DeviceArray<uint16_t> dx16(ctx_);
      DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, a.data->mathType));
      DDPRUN_CUDNN_OK(cudnnConvolutionBackwardData(
          ctx_->cudnn(), &kOne, wDesc_, w16, yDesc_, dy16.get(), conv_, a.data->algo,
          ctx_->workspace(a.data->memory), a.data->memory, &kZero, xDesc_,
          dx16.ensure(static_cast<size_t>(x.numel()))));
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
  // (data type, N, H, W) -> algorithms
  std::map<std::array<int64_t, 4>, Algos> cache_;
  // Autocast: the 16-bit input of the last training forward (and the float
  // tensor it came from) and weights of the last forward.
  DeviceArray<uint16_t> x16_, w16_;
  const float* x16Of_ = nullptr;
};
}  // namespace

std::unique_ptr<Layer> makeConv2d(std::shared_ptr<Context> ctx, std::string name,
                                  const Conv2dSpec& spec) {
  return std::make_unique<Conv2d>(std::move(ctx), std::move(name), spec);
}

}  // namespace ddprun::train::cuda
