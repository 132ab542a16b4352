// Small host data (a step's labels, the optimizer's per-step scalars) copied
// into device memory in stream order through a ring of pinned buffers, so
// that the host's memory is free again at once and a CUDA graph replayed
// after the copy reads the new values in its fixed device slot.
//
// A pinned buffer is refilled once the copy that last read it has run (its
// event), never waiting for the rest of the stream: with kSlots buffers the
// host runs up to kSlots uploads ahead of the device before it waits.
//
// Thread-safety: one thread (the backend's training thread). Preconditions:
// `dst` is device memory of the current device, at least `bytes` long, and
// stays valid until the copy has run (stream order).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "resources.h"

namespace ddprun::train::cuda {

class StagedUpload {
 public:
  StagedUpload();
  // Queues the copy of `bytes` of `host` into `dst` on `stream` (nothing
  // for 0 bytes); `host` may be reused on return.
  void upload(const void* host, size_t bytes, void* dst, cudaStream_t stream);

 private:
  static constexpr int kSlots = 4;
  PinnedBuffer pinned_[kSlots];
  Event copied_[kSlots];
  bool used_[kSlots] = {};
  int next_ = 0;
};

}  // namespace ddprun::train::cuda
