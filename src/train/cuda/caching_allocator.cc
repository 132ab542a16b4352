#include "caching_allocator.h"

#include <algorithm>
#include <bit>

#include "ddprun/common/error.h"
#include "ddprun/runtime/cuda_check.h"

namespace ddprun::train::cuda {

namespace {
constexpr size_t kSmallGranule = 512;
constexpr size_t kSmallLimit = size_t{1} << 20;

// Makes `device` current for the scope (orphan frees may come from any thread).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (prev_ != device) DDPRUN_CUDA_OK(cudaSetDevice(device));
    set_ = prev_ != device && prev_ >= 0;
  }
  ~DeviceScope() {
    if (set_) (void)cudaSetDevice(prev_);
  }

 private:
  int prev_ = -1;
  bool set_ = false;
};

double mib(size_t b) { return static_cast<double>(b) / (1 << 20); }
}  // namespace

size_t CachingAllocator::sizeClass(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  if (bytes <= kSmallLimit) return (bytes + kSmallGranule - 1) / kSmallGranule * kSmallGranule;
  // A sixteenth of the power of two at or below `bytes` (at most 6 % over
  // the request; training asks for the same sizes every step, so fine classes
  // cost no reuse).
  const size_t step = std::bit_floor(bytes) / 16;
  return (bytes + step - 1) / step * step;
}

CachingAllocator::CachingAllocator(int device, cudaStream_t stream)
    : device_(device), stream_(stream) {}

CachingAllocator::~CachingAllocator() { releaseCachedLocked(); }

void* CachingAllocator::take(size_t cls) {
  std::lock_guard lock(mu_);
  DDPRUN_CHECK(!orphan_, "CUDA memory requested from a backend that was destroyed");
  void* p = nullptr;
  auto it = free_.find(cls);
  if (it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    stats_.cached -= cls;
  } else {
    DeviceScope scope(device_);
    cudaError_t e = cudaMalloc(&p, cls);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      releaseCachedLocked();  // give the cache back and try once more
      e = cudaMalloc(&p, cls);
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      DDPRUN_THROW(runtime::CudaError, "cudaMalloc of ", mib(cls), " MiB failed on cuda:", device_,
                   ": ", runtime::cuda_check::statusName(e), " (the backend holds ",
                   mib(stats_.inUse), " MiB in tensors, peak ", mib(stats_.peak),
                   " MiB; try a smaller --batch-size)");
    }
    ++stats_.mallocs;
  }
  live_.emplace(p, cls);
  stats_.inUse += cls;
  stats_.peak = std::max(stats_.peak, stats_.inUse);
  return p;
}

void* CachingAllocator::allocBytes(size_t bytes) { return take(sizeClass(bytes)); }

float* CachingAllocator::alloc(size_t n) {
  const size_t bytes = std::max<size_t>(n, 1) * sizeof(float);
  void* p = take(sizeClass(bytes));
  DDPRUN_CUDA_OK(cudaMemsetAsync(p, 0, bytes, stream_));
  return static_cast<float*>(p);
}

float* CachingAllocator::allocUninitialized(size_t n) {
  return static_cast<float*>(take(sizeClass(std::max<size_t>(n, 1) * sizeof(float))));
}

void CachingAllocator::freeBytes(void* p) {
  if (!p) return;
  bool last = false;
  {
    std::lock_guard lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) return;  // not ours: nothing sensible to do in a deleter
    const size_t cls = it->second;
    live_.erase(it);
    stats_.inUse -= cls;
    if (orphan_) {
      DeviceScope scope(device_);
      (void)cudaFree(p);
      last = live_.empty();
    } else {
      free_[cls].push_back(p);
      stats_.cached += cls;
    }
  }
  if (last) delete this;
}

void CachingAllocator::free(float* p) { freeBytes(p); }

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void CachingAllocator::releaseCached() {
  std::lock_guard lock(mu_);
  releaseCachedLocked();
}

void CachingAllocator::releaseCachedLocked() {
  if (free_.empty()) return;
  DeviceScope scope(device_);
  if (stream_) (void)cudaStreamSynchronize(stream_);
  for (auto& [cls, blocks] : free_)
    for (void* p : blocks) (void)cudaFree(p);
  free_.clear();
  stats_.cached = 0;
}

void CachingAllocator::detach() {
  bool empty;
  {
    std::lock_guard lock(mu_);
    releaseCachedLocked();
    stream_ = nullptr;
    orphan_ = true;
    empty = live_.empty();
  }
  if (empty) delete this;
}

}  // namespace ddprun::train::cuda
