// The CUDA backend's kernels over NHWC activations (nhwc_kernels.cu): the
// layout transposes (activations and filters), global average and max
// pooling, and the channel bias of a 16-bit convolution output. Each launcher
// enqueues on `stream` and returns at once.
//
// Activation storage as kernels.h says: a runtime::DType `t` is the element
// type of every activation argument (float32, bfloat16 or float16; another
// throws InvalidArgument); the float* forms are t = float32.
// Preconditions: pointers are device memory of the current device, sized as
// the arguments say; empty shapes launch nothing. Launch errors throw
// CudaError.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ddprun/runtime/types.h"

namespace ddprun::train::cuda {

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
// Global average pooling of NHWC x ([n, hw, c] in memory): y[i * c + ch] =
// mean over q of x[(i * hw + q) * c + ch], summed in q order; and its backward
// dx[(i * hw + q) * c + ch] = dy[i * c + ch] / hw.
void launchGlobalAvgPoolNhwc(const float* x, float* y, int64_t n, int64_t c, int64_t hw,
                             cudaStream_t stream);
void launchGlobalAvgPoolNhwcBackward(const float* dy, float* dx, int64_t n, int64_t c,
                                     int64_t hw, cudaStream_t stream);
// The same over elements of t (x and y, dy and dx alike), summed in float.
void launchGlobalAvgPoolNhwc(const void* x, void* y, runtime::DType t, int64_t n, int64_t c,
                             int64_t hw, cudaStream_t stream);
void launchGlobalAvgPoolNhwcBackward(const void* dy, void* dx, runtime::DType t, int64_t n,
                                     int64_t c, int64_t hw, cudaStream_t stream);
// launchTranspose over elements of t, written (a 16-bit NHWC flatten).
void launchTranspose(const void* x, void* y, runtime::DType t, int64_t batches, int64_t rows,
                     int64_t cols, cudaStream_t stream);
// y[r * c + ch] += bias[ch] for an NHWC output seen as [rows = N*H*W, c] (a
// 16-bit convolution output and its float channel bias).
void launchAddChannelBias(void* y, runtime::DType t, const float* bias, int64_t rows, int64_t c,
                          cudaStream_t stream);
// Max pooling of NHWC x ([n, h, w, c] in memory, elements of t) into y
// ([n, oh, ow, c]): square window k (<= 16), stride s, padding p (padded
// positions never win), the first maximum in scan order (row, then column)
// winning, as the CPU backend; `arg` (not null: training) receives each
// output's winning tap a * k + b. The backward gathers, for each input
// element, dy of the outputs whose winning tap it is (in output order, in
// float; deterministic, no atomics) into dx. PyTorch's channels_last pooling
// is its own kernel too; the layer runs these where cuDNN refuses 16-bit
// pooling (or DDPRUN_CUDA_OWN_POOL=1).
void launchMaxPoolNhwc(const void* x, void* y, uint8_t* arg, runtime::DType t, int64_t n,
                       int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow, int k, int s,
                       int p, cudaStream_t stream);
void launchMaxPoolNhwcBackward(const void* dy, const uint8_t* arg, void* dx, runtime::DType t,
                               int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh,
                               int64_t ow, int k, int s, int p, cudaStream_t stream);

}  // namespace ddprun::train::cuda
