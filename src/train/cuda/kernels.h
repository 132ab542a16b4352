// The CUDA backend's own kernels (kernels.cu), for the work cuDNN and cuBLASLt
// do not cover: the loss, the optimizer steps, small element-wise operations,
// bilinear resizing, global average pooling, the sums of SyncBatchNorm, the
// gradient buckets' 16-bit compression and the casts of autocast (bf16/fp16).
// The NHWC layout's kernels are in nhwc_kernels.h, batch norm's on NHWC in
// bn_nhwc.h. Each launcher enqueues on `stream` and returns at once; the
// element math is kernel_math.h's.
//
// Preconditions: pointers are device memory of the current device, sized as
// the arguments say; n == 0 launches nothing. Launch errors throw CudaError.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "../kernel_math.h"
#include "ddprun/runtime/types.h"

namespace ddprun::train::cuda {

// Activation storage: the launchers taking a runtime::DType `t` read and
// write their tensors' elements as t (float32, bfloat16, float16: the
// activations of CudaBackendOptions::activations16), computing in float and
// rounding each stored result to nearest even; another t throws
// InvalidArgument. The float* forms are t = float32.

// ---------------------------------------------------------- element-wise
// The output may be one of the inputs (in place), not overlap it otherwise.
// Where every pointer is 16-byte aligned a thread moves 16 bytes, else one
// element: the results are the same.
void launchRelu(const float* x, float* y, size_t n, cudaStream_t stream);
void launchReluBackward(const float* y, const float* dy, float* dx, size_t n, cudaStream_t stream);
void launchAdd(const float* a, const float* b, float* out, size_t n, cudaStream_t stream);
void launchRelu(const void* x, void* y, size_t n, runtime::DType t, cudaStream_t stream);
void launchReluBackward(const void* y, const void* dy, void* dx, size_t n, runtime::DType t,
                        cudaStream_t stream);
void launchAdd(const void* a, const void* b, void* out, size_t n, runtime::DType t,
               cudaStream_t stream);
// *p += v (one element: num_batches_tracked).
void launchAddScalar(float* p, float v, cudaStream_t stream);
// data *= scale; *nonFinite becomes nonzero when a result is not finite
// (the caller zeroes it first).
void launchScaleCheckFinite(float* data, size_t n, float scale, int* nonFinite,
                            cudaStream_t stream);

// ------------------------------------------------------------- optimizers
// SGD's `nesterov`: kmath::sgdStep's Nesterov direction (momentum != 0).
void launchSgd(float* w, const float* g, float* buf, size_t n, float lr, float momentum, float wd,
               bool first, bool nesterov, cudaStream_t stream);
void launchAdam(float* w, const float* g, float* m, float* v, size_t n, kmath::AdamScalars s,
                float b1, float b2, float eps, float wd, cudaStream_t stream);

// The multi-tensor forms: one launch updates up to kMaxOptimChunks chunks
// (more chunks: one launch per kMaxOptimChunks), each chunk n contiguous
// elements of w with its gradient g and state s1 (SGD's momentum buffer, null
// without momentum; Adam's exp_avg) and s2 (Adam's exp_avg_sq). The element
// math is launchSgd's/launchAdam's (kernel_math.h), so the results are
// bitwise those of one launchSgd/launchAdam per chunk. A chunk's w16, when
// not null, receives the updated weights rounded to 16 bits (bf16 when
// `bf16`, else fp16; round to nearest even, exactly as launchTo16). The
// chunk table travels by value in the kernel's parameters: `chunks` is host
// memory, free to reuse on return. Chunks with n == 0 are skipped.
struct OptimChunk {
  float* w = nullptr;
  const float* g = nullptr;
  float* s1 = nullptr;
  float* s2 = nullptr;
  void* w16 = nullptr;
  size_t n = 0;
};
constexpr size_t kMaxOptimChunks = 64;
void launchSgdMulti(const OptimChunk* chunks, size_t count, float lr, float momentum, float wd,
                    bool first, bool nesterov, bool bf16, cudaStream_t stream);
// Precondition: every chunk with n > 0 has s1 and s2.
void launchAdamMulti(const OptimChunk* chunks, size_t count, kmath::AdamScalars s, float b1,
                     float b2, float eps, float wd, bool bf16, cudaStream_t stream);

// ---------------------------------------------------------- cross-entropy
struct CeResult {
  double lossSum = 0.0;
  long long correct = 0;
};
// Per row: loss into rowLoss[i], arg-max hit into rowHit[i], and (dlogits
// non-null) the gradient row. Then one block sums the rows in a fixed order
// into *out (deterministic). labels are device int32 in [0, k).
// labelSmoothing: eps of kmath::crossEntropyLoss/crossEntropyGrad (0: none).
void launchCrossEntropy(const float* logits, const int32_t* labels, int64_t n, int64_t k,
                        float* dlogits, float gradScale, float labelSmoothing, double* rowLoss,
                        int* rowHit, CeResult* out, cudaStream_t stream);

// *acc += r->lossSum (one thread: the deferred training loss, read back only
// when the trainer reports it).
void launchAccumulateLoss(const CeResult* r, double* acc, cudaStream_t stream);

// db[c] += sum_r dy[r * cols + c] (`accumulate`), or db[c] = the sum (the
// first gradient writer of a step, Param::overwriteGrad; rows == 0 writes 0),
// summed in double (the linear layer's bias gradient; rows in order, so
// deterministic).
void launchColumnSum(const float* dy, float* db, int64_t rows, int64_t cols, bool accumulate,
                     cudaStream_t stream);
void launchColumnSum(const void* dy, runtime::DType t, float* db, int64_t rows, int64_t cols,
                     bool accumulate, cudaStream_t stream);

// ------------------------------------------------------- pooling, resize
// y[p] = mean of plane p (hw elements) for `planes` planes.
void launchGlobalAvgPool(const float* x, float* y, int64_t planes, int64_t hw,
                         cudaStream_t stream);
// dx[p * hw + q] = dy[p] / hw.
void launchGlobalAvgPoolBackward(const float* dy, float* dx, int64_t planes, int64_t hw,
                                 cudaStream_t stream);
// F.interpolate bilinear, align_corners=False, plane by plane.
void launchResizeBilinear(const float* x, float* y, int64_t planes, int64_t h, int64_t w,
                          int64_t oh, int64_t ow, cudaStream_t stream);

// ------------------------------------------------------ sync batch norm
// (The NCHW kernels below serve NHWC x as n * hw rows of c channels with
// hw = 1: the element of (row e, channel ch) is x[e * c + ch].)
// NCHW x with n, c, hw. out[ch] = sum over (n, hw) of x; out[c] = n * hw.
void launchChannelSum(const float* x, int64_t n, int64_t c, int64_t hw, double* out,
                      cudaStream_t stream);
// out[ch] = sum (x - mean)^2 with mean = sums[ch] / sums[c] (the global sums).
void launchChannelSquaredDeviation(const float* x, int64_t n, int64_t c, int64_t hw,
                                   const double* sums, double* out, cudaStream_t stream);
// From global sums (count at sums[c]) and squared deviations: mean and invstd
// (float) per channel; training: the running statistics update (momentum).
void launchBnFinishStats(const double* sums, const double* sqdev, int64_t c, double eps,
                         double momentum, float* mean, float* invstd, float* runningMean,
                         float* runningVar, cudaStream_t stream);
// xhat = (x - mean) * invstd; y = xhat * gamma + beta.
void launchBnNormalize(const float* x, const float* mean, const float* invstd,
                       const float* gamma, const float* beta, float* xhat, float* y, int64_t n,
                       int64_t c, int64_t hw, cudaStream_t stream);
// out[ch] = sum dy, out[c + ch] = sum dy * xhat, out[2c] = n * hw.
void launchBnBackwardSums(const float* dy, const float* xhat, int64_t n, int64_t c, int64_t hw,
                          double* out, cudaStream_t stream);
// dgamma[ch] += sums[c + ch]; dbeta[ch] += sums[ch] (the local sums).
void launchBnParamGrads(const double* sums, int64_t c, float* dgamma, float* dbeta,
                        cudaStream_t stream);
// As launchBnParamGrads, each gradient overwritten (=) instead where its flag
// says so (Param::overwriteGrad).
void launchBnParamGrads(const double* sums, int64_t c, float* dgamma, float* dbeta,
                        bool overwriteGamma, bool overwriteBeta, cudaStream_t stream);
// dx from the global sums (count at sums[2c]).
void launchBnBackwardData(const float* dy, const float* xhat, const double* sums,
                          const float* gamma, const float* invstd, float* dx, int64_t n, int64_t c,
                          int64_t hw, cudaStream_t stream);

// ---------------------------------------------- autocast (bf16 / fp16)
// The casts around the 16-bit convolutions and matrix products. To 16 bits
// rounds to nearest even: in fp16, |v| >= 65520 becomes +-inf and NaN stays
// NaN, never clamped (the overflow the fp16 loss scaler must see); back to
// float is exact.
// dst16[i] = to16(src[i]).
void launchTo16(const float* src, void* dst16, size_t n, bool bf16, cudaStream_t stream);
// dst[i] = float(src16[i]) + bias[(i / hw) % c] (bias null: no bias), for
// NCHW [n, c, hw] output (a convolution's output and its channel bias).
void launchFrom16(const void* src16, const float* bias, float* dst, int64_t n, int64_t c,
                  int64_t hw, bool bf16, cudaStream_t stream);
// dst[i] += float(src16[i]) (a 16-bit weight gradient into the fp32 one).
void launchAccumulate16(const void* src16, float* dst, size_t n, bool bf16, cudaStream_t stream);

// ------------------------------------------------------ gradient buckets
// dst16[i] = to16(src[i] * scale) (round to nearest even); bf16 or fp16.
void launchCompress16(const float* src, void* dst16, size_t n, float scale, bool bf16,
                      cudaStream_t stream);
void launchDecompress16(const void* src16, float* dst, size_t n, bool bf16, cudaStream_t stream);

}  // namespace ddprun::train::cuda
