// The CUDA backend's device memory: a caching allocator in front of
// cudaMalloc, so that a training step (which frees and re-requests the same
// sizes every iteration) costs no cudaMalloc/cudaFree, both of which
// synchronise the device.
//
// Sizes are rounded to a size class (512-byte multiples up to 1 MiB, then a
// quarter of a power of two: at most 25% waste) and freed blocks wait in a
// free list per class. Reuse is stream-ordered on the backend's single compute
// stream: a block freed by the host may be handed out again at once, because
// every kernel that used it was issued to the same stream before any kernel
// that will use it next. Memory touched by other streams (the gradient
// buckets the collectives read) does not come from here.
//
// CudaBackendOptions::memory = kAsync (DDPRUN_CUDA_ALLOCATOR=async) swaps the
// free lists for CUDA's own stream-ordered pool (cudaMallocAsync / cudaFreeAsync on the same stream,
// the device's default pool with its release threshold raised so that memory
// stays reserved between steps, as the free lists keep it). Same contract;
// the benchmark weighs the two.
//
// Lifetime: tensors remember the allocator that made them and may outlive the
// backend. detach() (the backend's destructor) waits for the stream, returns
// the cache to CUDA and, if blocks are still in use, keeps the allocator alive
// in "orphan" mode, where free() calls cudaFree directly and the allocator
// deletes itself with its last block.
//
// CUDA graphs (Backend::capture): between beginCapture() and endCapture()
// a request the free lists cannot serve throws CudaError instead of calling
// cudaMalloc (which a capture forbids; stats().captureMisses counts them, and
// the capture then fails and the step runs eagerly); a graph kept alive by
// endCapture(true) has its blocks held out of the free lists as
// capture_ledger.h says, until releaseGraph(). The async pool takes no part
// (its cudaMallocAsync would become graph memory nodes): beginCapture refuses.
//
// Thread-safety: all members are safe to call from any thread (one mutex).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "capture_ledger.h"
#include "ddprun/train/tensor.h"

namespace ddprun::train::cuda {

struct AllocatorStats {
  size_t inUse = 0;   // bytes handed out (size classes, not requests)
  size_t peak = 0;    // largest inUse so far
  size_t cached = 0;  // bytes in the free lists
  size_t mallocs = 0; // cudaMalloc calls so far
  // What PyTorch's caching allocator reports, for side-by-side figures:
  // `allocated` counts live blocks at their requested size rounded up to 512
  // bytes (torch.cuda.memory_allocated); `reserved` what is held from CUDA,
  // cached blocks included (memory_reserved; the async pool: its reserved
  // memory). Peaks restart from the current values at resetPeaks().
  size_t allocated = 0, peakAllocated = 0;
  size_t reserved = 0, peakReserved = 0;
  // CUDA graphs: requests during a capture that would have needed cudaMalloc
  // (each failed its capture), and the bytes held for live graphs (counted
  // in cached too).
  size_t captureMisses = 0;
  size_t graphHeld = 0;
};

class CachingAllocator final : public Allocator {
 public:
  // async: CUDA's cudaMallocAsync pool instead of the free lists
  // (CudaBackendOptions::memory).
  CachingAllocator(int device, cudaStream_t stream, bool async = false);
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  Device device() const override { return Device::kCuda; }
  // n floats, zero-filled (an asynchronous memset on the stream), 256-byte
  // aligned (cudaMalloc's alignment).
  float* alloc(size_t n) override;
  float* allocUninitialized(size_t n) override;
  void free(float* p) override;
  // Raw bytes, not zeroed (workspaces, scratch).
  void* allocBytes(size_t bytes);
  void freeBytes(void* p);

  AllocatorStats stats() const;
  // Restarts the high-water marks (peak, peakAllocated, peakReserved) from
  // the current values (PyTorch's reset_peak_memory_stats).
  void resetPeaks();
  // True when this allocator uses CUDA's stream-ordered pool.
  bool usesAsyncPool() const { return async_; }
  // Returns every cached block to CUDA (waits for the stream first).
  void releaseCached();
  // A capture on the backend's stream starts (see the note above). Throws
  // InvalidArgument with the async pool, while another capture runs, or
  // while a graph lives (one at a time: release it first).
  void beginCapture();
  // It ended: keep (the graph was instantiated and will replay) holds its
  // blocks and returns the graph's id for releaseGraph; !keep forgets it (0).
  uint64_t endCapture(bool keep);
  // The graph will not replay again: its held blocks return to the free lists.
  void releaseGraph(uint64_t id);
  // The backend is going away: see the lifetime note above. `this` must not
  // be used by the caller afterwards.
  void detach();

  static size_t sizeClass(size_t bytes);
  // A request as PyTorch counts it in memory_allocated: rounded up to a
  // multiple of 512 bytes (at least 512).
  static size_t roundedRequest(size_t bytes);

 private:
  ~CachingAllocator();
  struct Block {
    size_t cls = 0;      // size class (the free lists' key); async: the rounded request
    size_t counted = 0;  // roundedRequest(bytes): the `allocated` figure
  };
  void* take(size_t bytes);
  void* mallocLocked(size_t bytes);
  void releaseCachedLocked();
  void noteReservedLocked();

  int device_;
  cudaStream_t stream_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;    // size class -> blocks
  std::unordered_map<void*, Block> live_;        // block -> its sizes
  AllocatorStats stats_;
  bool orphan_ = false;
  bool async_ = false;           // DDPRUN_CUDA_ALLOCATOR=async
  cudaMemPool_t pool_ = nullptr; // async: the device's default pool
  CaptureLedger ledger_;
  std::unordered_map<void*, size_t> held_;  // block -> size class, for live graphs
};

}  // namespace ddprun::train::cuda
