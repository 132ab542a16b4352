// The CUDA backend's element-wise kernels (elementwise.cu): ReLU and add
// (16 bytes a thread where aligned), the scalar update of
// num_batches_tracked, the loss scaler's scale-and-check, a channel bias and
// its gradient's column sums, and the casts of autocast and of the gradient
// buckets. The element math is kernel_math.h's.
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

// ------------------------------------------------------- channel bias
// db[c] += sum_r dy[r * cols + c] (`accumulate`), or db[c] = the sum (the
// first gradient writer of a step, Param::overwriteGrad; rows == 0 writes 0),
// summed in double (the linear layer's bias gradient; rows in order, so
// deterministic).
void launchColumnSum(const float* dy, float* db, int64_t rows, int64_t cols, bool accumulate,
                     cudaStream_t stream);
void launchColumnSum(const void* dy, runtime::DType t, float* db, int64_t rows, int64_t cols,
                     bool accumulate, cudaStream_t stream);
// y[r * c + ch] += bias[ch] for an NHWC output seen as [rows = N*H*W, c] (a
// 16-bit convolution output and its float channel bias).
void launchAddChannelBias(void* y, runtime::DType t, const float* bias, int64_t rows, int64_t c,
                          cudaStream_t stream);
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
