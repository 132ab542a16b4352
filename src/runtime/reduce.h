// CPU reduction kernels shared by every transport. Internal header.
#pragma once

#include <cstddef>

#include "ddprun/runtime/types.h"

namespace ddprun::runtime {

// dst[i] = op(srcs[0][i], ..., srcs[k-1][i]) for i < count. kAvg reduces as
// kSum (the caller divides once at the end with divideBy). dst may alias any
// source. 16-bit floats are accumulated in float and rounded once.
void reduceN(DType t, ReduceOp op, void* dst, const void* const* srcs, int k, size_t count);

// The same, storing each result block to all m destinations, divided by
// `divisor` first (1: no division; kAvg's final step fused into the pass).
// Saves re-reading the result to copy it to peers.
void reduceNTo(DType t, ReduceOp op, void* const* dsts, int m, const void* const* srcs, int k,
               size_t count, int divisor);

// dst[i] = op(dst[i], src[i]).
inline void reduceInto(DType t, ReduceOp op, void* dst, const void* src, size_t count) {
  const void* srcs[2] = {dst, src};
  reduceN(t, op, dst, srcs, 2, count);
}

// dst[i] /= divisor (integers truncate toward zero). Finishes kAvg.
void divideBy(DType t, void* dst, size_t count, int divisor);

}  // namespace ddprun::runtime
