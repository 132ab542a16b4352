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
      r = plugin::openTable<internal::CudaBackendPlugin>(internal::kCudaBackendPluginFile,
                                                         internal::kCudaBackendPluginEntry,
                                                         internal::kCudaBackendPluginAbi);
    }
    return r;
  }();
  return l;
}

}  // namespace

std::string cudaBackendUnusable() { return loaded().error; }

std::unique_ptr<Backend> loadCudaBackend(const CudaBackendOptions& o) {
  const Loaded& l = loaded();
  if (!l.table)
    DDPRUN_THROW(InvalidArgument, "the CUDA backend is not usable: ", l.error, "; ",
                 runtime::cudaInstallFix(l.error), "; or use --device cpu");
  return l.table->make(o);
}

}  // namespace ddprun::train
