// The seam between train and its CUDA backend. Internal header.
//
// The CUDA backend (train/cuda/) is built into libddprun_train_cuda.so, which
// links cuDNN, cuBLASLt and cudart and uses train's and the runtime's symbols
// from the program that loads it (train exports them, -rdynamic).
// cuda_backend_loader.cc loads it when --device cuda or auto asks for it;
// a program that links the backend in (the CUDA tests) uses it directly.
#pragma once

#include <cstdint>
#include <memory>

#include "ddprun/train/layers.h"

namespace ddprun::train::internal {

// A plugin of another build is refused, before it is loaded (the plugin
// exports its build id, cmake/build_id.cmake, as the data symbol
// ddprun_train_cuda_plugin_build_id, DDPRUN_PLUGIN_BUILD_ID, which
// common/plugin.h reads from the file) and again from the table.
struct CudaBackendPlugin {
  const char* buildId;  // the plugin's DDPRUN_BUILD_ID
  std::unique_ptr<Backend> (*make)(const CudaBackendOptions&);
};

inline constexpr const char* kCudaBackendPluginFile = "libddprun_train_cuda.so";
inline constexpr const char* kCudaBackendPluginEntry = "ddprun_train_cuda_plugin";

}  // namespace ddprun::train::internal

// The plugin's entry point (cuda/cuda_backend.cc): the table (static storage).
extern "C" const ddprun::train::internal::CudaBackendPlugin* ddprun_train_cuda_plugin();
