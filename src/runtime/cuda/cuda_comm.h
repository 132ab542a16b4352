// CUDA transports (self, staged, NCCL, IPC). Internal header.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../comm.h"
#include "../device_order.h"

namespace ddprun::runtime {

class ProcessGroup;
class ShmComm;

// The Comm operations block until the device work is done. The ordered
// operations are the stream-ordered path (device_order.h): they run in
// place, wait on the device for ev.after, record ev.start (optional) and
// ev.done on the transport's stream.
class CudaComm : public Comm {
 public:
  virtual std::string name() const = 0;
  // True when the ordered operations only enqueue device work and return
  // (NCCL, self): the calling thread never waits for the device. False: they
  // return once the operation is done (IPC, staged: host barriers between
  // ranks are part of them), so they belong on the group's thread.
  virtual bool enqueues() const = 0;
  virtual void allReduceOrdered(void* buf, size_t count, DType t, ReduceOp op,
                                const internal::OrderedEvents& ev) = 0;
  virtual void broadcastOrdered(const std::vector<std::pair<void*, size_t>>& buffers, int root,
                                const internal::OrderedEvents& ev) = 0;
};

// Chooses and connects the transport (collective: every rank must call it at
// the same point). hostComm runs host collectives (staged path, agreement);
// shm is this host's shared-memory comm when all ranks share one host.
std::unique_ptr<CudaComm> makeCudaComm(ProcessGroup& pg, Comm& hostComm, ShmComm* shm);

// The transports behind makeCudaComm, a file each (self_comm.cu,
// staged_comm.cu, nccl_comm.cu, ipc_comm.cu). makeNcclComm: `sharedBus`
// non-empty when ranks share that GPU, which NCCL accepts from 2.30 on (every
// rank's ncclRuntimeVersion in `versions`; else InvalidArgument naming the
// version and the fix).
std::unique_ptr<CudaComm> makeSelfComm(ProcessGroup& pg);
std::unique_ptr<CudaComm> makeStagedComm(ProcessGroup& pg, Comm& hostComm);
std::unique_ptr<CudaComm> makeNcclComm(ProcessGroup& pg, Comm& hostComm,
                                       const std::vector<int>& versions,
                                       const std::string& sharedBus);
std::unique_ptr<CudaComm> makeIpcComm(ProcessGroup& pg, ShmComm& shm, Comm& hostComm);

// Makes the runtime's device current on the calling thread.
void cudaBindThread();

// The first NCCL release that accepts several ranks on one GPU (with
// NCCL_MULTI_RANK_GPU_ENABLE=1), as ncclGetVersion codes it.
inline constexpr int kNcclMultiRankGpuVersion = 23000;
// "2.30.7" for 23007 (NCCL >= 2.9 codes major*10000 + minor*100 + patch,
// older ones major*1000 + minor*100 + patch), "none" for 0.
inline std::string ncclVersionString(int code) {
  if (code <= 0) return "none";
  const bool wide = code >= 20900;
  const int major = wide ? code / 10000 : code / 1000;
  const int minor = wide ? code / 100 % 100 : code / 100 % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

}  // namespace ddprun::runtime
