// --device/--precision against a fake inventory, and the fp16 loss scaler's
// transitions: pure logic, no device.
#include "ddprun/train/backend_choice.h"

#include <gtest/gtest.h>

#include "ddprun/common/error.h"
#include "ddprun/train/loss_scaler.h"

namespace ddprun::train {
namespace {

const DeviceInventory kGpu{.cudaBuilt = true, .gpus = 2};
const DeviceInventory kNoGpu{.cudaBuilt = true, .gpus = 0};
const DeviceInventory kNoCuda{.cudaBuilt = false, .gpus = 0};

constexpr DeviceChoice kCpu = DeviceChoice::kCpu, kCuda = DeviceChoice::kCuda,
                        kAuto = DeviceChoice::kAuto;

std::string refusal(DeviceChoice device, Precision precision, const DeviceInventory& inv) {
  try {
    chooseCuda(device, precision, inv);
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "";
}

TEST(BackendChoice, AutoTakesTheGpuWhenThereIsOne) {
  EXPECT_TRUE(chooseCuda(kAuto, Precision::kFp32, kGpu));
  EXPECT_TRUE(chooseCuda(kAuto, Precision::kBf16, kGpu));
  EXPECT_FALSE(chooseCuda(kAuto, Precision::kFp32, kNoGpu));
  EXPECT_FALSE(chooseCuda(kAuto, Precision::kFp32, kNoCuda));
  EXPECT_TRUE(chooseCuda(kCuda, Precision::kTf32, kGpu));
  EXPECT_FALSE(chooseCuda(kCpu, Precision::kFp32, kGpu));
}

TEST(BackendChoice, CudaWithoutAGpuNamesWhy) {
  const std::string noGpu = refusal(kCuda, Precision::kFp32, kNoGpu);
  EXPECT_NE(noGpu.find("--device cuda"), std::string::npos) << noGpu;
  EXPECT_NE(noGpu.find("no CUDA GPU is visible"), std::string::npos) << noGpu;
  EXPECT_NE(noGpu.find("--device cpu"), std::string::npos) << noGpu;
  const std::string noCuda = refusal(kCuda, Precision::kFp32, kNoCuda);
  EXPECT_NE(noCuda.find("built without CUDA"), std::string::npos) << noCuda;
}

TEST(BackendChoice, SixteenBitOrTf32OnTheCpuIsRefused) {
  for (Precision p : {Precision::kTf32, Precision::kBf16, Precision::kFp16}) {
    const std::string cpu = refusal(kCpu, p, kGpu);
    EXPECT_NE(cpu.find(std::string("--precision ") + precisionName(p)), std::string::npos)
        << cpu;
    EXPECT_NE(cpu.find("--device cpu was given"), std::string::npos) << cpu;
    const std::string autoCpu = refusal(kAuto, p, kNoGpu);
    EXPECT_NE(autoCpu.find("--device auto chose the CPU"), std::string::npos) << autoCpu;
  }
  EXPECT_EQ(refusal(kCpu, Precision::kFp32, kNoCuda), "");
}

TEST(LossScaler, OffIsScaleOneAndNeverChanges) {
  LossScaler off;
  EXPECT_FALSE(off.on());
  off.update(false);
  off.update(true);
  EXPECT_EQ(off.scale(), 1.0f);
  EXPECT_EQ(off.skipped(), 0);
}

TEST(LossScaler, HalvesOnOverflowDoublesAfterTheGrowthInterval) {
  LossScaler s({.initScale = 1024.0f, .growthInterval = 3});
  EXPECT_EQ(s.scale(), 1024.0f);
  s.update(false);
  EXPECT_EQ(s.scale(), 512.0f);
  EXPECT_EQ(s.skipped(), 1);
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 512.0f);
  s.update(false);  // an overflow restarts the count of clean steps
  EXPECT_EQ(s.scale(), 256.0f);
  for (int i = 0; i < 2; ++i) s.update(true);
  EXPECT_EQ(s.scale(), 256.0f);
  s.update(true);  // the third clean step in a row
  EXPECT_EQ(s.scale(), 512.0f);
  EXPECT_EQ(s.skipped(), 2);
}

TEST(LossScaler, NeverBelowOne) {
  LossScaler s({.initScale = 2.0f, .growthInterval = 2000});
  for (int i = 0; i < 5; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 1.0f);
  EXPECT_EQ(s.skipped(), 5);
}

}  // namespace
}  // namespace ddprun::train
