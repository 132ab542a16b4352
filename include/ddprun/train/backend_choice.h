// Which backend `train` computes on: --device and --precision against what
// this build and machine have. Bad combinations are InvalidArgument (exit 2)
// with a message naming the flag and the way out.
// Thread-safety: stateless (makeBackend creates a backend for the caller).
#pragma once

#include <memory>

#include "ddprun/train/layers.h"
#include "ddprun/train/precision.h"
#include "ddprun/train/train_config.h"

namespace ddprun::train {

// What the machine offers (injected by tests).
struct DeviceInventory {
  bool cudaBuilt = false;
  int gpus = 0;
};
// This build and machine: runtime::cudaBuilt(), runtime::cudaDeviceCount().
DeviceInventory probeDevices();

// DDPRUN_CUDNN_DETERMINISTIC=1: --deterministic without the flag (0 or unset:
// the flag decides). Other values are an error naming the variable.
bool deterministicFromEnv();

// Whether to compute on CUDA: --device cuda, or auto with a GPU. Throws
// InvalidArgument for --device cuda without a GPU (or CUDA in the build), and
// for a --precision other than fp32 when the choice is the CPU.
bool chooseCuda(DeviceChoice device, Precision precision, const DeviceInventory& inv);

// The backend --device chooses: CUDA on this process's GPU (LOCAL_RANK modulo
// the visible GPUs, DDPRUN_CUDA_DEVICE overrides; ranks may share a GPU), or
// the CPU with --threads.
std::unique_ptr<Backend> makeBackend(const TrainConfig& cfg);

}  // namespace ddprun::train
