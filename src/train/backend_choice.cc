#include "ddprun/train/backend_choice.h"

#include "ddprun/common/env.h"
#include "ddprun/common/error.h"
#include "ddprun/runtime/cuda.h"

namespace ddprun::train {

DeviceInventory probeDevices() {
  return {.cudaBuilt = runtime::cudaBuilt(), .gpus = runtime::cudaDeviceCount()};
}

bool deterministicFromEnv() {
  return env::integer("DDPRUN_CUDNN_DETERMINISTIC", 0, 0, 1) == 1;
}

bool chooseCuda(DeviceChoice device, Precision precision, const DeviceInventory& inv) {
  const bool gpu = inv.cudaBuilt && inv.gpus > 0;
  if (device == DeviceChoice::kCuda && !gpu)
    DDPRUN_THROW(InvalidArgument, "--device cuda: ",
                 inv.cudaBuilt ? "no CUDA GPU is visible on this machine (no device, no "
                                 "driver, or CUDA_VISIBLE_DEVICES hides them)"
                               : "this train was built without CUDA",
                 "; use --device cpu or --device auto");
  const bool cuda = device == DeviceChoice::kCuda || (device == DeviceChoice::kAuto && gpu);
  if (!cuda && precision != Precision::kFp32)
    DDPRUN_THROW(InvalidArgument, "--precision ", precisionName(precision),
                 " needs the CUDA backend, and ",
                 device == DeviceChoice::kCpu
                     ? "--device cpu was given"
                     : "no CUDA GPU is visible (--device auto chose the CPU)",
                 "; the CPU computes in fp32 only");
  return cuda;
}

std::unique_ptr<Backend> makeBackend(const TrainConfig& cfg) {
  if (chooseCuda(cfg.device, cfg.precision, probeDevices()))
    return makeCudaBackend({.device = runtime::cudaSelectedDevice(),
                            .precision = cfg.precision,
                            .deterministic = cfg.deterministic || deterministicFromEnv()});
  return makeCpuBackend(cfg.threads);
}

}  // namespace ddprun::train
