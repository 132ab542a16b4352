#include "ddprun/train/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>

#include "ddprun/common/error.h"

namespace ddprun::train {

int64_t numelOf(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    DDPRUN_CHECK(d >= 0, "negative dimension in shape ", shapeString(s));
    n *= d;
  }
  return n;
}

std::string shapeString(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

namespace {
class CpuAllocator final : public Allocator {
 public:
  Device device() const override { return Device::kCpu; }
  float* alloc(size_t n) override {
    const size_t bytes = ((std::max<size_t>(n, 1) * sizeof(float)) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    return static_cast<float*>(p);
  }
  void free(float* p) override { std::free(p); }
};
}  // namespace

Allocator& cpuAllocator() {
  static CpuAllocator a;
  return a;
}

Tensor::Tensor(Shape shape, Allocator& a) {
  const int64_t n = numelOf(shape);
  adopt(a.alloc(static_cast<size_t>(n)), static_cast<size_t>(n), a);
  shape_ = std::move(shape);
  numel_ = n;
}

void Tensor::adopt(float* p, size_t capacity, Allocator& a) {
  Allocator* alloc = &a;
  storage_ = std::shared_ptr<float>(p, [alloc](float* q) { alloc->free(q); });
  data_ = p;
  capacity_ = capacity;
  device_ = a.device();
}

Tensor Tensor::view(float* data, Shape shape, Device d) {
  Tensor t;
  t.numel_ = numelOf(shape);
  t.shape_ = std::move(shape);
  t.data_ = data;
  t.device_ = d;
  return t;
}

void Tensor::ensure(const Shape& shape, Allocator& a) {
  const int64_t n = numelOf(shape);
  if (!storage_ || static_cast<size_t>(n) > capacity_ || a.device() != device_) {
    adopt(a.allocUninitialized(static_cast<size_t>(n)), static_cast<size_t>(n), a);
  }
  shape_ = shape;
  numel_ = n;
}

Tensor Tensor::reshaped(Shape shape) const {
  DDPRUN_CHECK(numelOf(shape) == numel_, "cannot view ", shapeString(shape_), " as ",
               shapeString(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

void Tensor::zero() {
  DDPRUN_CHECK(device_ == Device::kCpu, "Tensor::zero on a device tensor: use the backend");
  if (numel_) std::memset(data_, 0, bytes());
}

}  // namespace ddprun::train
