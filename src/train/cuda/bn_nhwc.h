// Batch norm over NHWC activations with the residual add and the ReLU fused in
// (in the manner of apex's groupbn and PyTorch's channels_last batch norm),
// for activations stored as float32, bfloat16 or float16: cuDNN has no bf16
// batch norm, so these kernels normalise bf16 activations (and serve fp16 and
// float alike). Statistics, parameters and running statistics are float; the
// sums are double (the backward sums add float groups of a few terms,
// kmath::BnGradGroup); element math is float (kernel_math.h's bnActForward,
// bnActGrad, bnActBackwardData, bnMomentsFromSums), loads convert exactly to
// float and stores round to nearest even.
//
// Activations are viewed as `rows` x `c` row-major (rows = N*H*W; channel
// fastest). Training, per layer:
//   forward:  launchBnNhwcStats -> [all-reduce the 2c+1 sums: SyncBatchNorm]
//             -> launchBnNhwcFinish -> launchBnNhwcForward
//   backward: launchBnNhwcBackwardSums -> launchBnParamGrads (bn_nchw.h, from
//             the local sums) -> [all-reduce the sums] -> launchBnNhwcBackwardData
// Evaluation: launchBnNhwcInvStd (running variance) -> launchBnNhwcForward
// with the running mean. With a BnFold (below), the finish (without
// SyncBatchNorm) and the parameter gradients are done by the sums' launch.
//
// The sums layout (2c + 1 doubles): out[ch], out[c + ch] the two per-channel
// sums, out[2c] the count (rows, as double). The sums are reproducible
// bitwise: per-block partials over a fixed partition of the rows (a function
// of rows only) are written to `workspace`, then summed over the blocks in a
// fixed order; no atomics. The partition does not depend on the vector width
// the launcher picks from the pointers' alignment, nor on the device.
//
// Programmatic dependent launch: a launcher taking a LaunchStream
// (launch_stream.h) launches with PDL when its `pdl` is set (a layer sets it
// from Context::pdl(), DDPRUN_CUDA_PDL=1 on compute capability 9.0+): the
// kernels wait for the work before them at their start, so the results are
// the same bits either way. launchBnActPoolForward's max pool and
// launchBnParamGrads launch without it.
//
// Thread-safety: launchers only enqueue on `stream` and return; they may be
// called from any thread. Two launches sharing a workspace must be ordered
// (the same stream).
//
// Preconditions: pointers are device memory of the current device, sized as
// the arguments say ([rows, c] in storage `t` for activations; c floats for
// the per-channel vectors; 2c + 1 doubles for sums; bnNhwcWorkspaceBytes for
// workspace); rows, c >= 0. Storage t is kFloat32, kBFloat16 or kFloat16
// (anything else throws InvalidArgument naming it). Launch errors throw
// CudaError. Aliasing: only exact (same pointer), never partial overlap, and
// only where a launcher says so.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ddprun/runtime/types.h"
#include "launch_stream.h"
#include "pool_kernels.h"  // PoolShape

namespace ddprun::train::cuda {

// Bytes of scratch launchBnNhwcStats / launchBnNhwcBackwardSums need for
// (rows, c): one partial row of 2c doubles per row chunk (at most 512 chunks;
// at most 8 MiB at c = 1024). 0 when rows or c is 0 (workspace may then be null).
size_t bnNhwcWorkspaceBytes(int64_t rows, int64_t c);

// ------------------------------------------- folded launches (BnFold)
// The sums' launchers (launchBnNhwcStats, launchBnNhwcBackwardSums,
// launchBnActPoolBackwardSums) take an optional BnFold: what follows the
// sums, done by the same launch. With `counters`, each channel tile's last
// block to finish (a counter per tile, kmath::bnIsLastArrival) does the
// chunk reduction for the tile's channels in the unfolded reduction's order
// (kmath::bnChunkLaneSum and its tree: the same sums, bit for bit) and then
// the tile's epilogue: one launch where the unfolded path makes two to four
// (issue 44 item 3: in ResNet-18's small layers the kernels are bound by
// launch latency, not bytes). Without counters the launcher makes the
// unfolded launches, the epilogue included, so a caller's code is the same
// either way (CudaBackendOptions::bnFold decides).
//   finish (forward; mean not null): launchBnNhwcFinish's results from the
//     local sums with count = rows (not for SyncBatchNorm, whose finish
//     follows the all-reduce).
//   grads (backward; dgamma not null): launchBnParamGrads's (bn_nchw.h), the
//     flags saying overwrite (=) or add (+=).
// counters: bnNhwcFoldCounters(c) zeros on the device, ordered with the
// launch (the same stream); every launch leaves them zero again. Two
// launches that share counters must be ordered, as with the workspace.
struct BnFold {
  unsigned* counters = nullptr;
  struct Finish {
    double eps = 0.0, momentum = 0.0;
    float *mean = nullptr, *invstd = nullptr, *runningMean = nullptr, *runningVar = nullptr;
  } finish;
  struct Grads {
    float *dgamma = nullptr, *dbeta = nullptr;
    bool overwriteGamma = false, overwriteBeta = false;
  } grads;
};
// Counters a BnFold over c channels needs (one per channel tile at the
// narrowest vector width; at least 1).
size_t bnNhwcFoldCounters(int64_t c);

// out[ch] = sum over rows of x, out[c + ch] = sum of x^2 (double), out[2c] =
// rows. rows == 0: zeros and count 0. c == 0: only out[0] = rows. Reads x once.
void launchBnNhwcStats(const void* x, runtime::DType t, int64_t rows, int64_t c,
                       void* workspace, double* out, LaunchStream stream,
                       const BnFold* fold = nullptr);

// From sums laid out as above (possibly all-reduced over ranks; count at
// sums[2c]): mean and invstd = 1/sqrt(biased var + eps) (float), and, when
// runningMean is not null (then runningVar neither), PyTorch's running update
// (momentum; unbiased var; kmath::bnRunningUpdate). A count of 0 gives mean 0,
// invstd 1/sqrt(eps) and leaves the running statistics unchanged.
void launchBnNhwcFinish(const double* sums, int64_t c, double eps, double momentum, float* mean,
                        float* invstd, float* runningMean, float* runningVar,
                        LaunchStream stream);

// Evaluation: invstd[ch] = 1/sqrt(var[ch] + eps) (kmath::bnInvStd). invstd
// may alias var.
void launchBnNhwcInvStd(const float* var, int64_t c, double eps, float* invstd,
                        LaunchStream stream);

// y = relu?((x - mean) * invstd * gamma + beta + z) (kmath::bnActForward);
// z (the residual, storage t) may be null. y in storage t. y may be x or z
// itself (each element is read before it is written by the same thread), but
// the layer needs x for the backward. Traffic: reads x (and z), writes y.
void launchBnNhwcForward(const void* x, const void* z, void* y, runtime::DType t, int64_t rows,
                         int64_t c, const float* mean, const float* invstd, const float* gamma,
                         const float* beta, bool relu, LaunchStream stream);

// Backward sums. g = relu ? (y > 0 ? dy : 0) : dy (kmath::bnActGrad; y may be
// null without relu). Writes g into gOut (storage t: the residual's gradient
// dz, exact) when gOut is not null; gOut may be dy itself. out[ch] = sum g,
// out[c + ch] = sum g * xhat (xhat = (x - mean) * invstd recomputed from x, in
// float; g and g * xhat summed in float over each thread's group of
// kmath::kBnGradGroup rows, the groups in double: kmath::BnGradGroup), out[2c]
// = rows; rows == 0 and
// c == 0 as launchBnNhwcStats. Traffic: reads x, dy (and y), writes g.
void launchBnNhwcBackwardSums(const void* x, const void* y, const void* dy, void* gOut,
                              runtime::DType t, int64_t rows, int64_t c, const float* mean,
                              const float* invstd, bool relu, void* workspace, double* out,
                              LaunchStream stream, const BnFold* fold = nullptr);

// dx = gamma*invstd * (g - S1/M - xhat * S2/M) (kmath::bnActBackwardData)
// with S1, S2, M from sums (all-reduced for SyncBatchNorm; M = sums[2c] > 0);
// g read from `g` when not null (then y and dy are ignored), else recomputed
// from (y, dy, relu) as in launchBnNhwcBackwardSums. dx in storage t. dx may
// be dy, g, x or y itself (each element's inputs are read by the thread that
// writes it, before it writes). Traffic: reads x and g (or dy and y), writes dx.
void launchBnNhwcBackwardData(const void* x, const void* y, const void* dy, const void* g,
                              void* dx, runtime::DType t, int64_t rows, int64_t c,
                              const double* sums, const float* gamma, const float* mean,
                              const float* invstd, bool relu, LaunchStream stream);

// ------------------------- fused stem: batch norm + ReLU + max pool
// ResNet's stem as one layer (kernel_math.h's "fused stem"): the same
// statistics (launchBnNhwcStats, launchBnNhwcFinish; evaluation:
// launchBnNhwcInvStd), then
//   forward:  launchBnActPoolForward (the pooled output and the winning taps)
//   backward: launchBnActPoolBackwardSums -> launchBnParamGrads -> [all-reduce]
//             -> launchBnNhwcBackwardData with g = the gradient it wrote
// The pooling: PoolShape (pool_kernels.h).

// y[o] = the maximum over o's window of relu(bn(x)) as the unfused batch norm
// stores it (kmath::bnActForward rounded to t; kmath::poolReplaces: the first
// maximum, NaN propagating); arg (not null: training) each output's winning
// tap a * k + b. Reads each x element once per window covering it (mostly
// from cache), writes y and arg.
void launchBnActPoolForward(const void* x, void* y, uint8_t* arg, runtime::DType t,
                            const PoolShape& g, const float* mean, const float* invstd,
                            const float* gamma, const float* beta, cudaStream_t stream);

// Its backward sums: for each input element i, the pooled gradient routed to
// it (dy of the outputs whose winning tap i is, in output order, summed in
// float and rounded to t, as the unfused pooling's backward stores it),
// masked by the recomputed activation (kmath::bnActGrad), written to gOut
// when not null (storage t; the dx buffer launchBnNhwcBackwardData then reads
// as g and may overwrite), and summed as launchBnNhwcBackwardSums sums (same partition,
// same order: the unfused sums, bit for bit) into out (2c + 1 doubles,
// workspace bnNhwcWorkspaceBytes(n * h * w, c)). Traffic: reads x, dy and
// arg (a quarter of x's elements each at 3x3/2), writes gOut.
void launchBnActPoolBackwardSums(const void* x, const void* dy, const uint8_t* arg, void* gOut,
                                 runtime::DType t, const PoolShape& g, const float* mean,
                                 const float* invstd, const float* gamma, const float* beta,
                                 void* workspace, double* out, LaunchStream stream,
                                 const BnFold* fold = nullptr);

}  // namespace ddprun::train::cuda
