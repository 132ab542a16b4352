// The NCCL transport (every rank its own GPU; or, with NCCL >= 2.30 and
// DDPRUN_CUDA_TRANSPORT=nccl, ranks sharing one): blocking collectives, and
// the stream-ordered ones of the Reducer with a watchdog (cuda_comm.h).
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "../comm.h"
#include "cuda_comm.h"
#include "cuda_plugin.h"
#include "cuda_handles.h"
#include "cuda_support.h"
#include "reduce_kernels.h"
#include "ddprun/runtime/process_group.h"
#include "ddprun/common/log.h"
#include "ddprun/runtime/cuda.h"

namespace ddprun::runtime {

namespace {
ncclDataType_t ncclType(DType t) {
  switch (t) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kUInt8: return ncclUint8;
  }
  return ncclUint8;
}
ncclRedOp_t ncclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProduct: return ncclProd;
  }
  return ncclSum;
}

// Collectives on NCCL's stream. The Comm operations wait for their own
// completion (finish(): polling, bounded by the timeout). The ordered ones
// (the Reducer's path) only enqueue: the stream waits on the device for the
// producer's event, and completion is known through events. Their failures
// are still found, without the host waiting on them:
//   - every later operation first polls the ordered operations in flight
//     (cudaEventQuery, ncclCommGetAsyncError): an NCCL error, or an
//     operation older than the timeout, fails that operation as a
//     PeerFailure, which the process group turns into a message naming the
//     likely culprit;
//   - a watchdog thread polls the same while any are in flight; on a failure
//     it aborts the communicator, so that NCCL's kernels stop and a training
//     loop blocked in a device synchronisation behind them goes on to its
//     next collective, which reports the failure.
// mu_ guards the communicator (NCCL calls) and the in-flight list.
class NcclComm : public CudaComm {
 public:
  NcclComm(ProcessGroup& pg, Comm& host) : pg_(pg), host_(host), device_(cudaSelectedDevice()) {
    ncclUniqueId id{};
    if (pg.rank() == 0) DDPRUN_NCCL_OK(ncclGetUniqueId(&id));
    host_.broadcast(&id, sizeof(id), 0);
    stream_ = cuda::Stream::createBlocking();
    DDPRUN_NCCL_OK(ncclCommInitRank(&comm_, pg.size(), id, pg.rank()));
  }
  ~NcclComm() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    drain();
    if (comm_) aborted_ ? ncclCommAbort(comm_) : ncclCommDestroy(comm_);
    // Then the members: the events (pending_, spare_), then the stream.
  }
  std::string name() const override { return "nccl"; }
  bool enqueues() const override { return true; }
  int size() const override { return pg_.size(); }
  int me() const override { return pg_.rank(); }

  // kAvg is a sum plus our own division: NCCL 2.28's ncclAvg left the last
  // element of an out-of-place 4097-float all-reduce unwritten on one rank
  // (seen on an H100), and integer avg must truncate like the other paths.
  void allReduce(const void* in, void* out, size_t count, DType t, ReduceOp op) override {
    collective("allReduce", [&] {
      DDPRUN_NCCL_OK(ncclAllReduce(in, out, count, ncclType(t), ncclOp(sumForAvg(op)), comm_, stream_));
      divide(op, out, count, t);
    });
  }
  void broadcast(void* buf, size_t bytes, int root) override {
    collective("broadcast", [&] {
      DDPRUN_NCCL_OK(ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, stream_));
    });
  }
  void allGather(const void* in, void* out, const std::vector<size_t>& bytes) override {
    const bool equal = std::all_of(bytes.begin(), bytes.end(), [&](size_t b) { return b == bytes[0]; });
    collective("allGather", [&] {
      if (equal) {
        DDPRUN_NCCL_OK(ncclAllGather(in, out, bytes[0], ncclUint8, comm_, stream_));
        return;
      }
      // Unequal pieces: one broadcast per rank, fused in a group.
      std::vector<std::pair<void*, size_t>> pieces;
      size_t off = 0;
      for (int r = 0; r < size(); ++r) {
        pieces.emplace_back(static_cast<char*>(out) + off, bytes[r]);
        off += bytes[r];
      }
      groupedBroadcasts(pieces, -1, in);
    });
  }
  void reduceScatter(const void* in, void* out, size_t count, DType t, ReduceOp op) override {
    collective("reduceScatter", [&] {
      DDPRUN_NCCL_OK(ncclReduceScatter(in, out, count, ncclType(t), ncclOp(sumForAvg(op)), comm_, stream_));
      divide(op, out, count, t);
    });
  }
  void barrier() override { host_.barrier(); }
  void abort(int by) noexcept override {
    aborted_ = true;
    host_.abort(by);
  }

  void allReduceOrdered(void* buf, size_t count, DType t, ReduceOp op,
                        const internal::OrderedEvents& ev) override {
    std::lock_guard lock(mu_);
    checkLocked("allReduce");
    beginOrderedLocked(ev);
    DDPRUN_NCCL_OK(ncclAllReduce(buf, buf, count, ncclType(t), ncclOp(sumForAvg(op)), comm_, stream_));
    divide(op, buf, count, t);
    endOrderedLocked(ev, "allReduce");
  }
  void broadcastOrdered(const std::vector<std::pair<void*, size_t>>& buffers, int root,
                        const internal::OrderedEvents& ev) override {
    std::lock_guard lock(mu_);
    checkLocked("broadcast");
    beginOrderedLocked(ev);
    groupedBroadcasts(buffers, root, nullptr);
    endOrderedLocked(ev, "broadcast");
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    cuda::Event event;  // ours, recorded after the operation
    Clock::time_point issued;
    const char* what;
  };
  static constexpr auto kPollEvery = std::chrono::milliseconds(10);

  static ReduceOp sumForAvg(ReduceOp op) { return op == ReduceOp::kAvg ? ReduceOp::kSum : op; }
  void divide(ReduceOp op, void* buf, size_t count, DType t) {
    if (op != ReduceOp::kAvg || size() == 1) return;
    PtrSet p{};
    p.p[0] = static_cast<char*>(buf);
    launchReduce(t, ReduceOp::kSum, p, 1, p, 1, count, size(), stream_);
  }
  // Broadcasts of several buffers as one NCCL group (one launch). root -1:
  // buffer r comes from rank r (this rank's from `mine`). The group is always
  // closed, even when a call inside it failed.
  void groupedBroadcasts(const std::vector<std::pair<void*, size_t>>& buffers, int root,
                         const void* mine) {
    DDPRUN_NCCL_OK(ncclGroupStart());
    ncclResult_t first = ncclSuccess;
    for (size_t i = 0; i < buffers.size() && first == ncclSuccess; ++i) {
      const int from = root >= 0 ? root : static_cast<int>(i);
      void* dst = buffers[i].first;
      const void* src = root < 0 && from == me() ? mine : dst;
      first = ncclBroadcast(src, dst, buffers[i].second, ncclUint8, from, comm_, stream_);
    }
    const ncclResult_t end = ncclGroupEnd();
    DDPRUN_NCCL_OK(first);
    DDPRUN_NCCL_OK(end);
  }

  void beginOrderedLocked(const internal::OrderedEvents& ev) {
    if (ev.after) DDPRUN_CUDA_OK(cudaStreamWaitEvent(stream_, toEvent(ev.after), 0));
    if (ev.start) DDPRUN_CUDA_OK(cudaEventRecord(toEvent(ev.start), stream_));
  }
  void endOrderedLocked(const internal::OrderedEvents& ev, const char* what) {
    if (ev.done) DDPRUN_CUDA_OK(cudaEventRecord(toEvent(ev.done), stream_));
    cuda::Event mine;
    if (!spare_.empty()) {
      mine = std::move(spare_.back());
      spare_.pop_back();
    } else {
      mine = cuda::Event::create();
    }
    const cudaError_t rec = cudaEventRecord(mine, stream_);
    if (rec != cudaSuccess) spare_.push_back(std::move(mine));
    DDPRUN_CUDA_OK(rec);
    pending_.push_back({std::move(mine), Clock::now(), what});
    if (!watchdog_.joinable()) watchdog_ = std::thread([this] { watch(); });
    cv_.notify_all();
  }

  // Drops finished ordered operations; on an NCCL error, a CUDA error, or an
  // operation in flight for longer than the timeout, records the failure and
  // aborts the communicator. Caller holds mu_.
  void pollLocked() {
    if (!failure_.empty()) return;
    while (!pending_.empty()) {
      const cudaError_t e = cudaEventQuery(pending_.front().event);
      if (e == cudaErrorNotReady) break;
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return failLocked(std::string(pending_.front().what) + ": CUDA error " +
                              cudaGetErrorString(e), false);
      }
      spare_.push_back(std::move(pending_.front().event));
      pending_.pop_front();
    }
    if (!pending_.empty()) checkCommLocked(pending_.front().what, pending_.front().issued);
  }
  // An asynchronous NCCL error, or an operation issued longer than the
  // timeout ago, becomes the sticky failure (the communicator aborted).
  void checkCommLocked(const char* what, Clock::time_point issued) {
    if (!failure_.empty() || !comm_) return;
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress)
      return failLocked(std::string(what) + ": NCCL reported " + ncclGetErrorString(async) +
                            lastError(), false);
    const auto timeout = pg_.options().timeout;
    if (Clock::now() - issued > timeout)
      failLocked(std::string(what) + ": NCCL did not finish within " +
                     std::to_string(timeout.count() / 1000.0) + " s (a peer stalled or died)",
                 true);
  }
  void failLocked(std::string msg, bool timedOut) {
    if (!failure_.empty()) return;
    failure_ = std::move(msg);
    failureTimedOut_ = timedOut;
    DDPRUN_ERROR("rank ", pg_.rank(), ": aborting the NCCL communicator: ", failure_);
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  std::string lastError() const {
    const char* s = comm_ ? ncclGetLastError(comm_) : nullptr;
    return s && *s ? std::string(" (") + s + ")" : std::string();
  }
  // Every operation starts here: the failures of earlier ordered operations
  // are this operation's.
  // One collective: `enqueue` runs under mu_ after the in-flight check
  // (checkLocked), then finish() records its completion.
  template <class Enqueue>
  void collective(const char* what, Enqueue&& enqueue) {
    {
      std::lock_guard lock(mu_);
      checkLocked(what);
      enqueue();
    }
    finish(what);
  }
  void checkLocked(const char* what) {
    pollLocked();
    if (!failure_.empty())
      DDPRUN_PEER_FAILURE(-1, failureTimedOut_, what, " after an earlier NCCL failure: ", failure_);
    if (!comm_) DDPRUN_PEER_FAILURE(-1, false, what, ": the NCCL communicator was aborted");
  }

  void finish(const char* what) {
    const auto issued = Clock::now();
    while (true) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q != cudaErrorNotReady) {
        if (q != cudaSuccess) (void)cudaGetLastError();
        DDPRUN_CUDA_OK(q);
        return;
      }
      {
        std::lock_guard lock(mu_);
        checkCommLocked(what, issued);
        if (!failure_.empty()) DDPRUN_PEER_FAILURE(-1, failureTimedOut_, failure_);
      }
      std::this_thread::yield();
    }
  }

  void watch() {
    (void)cudaSetDevice(device_);
    std::unique_lock lock(mu_);
    while (!stop_) {
      cv_.wait(lock, [&] { return stop_ || (!pending_.empty() && failure_.empty()); });
      if (stop_) break;
      cv_.wait_for(lock, kPollEvery, [&] { return stop_; });
      if (!stop_) pollLocked();
    }
  }
  // Before the communicator goes: the ordered work in flight finishes (or
  // fails: pollLocked aborts past the timeout).
  void drain() noexcept {
    std::unique_lock lock(mu_);
    while (comm_ && failure_.empty() && !aborted_ && !pending_.empty()) {
      pollLocked();
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      lock.lock();
    }
  }

  ProcessGroup& pg_;
  Comm& host_;
  int device_;
  cuda::Stream stream_;  // blocking (cudaStreamCreate)
  ncclComm_t comm_{};
  std::atomic<bool> aborted_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;      // ordered operations in flight, oldest first
  std::vector<cuda::Event> spare_;  // their events, for reuse
  std::string failure_;              // sticky: the first failure seen
  bool failureTimedOut_ = false;
  bool stop_ = false;
  std::thread watchdog_;             // started with the first ordered operation
};


// NCCL reads NCCL_MULTI_RANK_GPU_ENABLE when it first initialises; set once
// an NCCL communicator exists in this process, later settings are not seen.
std::atomic<bool> gNcclStarted{false};

// Ranks share a GPU and NCCL is forced: allowed from NCCL 2.30 on (every
// rank's library, which all ranks know from the agreement), with
// NCCL_MULTI_RANK_GPU_ENABLE=1 set before this process's first NCCL
// initialisation (ncclGetVersion, already called, initialises nothing).
void allowSharedGpu(const ProcessGroup& pg, const std::vector<int>& versions,
                    const std::string& bus) {
  const auto low = std::min_element(versions.begin(), versions.end());
  const int who = static_cast<int>(low - versions.begin());
  if (*low < kNcclMultiRankGpuVersion)
    DDPRUN_THROW(InvalidArgument, "DDPRUN_CUDA_TRANSPORT=nccl but ranks share a GPU (", bus,
                 ") and the NCCL library loaded ",
                 who == pg.rank() ? std::string("here") : "by rank " + std::to_string(who), " is ",
                 ncclVersionString(*low), ", which refuses two ranks on one device. NCCL 2.30 "
                 "or newer accepts it (ddprun then sets NCCL_MULTI_RANK_GPU_ENABLE=1): pip "
                 "install 'nvidia-nccl-cu13>=2.30' and put its library directory "
                 "(site-packages/nvidia/nccl/lib) first on LD_LIBRARY_PATH, or leave "
                 "DDPRUN_CUDA_TRANSPORT unset to use CUDA IPC");
  if (gNcclStarted.load())
    DDPRUN_WARN("NCCL_MULTI_RANK_GPU_ENABLE=1 is set after this process already started NCCL: "
                "NCCL may not see it");
  ::setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 1);
  DDPRUN_INFO("ranks share GPU ", bus, ": NCCL ", ncclVersionString(*low),
              " with NCCL_MULTI_RANK_GPU_ENABLE=1 (a test and fallback path; CUDA IPC is the "
              "default there)");
}

}  // namespace

int internal::loadedNcclVersion() {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

std::unique_ptr<CudaComm> makeNcclComm(ProcessGroup& pg, Comm& host,
                                       const std::vector<int>& versions,
                                       const std::string& sharedBus) {
  if (!sharedBus.empty()) allowSharedGpu(pg, versions, sharedBus);
  gNcclStarted = true;
  return std::make_unique<NcclComm>(pg, host);
}

}  // namespace ddprun::runtime
