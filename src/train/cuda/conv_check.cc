#include "conv_check.h"

#include <algorithm>
#include <limits>

#include "conv_reference.h"
#include "ddprun/runtime/cuda_check.h"
#include "kernels.h"
#include "nhwc_kernels.h"

namespace ddprun::train::cuda {

namespace {
const float kOne = 1.0f, kZero = 0.0f;
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

double ConvAccuracyCheck::error(cudnnConvolutionFwdAlgo_t algo, cudnnMathType_t math) {
  if (!refY_.get())
    launchConvReferenceForward(x_.f.get(), w_.f.get(), refY_.ensure(yCount()), g_, ctx_->stream());
  DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, math));
  size_t bytes = 0;
  if (cudnnGetConvolutionForwardWorkspaceSize(ctx_->cudnn(), xDesc_, wDesc_, conv_, yDesc_, algo,
                                              &bytes) != CUDNN_STATUS_SUCCESS ||
      bytes > kConvWorkspaceCap)
    return kInf;
  ScopedDeviceBytes out(*ctx_, yCount() * elementBytes()), ws(*ctx_, bytes);
  if (cudnnConvolutionForward(ctx_->cudnn(), &kOne, xDesc_, x_.data(), wDesc_, w_.data(), conv_,
                              algo, ws.get(), bytes, &kZero, yDesc_,
                              out.get()) != CUDNN_STATUS_SUCCESS)
    return kInf;
  return measure(out.get(), refY_.get(), yCount(), yDims());
}

double ConvAccuracyCheck::error(cudnnConvolutionBwdDataAlgo_t algo, cudnnMathType_t math) {
  if (!refDx_.get())
    launchConvReferenceBackwardData(w_.f.get(), dy_.f.get(), refDx_.ensure(xCount()), g_,
                                    ctx_->stream());
  DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, math));
  size_t bytes = 0;
  if (cudnnGetConvolutionBackwardDataWorkspaceSize(ctx_->cudnn(), wDesc_, yDesc_, conv_, xDesc_,
                                                   algo, &bytes) != CUDNN_STATUS_SUCCESS ||
      bytes > kConvWorkspaceCap)
    return kInf;
  ScopedDeviceBytes out(*ctx_, xCount() * elementBytes()), ws(*ctx_, bytes);
  if (cudnnConvolutionBackwardData(ctx_->cudnn(), &kOne, wDesc_, w_.data(), yDesc_, dy_.data(),
                                   conv_, algo, ws.get(), bytes, &kZero, xDesc_,
                                   out.get()) != CUDNN_STATUS_SUCCESS)
    return kInf;
  return measure(out.get(), refDx_.get(), xCount(), xDims());
}

double ConvAccuracyCheck::error(cudnnConvolutionBwdFilterAlgo_t algo, cudnnMathType_t math) {
  if (!refDw_.get())
    launchConvReferenceBackwardFilter(x_.f.get(), dy_.f.get(), refDw_.ensure(wCount()), g_,
                                      ctx_->stream());
  DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, math));
  size_t bytes = 0;
  if (cudnnGetConvolutionBackwardFilterWorkspaceSize(ctx_->cudnn(), xDesc_, yDesc_, conv_, wDesc_,
                                                     algo, &bytes) != CUDNN_STATUS_SUCCESS ||
      bytes > kConvWorkspaceCap)
    return kInf;
  ScopedDeviceBytes out(*ctx_, wCount() * elementBytes()), ws(*ctx_, bytes);
  if (cudnnConvolutionBackwardFilter(ctx_->cudnn(), &kOne, xDesc_, x_.data(), yDesc_, dy_.data(),
                                     conv_, algo, ws.get(), bytes, &kZero, wDesc_,
                                     out.get()) != CUDNN_STATUS_SUCCESS)
    return kInf;
  return measure(out.get(), refDw_.get(), wCount(), wDims());
}

}  // namespace ddprun::train::cuda
