// A dense float32 tensor: a shape and a pointer to contiguous row-major
// (NCHW for images) elements, either owned or a view of memory owned
// elsewhere (a gradient bucket of the Reducer, a batch buffer).
//
// Memory comes from an Allocator so that a device backend (CUDA) can own
// device memory with the same type; Device says where the elements live.
// Copies share the storage (like a torch.Tensor handle); clone() copies the
// elements. Not thread-safe: one training thread uses a tensor at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/runtime/types.h"

namespace ddprun::train {

using runtime::Device;
using Shape = std::vector<int64_t>;

int64_t numelOf(const Shape& s);
std::string shapeString(const Shape& s);

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  virtual float* alloc(size_t n) = 0;  // zero-filled, 64-byte aligned
  // Contents unspecified (Tensor::ensure: its callers overwrite every
  // element); saves the zero-fill of a device buffer reacquired every step.
  virtual float* allocUninitialized(size_t n) { return alloc(n); }
  virtual void free(float* p) = 0;
};
// Host memory (the default).
Allocator& cpuAllocator();

class Tensor {
 public:
  Tensor() = default;
  // Owned, zero-filled.
  explicit Tensor(Shape shape, Allocator& a = cpuAllocator());
  // A view of memory owned elsewhere; the caller keeps it alive.
  static Tensor view(float* data, Shape shape, Device d = Device::kCpu);

  float* data() { return data_; }
  const float* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t rank() const { return shape_.size(); }
  int64_t numel() const { return numel_; }
  size_t bytes() const { return static_cast<size_t>(numel_) * sizeof(float); }
  Device device() const { return device_; }
  bool defined() const { return data_ != nullptr || numel_ == 0; }

  // Gives an owned tensor this shape, reallocating only when it grows (the
  // last batch of an epoch is smaller). Contents are unspecified afterwards.
  void ensure(const Shape& shape, Allocator& a = cpuAllocator());
  // Same elements, another shape with the same number of elements (a view).
  Tensor reshaped(Shape shape) const;
  void zero();

 private:
  // Owns p (capacity elements from a), freed through a with the last copy.
  void adopt(float* p, size_t capacity, Allocator& a);

  Shape shape_;
  int64_t numel_ = 0;
  float* data_ = nullptr;
  size_t capacity_ = 0;
  Device device_ = Device::kCpu;
  std::shared_ptr<float> storage_;
};

}  // namespace ddprun::train
