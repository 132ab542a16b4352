// CUDA transports (NCCL, IPC, staged). Internal header.
#pragma once

#include <memory>
#include <string>

#include "../comm.h"

namespace ddprun::runtime {

class ProcessGroup;
class ShmComm;

class CudaComm : public Comm {
 public:
  virtual std::string name() const = 0;
};

// Chooses and connects the transport (collective: every rank must call it at
// the same point). hostComm runs host collectives (staged path, agreement);
// shm is this host's shared-memory comm when all ranks share one host.
std::unique_ptr<CudaComm> makeCudaComm(ProcessGroup& pg, Comm& hostComm, ShmComm* shm);

// Makes the runtime's device current on the calling thread.
void cudaBindThread();

}  // namespace ddprun::runtime
