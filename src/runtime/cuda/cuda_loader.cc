// include/ddprun/runtime/cuda.h over the CUDA plugin (cuda_plugin.h): loaded
// on the first call that needs CUDA, never by a program that only uses the
// CPU. Without it every query answers "no CUDA" and every CUDA operation
// throws InvalidArgument with the reason.
#include <atomic>
#include <string>

#include "../pg_internal.h"
#include "cuda_comm.h"
#include "cuda_plugin.h"
#include "ddprun/common/error.h"
#include "ddprun/common/plugin.h"
#include "ddprun/runtime/cuda.h"

namespace ddprun::runtime {

namespace {

using Loaded = plugin::Loaded<internal::CudaPlugin>;

std::atomic<const internal::CudaPlugin*> gLoaded{nullptr};

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r = plugin::openTable<internal::CudaPlugin>(internal::kCudaPluginFile,
                                                       internal::kCudaPluginEntry);
    if (r.table) gLoaded.store(r.table, std::memory_order_release);
    return r;
  }();
  return l;
}

const internal::CudaPlugin& api() {
  const Loaded& l = loaded();
  if (!l.table)
    DDPRUN_THROW(InvalidArgument, "CUDA is not available to this program: ", l.error, "; ",
                 cudaInstallFix(l.error));
  return *l.table;
}

}  // namespace

bool cudaBuilt() { return loaded().table != nullptr; }
std::string cudaUnavailableReason() { return loaded().error; }
std::string cudaPluginPath() { return loaded().path; }

std::string cudaInstallFix(const std::string& why) {
  // The library the loader could not find -> NVIDIA's PyPI package that has it.
  static const std::pair<const char*, const char*> kPackages[] = {
      {"libcudart.so", "nvidia-cuda-runtime"}, {"libcublasLt.so", "nvidia-cublas"},
      {"libcublas.so", "nvidia-cublas"},       {"libcudnn", "nvidia-cudnn-cu13"},
      {"libnccl.so", "nvidia-nccl-cu13"},
  };
  for (const auto& [lib, pkg] : kPackages)
    if (why.find(lib) != std::string::npos && why.find("cannot open shared object") != std::string::npos)
      return std::string("install NVIDIA's package that has it: pip install ") + pkg +
             " (or the CUDA 13 toolkit, cuDNN 9 and NCCL system-wide)";
  if (plugin::notInstalled(why))
    return "this is a CPU-only ddprun: install its CUDA variant (README, Install: "
           "pip install . -C ddprun.cuda=true)";
  return "reinstall ddprun (README, Install)";
}

int cudaDeviceCount() {
  const Loaded& l = loaded();
  return l.table ? l.table->deviceCount() : 0;
}
int cudaSelectedDevice() {
  const Loaded& l = loaded();
  return l.table ? l.table->selectedDevice() : 0;
}
void cudaBindThread() {
  // Only once CUDA is in use: a CPU collective must not load the plugin.
  if (const auto* a = gLoaded.load(std::memory_order_acquire)) a->bindThread();
}
int ncclRuntimeVersion() {
  const Loaded& l = loaded();
  return l.table ? l.table->ncclVersion() : 0;
}
std::string cudaTransportName(ProcessGroup& pg) {
  const Loaded& l = loaded();
  return l.table ? l.table->transportName(pg) : "none";
}
void* cudaAllocDevice(size_t bytes) { return api().allocDevice(bytes); }
void cudaFreeDevice(void* p) {
  if (p) api().freeDevice(p);
}
void cudaCopyToDevice(void* dst, const void* src, size_t bytes) {
  api().copyToDevice(dst, src, bytes);
}
void cudaCopyToHost(void* dst, const void* src, size_t bytes) { api().copyToHost(dst, src, bytes); }
void cudaCopyOnDevice(void* dst, const void* src, size_t bytes) {
  api().copyOnDevice(dst, src, bytes);
}
void cudaSynchronize() {
  if (const auto* a = gLoaded.load(std::memory_order_acquire)) a->synchronize();
}
double cudaNowSeconds() { return api().nowSeconds(); }

std::unique_ptr<CudaComm> makeCudaComm(ProcessGroup& pg, Comm& hostComm, ShmComm* shm) {
  return api().makeComm(pg, hostComm, shm);
}

std::unique_ptr<internal::DeviceCollectives> internal::makeDeviceCollectives(ProcessGroup& pg) {
  return api().makeDeviceCollectives(pg);
}

}  // namespace ddprun::runtime
