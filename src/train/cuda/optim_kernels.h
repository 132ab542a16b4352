// The CUDA backend's optimizer kernels (optim_kernels.cu): SGD (momentum,
// Nesterov, weight decay) and Adam, one chunk table a launch, the 16-bit
// weight copies written in the same pass. The element math is
// kernel_math.h's (kmath::sgdStep, kmath::adamStep).
//
// Preconditions: pointers are device memory of the current device, sized as
// the arguments say; n == 0 (an empty shape) launches nothing. Launch errors
// throw CudaError. Each launcher enqueues on `stream` and returns at once.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "../kernel_math.h"
#include "ddprun/runtime/types.h"

namespace ddprun::train::cuda {

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

// The scalars of a step that change from step to step, in device memory: a
// launch recorded once in a CUDA graph reads them there at each replay
// (Backend::stageOptimizerStep fills them). SGD reads lr and first, Adam
// `adam` (its step size and bias correction, kmath::adamScalars on the host).
struct OptimStepScalars {
  float lr = 0.0f;
  int32_t first = 0;  // SGD's first step: the momentum buffer starts as the gradient
  kmath::AdamScalars adam;
};

// `stepScalars`: when not null (device memory), the kernel takes lr and
// first (SGD) or the AdamScalars (Adam) from there when it runs, instead of
// the arguments; the other arguments are used as given. The same kernel
// either way, so the results are bitwise equal for equal values.
void launchSgdMulti(const OptimChunk* chunks, size_t count, float lr, float momentum, float wd,
                    bool first, bool nesterov, bool bf16, cudaStream_t stream,
                    const OptimStepScalars* stepScalars = nullptr);
// Precondition: every chunk with n > 0 has s1 and s2.
void launchAdamMulti(const OptimChunk* chunks, size_t count, kmath::AdamScalars s, float b1,
                     float b2, float eps, float wd, bool bf16, cudaStream_t stream,
                     const OptimStepScalars* stepScalars = nullptr);

}  // namespace ddprun::train::cuda
