// The CUDA backend's pooling and resizing kernels (pool_kernels.cu): global
// average pooling over NCHW planes or NHWC images, our NHWC max pooling
// (the layer's alternative to cuDNN's, pooling.cc), and bilinear resizing.
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

// Max pooling's geometry: NHWC [n, h, w, c] into [n, oh, ow, c] through a
// square window k (<= 16), stride s, padding p (<= k / 2; padded positions
// never win), floor mode.
struct PoolShape {
  int64_t n = 0, h = 0, w = 0, c = 0, oh = 0, ow = 0;
  int k = 3, s = 2, p = 1;
};

// Activation storage: the launchers taking a runtime::DType `t` read and
// write their tensors' elements as t (float32, bfloat16, float16: the
// activations of CudaBackendOptions::activations16), computing in float and
// rounding each stored result to nearest even; another t throws
// InvalidArgument. The float* forms are t = float32.

// y[p] = mean of plane p (hw elements) for `planes` planes.
void launchGlobalAvgPool(const float* x, float* y, int64_t planes, int64_t hw,
                         cudaStream_t stream);
// dx[p * hw + q] = dy[p] / hw.
void launchGlobalAvgPoolBackward(const float* dy, float* dx, int64_t planes, int64_t hw,
                                 cudaStream_t stream);
// F.interpolate bilinear, align_corners=False, plane by plane.
void launchResizeBilinear(const float* x, float* y, int64_t planes, int64_t h, int64_t w,
                          int64_t oh, int64_t ow, cudaStream_t stream);

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
// Max pooling of NHWC x ([n, h, w, c] in memory, elements of t) into y
// ([n, oh, ow, c]): square window k (<= 16), stride s, padding p (padded
// positions never win), the first maximum in scan order (row, then column)
// winning and NaN propagating (kmath::poolReplaces), as the CPU backend; `arg` (not null: training) receives each
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
