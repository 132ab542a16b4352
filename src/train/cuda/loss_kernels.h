// The CUDA backend's loss kernels (loss_kernels.cu): cross-entropy with
// label smoothing, its gradient and arg-max hits, summed in a fixed order.
// The element math is kernel_math.h's (kmath::crossEntropy*).
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

}  // namespace ddprun::train::cuda
