// The staged CUDA transport: device buffers through pinned host memory and
// the host collectives (Comm). The fallback when neither NCCL nor CUDA IPC
// applies, and CUDA IPC's path for small operations. Internal header of
// src/runtime/cuda/ (CUDA types: include only from .cu files).
//
// Thread-safety: as every Comm, one caller at a time (the group's thread).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "../comm.h"
#include "cuda_comm.h"
#include "cuda_support.h"
#include "ddprun/runtime/process_group.h"

namespace ddprun::runtime {

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

}  // namespace ddprun::runtime
