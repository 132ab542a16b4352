// RAII owners of the CUDA backend's handles: streams, events, pinned host
// buffers, the cuDNN and cuBLASLt handles and their descriptors. Each owner is
// move-only, creates its object in the constructor (throwing CudaError naming
// the call and device) and destroys it in the destructor, ignoring errors
// there (a destructor must not throw, and a failed destroy leaks at worst).
//
// Thread-safety: as the underlying object (a stream may be used from any
// thread; a descriptor belongs to its layer's thread).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "ddprun/runtime/cuda_check.h"

namespace ddprun::train::cuda {

// Host synchronisations with the device, counted for the benchmark's "host
// synchronisations per step" (goal: none inside a training step). `calls`:
// every Stream::synchronize / Event::synchronize (and the Context's
// synchronous transfers); `waits`: those that found the device work not yet
// done, i.e. the host actually stalled. Process-wide, any thread.
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

// A non-blocking stream: never synchronises with the legacy default stream.
class Stream : public Owned<cudaStream_t, cudaStreamDestroy> {
 public:
  static Stream create() {
    cudaStream_t s = nullptr;
    DDPRUN_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
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

// Page-locked host memory that grows on demand (contents not kept on growth).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() {
    if (p_) (void)cudaFreeHost(p_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
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

// cuDNN and cuBLASLt objects.
template <typename T, auto Create, auto Destroy>
class CudnnOwned : public Owned<T, Destroy> {
 public:
  static CudnnOwned create() {
    T v{};
    DDPRUN_CUDNN_OK(Create(&v));
    return CudnnOwned(v);
  }
  CudnnOwned() = default;

 private:
  explicit CudnnOwned(T v) : Owned<T, Destroy>(v) {}
};
using CudnnHandle = CudnnOwned<cudnnHandle_t, cudnnCreate, cudnnDestroy>;
using TensorDesc =
    CudnnOwned<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDesc =
    CudnnOwned<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvDesc = CudnnOwned<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                            cudnnDestroyConvolutionDescriptor>;
using PoolDesc = CudnnOwned<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor,
                            cudnnDestroyPoolingDescriptor>;

class LtHandle : public Owned<cublasLtHandle_t, cublasLtDestroy> {
 public:
  static LtHandle create() {
    cublasLtHandle_t h = nullptr;
    DDPRUN_CUBLAS_OK(cublasLtCreate(&h));
    return LtHandle(h);
  }
  LtHandle() = default;

 private:
  explicit LtHandle(cublasLtHandle_t h) : Owned(h) {}
};
using LtMatmulDesc = Owned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using LtLayout = Owned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using LtPreference = Owned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

// 4-d NCHW descriptor (float unless `type` says otherwise).
inline void setTensor4d(cudnnTensorDescriptor_t d, int64_t n, int64_t c, int64_t h, int64_t w,
                        cudnnDataType_t type = CUDNN_DATA_FLOAT) {
  DDPRUN_CUDNN_OK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, type,
                                             static_cast<int>(n), static_cast<int>(c),
                                             static_cast<int>(h), static_cast<int>(w)));
}

}  // namespace ddprun::train::cuda
