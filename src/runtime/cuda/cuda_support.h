// What the CUDA transports share (cuda_comm.cu, nccl_comm.cu, ipc_comm.cu,
// staged_comm.cu): the GPU checks, a bounded stream wait, the event
// conversions of the ordered path and our reduction kernels. Internal header
// of src/runtime/cuda/ (CUDA types: include only from .cu files).
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <initializer_list>

#include "../device_order.h"
#include "ddprun/runtime/cuda_check.h"
#include "ddprun/runtime/types.h"

namespace ddprun::runtime {

// Ranks that may share a host's GPUs through CUDA IPC (and the most sources
// one reduction kernel reads).
constexpr int kMaxIpcPeers = 16;

// Throws InvalidArgument when no GPU is visible (a CUDA collective on a
// machine without one).
void requireGpu();

// Waits for the stream, failing with a timeout (a peer failure) instead of
// hanging forever.
void syncStream(cudaStream_t s, std::chrono::milliseconds timeout, const char* what);

inline cudaEvent_t toEvent(internal::DeviceEvent e) { return static_cast<cudaEvent_t>(e); }
inline cudaStream_t toStream(internal::DeviceStream s) { return static_cast<cudaStream_t>(s); }

// The ordered operations of the transports whose collectives block until
// done (IPC, staged): every stream the collective may use waits on the
// device for ev.after, `start` is recorded on the first one, the collective
// runs (its own stream synchronisation now also waits for the producer: the
// group's thread waits, which these transports' host barriers need anyway),
// and `done` is recorded once it returned, on an idle stream.
template <typename Op>
void runOrderedBlocking(std::initializer_list<cudaStream_t> streams,
                        const internal::OrderedEvents& ev, Op op) {
  if (ev.after)
    for (cudaStream_t s : streams) DDPRUN_CUDA_OK(cudaStreamWaitEvent(s, toEvent(ev.after), 0));
  const cudaStream_t first = *streams.begin();
  if (ev.start) DDPRUN_CUDA_OK(cudaEventRecord(toEvent(ev.start), first));
  op();
  if (ev.done) DDPRUN_CUDA_OK(cudaEventRecord(toEvent(ev.done), first));
}


// Device pointers of a reduction's sources or destinations.
struct PtrSet {
  char* p[kMaxIpcPeers];
};

// out_j[i] = op over k sources of src_k[i], for each of m destinations
// (avgDiv > 1: the result divided by it, kAvg's second half), on `st`.
void launchReduce(DType t, ReduceOp op, const PtrSet& s, int k, const PtrSet& d, int m,
                  size_t count, int avgDiv, cudaStream_t st);

}  // namespace ddprun::runtime
