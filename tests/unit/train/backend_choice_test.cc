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

std::string refusal(const std::string& device, const std::string& precision,
                    const DeviceInventory& inv) {
  try {
    chooseCuda(device, precision, inv);
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "";
}

TEST(BackendChoice, AutoTakesTheGpuWhenThereIsOne) {
  EXPECT_TRUE(chooseCuda("auto", "fp32", kGpu));
  EXPECT_TRUE(chooseCuda("auto", "bf16", kGpu));
  EXPECT_FALSE(chooseCuda("auto", "fp32", kNoGpu));
  EXPECT_FALSE(chooseCuda("auto", "fp32", kNoCuda));
  EXPECT_TRUE(chooseCuda("cuda", "tf32", kGpu));
  EXPECT_FALSE(chooseCuda("cpu", "fp32", kGpu));
}

TEST(BackendChoice, CudaWithoutAGpuNamesWhy) {
  const std::string noGpu = refusal("cuda", "fp32", kNoGpu);
  EXPECT_NE(noGpu.find("--device cuda"), std::string::npos) << noGpu;
  EXPECT_NE(noGpu.find("no CUDA GPU is visible"), std::string::npos) << noGpu;
  EXPECT_NE(noGpu.find("--device cpu"), std::string::npos) << noGpu;
  const std::string noCuda = refusal("cuda", "fp32", kNoCuda);
  EXPECT_NE(noCuda.find("built without CUDA"), std::string::npos) << noCuda;
}

TEST(BackendChoice, SixteenBitOrTf32OnTheCpuIsRefused) {
  for (const char* p : {"tf32", "bf16", "fp16"}) {
    const std::string cpu = refusal("cpu", p, kGpu);
    EXPECT_NE(cpu.find(std::string("--precision ") + p), std::string::npos) << cpu;
    EXPECT_NE(cpu.find("--device cpu was given"), std::string::npos) << cpu;
    const std::string autoCpu = refusal("auto", p, kNoGpu);
    EXPECT_NE(autoCpu.find("--device auto chose the CPU"), std::string::npos) << autoCpu;
  }
  EXPECT_EQ(refusal("cpu", "fp32", kNoCuda), "");
}

TEST(BackendChoice, ParsePrecision) {
  EXPECT_EQ(parsePrecision("fp32"), Precision::kFp32);
  EXPECT_EQ(parsePrecision("tf32"), Precision::kTf32);
  EXPECT_EQ(parsePrecision("bf16"), Precision::kBf16);
  EXPECT_EQ(parsePrecision("fp16"), Precision::kFp16);
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
