// The batch norm kernels of the NCHW path (bn_nchw.cu): SyncBatchNorm over
// float activations (per-channel sums in double, all-reduced by the layer,
// then the squared deviations; backward's two sums likewise), and the
// parameter gradients from the sums, which the NHWC path (bn_nhwc.h) shares.
// Which layer runs which path: batch_norm.h.
//
// Preconditions: pointers are device memory of the current device, sized as
// the arguments say; n == 0 (an empty shape) launches nothing. Launch errors
// throw CudaError. Each launcher enqueues on `stream` and returns at once.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ddprun/runtime/types.h"

namespace ddprun::train::cuda {

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

}  // namespace ddprun::train::cuda
