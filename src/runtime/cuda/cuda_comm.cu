// Which CUDA transport a group uses (makeCudaComm): every rank tells the
// others its host, GPU and NCCL version, and all choose the same one. The
// transports have their own files: self_comm.cu, staged_comm.cu,
// nccl_comm.cu, ipc_comm.cu (reduction kernels: reduce_kernels.cu). See
// include/ddprun/runtime/cuda.h for how a transport is chosen.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../comm.h"
#include "../shm/shm_comm.h"
#include "cuda_comm.h"
#include "cuda_plugin.h"
#include "cuda_support.h"
#include "ddprun/runtime/cuda.h"
#include "ddprun/runtime/process_group.h"

namespace ddprun::runtime {

namespace {
// What each rank tells the others when the CUDA transport is chosen.
struct RankRecord {
  char ident[120];      // "hostId|busId", NUL-padded (truncated if longer)
  int32_t ncclVersion;  // internal::loadedNcclVersion()
  int32_t pad;
};
static_assert(sizeof(RankRecord) == 128, "RankRecord is exchanged as 128 bytes");

}  // namespace

// Agreement: every rank contributes "hostId|busId" and its NCCL version;
// NCCL when all GPUs differ, IPC when everyone is on one host, else staged.
std::unique_ptr<CudaComm> internal::connectCudaComm(ProcessGroup& pg, Comm& host, ShmComm* shm) {
  requireGpu();
  const int dev = cudaSelectedDevice();
  DDPRUN_CUDA_OK(cudaSetDevice(dev));
  char bus[32] = {0};
  DDPRUN_CUDA_OK(cudaDeviceGetPCIBusId(bus, sizeof(bus), dev));
  const std::string ident = pg.options().hostId + "|" + bus;
  RankRecord mine{};
  std::memcpy(mine.ident, ident.data(), std::min(ident.size(), sizeof(mine.ident) - 1));
  mine.ncclVersion = internal::loadedNcclVersion();
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
    if (pg.size() == 1) return makeSelfComm(pg);
    want = distinct ? "nccl" : (oneHost && shm ? "ipc" : "staged");
  }
  if (want == "nccl") return makeNcclComm(pg, host, versions, distinct ? "" : bus);
  if (want == "ipc") {
    if (!oneHost || !shm)
      DDPRUN_THROW(InvalidArgument, "DDPRUN_CUDA_TRANSPORT=ipc needs every rank on one host "
                   "with the shared-memory transport");
    return makeIpcComm(pg, *shm, host);
  }
  if (want == "staged") return makeStagedComm(pg, host);
  DDPRUN_THROW(InvalidArgument, "DDPRUN_CUDA_TRANSPORT='", want,
               "': expected auto, nccl, ipc or staged");
}

}  // namespace ddprun::runtime
