// CUDA transports. See include/ddprun/runtime/cuda.h for how one is chosen.
#include <cuda.h>  // types only: driver calls go through cudaGetDriverEntryPoint
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../pg_internal.h"
#include "../shm/shm_comm.h"
#include "cuda_comm.h"
#include "ddprun/runtime/cuda.h"
#include "ddprun/common/log.h"
#include "ddprun/runtime/cuda_check.h"
#include "ddprun/runtime/process_group.h"
#include "ddprun/store/store.h"

namespace ddprun::runtime {

namespace {
constexpr int kMaxIpcPeers = 16;
// Per-rank device scratch for the IPC path (DDPRUN_CUDA_IPC_SCRATCH_MB). Big
// chunks amortise the host barriers and GPU context switches per chunk.
size_t ipcScratchBytes() {
  const char* v = std::getenv("DDPRUN_CUDA_IPC_SCRATCH_MB");
  return (v ? std::max<size_t>(1, std::strtoull(v, nullptr, 10)) : 256) << 20;
}
// Below this many bytes the IPC path stages through host shared memory
// instead (DDPRUN_CUDA_IPC_MIN_BYTES; on an H100 staging won up to ~1 MiB): ranks sharing a GPU time-slice it, so
// every GPU step costs a context switch, and small operations are all steps.
size_t ipcMinBytes() {
  const char* v = std::getenv("DDPRUN_CUDA_IPC_MIN_BYTES");
  return v ? std::strtoull(v, nullptr, 10) : size_t{1} << 20;
}

// Resolved once: every collective binds its thread to it (no driver query
// on the hot path).
int envDevice() {
  static const int dev = [] {
    if (const char* v = std::getenv("DDPRUN_CUDA_DEVICE")) return std::atoi(v);
    const char* lr = std::getenv("LOCAL_RANK");
    const int n = cudaDeviceCount();
    return n > 0 ? (lr ? std::atoi(lr) : 0) % n : 0;
  }();
  return dev;
}

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

cudaEvent_t toEvent(internal::DeviceEvent e) { return static_cast<cudaEvent_t>(e); }
cudaStream_t toStream(internal::DeviceStream s) { return static_cast<cudaStream_t>(s); }

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

// --------------------------------------------------------- reduction kernels
struct PtrSet {
  char* p[kMaxIpcPeers];
};

template <typename T>
struct Conv {
  using Acc = T;
  __device__ static Acc load(T v) { return v; }
  __device__ static T store(Acc v) { return v; }
};
template <>
struct Conv<__half> {
  using Acc = float;
  __device__ static float load(__half v) { return __half2float(v); }
  __device__ static __half store(float v) { return __float2half_rn(v); }
};
template <>
struct Conv<__nv_bfloat16> {
  using Acc = float;
  __device__ static float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

template <typename Acc, ReduceOp Op>
__device__ inline Acc combine(Acc a, Acc b) {
  if constexpr (Op == ReduceOp::kMin) return b < a ? b : a;
  if constexpr (Op == ReduceOp::kMax) return b > a ? b : a;
  if constexpr (Op == ReduceOp::kProduct) {
    if constexpr (sizeof(Acc) == 1) return static_cast<Acc>(a * b);
    return a * b;
  }
  if constexpr (sizeof(Acc) == 1) return static_cast<Acc>(a + b);
  return a + b;
}

// out_j[i] = op over k sources of src_k[i], for each of m destinations.
// Reads each source once, writes each destination once.
template <typename T, ReduceOp Op>
__global__ void reduceKernel(PtrSet srcs, int k, PtrSet dsts, int m, size_t count, int avgDiv) {
  using C = Conv<T>;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    auto acc = C::load(reinterpret_cast<const T*>(srcs.p[0])[i]);
    for (int j = 1; j < k; ++j)
      acc = combine<typename C::Acc, Op>(acc, C::load(reinterpret_cast<const T*>(srcs.p[j])[i]));
    if (avgDiv > 1) acc = acc / static_cast<typename C::Acc>(avgDiv);
    const T v = C::store(acc);
    for (int j = 0; j < m; ++j) reinterpret_cast<T*>(dsts.p[j])[i] = v;
  }
}

template <typename T>
void launchTyped(ReduceOp op, const PtrSet& s, int k, const PtrSet& d, int m, size_t count,
                 int avgDiv, cudaStream_t st) {
  const int threads = 512;
  const int blocks = static_cast<int>(std::min<size_t>((count + threads - 1) / threads, 132 * 8));
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      reduceKernel<T, ReduceOp::kSum><<<blocks, threads, 0, st>>>(s, k, d, m, count, avgDiv);
      break;
    case ReduceOp::kMin:
      reduceKernel<T, ReduceOp::kMin><<<blocks, threads, 0, st>>>(s, k, d, m, count, 1);
      break;
    case ReduceOp::kMax:
      reduceKernel<T, ReduceOp::kMax><<<blocks, threads, 0, st>>>(s, k, d, m, count, 1);
      break;
    case ReduceOp::kProduct:
      reduceKernel<T, ReduceOp::kProduct><<<blocks, threads, 0, st>>>(s, k, d, m, count, 1);
      break;
  }
}

void launchReduce(DType t, ReduceOp op, const PtrSet& s, int k, const PtrSet& d, int m,
                  size_t count, int avgDiv, cudaStream_t st) {
  if (count == 0) return;
  switch (t) {
    case DType::kFloat32: launchTyped<float>(op, s, k, d, m, count, avgDiv, st); break;
    case DType::kFloat64: launchTyped<double>(op, s, k, d, m, count, avgDiv, st); break;
    case DType::kFloat16: launchTyped<__half>(op, s, k, d, m, count, avgDiv, st); break;
    case DType::kBFloat16: launchTyped<__nv_bfloat16>(op, s, k, d, m, count, avgDiv, st); break;
    case DType::kInt32: launchTyped<int32_t>(op, s, k, d, m, count, avgDiv, st); break;
    case DType::kInt64: launchTyped<long long>(op, s, k, d, m, count, avgDiv, st); break;
    case DType::kUInt8: launchTyped<uint8_t>(op, s, k, d, m, count, avgDiv, st); break;
  }
  DDPRUN_CUDA_OK(cudaGetLastError());
}

// ------------------------------------------------------------------- NCCL
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
  NcclComm(ProcessGroup& pg, Comm& host) : pg_(pg), host_(host), device_(envDevice()) {
    ncclUniqueId id{};
    if (pg.rank() == 0) DDPRUN_NCCL_OK(ncclGetUniqueId(&id));
    host_.broadcast(&id, sizeof(id), 0);
    DDPRUN_CUDA_OK(cudaStreamCreate(&stream_));
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
    for (const Pending& p : pending_) cudaEventDestroy(p.event);
    for (cudaEvent_t e : spare_) cudaEventDestroy(e);
    cudaStreamDestroy(stream_);
  }
  std::string name() const override { return "nccl"; }
  bool enqueues() const override { return true; }
  int size() const override { return pg_.size(); }
  int me() const override { return pg_.rank(); }

  // kAvg is a sum plus our own division: NCCL 2.28's ncclAvg left the last
  // element of an out-of-place 4097-float all-reduce unwritten on one rank
  // (seen on an H100), and integer avg must truncate like the other paths.
  void allReduce(const void* in, void* out, size_t count, DType t, ReduceOp op) override {
    {
      std::lock_guard lock(mu_);
      checkLocked("allReduce");
      DDPRUN_NCCL_OK(ncclAllReduce(in, out, count, ncclType(t), ncclOp(sumForAvg(op)), comm_, stream_));
      divide(op, out, count, t);
    }
    finish("allReduce");
  }
  void broadcast(void* buf, size_t bytes, int root) override {
    {
      std::lock_guard lock(mu_);
      checkLocked("broadcast");
      DDPRUN_NCCL_OK(ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, stream_));
    }
    finish("broadcast");
  }
  void allGather(const void* in, void* out, const std::vector<size_t>& bytes) override {
    const bool equal = std::all_of(bytes.begin(), bytes.end(), [&](size_t b) { return b == bytes[0]; });
    {
      std::lock_guard lock(mu_);
      checkLocked("allGather");
      if (equal) {
        DDPRUN_NCCL_OK(ncclAllGather(in, out, bytes[0], ncclUint8, comm_, stream_));
      } else {  // unequal pieces: one broadcast per rank, fused in a group
        std::vector<std::pair<void*, size_t>> pieces;
        size_t off = 0;
        for (int r = 0; r < size(); ++r) {
          pieces.emplace_back(static_cast<char*>(out) + off, bytes[r]);
          off += bytes[r];
        }
        groupedBroadcasts(pieces, -1, in);
      }
    }
    finish("allGather");
  }
  void reduceScatter(const void* in, void* out, size_t count, DType t, ReduceOp op) override {
    {
      std::lock_guard lock(mu_);
      checkLocked("reduceScatter");
      DDPRUN_NCCL_OK(ncclReduceScatter(in, out, count, ncclType(t), ncclOp(sumForAvg(op)), comm_, stream_));
      divide(op, out, count, t);
    }
    finish("reduceScatter");
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
    cudaEvent_t event;  // ours, recorded after the operation
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
    cudaEvent_t mine = nullptr;
    if (!spare_.empty()) {
      mine = spare_.back();
      spare_.pop_back();
    } else {
      DDPRUN_CUDA_OK(cudaEventCreateWithFlags(&mine, cudaEventDisableTiming));
    }
    const cudaError_t rec = cudaEventRecord(mine, stream_);
    if (rec != cudaSuccess) spare_.push_back(mine);
    DDPRUN_CUDA_OK(rec);
    pending_.push_back({mine, Clock::now(), what});
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
      spare_.push_back(pending_.front().event);
      pending_.pop_front();
    }
    if (pending_.empty() || !comm_) return;
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress)
      return failLocked(std::string(pending_.front().what) + ": NCCL reported " +
                            ncclGetErrorString(async) + lastError(), false);
    const auto timeout = pg_.options().timeout;
    if (Clock::now() - pending_.front().issued > timeout)
      failLocked(std::string(pending_.front().what) + ": NCCL did not finish within " +
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
  void checkLocked(const char* what) {
    pollLocked();
    if (!failure_.empty())
      DDPRUN_PEER_FAILURE(-1, failureTimedOut_, what, " after an earlier NCCL failure: ", failure_);
    if (!comm_) DDPRUN_PEER_FAILURE(-1, false, what, ": the NCCL communicator was aborted");
  }

  void finish(const char* what) {
    const Deadline deadline(pg_.options().timeout);
    while (true) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q != cudaErrorNotReady) {
        if (q != cudaSuccess) (void)cudaGetLastError();
        DDPRUN_CUDA_OK(q);
        return;
      }
      {
        std::lock_guard lock(mu_);
        if (failure_.empty() && comm_) {
          ncclResult_t async = ncclSuccess;
          if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
              async != ncclInProgress)
            failLocked(std::string(what) + ": NCCL reported " + ncclGetErrorString(async) +
                           lastError(), false);
          else if (deadline.expired())
            failLocked(std::string(what) + ": NCCL did not finish within " +
                           std::to_string(pg_.options().timeout.count() / 1000.0) +
                           " s (a peer stalled or died)", true);
        }
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
  cudaStream_t stream_{};
  ncclComm_t comm_{};
  std::atomic<bool> aborted_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;      // ordered operations in flight, oldest first
  std::vector<cudaEvent_t> spare_;   // their events, for reuse
  std::string failure_;              // sticky: the first failure seen
  bool failureTimedOut_ = false;
  bool stop_ = false;
  std::thread watchdog_;             // started with the first ordered operation
};

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

// ----------------------------------------------------------------- staged
// Device -> pinned host, host collective, host -> device. Bytes over PCIe per
// rank: S down + S up (2S / B_pcie_dir when the directions do not overlap).
class StagedComm : public CudaComm {
 public:
  StagedComm(ProcessGroup& pg, Comm& host) : pg_(pg), host_(host) {
    DDPRUN_CUDA_OK(cudaStreamCreate(&stream_));
  }
  ~StagedComm() override {
    if (pinned_) cudaFreeHost(pinned_);
    cudaStreamDestroy(stream_);
  }
  std::string name() const override { return "staged"; }
  int size() const override { return host_.size(); }
  int me() const override { return host_.me(); }

  void allReduce(const void* in, void* out, size_t count, DType t, ReduceOp op) override {
    const size_t bytes = count * dtypeSize(t);
    char* h = stage(in, bytes, bytes);
    host_.allReduce(h, h, count, t, op);
    unstage(out, h, bytes);
  }
  void broadcast(void* buf, size_t bytes, int root) override {
    char* h = stage(me() == root ? buf : nullptr, bytes, bytes);
    host_.broadcast(h, bytes, root);
    if (me() != root) unstage(buf, h, bytes);
  }
  void allGather(const void* in, void* out, const std::vector<size_t>& bytes) override {
    const std::vector<size_t> off = prefixOffsets(bytes);
    const size_t before = off[me()], total = off.back();
    char* h = stage(nullptr, 0, total);
    copy(h + before, in, bytes[me()], cudaMemcpyDeviceToHost);
    host_.allGather(h + before, h, bytes);
    unstage(out, h, total);
  }
  void reduceScatter(const void* in, void* out, size_t count, DType t, ReduceOp op) override {
    const size_t bytes = count * dtypeSize(t);
    char* h = stage(in, bytes * size(), bytes * (size() + 1));
    host_.reduceScatter(h, h + bytes * size(), count, t, op);
    unstage(out, h + bytes * size(), bytes);
  }
  void barrier() override { host_.barrier(); }
  void abort(int by) noexcept override { host_.abort(by); }
  bool enqueues() const override { return false; }
  void allReduceOrdered(void* buf, size_t count, DType t, ReduceOp op,
                        const internal::OrderedEvents& ev) override {
    runOrderedBlocking({stream_}, ev, [&] { allReduce(buf, buf, count, t, op); });
  }
  void broadcastOrdered(const std::vector<std::pair<void*, size_t>>& buffers, int root,
                        const internal::OrderedEvents& ev) override {
    runOrderedBlocking({stream_}, ev, [&] {
      for (const auto& [p, bytes] : buffers) broadcast(p, bytes, root);
    });
  }
  cudaStream_t stream() const { return stream_; }

 private:
  char* stage(const void* dev, size_t bytes, size_t room) {
    if (room > pinnedBytes_) {
      if (pinned_) DDPRUN_CUDA_OK(cudaFreeHost(pinned_));
      pinned_ = nullptr;
      DDPRUN_CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&pinned_), room, cudaHostAllocDefault));
      pinnedBytes_ = room;
    }
    if (dev && bytes) copy(pinned_, dev, bytes, cudaMemcpyDeviceToHost);
    return pinned_;
  }
  void unstage(void* dev, const char* h, size_t bytes) {
    if (bytes) copy(dev, h, bytes, cudaMemcpyHostToDevice);
  }
  void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (!bytes) return;
    DDPRUN_CUDA_OK(cudaMemcpyAsync(dst, src, bytes, kind, stream_));
    syncStream(stream_, pg_.options().timeout, "staging copy");
  }

  ProcessGroup& pg_;
  Comm& host_;
  cudaStream_t stream_{};
  char* pinned_ = nullptr;
  size_t pinnedBytes_ = 0;
};


// -------------------------------------------------------------------- IPC
// cuMemGetAddressRange through the runtime's driver entry point (no link to
// libcuda, so binaries still start on machines without a driver).
using AddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
AddressRangeFn addressRangeFn() {
  static AddressRangeFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<AddressRangeFn>(nullptr);
    }
    return reinterpret_cast<AddressRangeFn>(f);
  }();
  return fn;
}

// Ranks sharing GPUs on one host: each rank exports a device scratch buffer;
// every rank maps all peers' buffers.
//
// All-reduce, direct (the default when every rank's buffers can be exported):
// ranks exchange IPC handles of their input and output allocations (peers
// cache the mappings); host barrier; one kernel per rank reduces its 1/n slice
// reading all n inputs and writes it into all n outputs; host barrier. HBM
// traffic: every input byte read once, every output byte written once — the
// 2nS floor — and one GPU step per rank.
// Chunked through scratch (fallback, and for the other collectives): copy the
// chunk into my scratch; barrier; reduce my slice over all scratch buffers
// into all of them; barrier; copy out: ~6nS.
class IpcComm : public CudaComm {
 public:
  IpcComm(ProcessGroup& pg, ShmComm& shm, Comm& host)
      : pg_(pg), shm_(shm), small_(pg, host), scratch_(ipcScratchBytes()), minBytes_(ipcMinBytes()) {
    const int n = shm.size();
    if (n > kMaxIpcPeers)
      DDPRUN_THROW(InvalidArgument, n, " ranks share this host's GPUs; the CUDA IPC path "
                   "supports ", kMaxIpcPeers, " (set DDPRUN_CUDA_TRANSPORT=staged)");
    DDPRUN_CUDA_OK(cudaStreamCreate(&stream_));
    DDPRUN_CUDA_OK(cudaMalloc(&mine_, scratch_));
    cudaIpcMemHandle_t handle{};
    DDPRUN_CUDA_OK(cudaIpcGetMemHandle(&handle, mine_));
    std::vector<cudaIpcMemHandle_t> all(n);
    std::vector<size_t> bytes(n, sizeof(handle));
    shm.allGather(&handle, all.data(), bytes);
    peers_.assign(n, nullptr);
    for (int j = 0; j < n; ++j) {
      if (j == shm.me()) {
        peers_[j] = static_cast<char*>(mine_);
        continue;
      }
      void* p = nullptr;
      DDPRUN_CUDA_OK(cudaIpcOpenMemHandle(&p, all[j], cudaIpcMemLazyEnablePeerAccess));
      peers_[j] = static_cast<char*>(p);
    }
    shm.barrier();
  }
  ~IpcComm() override {
    for (auto& [key, p] : mapped_) cudaIpcCloseMemHandle(p);
    if (ready_) cudaEventDestroy(ready_);
    for (int j = 0; j < static_cast<int>(peers_.size()); ++j)
      if (j != shm_.me() && peers_[j]) cudaIpcCloseMemHandle(peers_[j]);
    cudaFree(mine_);
    cudaStreamDestroy(stream_);
  }
  std::string name() const override { return "ipc"; }
  int size() const override { return shm_.size(); }
  int me() const override { return shm_.me(); }

  void allReduce(const void* in, void* out, size_t count, DType t, ReduceOp op) override {
    const size_t es = dtypeSize(t);
    if (count * es < minBytes_) return small_.allReduce(in, out, count, t, op);
    if (direct_ && allReduceDirect(in, out, count, t, op)) return;
    const int n = size();
    const size_t chunk = scratch_ / es;
    for (size_t e0 = 0; e0 < count; e0 += chunk) {
      const size_t len = std::min(chunk, count - e0);
      DDPRUN_CUDA_OK(cudaMemcpyAsync(mine_, static_cast<const char*>(in) + e0 * es, len * es,
                              cudaMemcpyDeviceToDevice, stream_));
      step("allReduce");
      const Partition part(len, n);
      PtrSet s{}, d{};
      for (int j = 0; j < n; ++j) s.p[j] = d.p[j] = peers_[j] + part.offset(me()) * es;
      launchReduce(t, op, s, n, d, n, part.length(me()), op == ReduceOp::kAvg ? n : 1, stream_);
      step("allReduce");
      DDPRUN_CUDA_OK(cudaMemcpyAsync(static_cast<char*>(out) + e0 * es, mine_, len * es,
                              cudaMemcpyDeviceToDevice, stream_));
    }
    syncStream(stream_, pg_.options().timeout, "allReduce");
  }
  void broadcast(void* buf, size_t bytes, int root) override {
    if (bytes < minBytes_) return small_.broadcast(buf, bytes, root);
    for (size_t off = 0; off < bytes; off += scratch_) {
      const size_t len = std::min(scratch_, bytes - off);
      if (me() == root)
        DDPRUN_CUDA_OK(cudaMemcpyAsync(mine_, static_cast<char*>(buf) + off, len,
                                cudaMemcpyDeviceToDevice, stream_));
      step("broadcast");
      if (me() != root)
        DDPRUN_CUDA_OK(cudaMemcpyAsync(static_cast<char*>(buf) + off, peers_[root], len,
                                cudaMemcpyDeviceToDevice, stream_));
      step("broadcast");
    }
  }
  void allGather(const void* in, void* out, const std::vector<size_t>& bytes) override {
    const std::vector<size_t> off = prefixOffsets(bytes);
    if (off.back() < minBytes_) return small_.allGather(in, out, bytes);
    const int n = size();
    char* o = static_cast<char*>(out);
    if (in != o + off[me()] && bytes[me()])
      DDPRUN_CUDA_OK(cudaMemcpyAsync(o + off[me()], in, bytes[me()], cudaMemcpyDeviceToDevice, stream_));
    const size_t maxLen = *std::max_element(bytes.begin(), bytes.end());
    for (size_t k0 = 0; k0 < maxLen; k0 += scratch_) {
      if (bytes[me()] > k0)
        DDPRUN_CUDA_OK(cudaMemcpyAsync(mine_, static_cast<const char*>(in) + k0,
                                std::min(scratch_, bytes[me()] - k0),
                                cudaMemcpyDeviceToDevice, stream_));
      step("allGather");
      for (int j = 0; j < n; ++j)
        if (j != me() && bytes[j] > k0)
          DDPRUN_CUDA_OK(cudaMemcpyAsync(o + off[j] + k0, peers_[j], std::min(scratch_, bytes[j] - k0),
                                  cudaMemcpyDeviceToDevice, stream_));
      step("allGather");
    }
    syncStream(stream_, pg_.options().timeout, "allGather");
  }
  void reduceScatter(const void* in, void* out, size_t count, DType t, ReduceOp op) override {
    const size_t es = dtypeSize(t);
    if (count * es * size() < minBytes_) return small_.reduceScatter(in, out, count, t, op);
    const int n = size();
    const size_t chunk = std::max<size_t>(1, scratch_ / (n * es));
    for (size_t e0 = 0; e0 < count; e0 += chunk) {
      const size_t len = std::min(chunk, count - e0);
      DDPRUN_CUDA_OK(cudaMemcpy2DAsync(mine_, len * es, static_cast<const char*>(in) + e0 * es, count * es,
                                len * es, n, cudaMemcpyDeviceToDevice, stream_));
      step("reduceScatter");
      PtrSet s{}, d{};
      for (int j = 0; j < n; ++j) s.p[j] = peers_[j] + me() * len * es;
      d.p[0] = static_cast<char*>(out) + e0 * es;
      launchReduce(t, op, s, n, d, 1, len, op == ReduceOp::kAvg ? n : 1, stream_);
      step("reduceScatter");
    }
    syncStream(stream_, pg_.options().timeout, "reduceScatter");
  }
  void barrier() override { shm_.barrier(); }
  void abort(int by) noexcept override { shm_.abort(by); }
  // Small operations take the staged path on its own stream: both wait.
  bool enqueues() const override { return false; }
  void allReduceOrdered(void* buf, size_t count, DType t, ReduceOp op,
                        const internal::OrderedEvents& ev) override {
    runOrderedBlocking({stream_, small_.stream()}, ev, [&] { allReduce(buf, buf, count, t, op); });
  }
  void broadcastOrdered(const std::vector<std::pair<void*, size_t>>& buffers, int root,
                        const internal::OrderedEvents& ev) override {
    runOrderedBlocking({stream_, small_.stream()}, ev, [&] {
      for (const auto& [p, bytes] : buffers) broadcast(p, bytes, root);
    });
  }

 private:
  struct DirectRecord {
    cudaIpcMemHandle_t in, out;
    uint64_t inOff, outOff;
    int32_t ok, pad;
  };
  static bool exportPtr(const void* p, cudaIpcMemHandle_t* h, uint64_t* off) {
    AddressRangeFn fn = addressRangeFn();
    CUdeviceptr base = 0;
    size_t bytes = 0;
    if (!fn || fn(&base, &bytes, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS) return false;
    if (cudaIpcGetMemHandle(h, reinterpret_cast<void*>(base)) != cudaSuccess) {
      cudaGetLastError();  // e.g. memory from cudaMallocAsync pools: not exportable
      return false;
    }
    *off = reinterpret_cast<uint64_t>(p) - base;
    return true;
  }
  // Peer allocation mapped here; mappings are cached (buffers are reused
  // every step) and the oldest closed beyond kMaxMapped.
  char* mapPeer(const cudaIpcMemHandle_t& h) {
    const std::string key(reinterpret_cast<const char*>(&h), sizeof(h));
    if (auto it = mapped_.find(key); it != mapped_.end()) return it->second;
    void* p = nullptr;
    DDPRUN_CUDA_OK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
    mapped_[key] = static_cast<char*>(p);
    order_.push_back(key);
    if (order_.size() > kMaxMapped) {
      cudaIpcCloseMemHandle(mapped_[order_.front()]);
      mapped_.erase(order_.front());
      order_.pop_front();
    }
    return static_cast<char*>(p);
  }
  bool allReduceDirect(const void* in, void* out, size_t count, DType t, ReduceOp op) {
    const int n = size();
    DirectRecord mine{};
    mine.ok = exportPtr(in, &mine.in, &mine.inOff) && exportPtr(out, &mine.out, &mine.outOff);
    // Peers read my input from their own contexts: work queued before this
    // call (on the default stream too: ours is a blocking stream) must be done.
    if (!ready_) DDPRUN_CUDA_OK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    DDPRUN_CUDA_OK(cudaEventRecord(ready_, stream_));
    syncStream(stream_, pg_.options().timeout, "allReduce");
    std::vector<DirectRecord> all(n);
    shm_.allGather(&mine, all.data(), std::vector<size_t>(n, sizeof(DirectRecord)));
    for (const auto& r : all)
      if (!r.ok) return false;  // every rank sees the same records: all fall back
    const size_t es = dtypeSize(t);
    const Partition part(count, n);
    const size_t lo = part.offset(me()) * es;
    PtrSet s{}, d{};
    for (int j = 0; j < n; ++j) {
      const char* src = j == me() ? static_cast<const char*>(in) : mapPeer(all[j].in) + all[j].inOff;
      char* dst = j == me() ? static_cast<char*>(out) : mapPeer(all[j].out) + all[j].outOff;
      s.p[j] = const_cast<char*>(src) + lo;
      d.p[j] = dst + lo;
    }
    launchReduce(t, op, s, n, d, n, part.length(me()), op == ReduceOp::kAvg ? n : 1, stream_);
    step("allReduce");
    return true;
  }

  // Finish this rank's GPU work, then meet the other ranks.
  void step(const char* what) {
    syncStream(stream_, pg_.options().timeout, what);
    shm_.barrier();
  }

  ProcessGroup& pg_;
  ShmComm& shm_;
  static constexpr size_t kMaxMapped = 64;
  StagedComm small_;
  size_t scratch_;
  size_t minBytes_;
  bool direct_ = !std::getenv("DDPRUN_CUDA_IPC_NO_DIRECT");
  cudaEvent_t ready_{};
  std::map<std::string, char*> mapped_;
  std::deque<std::string> order_;
  cudaStream_t stream_{};
  void* mine_ = nullptr;
  std::vector<char*> peers_;
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

int cudaSelectedDevice() { return envDevice(); }

void cudaBindThread() { DDPRUN_CUDA_OK(cudaSetDevice(envDevice())); }

std::string cudaTransportName(ProcessGroup& pg) {
  std::string name;
  internal::enqueue(pg, "cudaTransportName", [&] { name = internal::cudaComm(pg).name(); }).wait();
  return name;
}

void* cudaAllocDevice(size_t bytes) {
  requireGpu();
  DDPRUN_CUDA_OK(cudaSetDevice(envDevice()));
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

int ncclRuntimeVersion() {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? v : 0;
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
  const int dev = envDevice();
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
  if (want == "nccl") {
    if (!distinct) allowSharedGpu(pg, versions, bus);
    gNcclStarted = true;
    return std::make_unique<NcclComm>(pg, host);
  }
  if (want == "ipc") {
    if (!oneHost || !shm)
      DDPRUN_THROW(InvalidArgument, "DDPRUN_CUDA_TRANSPORT=ipc needs every rank on one host "
                   "with the shared-memory transport");
    return std::make_unique<IpcComm>(pg, *shm, host);
  }
  if (want == "staged") return std::make_unique<StagedComm>(pg, host);
  DDPRUN_THROW(InvalidArgument, "DDPRUN_CUDA_TRANSPORT='", want,
               "': expected auto, nccl, ipc or staged");
}

}  // namespace ddprun::runtime
