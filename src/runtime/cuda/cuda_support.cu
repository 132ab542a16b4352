// The CUDA transports' shared helpers (cuda_support.h).
#include "cuda_support.h"

#include <thread>

#include "../comm.h"
#include "ddprun/common/clock.h"
#include "ddprun/common/error.h"
#include "ddprun/runtime/cuda.h"

namespace ddprun::runtime {

void requireGpu() {
  if (cudaDeviceCount() == 0)
    DDPRUN_THROW(InvalidArgument,
                 "a CUDA collective was issued but no CUDA GPU is visible on this machine "
                 "(no device or no driver); use Device::kCpu buffers");
}

// Waits for the stream, failing with a timeout instead of hanging forever.
void syncStream(cudaStream_t s, std::chrono::milliseconds timeout, const char* what) {
  const Deadline deadline(timeout);
  while (true) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady)
      DDPRUN_THROW(IoError, what, ": CUDA error ", cudaGetErrorString(e));
    if (deadline.expired())
      DDPRUN_PEER_FAILURE(-1, true, what, ": the GPU work did not finish within ",
                          timeout.count() / 1000.0, " s (a peer rank stalled or died)");
    std::this_thread::yield();
  }
}

}  // namespace ddprun::runtime
