// What every part of the CUDA backend shares: the device, the precision, the
// one compute stream (non-blocking; every cuDNN, cuBLASLt, kernel and copy of
// the backend goes to it), the cuDNN and cuBLASLt handles bound to that
// stream, the caching allocator, a grow-only workspace and pinned staging.
//
// Layers hold a shared_ptr to the context, so a model may outlive its
// backend object; the allocator itself survives its last tensor (see
// caching_allocator.h).
//
// Thread-safety: one training thread uses a context (as a Backend). The
// stream and allocator may be touched from other threads as their own notes
// say (the gradient memory's fence waits for events from the communication
// thread).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <atomic>
#include <memory>
#include <string>

#include "caching_allocator.h"
#include "ddprun/train/layers.h"
#include "launch_stream.h"
#include "resources.h"

namespace ddprun::train::cuda {

class Context {
 public:
  // Sets `device` current on the calling thread and creates the stream and
  // handles. Precondition: o.device exists. The options as
  // CudaBackendOptions says (activations16 taken only with nhwc in bf16 or
  // fp16, ourBatchNorm only with nhwc).
  explicit Context(const CudaBackendOptions& o);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const { return device_; }
  Precision precision() const { return precision_; }
  // Bitwise-repeatable algorithms only (--deterministic).
  bool deterministic() const { return deterministic_; }
  // Activations NHWC in memory (shapes [N, C, H, W]); else NCHW.
  bool nhwc() const { return nhwc_; }
  // The autocast precisions (bf16, fp16): convolutions and matrix products
  // take 16-bit inputs and accumulate in float; everything else stays float.
  bool autocast() const { return precision_ == Precision::kBf16 || precision_ == Precision::kFp16; }
  bool bf16() const { return precision_ == Precision::kBf16; }
  // Activations between layers in 16 bits (CudaBackendOptions::activations16):
  // the layers make their outputs of type actType(), bf16 or fp16; float32
  // otherwise.
  bool activations16() const { return act16_; }
  // Batch norm through our NHWC kernels (bn_nhwc.h): with 16-bit
  // activations always, on float NHWC ones where CudaBackendOptions::
  // ourBatchNorm asks; otherwise cuDNN's.
  bool ourBatchNorm() const { return ourBn_; }
  // Convolution search through cuDNN's graph API (CudaBackendOptions::
  // graphConv; kOff in NCHW and in deterministic mode).
  CudaBackendOptions::GraphConv graphConv() const { return graphConv_; }
  // Max pooling through our NHWC kernels from the start (CudaBackendOptions::ownPool).
  bool ownPool() const { return ownPool_; }
  // cuDNN's fused batch norm + activation (CudaBackendOptions::cudnnBnFusion).
  bool cudnnBnFusion() const { return cudnnBnFusion_; }
  // ResNet's stem as one layer, on our batch norm (CudaBackendOptions::fusedStem).
  bool fusedStem() const { return fusedStem_; }
  // Our batch norm's sums with their epilogue in one launch (CudaBackendOptions::bnFold).
  bool bnFold() const { return bnFold_; }
  // Steps may be captured as CUDA graphs (CudaBackendOptions::cudaGraph;
  // step_graph.h), and whether a capture is recording now (the layers skip
  // host bookkeeping a replay would not repeat).
  bool cudaGraph() const { return cudaGraph_; }
  bool capturing() const { return capturing_; }
  void setCapturing(bool on) { capturing_ = on; }
  // ResNet's conv2 input recomputed for backward (CudaBackendOptions::recompute).
  bool recompute() const { return recompute_; }
  // Our batch norm's kernels under programmatic dependent launch
  // (CudaBackendOptions::pdl, on a device of compute capability 9.0+ running
  // code compiled for it: pdlCompiled()), and
  // the stream they are launched on with it (launch_stream.h).
  bool pdl() const { return pdl_; }
  LaunchStream kernelStream() const { return {stream_.get(), pdl_}; }
  runtime::DType actType() const {
    if (!act16_) return runtime::DType::kFloat32;
    return bf16() ? runtime::DType::kBFloat16 : runtime::DType::kFloat16;
  }
  cudaStream_t stream() const { return stream_.get(); }
  cudnnHandle_t cudnn() const { return cudnn_.get(); }
  cublasLtHandle_t lt() const { return lt_.get(); }
  CachingAllocator& allocator() { return *alloc_; }
  const std::string& deviceName() const { return deviceName_; }

  // Makes this context's device current on the calling thread (cheap).
  void bind() const;
  // Waits for everything issued to the stream.
  void synchronize() const { stream_.synchronize(); }
  // At least `bytes` of device scratch, valid until the next call (stream
  // ordered: a later kernel never overlaps an earlier one on the stream).
  void* workspace(size_t bytes);
  // Host <-> device through pinned staging; synchronous.
  void upload(const void* host, void* dst, size_t bytes);
  void download(const void* src, void* host, size_t bytes);
  // Copies `bytes` of device memory into pinned memory and waits: small
  // results (a loss, a flag) read back with one transfer.
  void readBack(const void* src, void* host, size_t bytes);

  // Device memory held outside the caching allocator (the reducer's gradient
  // buckets): counted so that peakBytes() covers everything this backend holds.
  void noteExternal(int64_t deltaBytes);
  // High-water marks of what this backend holds: allocated (requests rounded
  // as PyTorch counts them) and reserved (cached blocks and size classes
  // included), each the allocator's plus the external bytes'.
  size_t peakBytes() const;
  size_t peakReservedBytes() const;
  // Restarts both from what is held now.
  void resetPeaks();

 private:
  std::atomic<int64_t> external_{0};
  std::atomic<int64_t> externalPeak_{0};
  int device_;
  Precision precision_;
  bool deterministic_;
  bool nhwc_;
  bool act16_;
  bool ourBn_;
  CudaBackendOptions::GraphConv graphConv_;
  bool ownPool_;
  bool cudnnBnFusion_;
  bool fusedStem_;
  bool bnFold_;
  bool cudaGraph_;
  bool recompute_;
  bool pdl_ = false;
  bool capturing_ = false;
  std::string deviceName_;
  Stream stream_;
  CudnnHandle cudnn_;
  LtHandle lt_;
  CachingAllocator* alloc_ = nullptr;  // detached (not deleted) in ~Context
  void* workspace_ = nullptr;
  size_t workspaceBytes_ = 0;
  PinnedBuffer staging_;
  PinnedBuffer small_;
};

// An owned device buffer of `T` from the context's allocator (scratch that
// is not a float Tensor: labels, double sums, flags).
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(std::shared_ptr<Context> ctx) : ctx_(std::move(ctx)) {}
  ~DeviceArray() { release(); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* ensure(size_t n) {
    if (n > n_ || !p_) {
      release();
      p_ = static_cast<T*>(ctx_->allocator().allocBytes(std::max<size_t>(n, 1) * sizeof(T)));
      n_ = n;
    }
    return p_;
  }
  T* get() const { return p_; }
  // Returns the memory to the allocator (stream ordered, as every free).
  void reset() { release(); }

 private:
  void release() {
    if (p_) ctx_->allocator().freeBytes(p_);
    p_ = nullptr;
    n_ = 0;
  }
  std::shared_ptr<Context> ctx_;
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace ddprun::train::cuda
