// Stream-ordered uploads through pinned staging (staged_upload.h).
#include "staged_upload.h"

#include <algorithm>
#include <cstring>

#include "ddprun/runtime/cuda_check.h"

namespace ddprun::train::cuda {

StagedUpload::StagedUpload() {
  for (Event& e : copied_) e = Event::create();
}

void StagedUpload::upload(const void* host, size_t bytes, void* dst, cudaStream_t stream) {
  const int slot = next_;
  next_ = (next_ + 1) % kSlots;
  if (used_[slot] && !copied_[slot].done()) copied_[slot].synchronize();
  void* pin = pinned_[slot].ensure(std::max<size_t>(bytes, 1));
  if (bytes) {
    std::memcpy(pin, host, bytes);
    DDPRUN_CUDA_OK(cudaMemcpyAsync(dst, pin, bytes, cudaMemcpyHostToDevice, stream));
  }
  copied_[slot].record(stream);
  used_[slot] = true;
}

}  // namespace ddprun::train::cuda
