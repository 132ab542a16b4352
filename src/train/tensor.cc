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

bool isTensorType(DType t) {
  return t == DType::kFloat32 || t == DType::kBFloat16 || t == DType::kFloat16;
}

namespace {
void checkTensorType(DType t) {
  if (!isTensorType(t))
    DDPRUN_THROW(InvalidArgument, "a tensor holds float32, bfloat16 or float16 elements, not ",
                 runtime::dtypeName(t));
}
// The allocators count floats: the floats that hold n elements of t.
size_t floatsFor(int64_t n, DType t) {
  return (static_cast<size_t>(n) * runtime::dtypeSize(t) + sizeof(float) - 1) / sizeof(float);
}
}  // namespace

Tensor::Tensor(Shape shape, Allocator& a, DType t) {
  checkTensorType(t);
  const int64_t n = numelOf(shape);
  const size_t floats = floatsFor(n, t);
  adopt(a.alloc(floats), floats * sizeof(float), a);
  shape_ = std::move(shape);
  numel_ = n;
  dtype_ = t;
}

void Tensor::adopt(float* p, size_t capacityBytes, Allocator& a) {
  Allocator* alloc = &a;
  storage_ = std::shared_ptr<float>(p, [alloc](float* q) { alloc->free(q); });
  data_ = p;
  capacityBytes_ = capacityBytes;
  device_ = a.device();
}

Tensor Tensor::view(float* data, Shape shape, Device d) {
  return view(data, std::move(shape), d, DType::kFloat32);
}

Tensor Tensor::view(void* data, Shape shape, Device d, DType type) {
  checkTensorType(type);
  Tensor t;
  t.numel_ = numelOf(shape);
  t.shape_ = std::move(shape);
  t.data_ = data;
  t.device_ = d;
  t.dtype_ = type;
  return t;
}

void Tensor::ensure(const Shape& shape, Allocator& a, DType t) {
  checkTensorType(t);
  const int64_t n = numelOf(shape);
  const size_t floats = floatsFor(n, t);
  if (!storage_ || floats * sizeof(float) > capacityBytes_ || a.device() != device_)
    adopt(a.allocUninitialized(floats), floats * sizeof(float), a);
  shape_ = shape;
  numel_ = n;
  dtype_ = t;
}

void Tensor::notFloat() const {
  DDPRUN_THROW(InvalidArgument, "a ", runtime::dtypeName(dtype_), " tensor ", shapeString(shape_),
               " was read as float32: this operation takes float32 elements (a 16-bit "
               "activation reached a layer that does not take them)");
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
