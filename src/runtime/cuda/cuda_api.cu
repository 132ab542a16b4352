// The public CUDA helpers of include/ddprun/runtime/cuda.h, built with CUDA
// (cuda_stub.cc is their counterpart without it), and cudaBindThread of
// cuda_comm.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>

#include "../pg_internal.h"
#include "cuda_comm.h"
#include "cuda_support.h"
#include "ddprun/runtime/cuda.h"
#include "ddprun/runtime/process_group.h"

namespace ddprun::runtime {

bool cudaBuilt() { return true; }

int cudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device/driver" error
    return 0;
  }
  return n;
}

// Resolved once: every collective binds its thread to it (no driver query
// on the hot path).
int cudaSelectedDevice() {
  static const int dev = [] {
    if (const char* v = std::getenv("DDPRUN_CUDA_DEVICE")) return std::atoi(v);
    const char* lr = std::getenv("LOCAL_RANK");
    const int n = cudaDeviceCount();
    return n > 0 ? (lr ? std::atoi(lr) : 0) % n : 0;
  }();
  return dev;
}

void cudaBindThread() { DDPRUN_CUDA_OK(cudaSetDevice(cudaSelectedDevice())); }

std::string cudaTransportName(ProcessGroup& pg) {
  std::string name;
  internal::enqueue(pg, "cudaTransportName", [&] { name = internal::cudaComm(pg).name(); }).wait();
  return name;
}

void* cudaAllocDevice(size_t bytes) {
  requireGpu();
  DDPRUN_CUDA_OK(cudaSetDevice(cudaSelectedDevice()));
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

}  // namespace ddprun::runtime
