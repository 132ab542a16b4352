// The CUDA helpers behind include/ddprun/runtime/cuda.h, and the plugin's
// entry point: the table cuda_loader.cc calls through (cuda_plugin.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>

#include "../pg_internal.h"
#include "cuda_comm.h"
#include "cuda_plugin.h"
#include "cuda_support.h"
#include "ddprun/build_id.h"  // generated: cmake/build_id.cmake
#include "ddprun/common/plugin.h"
#include "ddprun/runtime/cuda.h"
#include "ddprun/runtime/process_group.h"

namespace ddprun::runtime {
namespace {
namespace gpu {

int deviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device/driver" error
    return 0;
  }
  return n;
}

// Resolved once: every collective binds its thread to it (no driver query
// on the hot path).
int selectedDevice() {
  static const int dev = [] {
    if (const char* v = std::getenv("DDPRUN_CUDA_DEVICE")) return std::atoi(v);
    const char* lr = std::getenv("LOCAL_RANK");
    const int n = deviceCount();
    return n > 0 ? (lr ? std::atoi(lr) : 0) % n : 0;
  }();
  return dev;
}

void bindThread() { DDPRUN_CUDA_OK(cudaSetDevice(selectedDevice())); }

std::string transportName(ProcessGroup& pg) {
  std::string name;
  internal::enqueue(pg, "cudaTransportName", [&] { name = internal::cudaComm(pg).name(); }).wait();
  return name;
}

void* allocDevice(size_t bytes) {
  requireGpu();
  DDPRUN_CUDA_OK(cudaSetDevice(selectedDevice()));
  void* p = nullptr;
  DDPRUN_CUDA_OK(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
  return p;
}
void freeDevice(void* p) {
  if (p) cudaFree(p);
}
void copyToDevice(void* dst, const void* src, size_t bytes) {
  // From pageable memory cudaMemcpy may return before the DMA has landed.
  if (bytes) DDPRUN_CUDA_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  DDPRUN_CUDA_OK(cudaStreamSynchronize(0));
}
void copyToHost(void* dst, const void* src, size_t bytes) {
  if (bytes) DDPRUN_CUDA_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
void copyOnDevice(void* dst, const void* src, size_t bytes) {
  if (bytes) DDPRUN_CUDA_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}
void synchronize() { DDPRUN_CUDA_OK(cudaDeviceSynchronize()); }
double nowSeconds() {
  DDPRUN_CUDA_OK(cudaDeviceSynchronize());
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace gpu
}  // namespace
}  // namespace ddprun::runtime

// Read from the file before it is loaded (common/plugin.h): a program of
// another build refuses this plugin without running any of its code.
DDPRUN_PLUGIN_BUILD_ID(ddprun_runtime_cuda_plugin, DDPRUN_BUILD_ID);

extern "C" __attribute__((visibility("default"))) const ddprun::runtime::internal::CudaPlugin*
ddprun_runtime_cuda_plugin() {
  using namespace ddprun::runtime;
  static const internal::CudaPlugin table{
      .buildId = DDPRUN_BUILD_ID,
      .deviceCount = gpu::deviceCount,
      .selectedDevice = gpu::selectedDevice,
      .bindThread = gpu::bindThread,
      .ncclVersion = internal::loadedNcclVersion,
      .transportName = gpu::transportName,
      .allocDevice = gpu::allocDevice,
      .freeDevice = gpu::freeDevice,
      .copyToDevice = gpu::copyToDevice,
      .copyToHost = gpu::copyToHost,
      .copyOnDevice = gpu::copyOnDevice,
      .synchronize = gpu::synchronize,
      .nowSeconds = gpu::nowSeconds,
      .makeComm = internal::connectCudaComm,
      .makeDeviceCollectives = internal::makeGpuDeviceCollectives,
  };
  return &table;
}
