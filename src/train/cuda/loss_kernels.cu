// The CUDA backend's loss kernels (loss_kernels.h): cross-entropy by rows,
// reduced in a fixed order, and the deferred training loss. Element math
// from kernel_math.h.
#include "loss_kernels.h"

#include <algorithm>
#include <cstdint>

#include "../kernel_math.h"
#include "kernel_support.cuh"

namespace ddprun::train::cuda {

namespace {
// ---------------------------------------------------------- cross-entropy
__global__ void crossEntropyRowsKernel(const float* logits, const int32_t* labels, int64_t n,
                                       int64_t k, float* dlogits, float gradScale, float eps,
                                       double* rowLoss, int* rowHit) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float* z = logits + i * k;
  const int32_t y = labels[i];
  const kmath::CeRow r = kmath::crossEntropyRow(z, k);
  rowLoss[i] = kmath::crossEntropyLoss(z, r, y, eps, k);
  rowHit[i] = r.arg == y;
  if (dlogits) {
    float* d = dlogits + i * k;
    for (int64_t j = 0; j < k; ++j)
      d[j] = kmath::crossEntropyGrad(z[j], r.lse, j == y, n, gradScale, eps, k);
  }
}
__global__ void crossEntropyReduceKernel(const double* rowLoss, const int* rowHit, int64_t n,
                                         CeResult* out) {
  double loss = 0.0, hits = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    loss += rowLoss[i];
    hits += rowHit[i];
  }
  loss = blockSum(loss);
  hits = blockSum(hits);
  if (threadIdx.x == 0) {
    out->lossSum = loss;
    out->correct = static_cast<long long>(hits);
  }
}
__global__ void accumulateLossKernel(const CeResult* r, double* acc) { *acc += r->lossSum; }
}  // namespace

void launchAccumulateLoss(const CeResult* r, double* acc, cudaStream_t s) {
  accumulateLossKernel<<<1, 1, 0, s>>>(r, acc);
  DDPRUN_CUDA_OK(cudaGetLastError());
}

void launchCrossEntropy(const float* logits, const int32_t* labels, int64_t n, int64_t k,
                        float* dlogits, float gradScale, float labelSmoothing, double* rowLoss,
                        int* rowHit, CeResult* out, cudaStream_t s) {
  if (n > 0) {
    crossEntropyRowsKernel<<<rowsBlocks(n), kThreads, 0, s>>>(
        logits, labels, n, k, dlogits, gradScale, labelSmoothing, rowLoss, rowHit);
    checkLaunch();
  }
  crossEntropyReduceKernel<<<1, kThreads, 0, s>>>(rowLoss, rowHit, n, out);
  checkLaunch();
}

}  // namespace ddprun::train::cuda
