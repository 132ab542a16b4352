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

Precision parsePrecision(const std::string& p) {
  if (p == "tf32") return Precision::kTf32;
  if (p == "bf16") return Precision::kBf16;
  if (p == "fp16") return Precision::kFp16;
  return Precision::kFp32;
}

bool chooseCuda(const std::string& device, const std::string& precision,
                const DeviceInventory& inv) {
  const bool gpu = inv.cudaBuilt && inv.gpus > 0;
  if (device == "cuda" && !gpu)
    DDPRUN_THROW(InvalidArgument, "--device cuda: ",
                 inv.cudaBuilt ? "no CUDA GPU is visible on this machine (no device, no "
                                 "driver, or CUDA_VISIBLE_DEVICES hides them)"
                               : "this train was built without CUDA",
                 "; use --device cpu or --device auto");
  const bool cuda = device == "cuda" || (device == "auto" && gpu);
  if (!cuda && precision != "fp32")
    DDPRUN_THROW(InvalidArgument, "--precision ", precision, " needs the CUDA backend, and ",
                 device == "cpu" ? "--device cpu was given"
                                 : "no CUDA GPU is visible (--device auto chose the CPU)",
                 "; the CPU computes in fp32 only");
  return cuda;
}

std::unique_ptr<Backend> makeBackend(const TrainConfig& cfg) {
  if (chooseCuda(cfg.device, cfg.precision, probeDevices()))
    return makeCudaBackend({.device = runtime::cudaSelectedDevice(),
                            .precision = parsePrecision(cfg.precision),
                            .deterministic = cfg.deterministic || deterministicFromEnv()});
  return makeCpuBackend(cfg.threads);
}

}  // namespace ddprun::train
