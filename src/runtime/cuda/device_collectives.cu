// The stream-ordered collectives of the Reducer (device_order.h) on the CUDA
// transports: events on the runtime's device, and the ordered operations
// issued on the group's transport (inline when it only enqueues).
#include <cuda_runtime.h>

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../device_order.h"
#include "../pg_internal.h"
#include "cuda_comm.h"
#include "cuda_plugin.h"
#include "cuda_support.h"
#include "ddprun/runtime/cuda.h"
#include "ddprun/runtime/process_group.h"

namespace ddprun::runtime {

namespace {

class CudaDeviceCollectives final : public internal::DeviceCollectives {
 public:
  explicit CudaDeviceCollectives(ProcessGroup& pg) : pg_(pg) {}

  internal::DeviceEvent createEvent(bool timing) override {
    requireGpu();
    cudaBindThread();  // an event belongs to the device current at its creation
    cudaEvent_t e = nullptr;
    DDPRUN_CUDA_OK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    return e;
  }
  void destroyEvent(internal::DeviceEvent e) noexcept override {
    if (e) (void)cudaEventDestroy(toEvent(e));
  }
  void record(internal::DeviceEvent e, internal::DeviceStream s) override {
    DDPRUN_CUDA_OK(cudaEventRecord(toEvent(e), toStream(s)));
  }
  void streamWait(internal::DeviceStream s, internal::DeviceEvent e) override {
    DDPRUN_CUDA_OK(cudaStreamWaitEvent(toStream(s), toEvent(e), 0));
  }
  double elapsedMs(internal::DeviceEvent from, internal::DeviceEvent to) override {
    float ms = 0;
    const cudaError_t r = cudaEventElapsedTime(&ms, toEvent(from), toEvent(to));
    if (r == cudaErrorNotReady) {
      (void)cudaGetLastError();
      DDPRUN_THROW(InvalidArgument, "device timings read before the device finished the "
                   "iteration: synchronise the device after finalize() and read them before "
                   "the next iteration launches a bucket");
    }
    DDPRUN_CUDA_OK(r);
    return ms;
  }
  Work allReduce(const AllReduceOptions& o, const internal::OrderedEvents& ev) override {
    DDPRUN_CHECK(o.input == nullptr || o.input == o.output,
                 "a stream-ordered all-reduce runs in place (input null or equal to output)");
    DDPRUN_CHECK(o.output != nullptr || o.count == 0, "AllReduceOptions::output is null but count is ",
                 o.count);
    const AllReduceOptions c = o;
    return issue("ordered allReduce(" + std::to_string(o.count) + " x " + dtypeName(o.dtype) + ")",
                 [c, ev](CudaComm& comm) {
                   comm.allReduceOrdered(c.output, c.count, c.dtype, c.op, ev);
                 });
  }
  Work broadcast(const std::vector<std::pair<void*, size_t>>& buffers, int root,
                 const internal::OrderedEvents& ev) override {
    DDPRUN_CHECK(root >= 0 && root < pg_.size(), "broadcast root ", root,
                 " is not a rank of this group of ", pg_.size());
    for (const auto& [p, bytes] : buffers)
      DDPRUN_CHECK(p != nullptr || bytes == 0, "a broadcast buffer is null but has ", bytes, " bytes");
    return issue("ordered broadcast(" + std::to_string(buffers.size()) + " buffers)",
                 [buffers, root, ev](CudaComm& comm) { comm.broadcastOrdered(buffers, root, ev); });
  }

 private:
  enum Mode : int { kUnknown, kEnqueues, kBlocks };
  // Runs `f` on the transport after everything issued before it: inline on
  // the calling thread when the transport only enqueues and the group is
  // idle (no thread hand-off), else on the group's thread. Until the first
  // operation has run, the transport is not known: that one goes to the
  // group's thread too.
  template <typename F>
  Work issue(std::string name, F f) {
    const bool inlineOk = mode_.load(std::memory_order_acquire) == kEnqueues;
    return internal::run(pg_, std::move(name), [this, f = std::move(f)] {
      cudaBindThread();
      CudaComm& comm = internal::cudaComm(pg_);
      mode_.store(comm.enqueues() ? kEnqueues : kBlocks, std::memory_order_release);
      f(comm);
    }, inlineOk);
  }

  ProcessGroup& pg_;
  std::atomic<int> mode_{kUnknown};
};

}  // namespace

std::unique_ptr<internal::DeviceCollectives> internal::makeGpuDeviceCollectives(ProcessGroup& pg) {
  return std::make_unique<CudaDeviceCollectives>(pg);
}

}  // namespace ddprun::runtime
