// RAII owners of CUDA runtime objects, shared by the runtime's CUDA
// transports (src/runtime/cuda/) and the trainer's CUDA backend
// (src/train/cuda/resources.h): streams, events, device memory, pinned host
// memory, and a scope that makes a device current. Each owner is move-only,
// creates its object in a factory (throwing CudaError naming the call and
// device, cuda_check.h) and destroys it in the destructor, ignoring errors
// there (a destructor must not throw, and a failed destroy leaks at worst).
// Destroying does not wait: as with the raw handles, work still queued on a
// stream or behind an event completes first.
//
// Internal header (CUDA types): include only from code built against the CUDA
// toolkit; not installed. The trainer may include it (train depends on the
// runtime); the runtime never includes the trainer's.
//
// Host waits through these owners (Stream::synchronize, Event::synchronize)
// are counted process-wide (hostSyncCounts()): the trainer's "host
// synchronisations per step". The runtime's transports wait with bounded
// polls of their own (syncStream, cuda_support.h) and are not counted.
//
// Thread-safety: as the underlying object (a stream may be used from any
// thread); the counters may be read and bumped from any thread.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "ddprun/runtime/cuda_check.h"

namespace ddprun::runtime::cuda {

// Host synchronisations with the device, counted for the benchmark's "host
// synchronisations per step" (goal: none inside a training step). `calls`:
// every Stream::synchronize / Event::synchronize (and the trainer Context's
// synchronous transfers, which use them); `waits`: those that found the
// device work not yet done, i.e. the host actually stalled. Process-wide, any
// thread.
struct HostSyncCounts {
  int64_t calls = 0, waits = 0;
};
namespace detail {
inline std::atomic<int64_t> gSyncCalls{0}, gSyncWaits{0};
// Counts one synchronisation; `pending`: the work was not done yet.
inline void countSync(bool pending) {
  gSyncCalls.fetch_add(1, std::memory_order_relaxed);
  if (pending) gSyncWaits.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace detail
inline HostSyncCounts hostSyncCounts() {
  return {detail::gSyncCalls.load(std::memory_order_relaxed),
          detail::gSyncWaits.load(std::memory_order_relaxed)};
}

// A move-only owner of a handle-like value `T` with a destroy function.
template <typename T, auto Destroy>
class Owned {
 public:
  Owned() = default;
  explicit Owned(T v) : v_(v) {}
  ~Owned() { reset(); }
  Owned(Owned&& o) noexcept : v_(std::exchange(o.v_, T{})) {}
  Owned& operator=(Owned&& o) noexcept {
    if (this != &o) {
      reset();
      v_ = std::exchange(o.v_, T{});
    }
    return *this;
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  T get() const { return v_; }
  operator T() const { return v_; }  // NOLINT: handles pass straight to the C APIs
  void reset() {
    if (v_) (void)Destroy(v_);
    v_ = T{};
  }

 private:
  T v_{};
};

// A stream on the device current at creation.
class Stream : public Owned<cudaStream_t, cudaStreamDestroy> {
 public:
  Stream() = default;
  // Non-blocking: never synchronises with the legacy default stream (the
  // trainer's streams).
  static Stream create() {
    cudaStream_t s = nullptr;
    DDPRUN_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return Stream(s);
  }
  // Blocking (cudaStreamCreate): ordered with the legacy default stream, so
  // work a caller queued there finishes before this stream's next work (the
  // runtime's transports rely on it, e.g. CUDA IPC's direct all-reduce).
  static Stream createBlocking() {
    cudaStream_t s = nullptr;
    DDPRUN_CUDA_OK(cudaStreamCreate(&s));
    return Stream(s);
  }
  // Waits for everything issued so far (counted: hostSyncCounts()).
  void synchronize() const {
    const cudaError_t q = cudaStreamQuery(get());
    if (q != cudaSuccess && q != cudaErrorNotReady) DDPRUN_CUDA_OK(q);
    detail::countSync(q == cudaErrorNotReady);
    if (q == cudaErrorNotReady) DDPRUN_CUDA_OK(cudaStreamSynchronize(get()));
  }

 private:
  using Owned::Owned;
};

// An event, by default without timing (cheapest to record and wait for).
class Event : public Owned<cudaEvent_t, cudaEventDestroy> {
 public:
  Event() = default;
  static Event create() {
    cudaEvent_t e = nullptr;
    DDPRUN_CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return Event(e);
  }
  // An event that records a timestamp (cudaEventElapsedTime): the profile's.
  static Event createTiming() {
    cudaEvent_t e = nullptr;
    DDPRUN_CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDefault));
    return Event(e);
  }
  void record(cudaStream_t s) const { DDPRUN_CUDA_OK(cudaEventRecord(get(), s)); }
  // True when the work before the last record() has finished (never waits).
  bool done() const {
    const cudaError_t q = cudaEventQuery(get());
    if (q == cudaErrorNotReady) return false;
    DDPRUN_CUDA_OK(q);
    return true;
  }
  // Waits for the work before the last record() (counted: hostSyncCounts()).
  void synchronize() const {
    const bool pending = !done();
    detail::countSync(pending);
    if (pending) DDPRUN_CUDA_OK(cudaEventSynchronize(get()));
  }

 private:
  using Owned::Owned;
};

// Device memory from cudaMalloc on the device current at allocation (at
// least one byte, so that a zero-byte buffer still has an address).
class DeviceMemory : public Owned<void*, cudaFree> {
 public:
  DeviceMemory() = default;
  static DeviceMemory alloc(size_t bytes) {
    void* p = nullptr;
    DDPRUN_CUDA_OK(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
    return DeviceMemory(p);
  }

 private:
  using Owned::Owned;
};

// Makes `device` current on the calling thread for the scope and restores
// the previous one after (when there was one and it differed).
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
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = -1;
  bool set_ = false;
};

// Page-locked host memory that grows on demand (contents not kept on growth).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() {
    if (p_) (void)cudaFreeHost(p_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  // At least `bytes` (the current buffer when it is big enough; none while
  // `bytes` is 0 and nothing was allocated yet).
  void* ensure(size_t bytes) {
    if (bytes > bytes_) {
      if (p_) DDPRUN_CUDA_OK(cudaFreeHost(p_));
      p_ = nullptr;
      bytes_ = 0;
      DDPRUN_CUDA_OK(cudaHostAlloc(&p_, bytes, cudaHostAllocDefault));
      bytes_ = bytes;
    }
    return p_;
  }
  void* data() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace ddprun::runtime::cuda
