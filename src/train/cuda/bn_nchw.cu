// The NCHW batch norm kernels (bn_nchw.h): SyncBatchNorm's per-channel sums
// in double, its normalisation and backward, and the parameter gradients
// from the sums (shared with bn_nhwc.cu's path). Element math from
// kernel_math.h; fixed-order block sums, so results repeat bitwise.
#include "bn_nchw.h"

#include <algorithm>
#include <cstdint>

#include "../kernel_math.h"
#include "kernel_support.cuh"

namespace ddprun::train::cuda {

namespace {
// One block per channel; the (n, hw) elements of channel ch.
__global__ void channelSumKernel(const float* x, int64_t n, int64_t c, int64_t hw, double* out) {
  const int64_t ch = blockIdx.x;
  double s = 0.0;
  for (int64_t e = threadIdx.x; e < n * hw; e += blockDim.x)
    s += x[((e / hw) * c + ch) * hw + e % hw];
  s = blockSum(s);
  if (threadIdx.x == 0) {
    out[ch] = s;
    if (ch == 0) out[c] = static_cast<double>(n * hw);
  }
}
__global__ void channelSqDevKernel(const float* x, int64_t n, int64_t c, int64_t hw,
                                   const double* sums, double* out) {
  const int64_t ch = blockIdx.x;
  const double mean = sums[ch] / sums[c];
  double s = 0.0;
  for (int64_t e = threadIdx.x; e < n * hw; e += blockDim.x) {
    const double d = x[((e / hw) * c + ch) * hw + e % hw] - mean;
    s += d * d;
  }
  s = blockSum(s);
  if (threadIdx.x == 0) out[ch] = s;
}
__global__ void bnFinishStatsKernel(const double* sums, const double* sqdev, int64_t c,
                                    double eps, double momentum, float* mean, float* invstd,
                                    float* runningMean, float* runningVar) {
  const int64_t ch = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (ch >= c) return;
  const double count = sums[c];
  const double mu = sums[ch] / count, var = sqdev[ch] / count;
  mean[ch] = static_cast<float>(mu);
  invstd[ch] = kmath::bnInvStd(var, eps);
  if (runningMean)
    kmath::bnRunningUpdate(runningMean[ch], runningVar[ch], mu, var, count, momentum);
}
__global__ void bnNormalizeKernel(const float* x, const float* mean, const float* invstd,
                                  const float* gamma, const float* beta, float* xhat, float* y,
                                  int64_t n, int64_t c, int64_t hw) {
  const size_t total = static_cast<size_t>(n * c * hw);
  DDPRUN_GRID_LOOP(i, total) {
    const int64_t ch = static_cast<int64_t>(i / hw) % c;
    const float xh = kmath::bnXhat(x[i], mean[ch], invstd[ch]);
    xhat[i] = xh;
    y[i] = kmath::bnOut(xh, gamma[ch], beta[ch]);
  }
}
__global__ void bnBackwardSumsKernel(const float* dy, const float* xhat, int64_t n, int64_t c,
                                     int64_t hw, double* out) {
  const int64_t ch = blockIdx.x;
  double s1 = 0.0, s2 = 0.0;
  for (int64_t e = threadIdx.x; e < n * hw; e += blockDim.x) {
    const int64_t idx = ((e / hw) * c + ch) * hw + e % hw;
    const float g = dy[idx];
    s1 += g;
    s2 += static_cast<double>(g) * xhat[idx];
  }
  s1 = blockSum(s1);
  s2 = blockSum(s2);
  if (threadIdx.x == 0) {
    out[ch] = s1;
    out[c + ch] = s2;
    if (ch == 0) out[2 * c] = static_cast<double>(n * hw);
  }
}
__global__ void bnParamGradsKernel(const double* sums, int64_t c, float* dgamma, float* dbeta,
                                   bool overwriteGamma, bool overwriteBeta) {
  const int64_t ch = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (ch >= c) return;
  dgamma[ch] = kmath::bnGradAccumulate(dgamma[ch], sums[c + ch], overwriteGamma);
  dbeta[ch] = kmath::bnGradAccumulate(dbeta[ch], sums[ch], overwriteBeta);
}
__global__ void bnBackwardDataKernel(const float* dy, const float* xhat, const double* sums,
                                     const float* gamma, const float* invstd, float* dx, int64_t n,
                                     int64_t c, int64_t hw) {
  const size_t total = static_cast<size_t>(n * c * hw);
  const double m = sums[2 * c];
  DDPRUN_GRID_LOOP(i, total) {
    const int64_t ch = static_cast<int64_t>(i / hw) % c;
    const float k1 = static_cast<float>(sums[ch] / m), k2 = static_cast<float>(sums[c + ch] / m);
    dx[i] = kmath::bnBackward(dy[i], xhat[i], gamma[ch] * invstd[ch], k1, k2);
  }
}

}  // namespace

void launchChannelSum(const float* x, int64_t n, int64_t c, int64_t hw, double* out,
                      cudaStream_t s) {
  if (c <= 0) return;
  channelSumKernel<<<static_cast<int>(c), kThreads, 0, s>>>(x, n, c, hw, out);
  checkLaunch();
}
void launchChannelSquaredDeviation(const float* x, int64_t n, int64_t c, int64_t hw,
                                   const double* sums, double* out, cudaStream_t s) {
  if (c <= 0) return;
  channelSqDevKernel<<<static_cast<int>(c), kThreads, 0, s>>>(x, n, c, hw, sums, out);
  checkLaunch();
}
void launchBnFinishStats(const double* sums, const double* sqdev, int64_t c, double eps,
                         double momentum, float* mean, float* invstd, float* runningMean,
                         float* runningVar, cudaStream_t s) {
  if (c <= 0) return;
  bnFinishStatsKernel<<<rowsBlocks(c), kThreads, 0, s>>>(sums, sqdev, c, eps, momentum, mean,
                                                         invstd, runningMean, runningVar);
  checkLaunch();
}
void launchBnNormalize(const float* x, const float* mean, const float* invstd,
                       const float* gamma, const float* beta, float* xhat, float* y, int64_t n,
                       int64_t c, int64_t hw, cudaStream_t s) {
  const size_t total = static_cast<size_t>(n * c * hw);
  if (!total) return;
  bnNormalizeKernel<<<blocksFor(total), kThreads, 0, s>>>(x, mean, invstd, gamma, beta, xhat, y,
                                                          n, c, hw);
  checkLaunch();
}
void launchBnBackwardSums(const float* dy, const float* xhat, int64_t n, int64_t c, int64_t hw,
                          double* out, cudaStream_t s) {
  if (c <= 0) return;
  bnBackwardSumsKernel<<<static_cast<int>(c), kThreads, 0, s>>>(dy, xhat, n, c, hw, out);
  checkLaunch();
}
void launchBnParamGrads(const double* sums, int64_t c, float* dgamma, float* dbeta,
                        cudaStream_t s) {
  launchBnParamGrads(sums, c, dgamma, dbeta, false, false, s);
}
void launchBnParamGrads(const double* sums, int64_t c, float* dgamma, float* dbeta,
                        bool overwriteGamma, bool overwriteBeta, cudaStream_t s) {
  if (c <= 0) return;
  bnParamGradsKernel<<<rowsBlocks(c), kThreads, 0, s>>>(sums, c, dgamma, dbeta, overwriteGamma,
                                                        overwriteBeta);
  checkLaunch();
}
void launchBnBackwardData(const float* dy, const float* xhat, const double* sums,
                          const float* gamma, const float* invstd, float* dx, int64_t n, int64_t c,
                          int64_t hw, cudaStream_t s) {
  const size_t total = static_cast<size_t>(n * c * hw);
  if (!total) return;
  bnBackwardDataKernel<<<blocksFor(total), kThreads, 0, s>>>(dy, xhat, sums, gamma, invstd, dx, n,
                                                             c, hw);
  checkLaunch();
}

}  // namespace ddprun::train::cuda
