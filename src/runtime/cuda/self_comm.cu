// The one-rank CUDA transport (cuda_comm.h): a group of one moves nothing
// between ranks; its collectives are device copies on its own stream.
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../comm.h"
#include "cuda_comm.h"
#include "cuda_handles.h"
#include "cuda_support.h"
#include "ddprun/runtime/process_group.h"

namespace ddprun::runtime {

namespace {
// A group of one: every collective is a device-to-device copy (or nothing).
class SelfComm : public CudaComm {
 public:
  explicit SelfComm(ProcessGroup& pg) : pg_(pg), stream_(cuda::Stream::createBlocking()) {}
  std::string name() const override { return "self"; }
  int size() const override { return 1; }
  int me() const override { return 0; }
  void allReduce(const void* in, void* out, size_t count, DType t, ReduceOp) override {
    copy(out, in, count * dtypeSize(t));
  }
  void broadcast(void*, size_t, int) override {}
  void allGather(const void* in, void* out, const std::vector<size_t>& bytes) override {
    copy(out, in, bytes[0]);
  }
  void reduceScatter(const void* in, void* out, size_t count, DType t, ReduceOp) override {
    copy(out, in, count * dtypeSize(t));
  }
  void barrier() override { DDPRUN_CUDA_OK(cudaStreamSynchronize(stream_)); }
  void abort(int) noexcept override {}
  // In place on one rank there is nothing to move: only the events.
  bool enqueues() const override { return true; }
  void allReduceOrdered(void*, size_t, DType, ReduceOp, const internal::OrderedEvents& ev) override {
    order(ev);
  }
  void broadcastOrdered(const std::vector<std::pair<void*, size_t>>&, int,
                        const internal::OrderedEvents& ev) override {
    order(ev);
  }

 private:
  void order(const internal::OrderedEvents& ev) {
    if (ev.after) DDPRUN_CUDA_OK(cudaStreamWaitEvent(stream_, toEvent(ev.after), 0));
    if (ev.start) DDPRUN_CUDA_OK(cudaEventRecord(toEvent(ev.start), stream_));
    if (ev.done) DDPRUN_CUDA_OK(cudaEventRecord(toEvent(ev.done), stream_));
  }
  void copy(void* dst, const void* src, size_t bytes) {
    if (dst == src || bytes == 0) return;
    DDPRUN_CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    syncStream(stream_, pg_.options().timeout, "copy");
  }
  ProcessGroup& pg_;
  cuda::Stream stream_;
};

}  // namespace

std::unique_ptr<CudaComm> makeSelfComm(ProcessGroup& pg) { return std::make_unique<SelfComm>(pg); }

}  // namespace ddprun::runtime
