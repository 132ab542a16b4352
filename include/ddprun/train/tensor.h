// A dense tensor: a shape, an element type and a pointer to contiguous
// row-major (NCHW for images) elements, either owned or a view of memory
// owned elsewhere (a gradient bucket of the Reducer, a batch buffer).
//
// Element types: float32 (the default, and the only one the CPU backend, the
// parameters, gradients and optimizer state use), and bfloat16/float16 for
// the activations a device backend keeps in 16 bits (CudaBackendOptions::
// activations16). data() is the float32 view and refuses a 16-bit tensor;
// raw() is the untyped one.
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
using runtime::DType;
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

// Whether a Tensor may hold elements of type t: float32, bfloat16, float16.
bool isTensorType(DType t);

class Tensor {
 public:
  Tensor() = default;
  // Owned, zero-filled. Throws InvalidArgument for a type that is not a
  // tensor type (isTensorType).
  explicit Tensor(Shape shape, Allocator& a = cpuAllocator(), DType t = DType::kFloat32);
  // A view of memory owned elsewhere; the caller keeps it alive.
  static Tensor view(float* data, Shape shape, Device d = Device::kCpu);
  static Tensor view(void* data, Shape shape, Device d, DType t);

  // The float32 elements. Throws InvalidArgument on a 16-bit tensor (a layer
  // that reads floats was handed 16-bit activations): use raw() and dtype().
  float* data() {
    if (dtype_ != DType::kFloat32) notFloat();
    return static_cast<float*>(data_);
  }
  const float* data() const {
    if (dtype_ != DType::kFloat32) notFloat();
    return static_cast<const float*>(data_);
  }
  void* raw() { return data_; }
  const void* raw() const { return data_; }
  DType dtype() const { return dtype_; }
  bool is16() const { return dtype_ != DType::kFloat32; }
  const Shape& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t rank() const { return shape_.size(); }
  int64_t numel() const { return numel_; }
  size_t bytes() const { return static_cast<size_t>(numel_) * runtime::dtypeSize(dtype_); }
  Device device() const { return device_; }
  bool defined() const { return data_ != nullptr || numel_ == 0; }

  // Gives an owned tensor this shape and element type, reallocating only
  // when it needs more bytes than it holds (the last batch of an epoch is
  // smaller) or another device. Contents are unspecified afterwards.
  void ensure(const Shape& shape, Allocator& a = cpuAllocator(), DType t = DType::kFloat32);
  // ensure() with `like`'s shape and element type (a gradient of `like`).
  void ensureLike(const Tensor& like, Allocator& a) { ensure(like.shape(), a, like.dtype()); }
  // Same elements, another shape with the same number of elements (a view).
  Tensor reshaped(Shape shape) const;
  void zero();

 private:
  // Owns p (capacityBytes from a), freed through a with the last copy.
  void adopt(float* p, size_t capacityBytes, Allocator& a);
  [[noreturn]] void notFloat() const;

  Shape shape_;
  int64_t numel_ = 0;
  void* data_ = nullptr;
  size_t capacityBytes_ = 0;
  Device device_ = Device::kCpu;
  DType dtype_ = DType::kFloat32;
  std::shared_ptr<float> storage_;
};

}  // namespace ddprun::train
