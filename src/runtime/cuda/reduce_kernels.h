// The CUDA transports' reduction kernel (reduce_kernels.cu): k device sources
// combined element-wise into m device destinations, on a given stream. Used by
// the IPC transport (its reductions) and the NCCL transport (kAvg's division).
// Internal header of src/runtime/cuda/ (CUDA types: include only from .cu
// files).
//
// Thread-safety: no state; the stream orders the work.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "ddprun/runtime/types.h"

namespace ddprun::runtime {

// Ranks that may share a host's GPUs through CUDA IPC (and the most sources
// one reduction kernel reads).
constexpr int kMaxIpcPeers = 16;

// Device pointers of a reduction's sources or destinations.
struct PtrSet {
  char* p[kMaxIpcPeers];
};

// out_j[i] = op over k sources of src_k[i], for each of m destinations
// (avgDiv > 1: the result divided by it, kAvg's second half), on `st`.
void launchReduce(DType t, ReduceOp op, const PtrSet& s, int k, const PtrSet& d, int m,
                  size_t count, int avgDiv, cudaStream_t st);

}  // namespace ddprun::runtime
