// What the CUDA transports share (self_comm.cu, staged_comm.cu, nccl_comm.cu,
// ipc_comm.cu, device_collectives.cu): the GPU checks, a bounded stream wait
// and the event conversions of the ordered path (the reduction kernels are in
// reduce_kernels.h). Internal header of src/runtime/cuda/ (CUDA types:
// include only from .cu files).
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <initializer_list>

#include "../device_order.h"
#include "ddprun/runtime/cuda_check.h"
#include "ddprun/runtime/types.h"

namespace ddprun::runtime {

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

}  // namespace ddprun::runtime
