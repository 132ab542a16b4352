#include "caching_allocator.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <string_view>

#include "ddprun/common/error.h"
#include "ddprun/runtime/cuda_check.h"
#include "resources.h"  // DeviceScope (orphan frees may come from any thread)

namespace ddprun::train::cuda {

namespace {
constexpr size_t kSmallGranule = 512;
constexpr size_t kSmallLimit = size_t{1} << 20;

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

size_t CachingAllocator::roundedRequest(size_t bytes) {
  return std::max<size_t>((bytes + 511) / 512 * 512, 512);
}

CachingAllocator::CachingAllocator(int device, cudaStream_t stream, bool async)
    : device_(device), stream_(stream), async_(async) {
  if (!async_) return;
  DeviceScope scope(device_);
  DDPRUN_CUDA_OK(cudaDeviceGetDefaultMemPool(&pool_, device_));
  // Keep what was freed reserved (as the free lists do) instead of returning
  // it to the driver at every synchronisation.
  uint64_t keep = UINT64_MAX;
  DDPRUN_CUDA_OK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep));
}

CachingAllocator::~CachingAllocator() { releaseCachedLocked(); }

void* CachingAllocator::mallocLocked(size_t bytes) {
  DeviceScope scope(device_);
  void* p = nullptr;
  auto attempt = [&] {
    return async_ && stream_ ? cudaMallocAsync(&p, bytes, stream_) : cudaMalloc(&p, bytes);
  };
  cudaError_t e = attempt();
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    releaseCachedLocked();  // give the cache back and try once more
    e = attempt();
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    DDPRUN_THROW(runtime::CudaError, "cudaMalloc", async_ ? "Async" : "", " of ", mib(bytes),
                 " MiB failed on cuda:", device_, ": ", runtime::cuda_check::statusName(e),
                 " (the backend holds ", mib(stats_.allocated), " MiB in tensors, peak ",
                 mib(stats_.peakAllocated), " MiB; try a smaller --batch-size)");
  }
  ++stats_.mallocs;
  return p;
}

void* CachingAllocator::take(size_t bytes) {
  std::lock_guard lock(mu_);
  DDPRUN_CHECK(!orphan_, "CUDA memory requested from a backend that was destroyed");
  Block b{async_ ? roundedRequest(bytes) : sizeClass(bytes), roundedRequest(bytes)};
  void* p = nullptr;
  auto it = async_ ? free_.end() : free_.find(b.cls);
  if (it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    stats_.cached -= b.cls;
  } else {
    if (ledger_.capturing()) {
      ++stats_.captureMisses;
      DDPRUN_THROW(runtime::CudaError, "a CUDA graph capture on cuda:", device_, " asked for ",
                   mib(b.cls), " MiB that the caching allocator has not cached: a capture "
                   "may not call cudaMalloc (the step runs eagerly instead)");
    }
    p = mallocLocked(b.cls);
    if (!async_) stats_.reserved += b.cls;
  }
  live_.emplace(p, b);
  ledger_.touched(p);
  stats_.inUse += b.cls;
  stats_.peak = std::max(stats_.peak, stats_.inUse);
  stats_.allocated += b.counted;
  stats_.peakAllocated = std::max(stats_.peakAllocated, stats_.allocated);
  noteReservedLocked();
  return p;
}

// The async pool keeps its own books of what it holds from the driver.
void CachingAllocator::noteReservedLocked() {
  if (async_ && pool_) {
    uint64_t r = 0;
    if (cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &r) == cudaSuccess)
      stats_.reserved = static_cast<size_t>(r);
    else
      (void)cudaGetLastError();
  }
  stats_.peakReserved = std::max(stats_.peakReserved, stats_.reserved);
}

void* CachingAllocator::allocBytes(size_t bytes) { return take(std::max<size_t>(bytes, 1)); }

float* CachingAllocator::alloc(size_t n) {
  const size_t bytes = std::max<size_t>(n, 1) * sizeof(float);
  void* p = take(bytes);
  DDPRUN_CUDA_OK(cudaMemsetAsync(p, 0, bytes, stream_));
  return static_cast<float*>(p);
}

float* CachingAllocator::allocUninitialized(size_t n) {
  return static_cast<float*>(take(std::max<size_t>(n, 1) * sizeof(float)));
}

void CachingAllocator::freeBytes(void* p) {
  if (!p) return;
  bool last = false;
  {
    std::lock_guard lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) return;  // not ours: nothing sensible to do in a deleter
    const Block b = it->second;
    live_.erase(it);
    stats_.inUse -= b.cls;
    stats_.allocated -= b.counted;
    if (orphan_) {
      DeviceScope scope(device_);
      (void)cudaFree(p);  // also frees a cudaMallocAsync block (synchronously)
      if (!async_) stats_.reserved -= b.cls;
      last = live_.empty();
    } else if (async_) {
      // Stream-ordered: the block may be handed out again to work issued
      // after this point on the same stream, as the free lists do.
      DeviceScope scope(device_);
      (void)cudaFreeAsync(p, stream_);
    } else {
      ledger_.touched(p);
      if (ledger_.heldByGraph(p)) {  // a live graph may still use it
        held_.emplace(p, b.cls);
        stats_.graphHeld += b.cls;
      } else {
        free_[b.cls].push_back(p);
      }
      stats_.cached += b.cls;
    }
  }
  if (last) delete this;
}

void CachingAllocator::free(float* p) { freeBytes(p); }

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void CachingAllocator::resetPeaks() {
  std::lock_guard lock(mu_);
  stats_.peak = stats_.inUse;
  stats_.peakAllocated = stats_.allocated;
  if (async_ && pool_) {
    uint64_t zero = 0;  // "reset to the current value"
    if (cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &zero) != cudaSuccess)
      (void)cudaGetLastError();
  }
  stats_.peakReserved = 0;
  noteReservedLocked();
}

void CachingAllocator::releaseCached() {
  std::lock_guard lock(mu_);
  releaseCachedLocked();
}

void CachingAllocator::releaseCachedLocked() {
  if (async_) {
    if (!pool_) return;
    DeviceScope scope(device_);
    if (stream_) (void)cudaStreamSynchronize(stream_);
    (void)cudaMemPoolTrimTo(pool_, 0);
    return;
  }
  if (free_.empty()) return;
  DeviceScope scope(device_);
  if (stream_) (void)cudaStreamSynchronize(stream_);
  for (auto& [cls, blocks] : free_)
    for (void* p : blocks) {
      (void)cudaFree(p);
      stats_.reserved -= cls;
    }
  free_.clear();
  stats_.cached = stats_.graphHeld;  // a live graph's blocks stay
}

void CachingAllocator::beginCapture() {
  std::lock_guard lock(mu_);
  DDPRUN_CHECK(!async_, "CUDA graphs run on the caching allocator, not on "
               "DDPRUN_CUDA_ALLOCATOR=async (its allocations would become graph memory nodes)");
  DDPRUN_CHECK(!ledger_.capturing(), "a CUDA graph capture is already in progress");
  DDPRUN_CHECK(ledger_.liveGraphs() == 0, "one CUDA graph at a time: release the previous "
               "one (releaseGraph) before capturing another");
  ledger_.begin();
}

uint64_t CachingAllocator::endCapture(bool keep) {
  std::lock_guard lock(mu_);
  std::vector<void*> live;
  live.reserve(live_.size());
  for (const auto& [p, b] : live_) live.push_back(p);
  const uint64_t id = ledger_.end(keep, live);
  if (!id) return 0;
  // The graph's blocks that are free now leave the free lists.
  for (auto& [cls, blocks] : free_) {
    auto keepFree = std::stable_partition(blocks.begin(), blocks.end(),
                                          [&](void* p) { return !ledger_.heldByGraph(p); });
    for (auto it = keepFree; it != blocks.end(); ++it) {
      held_.emplace(*it, cls);
      stats_.graphHeld += cls;
    }
    blocks.erase(keepFree, blocks.end());
  }
  return id;
}

void CachingAllocator::releaseGraph(uint64_t id) {
  std::lock_guard lock(mu_);
  for (void* p : ledger_.release(id)) {
    auto it = held_.find(p);
    if (it == held_.end()) continue;  // in use: its free goes to the free lists
    free_[it->second].push_back(p);
    stats_.graphHeld -= it->second;
    held_.erase(it);
  }
}

void CachingAllocator::detach() {
  bool empty;
  {
    std::lock_guard lock(mu_);
    for (const auto& [p, cls] : held_) free_[cls].push_back(p);  // no graph replays now
    held_.clear();
    stats_.graphHeld = 0;
    releaseCachedLocked();
    stream_ = nullptr;
    orphan_ = true;
    empty = live_.empty();
  }
  if (empty) delete this;
}

}  // namespace ddprun::train::cuda
