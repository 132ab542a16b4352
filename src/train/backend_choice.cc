#include "ddprun/train/backend_choice.h"

#include "ddprun/common/env.h"
#include "ddprun/common/error.h"
#include "ddprun/common/strings.h"
#include "ddprun/runtime/cuda.h"

namespace ddprun::train {

namespace {

bool isDeviceIndex(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

std::string plural(int n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

std::string visibleDevicesSetting(const DeviceInventory& inv) {
  return "CUDA_VISIBLE_DEVICES=\"" + inv.visibleDevices.value_or("") + "\"";
}

// Every cause that leaves no GPU to train on starts so (scripts and tests
// look for it), then names the one cause found.
constexpr const char* kNoGpu = "no CUDA GPU is visible: ";

// The cause in a few words: the same for the --device auto notice, the
// --device cuda error and the final JSON.
std::string causeText(const DeviceInventory& inv) {
  switch (inv.cause) {
    case CudaCause::kUsable:
      return plural(inv.gpus, "GPU", "GPUs") + " visible";
    case CudaCause::kNotInstalled:
      return "this ddprun has no CUDA backend installed";
    case CudaCause::kHidden:
      return kNoGpu + visibleDevicesSetting(inv) + " hides every GPU";
    case CudaCause::kNoDriver:
      return std::string(kNoGpu) + "no NVIDIA driver on this machine (" + inv.detail +
             ")";
    case CudaCause::kDriverFailed:
      return std::string(kNoGpu) + "the NVIDIA driver does not start (" + inv.detail +
             ")";
    case CudaCause::kNoDevice:
      return std::string(kNoGpu) + "the NVIDIA driver finds none" +
             (inv.visibleDevices ? " with " + visibleDevicesSetting(inv) : std::string());
    case CudaCause::kBackendUnusable:
      return plural(inv.gpus, "NVIDIA GPU is", "NVIDIA GPUs are") +
             " present but the CUDA backend does not load: " + inv.detail;
    case CudaCause::kRuntimeNoDevice:
      return kNoGpu + ("the NVIDIA driver finds " + plural(inv.gpus, "GPU", "GPUs")) +
             " but the CUDA runtime none (" +
             (inv.detail.empty() ? "a driver older than the CUDA runtime?" : inv.detail) +
             ")";
  }
  return "";
}

// What to do about it.
std::string causeFix(const DeviceInventory& inv) {
  switch (inv.cause) {
    case CudaCause::kUsable:
      return "";
    case CudaCause::kNotInstalled:
    case CudaCause::kBackendUnusable:
      return runtime::cudaInstallFix(inv.detail);
    case CudaCause::kHidden:
      return "unset CUDA_VISIBLE_DEVICES or set it to the GPUs to use";
    case CudaCause::kNoDriver:
      return "on a machine with an NVIDIA GPU, install the NVIDIA driver";
    case CudaCause::kDriverFailed:
      return "see what nvidia-smi says about the driver";
    case CudaCause::kNoDevice:
      return inv.visibleDevices ? "check CUDA_VISIBLE_DEVICES against nvidia-smi -L"
                                : "check nvidia-smi -L";
    case CudaCause::kRuntimeNoDevice:
      return "update the NVIDIA driver";
  }
  return "";
}

// Why --device auto chose the CPU: the cause, and where a GPU is there but
// unused, what to do about it.
std::string autoCpuWhy(const DeviceInventory& inv) {
  switch (inv.cause) {
    case CudaCause::kNotInstalled:
      if (inv.driverGpus > 0)
        return plural(inv.driverGpus, "NVIDIA GPU is", "NVIDIA GPUs are") +
               " present but this ddprun has no CUDA backend installed; to use " +
               (inv.driverGpus == 1 ? "it" : "them") + ": " + causeFix(inv);
      return causeText(inv);
    case CudaCause::kBackendUnusable:
    case CudaCause::kRuntimeNoDevice:
      return causeText(inv) + "; to use " + (inv.gpus == 1 ? "it" : "them") + ": " +
             causeFix(inv);
    default:
      return causeText(inv);
  }
}

}  // namespace

bool visibleDevicesHideAll(const std::string& value) {
  const std::string first = str::trim(value.substr(0, value.find(',')));
  return !(isDeviceIndex(first) || first.rfind("GPU-", 0) == 0 ||
           first.rfind("MIG-", 0) == 0);
}

DeviceInventory probeDevices(const CudaProbes& p) {
  DeviceInventory inv;
  inv.visibleDevices = p.visibleDevices;
  inv.driverGpus = p.driverGpus ? p.driverGpus() : 0;
  if (inv.detail = p.pluginMissing(); !inv.detail.empty()) {
    inv.cause = CudaCause::kNotInstalled;
    return inv;
  }
  if (p.visibleDevices && visibleDevicesHideAll(*p.visibleDevices)) {
    inv.cause = CudaCause::kHidden;
    return inv;
  }
  if (inv.detail = p.loadDriver(); !inv.detail.empty()) {
    inv.cause = CudaCause::kNoDriver;
    return inv;
  }
  const CudaProbes::DriverDevices d = p.driverDevices();
  inv.gpus = d.count;
  inv.detail = d.error;
  if (!d.error.empty() || d.count <= 0) {
    inv.cause = d.error.empty() ? CudaCause::kNoDevice : CudaCause::kDriverFailed;
    return inv;
  }
  if (inv.detail = p.loadBackend(); !inv.detail.empty()) {
    inv.cause = CudaCause::kBackendUnusable;
    return inv;
  }
  if (const int n = p.runtimeDevices(); n > 0) {
    inv.cause = CudaCause::kUsable;
    inv.gpus = n;
  } else {
    inv.cause = CudaCause::kRuntimeNoDevice;
  }
  return inv;
}

DeviceInventory probeDevices(DeviceChoice device) {
  if (device == DeviceChoice::kCpu) return {};
  static const DeviceInventory inv = probeDevices(systemCudaProbes());
  return inv;
}

CudaBackendOptions withEnvSwitches(CudaBackendOptions o) {
  // A 0/1 switch: set, it decides; unset or empty, `v` stays.
  auto flag = [](const char* name, bool& v) { v = env::integer(name, v ? 1 : 0, 0, 1) == 1; };
  if (env::integer("DDPRUN_CUDNN_DETERMINISTIC", 0, 0, 1) == 1) o.deterministic = true;
  flag("DDPRUN_CUDA_ACT16", o.activations16);
  flag("DDPRUN_CUDA_OUR_BN", o.ourBatchNorm);
  o.graphConv = static_cast<CudaBackendOptions::GraphConv>(
      env::integer("DDPRUN_CUDNN_GRAPH", static_cast<int64_t>(o.graphConv), 0, 2));
  flag("DDPRUN_CUDA_OWN_POOL", o.ownPool);
  flag("DDPRUN_CUDNN_BN_FUSION", o.cudnnBnFusion);
  flag("DDPRUN_CUDA_FUSED_STEM", o.fusedStem);
  flag("DDPRUN_CUDA_BN_FOLD", o.bnFold);
  flag("DDPRUN_CUDA_GRAPH", o.cudaGraph);
  flag("DDPRUN_CUDA_RECOMPUTE", o.recompute);
  flag("DDPRUN_CUDA_PDL", o.pdl);
  if (const auto v = env::get("DDPRUN_CUDA_ALLOCATOR"); v && !v->empty()) {
    if (*v == "caching")
      o.memory = CudaBackendOptions::Memory::kCaching;
    else if (*v == "async")
      o.memory = CudaBackendOptions::Memory::kAsync;
    else
      DDPRUN_THROW(InvalidArgument, "DDPRUN_CUDA_ALLOCATOR='", str::escape(*v),
                   "': expected caching (the default) or async (CUDA's cudaMallocAsync pool)");
  }
  return o;
}

DeviceDecision decideDevice(DeviceChoice device, Precision precision,
                            const DeviceInventory& inv) {
  DeviceDecision d;
  const bool usable = inv.cause == CudaCause::kUsable && inv.gpus > 0;
  if (device == DeviceChoice::kCuda && !usable)
    DDPRUN_THROW(InvalidArgument, "--device cuda: ", causeText(inv), "; ", causeFix(inv),
                 "; or use --device cpu");
  d.cuda = device == DeviceChoice::kCuda || (device == DeviceChoice::kAuto && usable);
  std::string why;  // why auto chose the CPU
  if (device == DeviceChoice::kAuto && !d.cuda) {
    why = autoCpuWhy(inv);
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
  if (d.cuda && device == DeviceChoice::kAuto) d.summary += ": " + causeText(inv);
  d.summary += ")";
  return d;
}

bool nhwcLayout(Layout layout, Precision precision) {
  if (layout == Layout::kAuto) return precision != Precision::kFp32;
  return layout == Layout::kNhwc;
}

std::unique_ptr<Backend> makeBackend(const TrainConfig& cfg, DeviceDecision* decision) {
  const DeviceDecision d =
      decideDevice(cfg.device, cfg.precision, probeDevices(cfg.device));
  if (decision) *decision = d;
  if (d.cuda)
    return loadCudaBackend(withEnvSwitches(
        {.device = runtime::cudaSelectedDevice(),
         .precision = cfg.precision,
         .deterministic = cfg.deterministic,
         .nhwc = nhwcLayout(cfg.layout, cfg.precision),
         // The trainer's defaults, from the H200 run of 2026-11-27
         // (docs/benchmarks.md): 16-bit activations (+28 % in bf16, half
         // the memory) and our batch norm (+3 % in tf32); =0 is the A/B.
         // The graph-API search stays opt-in (+2 % in bf16 for +27 % of
         // reserved memory).
         .activations16 = true,
         .ourBatchNorm = true}));
  return makeCpuBackend(cfg.threads);
}

}  // namespace ddprun::train
