// The float64 reference of a convolution on the GPU, for the accuracy check
// of cuDNN's algorithms (conv_search.h): one thread per output element, each
// summing its products in double with kernel_math.h's convForwardAt,
// convBackwardDataAt and convBackwardFilterAt (which the CPU unit tests check
// against the CPU backend). Slow by design (no tiling, no shared memory):
// it runs on a reduced problem (batch 1 or 2) once per layer, shape and
// direction, at algorithm search time.
//
// Preconditions: device pointers of the current device, sized by the
// geometry (x [n, c, h, w], w [k, c, r, r], y/dy [n, k, oh, ow]); every
// launcher enqueues on `stream` and returns at once; launch errors throw
// CudaError. Thread-safety: none needed (stateless).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "../kernel_math.h"

namespace ddprun::train::cuda {

// y = conv(x, w) in double.
void launchConvReferenceForward(const float* x, const float* w, double* y,
                                const kmath::ConvGeom& g, cudaStream_t stream);
// dx = conv_backward_data(w, dy) in double.
void launchConvReferenceBackwardData(const float* w, const float* dy, double* dx,
                                     const kmath::ConvGeom& g, cudaStream_t stream);
// dw = conv_backward_filter(x, dy) in double (written, not accumulated).
void launchConvReferenceBackwardFilter(const float* x, const float* dy, double* dw,
                                       const kmath::ConvGeom& g, cudaStream_t stream);

// p[i] = kmath::hashUniform(seed, i), in [-1, 1).
void launchFillUniform(float* p, size_t n, uint64_t seed, cudaStream_t stream);
// The same rounded to bfloat16 (bf16) or float16 (16-bit elements).
void launchFillUniform16(void* p, size_t n, uint64_t seed, bool bf16, cudaStream_t stream);

// out[0] = max_i |got[i] - want[i]|, out[1] = max_i |want[i]| (one block, a
// fixed order; a NaN in got makes out[0] NaN). n >= 1.
void launchMaxError(const float* got, const double* want, size_t n, double* out,
                    cudaStream_t stream);

}  // namespace ddprun::train::cuda
