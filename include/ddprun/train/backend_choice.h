// Which backend `train` computes on: --device and --precision against what
// this build and machine have. Bad combinations are InvalidArgument (exit 2)
// with a message naming the flag and the way out.
// Thread-safety: stateless (makeBackend creates a backend for the caller).
#pragma once

#include <memory>
#include <string>

#include "ddprun/train/layers.h"
#include "ddprun/train/precision.h"
#include "ddprun/train/train_config.h"

namespace ddprun::train {

// What the machine offers (injected by tests).
struct DeviceInventory {
  // The CUDA backend loads: the runtime's and train's CUDA plugins are
  // installed and every library they need resolves.
  bool cudaBuilt = false;
  int gpus = 0;              // GPUs CUDA sees (0 when !cudaBuilt)
  std::string unusableWhy{};  // why !cudaBuilt (runtime::cudaUnavailableReason())
  int driverGpus = 0;        // GPUs the NVIDIA driver lists (/proc/driver/nvidia/gpus)
};
// This build and machine. --device cpu probes nothing (no CUDA library is
// loaded); cuda and auto load the CUDA plugins (cuda_backend_loader.cc).
DeviceInventory probeDevices(DeviceChoice device);

// DDPRUN_CUDNN_DETERMINISTIC=1: --deterministic without the flag (0 or unset:
// the flag decides). Other values are an error naming the variable.
bool deterministicFromEnv();

// Where to compute, and why, for the start line and the final JSON.
struct DeviceDecision {
  bool cuda = false;
  // One line for the user when --device auto chose the CPU (why, and with a
  // GPU present the fix); "" otherwise.
  std::string notice;
  // The choice and its reason, e.g. "cpu (--device auto: no CUDA GPU is visible)".
  std::string summary;
};
// --device cuda, or auto with a usable backend and a GPU. Throws
// InvalidArgument (exit 2) for --device cuda without a usable backend (naming
// why and what to install) or without a GPU, and for a --precision other
// than fp32 when the choice is the CPU. Pure.
DeviceDecision decideDevice(DeviceChoice device, Precision precision, const DeviceInventory& inv);
inline bool chooseCuda(DeviceChoice device, Precision precision, const DeviceInventory& inv) {
  return decideDevice(device, precision, inv).cuda;
}

// Whether CUDA's activations are NHWC for --layout `layout` at `precision`:
// auto is NHWC where cuDNN runs tensor-core kernels on it (tf32, bf16, fp16)
// and NCHW in fp32, whose NHWC kernels are not tensor-core kernels
// (docs/benchmarks.md). Pure.
bool nhwcLayout(Layout layout, Precision precision);

// The backend --device chooses: CUDA on this process's GPU (LOCAL_RANK modulo
// the visible GPUs, DDPRUN_CUDA_DEVICE overrides; ranks may share a GPU), or
// the CPU with --threads.
// `decision` (optional) receives the choice.
std::unique_ptr<Backend> makeBackend(const TrainConfig& cfg, DeviceDecision* decision = nullptr);

// The CUDA backend through train's CUDA plugin (libddprun_train_cuda.so,
// cuda_backend_loader.cc), or linked in when the program has it (tests).
// cudaBackendUnusable(): "" when it loads, else why (loading it on the first call).
std::string cudaBackendUnusable();
std::unique_ptr<Backend> loadCudaBackend(const CudaBackendOptions& o);

}  // namespace ddprun::train
