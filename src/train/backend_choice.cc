#include "ddprun/train/backend_choice.h"

#include <dirent.h>

#include "ddprun/common/env.h"
#include "ddprun/common/error.h"
#include "ddprun/common/plugin.h"
#include "ddprun/runtime/cuda.h"

namespace ddprun::train {

namespace {

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

const char* kNoGpu =
    "no CUDA GPU is visible on this machine (no device, no driver, or CUDA_VISIBLE_DEVICES "
    "hides them)";

// A reason in a few words: a missing plugin is "no CUDA backend installed"
// (the directories searched are for the --device cuda error only).
std::string shortWhy(const std::string& why) {
  if (plugin::notInstalled(why))
    return "this ddprun has no CUDA backend installed";
  return "the CUDA backend does not load: " + why;
}

}  // namespace

DeviceInventory probeDevices(DeviceChoice device) {
  DeviceInventory inv;
  if (device == DeviceChoice::kCpu) return inv;
  inv.unusableWhy = cudaBackendUnusable();
  inv.cudaBuilt = inv.unusableWhy.empty();
  inv.gpus = inv.cudaBuilt ? runtime::cudaDeviceCount() : 0;
  inv.driverGpus = driverGpuCount();
  return inv;
}

bool deterministicFromEnv() {
  return env::integer("DDPRUN_CUDNN_DETERMINISTIC", 0, 0, 1) == 1;
}

DeviceDecision decideDevice(DeviceChoice device, Precision precision, const DeviceInventory& inv) {
  DeviceDecision d;
  const bool gpu = inv.cudaBuilt && inv.gpus > 0;
  if (device == DeviceChoice::kCuda && !inv.cudaBuilt)
    DDPRUN_THROW(InvalidArgument, "--device cuda: the CUDA backend is not usable: ",
                 inv.unusableWhy.empty() ? "this train was built without CUDA" : inv.unusableWhy,
                 "; ", runtime::cudaInstallFix(inv.unusableWhy), "; or use --device cpu");
  if (device == DeviceChoice::kCuda && !gpu)
    DDPRUN_THROW(InvalidArgument, "--device cuda: ", kNoGpu, "; use --device cpu or --device auto");
  d.cuda = device == DeviceChoice::kCuda || (device == DeviceChoice::kAuto && gpu);
  std::string why;  // why auto chose the CPU
  if (device == DeviceChoice::kAuto && !d.cuda) {
    if (inv.cudaBuilt) {
      why = kNoGpu;
    } else if (inv.driverGpus > 0) {
      why = std::to_string(inv.driverGpus) + " NVIDIA GPU" + (inv.driverGpus == 1 ? " is" : "s are") +
            " present but " + shortWhy(inv.unusableWhy) + "; to use " +
            (inv.driverGpus == 1 ? "it" : "them") + ": " + runtime::cudaInstallFix(inv.unusableWhy);
    } else {
      why = shortWhy(inv.unusableWhy);
    }
    d.notice = "--device auto: training on the CPU (" + why + ")";
  }
  if (!d.cuda && precision != Precision::kFp32)
    DDPRUN_THROW(InvalidArgument, "--precision ", precisionName(precision),
                 " needs the CUDA backend, and ",
                 device == DeviceChoice::kCpu ? std::string("--device cpu was given")
                                              : "--device auto chose the CPU: " + why,
                 "; the CPU computes in fp32 only");
  const char* flag = device == DeviceChoice::kCpu    ? "--device cpu"
                     : device == DeviceChoice::kCuda ? "--device cuda"
                                                     : "--device auto";
  d.summary = std::string(d.cuda ? "cuda" : "cpu") + " (" + flag;
  if (!why.empty()) d.summary += ": " + why;
  if (d.cuda && device == DeviceChoice::kAuto)
    d.summary += ": " + std::to_string(inv.gpus) + " GPU" + (inv.gpus == 1 ? "" : "s") + " visible";
  d.summary += ")";
  return d;
}

bool nhwcLayout(Layout layout, Precision precision) {
  if (layout == Layout::kAuto) return precision != Precision::kFp32;
  return layout == Layout::kNhwc;
}

std::unique_ptr<Backend> makeBackend(const TrainConfig& cfg, DeviceDecision* decision) {
  const DeviceDecision d = decideDevice(cfg.device, cfg.precision, probeDevices(cfg.device));
  if (decision) *decision = d;
  if (d.cuda)
    return loadCudaBackend({.device = runtime::cudaSelectedDevice(),
                            .precision = cfg.precision,
                            .deterministic = cfg.deterministic || deterministicFromEnv(),
                            .nhwc = nhwcLayout(cfg.layout, cfg.precision),
                            // The trainer's defaults, from the H200 run of 2026-11-27
                            // (docs/benchmarks.md): 16-bit activations (+28 % in bf16, half
                            // the memory) and our batch norm (+3 % in tf32); =0 is the A/B.
                            // The graph-API search stays opt-in (+2 % in bf16 for +27 % of
                            // reserved memory).
                            .activations16 = env::integer("DDPRUN_CUDA_ACT16", 1, 0, 1) == 1,
                            .ourBatchNorm = env::integer("DDPRUN_CUDA_OUR_BN", 1, 0, 1) == 1,
                            .graphConv = static_cast<CudaBackendOptions::GraphConv>(
                                env::integer("DDPRUN_CUDNN_GRAPH", 0, 0, 2))});
  return makeCpuBackend(cfg.threads);
}

}  // namespace ddprun::train
