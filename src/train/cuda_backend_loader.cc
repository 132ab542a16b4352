// train's CUDA backend, loaded at run time (cuda_plugin.h), or linked in.
#include <string>

#include "cuda_plugin.h"
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

struct Loaded {
  const internal::CudaBackendPlugin* api = nullptr;
  std::string why;
};

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r;
    // The backend stands on the runtime's CUDA part: without it, its reason.
    if (!runtime::cudaBuilt()) {
      r.why = runtime::cudaUnavailableReason();
      return r;
    }
    const internal::CudaBackendPlugin* api = nullptr;
    if (ddprun_train_cuda_plugin) {
      api = ddprun_train_cuda_plugin();
    } else {
      const plugin::Opened o =
          plugin::open(internal::kCudaBackendPluginFile, internal::kCudaBackendPluginEntry);
      if (!o.symbol) {
        r.why = o.error;
        return r;
      }
      api = reinterpret_cast<const internal::CudaBackendPlugin* (*)()>(o.symbol)();
      if (!api || api->abi != internal::kCudaBackendPluginAbi) {
        r.why = o.path + " is from another ddprun build";
        return r;
      }
    }
    r.api = api;
    return r;
  }();
  return l;
}

}  // namespace

std::string cudaBackendUnusable() { return loaded().why; }

std::unique_ptr<Backend> loadCudaBackend(const CudaBackendOptions& o) {
  const Loaded& l = loaded();
  if (!l.api)
    DDPRUN_THROW(InvalidArgument, "the CUDA backend is not usable: ", l.why, "; ",
                 runtime::cudaInstallFix(l.why), "; or use --device cpu");
  return l.api->make(o);
}

}  // namespace ddprun::train
