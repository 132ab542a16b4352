// CUDA support of the runtime, usable from code compiled without nvcc.
//
// Collectives on Device::kCuda buffers pick a transport when first used:
//   nccl   — every rank owns a different GPU. Ranks sharing a GPU get NCCL
//            only when forced (a test and fallback path) and NCCL >= 2.30
//            is loaded: the runtime then sets NCCL_MULTI_RANK_GPU_ENABLE=1
//            (older NCCL refuses duplicate GPUs: the error says how to fix);
//   ipc    — ranks share GPUs on one host: CUDA IPC handles plus our own
//            reduction kernels reading peers' device buffers;
//   staged — anything else: copy to pinned host memory, run the host
//            collective, copy back.
// DDPRUN_CUDA_TRANSPORT=nccl|ipc|staged forces one. The device is
// LOCAL_RANK modulo the number of visible GPUs (set before the first CUDA
// collective; DDPRUN_CUDA_DEVICE overrides it).
//
// The CUDA part is a plugin, libddprun_runtime_cuda.so (built with
// -DDDPRUN_CUDA=ON; common/plugin.h says where it is looked for), loaded on
// the first call below that needs it: a program that uses only the CPU never
// loads a CUDA library. Programs that link the runtime with CUDA on export
// their symbols (-rdynamic, set by the ddprun_runtime target) for it.
// Without the plugin, or when a library it needs does not resolve, or on a
// machine without a GPU/driver, cudaDeviceCount() is 0 and CUDA collectives
// throw InvalidArgument saying why and how to fix it.
#pragma once

#include <cstddef>
#include <string>

namespace ddprun::runtime {

class ProcessGroup;

// True when the CUDA plugin is loaded (loading it on the first call): the
// build has CUDA and every library the plugin needs resolves. Never throws.
bool cudaBuilt();
// Why cudaBuilt() is false ("" when it is true): the plugin is not installed
// (naming where it was looked for), or the loader's message (a library that
// does not resolve). Never throws.
std::string cudaUnavailableReason();
// The plugin file found ("" when none was), for logs.
std::string cudaPluginPath();
// How to fix `why` (a cudaUnavailableReason()), in a few words naming what to
// install: NVIDIA's PyPI package for a library that did not resolve, the
// CUDA build of ddprun for a missing plugin. Pure.
std::string cudaInstallFix(const std::string& why);
// Visible GPUs; 0 without CUDA, driver or device (never throws).
int cudaDeviceCount();
// The device the runtime uses for this process (LOCAL_RANK % count).
int cudaSelectedDevice();
// Name of the CUDA transport `pg` uses (initialising it if needed).
std::string cudaTransportName(ProcessGroup& pg);
// The version of the NCCL library loaded at run time (ncclGetVersion: 23007
// for 2.30.7), which may differ from the headers the runtime was built with
// (libnccl.so.2 keeps its ABI: a newer one first on LD_LIBRARY_PATH is used).
// 0 when built without CUDA. Never throws; needs no GPU.
int ncclRuntimeVersion();

// Minimal device-memory helpers for programs without CUDA headers. Throw
// InvalidArgument without a GPU, IoError on a CUDA error.
void* cudaAllocDevice(size_t bytes);
void cudaFreeDevice(void* p);
void cudaCopyToDevice(void* dst, const void* src, size_t bytes);
void cudaCopyToHost(void* dst, const void* src, size_t bytes);
void cudaCopyOnDevice(void* dst, const void* src, size_t bytes);
void cudaSynchronize();
// Elapsed-time helpers for benchmarks: a device-synchronised wall clock read.
double cudaNowSeconds();

}  // namespace ddprun::runtime
