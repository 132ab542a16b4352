// CUDA transports: which one a group uses (makeCudaComm), the one-rank
// transport, the public helpers of include/ddprun/runtime/cuda.h and the
// stream-ordered collectives of the Reducer (device_order.h). NCCL, CUDA IPC
// and staging have their own files. See include/ddprun/runtime/cuda.h for how
// a transport is chosen.
#include <atomic>
#include <cstring>
#include <memory>

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "../comm.h"
#include "cuda_comm.h"
#include "cuda_support.h"
#include "ddprun/runtime/process_group.h"
#include "../pg_internal.h"
#include "../shm/shm_comm.h"
#include "ddprun/runtime/cuda.h"
#include "staged_comm.h"

namespace ddprun::runtime {

namespace {
// ------------------------------------------------------------------- self
// A group of one: every collective is a device-to-device copy (or nothing).
class SelfComm : public CudaComm {
 public:
  explicit SelfComm(ProcessGroup& pg) : pg_(pg) { DDPRUN_CUDA_OK(cudaStreamCreate(&stream_)); }
  ~SelfComm() override { cudaStreamDestroy(stream_); }
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
  cudaStream_t stream_{};
};

}  // namespace

// ------------------------------------------------------------- public API
bool cudaBuilt() { return true; }

int cudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device/driver" error
    return 0;
  }
  return n;
}

void cudaBindThread() { DDPRUN_CUDA_OK(cudaSetDevice(cudaSelectedDevice())); }

std::string cudaTransportName(ProcessGroup& pg) {
  std::string name;
  internal::enqueue(pg, "cudaTransportName", [&] { name = internal::cudaComm(pg).name(); }).wait();
  return name;
}

void* cudaAllocDevice(size_t bytes) {
  requireGpu();
  DDPRUN_CUDA_OK(cudaSetDevice(cudaSelectedDevice()));
  void* p = nullptr;
  DDPRUN_CUDA_OK(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
  return p;
}
void cudaFreeDevice(void* p) {
  if (p) cudaFree(p);
}
void cudaCopyToDevice(void* dst, const void* src, size_t bytes) {
  // From pageable memory cudaMemcpy may return before the DMA has landed.
  if (bytes) DDPRUN_CUDA_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  DDPRUN_CUDA_OK(cudaStreamSynchronize(0));
}
void cudaCopyToHost(void* dst, const void* src, size_t bytes) {
  if (bytes) DDPRUN_CUDA_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
void cudaCopyOnDevice(void* dst, const void* src, size_t bytes) {
  if (bytes) DDPRUN_CUDA_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}
void cudaSynchronize() { DDPRUN_CUDA_OK(cudaDeviceSynchronize()); }
double cudaNowSeconds() {
  DDPRUN_CUDA_OK(cudaDeviceSynchronize());
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ------------------------------------------------------ ordered collectives
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

// What each rank tells the others when the CUDA transport is chosen.
struct RankRecord {
  char ident[120];      // "hostId|busId", NUL-padded (truncated if longer)
  int32_t ncclVersion;  // ncclRuntimeVersion()
  int32_t pad;
};
static_assert(sizeof(RankRecord) == 128, "RankRecord is exchanged as 128 bytes");

}  // namespace

std::unique_ptr<internal::DeviceCollectives> internal::makeDeviceCollectives(ProcessGroup& pg) {
  return std::make_unique<CudaDeviceCollectives>(pg);
}

// Agreement: every rank contributes "hostId|busId" and its NCCL version;
// NCCL when all GPUs differ, IPC when everyone is on one host, else staged.
std::unique_ptr<CudaComm> makeCudaComm(ProcessGroup& pg, Comm& host, ShmComm* shm) {
  requireGpu();
  const int dev = cudaSelectedDevice();
  DDPRUN_CUDA_OK(cudaSetDevice(dev));
  char bus[32] = {0};
  DDPRUN_CUDA_OK(cudaDeviceGetPCIBusId(bus, sizeof(bus), dev));
  const std::string ident = pg.options().hostId + "|" + bus;
  RankRecord mine{};
  std::memcpy(mine.ident, ident.data(), std::min(ident.size(), sizeof(mine.ident) - 1));
  mine.ncclVersion = ncclRuntimeVersion();
  std::vector<RankRecord> all(pg.size());
  host.allGather(&mine, all.data(), std::vector<size_t>(pg.size(), sizeof(RankRecord)));
  std::vector<std::string> ids;
  std::vector<int> versions;
  for (const RankRecord& r : all) {
    ids.emplace_back(r.ident, strnlen(r.ident, sizeof(r.ident)));
    versions.push_back(r.ncclVersion);
  }
  std::vector<std::string> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  const bool distinct = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
  const bool oneHost = pg.topology().numHosts == 1;
  std::string want = std::getenv("DDPRUN_CUDA_TRANSPORT") ? std::getenv("DDPRUN_CUDA_TRANSPORT") : "";
  if (want.empty() || want == "auto") {
    if (pg.size() == 1) return std::make_unique<SelfComm>(pg);
    want = distinct ? "nccl" : (oneHost && shm ? "ipc" : "staged");
  }
  if (want == "nccl") return makeNcclComm(pg, host, versions, distinct ? "" : bus);
  if (want == "ipc") {
    if (!oneHost || !shm)
      DDPRUN_THROW(InvalidArgument, "DDPRUN_CUDA_TRANSPORT=ipc needs every rank on one host "
                   "with the shared-memory transport");
    return makeIpcComm(pg, *shm, host);
  }
  if (want == "staged") return std::make_unique<StagedComm>(pg, host);
  DDPRUN_THROW(InvalidArgument, "DDPRUN_CUDA_TRANSPORT='", want,
               "': expected auto, nccl, ipc or staged");
}

}  // namespace ddprun::runtime
