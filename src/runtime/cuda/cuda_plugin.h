// The seam between the runtime and its CUDA part. Internal header.
//
// The CUDA transports and helpers (the .cu files of this folder) are built
// into libddprun_runtime_cuda.so, which links cudart, NCCL and nothing of the
// runtime: it uses the runtime's symbols from the program that loads it
// (programs linking ddprun_runtime with CUDA on export theirs, -rdynamic).
// cuda_loader.cc implements include/ddprun/runtime/cuda.h by loading it on
// first use (common/plugin.h says where it is looked for) and calling
// through this table. A build or install without it has no CUDA, and says
// why (cudaUnavailableReason).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "../device_order.h"
#include "cuda_comm.h"

namespace ddprun::runtime::internal {

// A plugin of another build is refused: its build id (common/plugin.h,
// cmake/build_id.cmake, generated per build directory and changed with this
// header) is checked from the file before it is loaded, and again here.
struct CudaPlugin {
  const char* buildId;  // the plugin's DDPRUN_BUILD_ID
  int (*deviceCount)();
  int (*selectedDevice)();
  void (*bindThread)();
  int (*ncclVersion)();
  std::string (*transportName)(ProcessGroup&);
  void* (*allocDevice)(size_t);
  void (*freeDevice)(void*);
  void (*copyToDevice)(void*, const void*, size_t);
  void (*copyToHost)(void*, const void*, size_t);
  void (*copyOnDevice)(void*, const void*, size_t);
  void (*synchronize)();
  double (*nowSeconds)();
  std::unique_ptr<CudaComm> (*makeComm)(ProcessGroup&, Comm&, ShmComm*);
  std::unique_ptr<DeviceCollectives> (*makeDeviceCollectives)(ProcessGroup&);
};

// The plugin's file name and entry point.
inline constexpr const char* kCudaPluginFile = "libddprun_runtime_cuda.so";
inline constexpr const char* kCudaPluginEntry = "ddprun_runtime_cuda_plugin";

// Inside the plugin: the implementations behind the table (cuda_comm.cu,
// device_collectives.cu, nccl_comm.cu).
std::unique_ptr<CudaComm> connectCudaComm(ProcessGroup& pg, Comm& hostComm, ShmComm* shm);
std::unique_ptr<DeviceCollectives> makeGpuDeviceCollectives(ProcessGroup& pg);
int loadedNcclVersion();

}  // namespace ddprun::runtime::internal

// The plugin's entry point: the table (static storage).
extern "C" const ddprun::runtime::internal::CudaPlugin* ddprun_runtime_cuda_plugin();
