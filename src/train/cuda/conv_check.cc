#include "conv_check.h"

#include <algorithm>
#include <limits>

#include "conv_reference.h"
#include "ddprun/runtime/cuda_check.h"
#include "elementwise.h"
#include "transpose.h"

namespace ddprun::train::cuda {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
// The reduced problem's inputs: fixed streams, so a search repeats exactly.
constexpr uint64_t kSeedX = 0x5eed0001, kSeedW = 0x5eed0002, kSeedDy = 0x5eed0003;
}  // namespace

// The measure is e = max|out - ref| / max|ref| on uniform inputs in [-1, 1)
// (the largest error in units of the output's scale, which is what a
// gradient step feels; per-element relative errors blow up near zero).
// u below is the unit roundoff of the precision's inputs.
//
// fp32, 1e-4: direct sums with FMA math show ~1e-6; a normal Winograd 3x3
//   forward ~1e-5, admitted 10x below the bound; the error that made fp32
//   keep to direct sums before (a Winograd/FFT backward-data of LeNet's 5x5
//   conv1, 1 input channel, off by 0.9 % = 9e-3 of the gradient's scale on
//   an H100 with cuDNN 9.14) is rejected 90x above it. The bound is also 4x
//   below tf32's own rounding error (~4e-4, next), so fp32 never silently
//   computes at tf32's accuracy.
// tf32, 8u with u = 2^-11 (10 stored mantissa bits): 3.9e-3. Rounding x and
//   w to tf32 costs each product up to 2u; over sums with random signs the
//   error is about u in this measure (~5e-4, the direct tf32 algorithms);
//   8u leaves room for the transforms' extra roundings and still rejects the
//   9e-3 kind of error.
// bf16, 8u with u = 2^-8: 3.1e-2; fp16, 8u with u = 2^-11: 3.9e-3. The
//   check's inputs are already 16-bit, so it measures the output's rounding
//   to 16 bits (<= u/2 of each element) and the float accumulation; a
//   layer's error against a float reference adds the rounding of its float
//   inputs, about another u, still well inside.
double convErrorBound(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return 1e-4;
    case Precision::kTf32:
      return 8.0 / 2048;
    case Precision::kBf16:
      return 8.0 / 256;
    case Precision::kFp16:
      return 8.0 / 2048;
  }
  return 0.0;
}

ConvAccuracyCheck::ConvAccuracyCheck(std::shared_ptr<Context> ctx, const kmath::ConvGeom& full,
                                     cudnnDataType_t type, cudnnFilterDescriptor_t wDesc,
                                     cudnnConvolutionDescriptor_t conv)
    : ctx_(std::move(ctx)), g_(full), type_(type), nhwc_(ctx_->nhwc()), wDesc_(wDesc), conv_(conv),
      xDesc_(TensorDesc::create()), yDesc_(TensorDesc::create()), x_(ctx_), w_(ctx_), dy_(ctx_),
      refY_(ctx_), refDx_(ctx_), refDw_(ctx_), result_(ctx_), outF_(ctx_) {
  g_.n = std::min(full.n, kConvCheckBatch);
  setTensor4d(xDesc_, g_.n, g_.c, g_.h, g_.w, type_, nhwc_);
  setTensor4d(yDesc_, g_.n, g_.k, g_.oh, g_.ow, type_, nhwc_);
  draw(x_, xCount(), kSeedX, xDims());
  draw(w_, wCount(), kSeedW, wDims());
  draw(dy_, yCount(), kSeedDy, yDims());
}

void ConvAccuracyCheck::draw(Operand& o, size_t n, uint64_t seed, Dims d) {
  const cudaStream_t s = ctx_->stream();
  float* f = o.f.ensure(n);
  launchFillUniform(f, n, seed, s);
  const bool bf16 = type_ == CUDNN_DATA_BFLOAT16;
  if (type_ != CUDNN_DATA_FLOAT) {  // f becomes what cuDNN reads
    void* h = o.h.ensure(n);
    launchTo16(f, h, n, bf16, s);
    launchFrom16(h, nullptr, f, static_cast<int64_t>(n), 1, 1, bf16, s);
    if (nhwc_) launchTransposeTo16(f, h, d.a, d.b, d.cd, bf16, s);  // exact: f is 16-bit
  } else if (nhwc_) {
    launchTranspose(f, o.t.ensure(n), d.a, d.b, d.cd, false, s);
  }
}

double ConvAccuracyCheck::measure(const void* out, const double* ref, size_t n, Dims d) {
  const float* got = static_cast<const float*>(out);
  const bool bf16 = type_ == CUDNN_DATA_BFLOAT16;
  if (nhwc_) {  // back to NCHW / OIHW, as float
    float* f = outF_.ensure(n);
    if (type_ != CUDNN_DATA_FLOAT)
      launchTransposeFrom16(out, f, d.a, d.cd, d.b, bf16, false, ctx_->stream());
    else
      launchTranspose(got, f, d.a, d.cd, d.b, false, ctx_->stream());
    got = f;
  } else if (type_ != CUDNN_DATA_FLOAT) {
    float* f = outF_.ensure(n);
    launchFrom16(out, nullptr, f, static_cast<int64_t>(n), 1, 1, bf16, ctx_->stream());
    got = f;
  }
  double* r = result_.ensure(2);
  launchMaxError(got, ref, n, r, ctx_->stream());
  double host[2] = {0.0, 0.0};
  ctx_->readBack(r, host, sizeof host);
  if (host[1] == 0.0) return host[0] == 0.0 ? 0.0 : kInf;
  return host[0] / host[1];  // NaN stays NaN
}

double ConvAccuracyCheck::errorOf(ConvDirection dir, const Runner& run) {
  const cudaStream_t s = ctx_->stream();
  const double* ref = nullptr;
  size_t n = 0;
  Dims d{};
  const void* in1 = x_.data();
  const void* in2 = dy_.data();
  switch (dir) {
    case ConvDirection::kForward:
      if (!refY_.get())
        launchConvReferenceForward(x_.f.get(), w_.f.get(), refY_.ensure(yCount()), g_, s);
      ref = refY_.get(), n = yCount(), d = yDims(), in2 = w_.data();
      break;
    case ConvDirection::kBackwardData:
      if (!refDx_.get())
        launchConvReferenceBackwardData(w_.f.get(), dy_.f.get(), refDx_.ensure(xCount()), g_, s);
      ref = refDx_.get(), n = xCount(), d = xDims(), in1 = w_.data();
      break;
    case ConvDirection::kBackwardFilter:
      if (!refDw_.get())
        launchConvReferenceBackwardFilter(x_.f.get(), dy_.f.get(), refDw_.ensure(wCount()), g_, s);
      ref = refDw_.get(), n = wCount(), d = wDims();
      break;
  }
  ScopedDeviceBytes out(*ctx_, n * elementBytes());
  if (!run(in1, in2, out.get())) return kInf;
  return measure(out.get(), ref, n, d);
}

double ConvAccuracyCheck::error(cudnnConvolutionFwdAlgo_t algo, cudnnMathType_t math) {
  return errorOf(ConvDirection::kForward, [&](const void* x, const void* w, void* y) {
    DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, math));
    size_t bytes = 0;
    if (cudnnGetConvolutionForwardWorkspaceSize(ctx_->cudnn(), xDesc_, wDesc_, conv_, yDesc_,
                                                algo, &bytes) != CUDNN_STATUS_SUCCESS ||
        bytes > kConvWorkspaceCap)
      return false;
    ScopedDeviceBytes ws(*ctx_, bytes);
    return cudnnConvolutionForward(ctx_->cudnn(), &kCudnnOne, xDesc_, x, wDesc_, w, conv_, algo,
                                   ws.get(), bytes, &kCudnnZero, yDesc_, y) == CUDNN_STATUS_SUCCESS;
  });
}

double ConvAccuracyCheck::error(cudnnConvolutionBwdDataAlgo_t algo, cudnnMathType_t math) {
  return errorOf(ConvDirection::kBackwardData, [&](const void* w, const void* dy, void* dx) {
    DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, math));
    size_t bytes = 0;
    if (cudnnGetConvolutionBackwardDataWorkspaceSize(ctx_->cudnn(), wDesc_, yDesc_, conv_,
                                                     xDesc_, algo, &bytes) !=
            CUDNN_STATUS_SUCCESS ||
        bytes > kConvWorkspaceCap)
      return false;
    ScopedDeviceBytes ws(*ctx_, bytes);
    return cudnnConvolutionBackwardData(ctx_->cudnn(), &kCudnnOne, wDesc_, w, yDesc_, dy, conv_, algo,
                                        ws.get(), bytes, &kCudnnZero, xDesc_,
                                        dx) == CUDNN_STATUS_SUCCESS;
  });
}

double ConvAccuracyCheck::error(cudnnConvolutionBwdFilterAlgo_t algo, cudnnMathType_t math) {
  return errorOf(ConvDirection::kBackwardFilter, [&](const void* x, const void* dy, void* dw) {
    DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, math));
    size_t bytes = 0;
    if (cudnnGetConvolutionBackwardFilterWorkspaceSize(ctx_->cudnn(), xDesc_, yDesc_, conv_,
                                                       wDesc_, algo, &bytes) !=
            CUDNN_STATUS_SUCCESS ||
        bytes > kConvWorkspaceCap)
      return false;
    ScopedDeviceBytes ws(*ctx_, bytes);
    return cudnnConvolutionBackwardFilter(ctx_->cudnn(), &kCudnnOne, xDesc_, x, yDesc_, dy, conv_,
                                          algo, ws.get(), bytes, &kCudnnZero, wDesc_,
                                          dw) == CUDNN_STATUS_SUCCESS;
  });
}

double ConvAccuracyCheck::error(ConvDirection dir, const GraphEngine& e) {
  const int i = static_cast<int>(dir);
  if (!graphTried_[i]) {  // the reduced problem's graph, once per direction
    graphTried_[i] = true;
    graph_[i] = GraphConv::create(ctx_->cudnn(), {dir, g_, type_, nhwc_}, nullptr);
  }
  if (!graph_[i]) return kInf;
  const std::shared_ptr<const GraphPlan> plan = graph_[i]->plan(e);
  if (!plan || plan->workspace() > kConvWorkspaceCap) return kInf;
  return errorOf(dir, [&](const void* in1, const void* in2, void* out) {
    ScopedDeviceBytes ws(*ctx_, plan->workspace());
    return plan->execute(ctx_->cudnn(), in1, in2, out, ws.get()) == CUDNN_STATUS_SUCCESS;
  });
}

}  // namespace ddprun::train::cuda
