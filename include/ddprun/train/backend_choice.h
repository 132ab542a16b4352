// Which backend `train` computes on: --device and --precision against what
// this build and machine have. Bad combinations are InvalidArgument (exit 2)
// with a message naming the flag and the way out.
// Thread-safety: stateless (makeBackend creates a backend for the caller).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ddprun/train/layers.h"
#include "ddprun/train/precision.h"
#include "ddprun/train/train_config.h"

namespace ddprun::train {

// Why CUDA is not used: the first cause found by the checks below, which run
// cheapest first and stop at the first that fails. The CUDA plugins link
// cudart, cuBLAS(Lt), cuDNN and NCCL (about 180 MB resident once mapped):
// they are loaded last, so that on a machine without a driver or a GPU no
// CUDA library is loaded but the driver's own libcuda.so.1 where installed.
enum class CudaCause {
  kUsable,           // the backend loaded and the CUDA runtime sees `gpus` GPUs
  kNotInstalled,     // no CUDA plugin beside this program: a CPU-only ddprun
  kHidden,           // CUDA_VISIBLE_DEVICES hides every GPU ("", "-1", ...)
  kNoDriver,         // libcuda.so.1, the NVIDIA driver's library, does not load
  kDriverFailed,     // libcuda.so.1 loads but cuInit fails
  kNoDevice,         // the driver works and finds no GPU
  kBackendUnusable,  // the driver finds GPUs but a CUDA plugin, or a library it needs,
                     // does not load
  kRuntimeNoDevice,  // the backend loaded but the CUDA runtime sees none of the driver's
                     // GPUs
};

// What the machine offers (injected by tests).
struct DeviceInventory {
  CudaCause cause = CudaCause::kNotInstalled;
  // The specifics of the cause: the plugin search (kNotInstalled), the
  // loader's message naming the library (kNoDriver, kBackendUnusable), cuInit's
  // error (kDriverFailed).
  std::string detail{};
  int gpus = 0;        // GPUs the CUDA runtime (kUsable) or the driver (others) sees
  int driverGpus = 0;  // GPUs the NVIDIA kernel driver lists (/proc/driver/nvidia/gpus)
  std::optional<std::string> visibleDevices{};  // $CUDA_VISIBLE_DEVICES, when set
};

// The checks behind probeDevices, in the order run (each a seam for tests).
struct CudaProbes {
  // "" when the CUDA plugin file is installed (looked for, not loaded), else why.
  std::function<std::string()> pluginMissing;
  std::optional<std::string> visibleDevices;  // $CUDA_VISIBLE_DEVICES
  // "" when libcuda.so.1 loads (dlopen), else the loader's message.
  std::function<std::string()> loadDriver;
  // cuInit(0) and cuDeviceGetCount: the count, or cuInit's error
  // (CUDA_ERROR_NO_DEVICE counts as 0 GPUs, not an error).
  struct DriverDevices {
    int count = 0;
    std::string error{};
  };
  std::function<DriverDevices()> driverDevices;
  // "" when the CUDA plugins and every library they need load, else why.
  std::function<std::string()> loadBackend;
  std::function<int()> runtimeDevices;  // GPUs the CUDA runtime sees (after loadBackend)
  std::function<int()> driverGpus;      // /proc/driver/nvidia/gpus
};
// True when CUDA_VISIBLE_DEVICES=`value` hides every GPU: empty, or its first
// entry is neither a device index nor a GPU-/MIG- UUID (CUDA ignores the list
// from the first invalid entry on, so "-1" or "none" hides all). Pure.
bool visibleDevicesHideAll(const std::string& value);
// Runs `probes` in order, stopping at the first that fails. No check after
// the first failing one runs.
DeviceInventory probeDevices(const CudaProbes& probes);
// This build and machine (cuda_backend_loader.cc), probed once a process.
// --device cpu probes nothing: no CUDA library is loaded.
DeviceInventory probeDevices(DeviceChoice device);
// The checks on this machine (cuda_backend_loader.cc).
CudaProbes systemCudaProbes();

// train's CUDA switches, read here once and nowhere else in the trainer:
// `o` with each one that is set applied. DDPRUN_CUDNN_DETERMINISTIC=1
// (--deterministic without the flag), DDPRUN_CUDA_ACT16 and
// DDPRUN_CUDA_OUR_BN (0: the A/B against the defaults), DDPRUN_CUDNN_GRAPH
// (0-2, CudaBackendOptions::GraphConv), DDPRUN_CUDA_OWN_POOL,
// DDPRUN_CUDNN_BN_FUSION, DDPRUN_CUDA_FUSED_STEM, DDPRUN_CUDA_BN_FOLD,
// DDPRUN_CUDA_GRAPH, DDPRUN_CUDA_RECOMPUTE, DDPRUN_CUDA_PDL (0/1)
// and DDPRUN_CUDA_ALLOCATOR (caching|async).
// Unset or empty: `o`'s value stays. Throws InvalidArgument naming a
// malformed one.
CudaBackendOptions withEnvSwitches(CudaBackendOptions o);

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
// InvalidArgument (exit 2) for --device cuda when the inventory's cause is not
// kUsable (naming that cause and its fix), and for a --precision other than
// fp32 when the choice is the CPU. Pure.
DeviceDecision decideDevice(DeviceChoice device, Precision precision,
                            const DeviceInventory& inv);
inline bool chooseCuda(DeviceChoice device, Precision precision,
                       const DeviceInventory& inv) {
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
std::unique_ptr<Backend> makeBackend(const TrainConfig& cfg,
                                     DeviceDecision* decision = nullptr);

// The CUDA backend through train's CUDA plugin (libddprun_train_cuda.so,
// cuda_backend_loader.cc), or linked in when the program has it (tests).
// cudaBackendUnusable(): "" when it loads, else why (loading it on the first
// call: the runtime's CUDA plugin, then train's).
std::string cudaBackendUnusable();
std::unique_ptr<Backend> loadCudaBackend(const CudaBackendOptions& o);

}  // namespace ddprun::train
