// The CUDA IPC transport: ranks sharing a host's GPUs map each other's
// device buffers and reduce with our kernels (cuda_comm.h, docs/runtime.md).
#include <cuda.h>  // types only: driver calls go through cudaGetDriverEntryPoint

#include <cstdlib>
#include <deque>
#include <map>

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "../comm.h"
#include "cuda_comm.h"
#include "cuda_handles.h"
#include "cuda_support.h"
#include "reduce_kernels.h"
#include "ddprun/runtime/process_group.h"
#include "../shm/shm_comm.h"
#include "staged_comm.h"

namespace ddprun::runtime {

namespace {
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
    stream_ = cuda::Stream::createBlocking();
    mine_ = cuda::DeviceMemory::alloc(scratch_);
    cudaIpcMemHandle_t handle{};
    DDPRUN_CUDA_OK(cudaIpcGetMemHandle(&handle, mine_));
    std::vector<cudaIpcMemHandle_t> all(n);
    std::vector<size_t> bytes(n, sizeof(handle));
    shm.allGather(&handle, all.data(), bytes);
    peers_.assign(n, nullptr);
    for (int j = 0; j < n; ++j) {
      if (j == shm.me()) {
        peers_[j] = static_cast<char*>(mine_.get());
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
    for (int j = 0; j < static_cast<int>(peers_.size()); ++j)
      if (j != shm_.me() && peers_[j]) cudaIpcCloseMemHandle(peers_[j]);
    // Then the members: ready_, mine_, stream_ (reverse declaration order).
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
    if (!ready_) ready_ = cuda::Event::create();
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
  StagedComm small_;  // small operations
  size_t scratch_;
  size_t minBytes_;
  bool direct_ = !std::getenv("DDPRUN_CUDA_IPC_NO_DIRECT");
  std::map<std::string, char*> mapped_;
  std::deque<std::string> order_;
  cuda::Stream stream_;       // blocking (cudaStreamCreate): see allReduceDirect
  cuda::DeviceMemory mine_;   // this rank's scratch, exported to the peers
  cuda::Event ready_;         // allReduceDirect's, created on first use
  std::vector<char*> peers_;
};

}  // namespace

std::unique_ptr<CudaComm> makeIpcComm(ProcessGroup& pg, ShmComm& shm, Comm& host) {
  return std::make_unique<IpcComm>(pg, shm, host);
}

}  // namespace ddprun::runtime
