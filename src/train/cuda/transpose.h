// The CUDA backend's layout transposes (transpose.cu): activations NCHW <->
// NHWC and filters OIHW <-> KRSC, written, added or cast to and from 16 bits
// in the same pass.
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

// y[b][j][i] = x[b][i][j] for `batches` row-major [rows, cols] matrices: NCHW
// to NHWC is (N, C, H*W), NHWC to NCHW (N, H*W, C), OIHW filters to KRSC
// (O, I, R*S) and back (O, R*S, I). `accumulate`: y[...] += instead of =.
// A matrix with a side of at most 32 (the input's channels, a filter's R*S)
// goes through kmath::narrowTranspose's chunks, any other through 32x32 tiles.
// Preconditions: with both sides over 32, rows < 2^21 and batches < 65536
// (the grid's y and z limits).
void launchTranspose(const float* x, float* y, int64_t batches, int64_t rows, int64_t cols,
                     bool accumulate, cudaStream_t stream);
// The same, each result rounded to 16 bits (launchTo16's rounding): a filter's
// autocast copy in KRSC.
void launchTransposeTo16(const float* x, void* y16, int64_t batches, int64_t rows, int64_t cols,
                         bool bf16, cudaStream_t stream);
// The same from 16 bits into float, written or added (a KRSC 16-bit weight
// gradient into the OIHW float one).
void launchTransposeFrom16(const void* x16, float* y, int64_t batches, int64_t rows,
                           int64_t cols, bool bf16, bool accumulate, cudaStream_t stream);
// launchTranspose over elements of t, written (a 16-bit NHWC flatten).
void launchTranspose(const void* x, void* y, runtime::DType t, int64_t batches, int64_t rows,
                     int64_t cols, cudaStream_t stream);

}  // namespace ddprun::train::cuda
