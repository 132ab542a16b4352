// train's CUDA backend, loaded at run time (cuda_plugin.h), or linked in; and
// the checks that run before it is loaded (backend_choice.h, CudaProbes).
#include <dirent.h>
#include <dlfcn.h>

#include <string>

#include "cuda_plugin.h"
#include "ddprun/common/env.h"
#include "ddprun/common/error.h"
#include "ddprun/common/plugin.h"
#include "ddprun/runtime/cuda.h"
#include "ddprun/train/backend_choice.h"

// Defined when the program links the backend in (the CUDA tests); null in
// `train`, which loads the plugin.
extern "C" const ddprun::train::internal::CudaBackendPlugin* ddprun_train_cuda_plugin()
    __attribute__((weak));

namespace ddprun::train {

namespace {

using Loaded = plugin::Loaded<internal::CudaBackendPlugin>;

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r;
    // The backend stands on the runtime's CUDA part: without it, its reason.
    if (!runtime::cudaBuilt()) {
      r.error = runtime::cudaUnavailableReason();
    } else if (ddprun_train_cuda_plugin) {
      r.table = ddprun_train_cuda_plugin();
    } else {
      r = plugin::openTable<internal::CudaBackendPlugin>(
          internal::kCudaBackendPluginFile, internal::kCudaBackendPluginEntry);
    }
    return r;
  }();
  return l;
}

// ------------------------------------------------ the checks before loading

// GPUs the NVIDIA kernel driver lists, whether or not any CUDA library is
// installed (one directory per GPU).
int driverGpuCount() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/driver/nvidia/gpus")) {
    while (const dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
  }
  return n;
}

// Looked for, not loaded: a CPU-only ddprun says so before anything else.
std::string pluginMissing() {
  if (ddprun_train_cuda_plugin) return "";
  const plugin::Found f =
      plugin::find(plugin::defaultSearchDirs(), internal::kCudaBackendPluginFile);
  return f.path.empty() ? f.error : "";
}

// The NVIDIA driver's user-space library. It is what cudart itself loads (the
// same handle, reference counted), a small fraction of the plugins' cuDNN,
// cuBLAS and NCCL, and loading it runs no CUDA initialisation; asking it
// (cuInit) needs no other CUDA library. The kernel driver's
// /proc/driver/nvidia is not used as the test: WSL2 and some containers have
// a working libcuda.so.1 without it. Once loaded, it stays (cuInit may have
// left threads or handlers behind that unloading would pull from under them).
void*& driverHandle() {
  static void* h = nullptr;
  return h;
}

std::string loadDriver() {
  if (driverHandle()) return "";
  void* h = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!h) {
    // Not there at all is the common case, said plainly; anything else (a
    // library of the wrong class, unreadable) in the loader's words.
    const char* e = ::dlerror();
    const std::string why = e ? e : "libcuda.so.1 does not load";
    return why.find("No such file or directory") != std::string::npos
               ? "libcuda.so.1 not found by the dynamic loader"
               : why;
  }
  driverHandle() = h;
  return "";
}

// The driver API's calls, declared here: this file is compiled without CUDA.
using CuInit = int (*)(unsigned);
using CuDeviceGetCount = int (*)(int*);
using CuGetErrorText = int (*)(int, const char**);
constexpr int kCudaSuccess = 0;
constexpr int kCudaErrorNoDevice = 100;  // CUDA_ERROR_NO_DEVICE

std::string driverError(const char* call, int rc) {
  std::string text = std::string(call) + ": error " + std::to_string(rc);
  const char* s = nullptr;
  if (auto name =
          reinterpret_cast<CuGetErrorText>(::dlsym(driverHandle(), "cuGetErrorName"));
      name && name(rc, &s) == kCudaSuccess && s)
    text = std::string(call) + ": " + s;
  if (auto str =
          reinterpret_cast<CuGetErrorText>(::dlsym(driverHandle(), "cuGetErrorString"));
      str && str(rc, &s) == kCudaSuccess && s)
    text += std::string(" (") + s + ")";
  return text;
}

CudaProbes::DriverDevices driverDevices() {
  auto init = reinterpret_cast<CuInit>(::dlsym(driverHandle(), "cuInit"));
  auto count =
      reinterpret_cast<CuDeviceGetCount>(::dlsym(driverHandle(), "cuDeviceGetCount"));
  if (!init || !count) return {.error = "libcuda.so.1 has no cuInit or cuDeviceGetCount"};
  const int rc = init(0);
  if (rc == kCudaErrorNoDevice) return {.count = 0};
  if (rc != kCudaSuccess) return {.error = driverError("cuInit", rc)};
  int n = 0;
  if (const int c = count(&n); c != kCudaSuccess)
    return {.error = driverError("cuDeviceGetCount", c)};
  return {.count = n};
}

}  // namespace

CudaProbes systemCudaProbes() {
  CudaProbes p;
  p.pluginMissing = pluginMissing;
  p.visibleDevices = env::get("CUDA_VISIBLE_DEVICES");
  p.loadDriver = loadDriver;
  p.driverDevices = driverDevices;
  p.loadBackend = cudaBackendUnusable;
  p.runtimeDevices = runtime::cudaDeviceCount;
  p.driverGpus = driverGpuCount;
  return p;
}

std::string cudaBackendUnusable() { return loaded().error; }

std::unique_ptr<Backend> loadCudaBackend(const CudaBackendOptions& o) {
  const Loaded& l = loaded();
  if (!l.table)
    DDPRUN_THROW(InvalidArgument, "the CUDA backend is not usable: ", l.error, "; ",
                 runtime::cudaInstallFix(l.error), "; or use --device cpu");
  return l.table->make(o);
}

}  // namespace ddprun::train
