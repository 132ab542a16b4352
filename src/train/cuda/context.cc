#include "context.h"

#include <algorithm>
#include <cstring>

#include "ddprun/common/error.h"

namespace ddprun::train::cuda {

namespace {
// Host transfers move through a pinned buffer of at most this size.
constexpr size_t kStagingBytes = size_t{32} << 20;
}  // namespace

Context::Context(const CudaBackendOptions& o)
    : device_(o.device), precision_(o.precision), deterministic_(o.deterministic), nhwc_(o.nhwc),
      act16_(o.activations16 && o.nhwc &&
             (o.precision == Precision::kBf16 || o.precision == Precision::kFp16)),
      ourBn_(act16_ || (o.ourBatchNorm && o.nhwc)),
      graphConv_(o.nhwc && !o.deterministic ? o.graphConv : CudaBackendOptions::GraphConv::kOff),
      ownPool_(o.ownPool),
      cudnnBnFusion_(o.cudnnBnFusion),
      fusedStem_(ourBn_ && o.fusedStem),
      bnFold_(ourBn_ && o.bnFold),
      cudaGraph_(o.cudaGraph),
      recompute_(ourBn_ && o.recompute) {
  const int device = o.device;
  DDPRUN_CUDA_OK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  DDPRUN_CUDA_OK(cudaGetDeviceProperties(&prop, device));
  deviceName_ = prop.name;
  // PDL needs compute capability 9.0, in the device and in the code run.
  pdl_ = ourBn_ && o.pdl && prop.major >= 9 && pdlCompiled();
  stream_ = Stream::create();
  cudnn_ = CudnnHandle::create();
  DDPRUN_CUDNN_OK(cudnnSetStream(cudnn_, stream_));
  lt_ = LtHandle::create();
  alloc_ = new CachingAllocator(device, stream_, o.memory == CudaBackendOptions::Memory::kAsync);
}

Context::~Context() {
  (void)cudaSetDevice(device_);
  (void)cudaStreamSynchronize(stream_);
  if (workspace_) alloc_->freeBytes(workspace_);
  alloc_->detach();
}

void Context::bind() const { DDPRUN_CUDA_OK(cudaSetDevice(device_)); }

void* Context::workspace(size_t bytes) {
  if (bytes > workspaceBytes_) {
    if (workspace_) alloc_->freeBytes(workspace_);
    workspace_ = nullptr;
    workspaceBytes_ = 0;
    workspace_ = alloc_->allocBytes(bytes);
    workspaceBytes_ = bytes;
  }
  return workspace_;
}

void Context::upload(const void* host, void* dst, size_t bytes) {
  if (!bytes) return;
  char* pin = static_cast<char*>(staging_.ensure(std::min(bytes, kStagingBytes)));
  for (size_t off = 0; off < bytes; off += kStagingBytes) {
    const size_t len = std::min(kStagingBytes, bytes - off);
    std::memcpy(pin, static_cast<const char*>(host) + off, len);
    DDPRUN_CUDA_OK(cudaMemcpyAsync(static_cast<char*>(dst) + off, pin, len,
                                   cudaMemcpyHostToDevice, stream_));
    synchronize();  // the staging buffer is reused by the next chunk
  }
}

void Context::download(const void* src, void* host, size_t bytes) {
  if (!bytes) return;
  char* pin = static_cast<char*>(staging_.ensure(std::min(bytes, kStagingBytes)));
  for (size_t off = 0; off < bytes; off += kStagingBytes) {
    const size_t len = std::min(kStagingBytes, bytes - off);
    DDPRUN_CUDA_OK(cudaMemcpyAsync(pin, static_cast<const char*>(src) + off, len,
                                   cudaMemcpyDeviceToHost, stream_));
    synchronize();
    std::memcpy(static_cast<char*>(host) + off, pin, len);
  }
}

void Context::readBack(const void* src, void* host, size_t bytes) {
  void* pin = small_.ensure(std::max<size_t>(bytes, 64));
  DDPRUN_CUDA_OK(cudaMemcpyAsync(pin, src, bytes, cudaMemcpyDeviceToHost, stream_));
  synchronize();  // counted, as every host wait (resources.h)
  std::memcpy(host, pin, bytes);
}

void Context::noteExternal(int64_t deltaBytes) {
  const int64_t now = external_.fetch_add(deltaBytes) + deltaBytes;
  int64_t peak = externalPeak_.load();
  while (now > peak && !externalPeak_.compare_exchange_weak(peak, now)) {
  }
}

size_t Context::peakBytes() const {
  return alloc_->stats().peakAllocated + static_cast<size_t>(externalPeak_.load());
}

size_t Context::peakReservedBytes() const {
  return alloc_->stats().peakReserved + static_cast<size_t>(externalPeak_.load());
}

void Context::resetPeaks() {
  alloc_->resetPeaks();
  externalPeak_.store(external_.load());
}

}  // namespace ddprun::train::cuda
