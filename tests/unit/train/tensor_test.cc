// Tensor's element types: the bytes a 16-bit tensor holds, reallocation
// by bytes rather than elements, views and reshapes keeping the type, the
// float32 accessor refusing 16-bit elements, and what a gradient inherits.
#include "ddprun/train/tensor.h"

#include <gtest/gtest.h>

#include <string>

#include "ddprun/common/error.h"

namespace ddprun::train {
namespace {

// Counts allocations and the floats asked for, on the host.
class CountingAllocator final : public Allocator {
 public:
  Device device() const override { return Device::kCpu; }
  float* alloc(size_t n) override {
    ++allocs;
    lastFloats = n;
    return cpuAllocator().alloc(n);
  }
  void free(float* p) override { cpuAllocator().free(p); }
  int allocs = 0;
  size_t lastFloats = 0;
};

TEST(Tensor, FloatIsTheDefault) {
  Tensor t({2, 3});
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  EXPECT_FALSE(t.is16());
  EXPECT_EQ(t.bytes(), 24u);
  EXPECT_EQ(t.data(), t.raw());
}

TEST(Tensor, SixteenBitTensorsHoldTwoBytesAnElement) {
  CountingAllocator a;
  for (DType d : {DType::kBFloat16, DType::kFloat16}) {
    Tensor t({3, 5}, a, d);
    EXPECT_EQ(t.dtype(), d);
    EXPECT_TRUE(t.is16());
    EXPECT_EQ(t.numel(), 15);
    EXPECT_EQ(t.bytes(), 30u);
    EXPECT_EQ(a.lastFloats, 8u) << "15 two-byte elements need 8 floats, rounded up";
    EXPECT_NE(t.raw(), nullptr);
  }
}

TEST(Tensor, DataRefusesSixteenBitElements) {
  Tensor t({4}, cpuAllocator(), DType::kBFloat16);
  try {
    (void)t.data();
    FAIL() << "data() gave floats of a bfloat16 tensor";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("bfloat16"), std::string::npos) << m;
    EXPECT_NE(m.find("[4]"), std::string::npos) << m;
  }
  const Tensor& c = t;
  EXPECT_THROW((void)c.data(), InvalidArgument);
}

TEST(Tensor, OnlyFloatingTypesOfTwoOrFourBytes) {
  for (DType d : {DType::kFloat64, DType::kInt32, DType::kInt64, DType::kUInt8}) {
    EXPECT_FALSE(isTensorType(d));
    EXPECT_THROW(Tensor({2}, cpuAllocator(), d), InvalidArgument);
    Tensor t;
    EXPECT_THROW(t.ensure({2}, cpuAllocator(), d), InvalidArgument);
  }
}

TEST(Tensor, EnsureReallocatesByBytesNotElements) {
  CountingAllocator a;
  Tensor t;
  t.ensure({8}, a, DType::kBFloat16);  // 16 bytes
  EXPECT_EQ(a.allocs, 1);
  const void* p = t.raw();
  t.ensure({8}, a, DType::kFloat32);  // 32 bytes: more than it holds
  EXPECT_EQ(a.allocs, 2);
  EXPECT_NE(t.raw(), p);
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  const void* q = t.raw();
  t.ensure({16}, a, DType::kFloat16);  // 32 bytes: fits
  EXPECT_EQ(a.allocs, 2);
  EXPECT_EQ(t.raw(), q);
  EXPECT_EQ(t.dtype(), DType::kFloat16);
  EXPECT_EQ(t.numel(), 16);
  t.ensure({17}, a, DType::kFloat16);  // 34 bytes: grows
  EXPECT_EQ(a.allocs, 3);
}

TEST(Tensor, ViewsReshapesAndCopiesKeepTheType) {
  uint16_t buf[6] = {};
  Tensor v = Tensor::view(buf, {2, 3}, Device::kCpu, DType::kFloat16);
  EXPECT_EQ(v.raw(), buf);
  EXPECT_EQ(v.bytes(), 12u);
  Tensor r = v.reshaped({3, 2});
  EXPECT_EQ(r.dtype(), DType::kFloat16);
  EXPECT_EQ(r.raw(), buf);
  Tensor c = r;
  EXPECT_EQ(c.dtype(), DType::kFloat16);
  EXPECT_THROW(Tensor::view(buf, {2}, Device::kCpu, DType::kInt64), InvalidArgument);
}

TEST(Tensor, EnsureLikeGivesAGradientItsActivationsType) {
  Tensor act({2, 2}, cpuAllocator(), DType::kBFloat16);
  Tensor grad;
  grad.ensureLike(act, cpuAllocator());
  EXPECT_EQ(grad.dtype(), DType::kBFloat16);
  EXPECT_EQ(grad.shape(), act.shape());
  EXPECT_NE(grad.raw(), act.raw());
}

TEST(Tensor, ZeroClearsEveryByte) {
  Tensor t({5}, cpuAllocator(), DType::kBFloat16);
  auto* p = static_cast<uint16_t*>(t.raw());
  for (int i = 0; i < 5; ++i) p[i] = 0x3f80;  // 1.0 in bfloat16
  t.zero();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(p[i], 0) << i;
}

}  // namespace
}  // namespace ddprun::train
