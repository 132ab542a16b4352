// The staged CUDA transport (staged_comm.cu): device buffers through pinned
// host memory and the host collectives (Comm). The fallback when neither NCCL
// nor CUDA IPC applies, and CUDA IPC's path for small operations (IpcComm
// holds one, hence the class here). Internal header of src/runtime/cuda/
// (CUDA types: include only from .cu files).
//
// Thread-safety: as every Comm, one caller at a time (the group's thread).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "../comm.h"
#include "cuda_comm.h"
#include "cuda_handles.h"
#include "ddprun/runtime/process_group.h"

namespace ddprun::runtime {

// Device -> pinned host, host collective, host -> device. Bytes over PCIe per
// rank: S down + S up (2S / B_pcie_dir when the directions do not overlap).
class StagedComm : public CudaComm {
 public:
  StagedComm(ProcessGroup& pg, Comm& host);
  std::string name() const override { return "staged"; }
  int size() const override { return host_.size(); }
  int me() const override { return host_.me(); }

  void allReduce(const void* in, void* out, size_t count, DType t, ReduceOp op) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void allGather(const void* in, void* out, const std::vector<size_t>& bytes) override;
  void reduceScatter(const void* in, void* out, size_t count, DType t, ReduceOp op) override;
  void barrier() override { host_.barrier(); }
  void abort(int by) noexcept override { host_.abort(by); }
  bool enqueues() const override { return false; }
  void allReduceOrdered(void* buf, size_t count, DType t, ReduceOp op,
                        const internal::OrderedEvents& ev) override;
  void broadcastOrdered(const std::vector<std::pair<void*, size_t>>& buffers, int root,
                        const internal::OrderedEvents& ev) override;
  cudaStream_t stream() const { return stream_; }

 private:
  char* stage(const void* dev, size_t bytes, size_t room);
  void unstage(void* dev, const char* h, size_t bytes);
  void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);

  ProcessGroup& pg_;
  Comm& host_;
  cuda::Stream stream_;  // blocking (cudaStreamCreate)
  cuda::PinnedBuffer pinned_;
};

}  // namespace ddprun::runtime
