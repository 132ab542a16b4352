// --device/--precision against a fake inventory, and the fp16 loss scaler's
// transitions: pure logic, no device.
#include "ddprun/train/backend_choice.h"

#include <gtest/gtest.h>

#include "ddprun/common/error.h"
#include "ddprun/train/loss_scaler.h"

namespace ddprun::train {
namespace {

const DeviceInventory kGpu{.cause = CudaCause::kUsable, .gpus = 2};
const DeviceInventory kNoGpu{.cause = CudaCause::kNoDevice};
const DeviceInventory kNoCuda{
    .cause = CudaCause::kNotInstalled,
    .detail = "libddprun_train_cuda.so is not installed (looked in /x)"};

constexpr DeviceChoice kCpu = DeviceChoice::kCpu, kCuda = DeviceChoice::kCuda,
                       kAuto = DeviceChoice::kAuto;

std::string refusal(DeviceChoice device, Precision precision,
                    const DeviceInventory& inv) {
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
  EXPECT_NE(noCuda.find("no CUDA backend installed"), std::string::npos) << noCuda;
}

TEST(BackendChoice, AnUnusableBackendNamesWhyAndTheFix) {
  const DeviceInventory noCudnn{.cause = CudaCause::kBackendUnusable,
                                .detail =
                                    "libcudnn_graph.so.9: cannot open shared object "
                                    "file: No such file or directory",
                                .gpus = 1};
  const std::string cuda = refusal(kCuda, Precision::kFp32, noCudnn);
  EXPECT_NE(cuda.find("libcudnn_graph.so.9"), std::string::npos) << cuda;
  EXPECT_NE(cuda.find("pip install nvidia-cudnn-cu13"), std::string::npos) << cuda;
  EXPECT_NE(cuda.find("--device cpu"), std::string::npos) << cuda;
  // auto: the CPU, with one line naming the GPU, the library and the fix.
  const DeviceDecision told = decideDevice(kAuto, Precision::kFp32, noCudnn);
  EXPECT_FALSE(told.cuda);
  EXPECT_NE(told.notice.find("training on the CPU"), std::string::npos) << told.notice;
  EXPECT_EQ(told.notice.find('\n'), std::string::npos) << told.notice;
  EXPECT_NE(told.notice.find("1 NVIDIA GPU is present"), std::string::npos)
      << told.notice;
  EXPECT_NE(told.notice.find("libcudnn_graph.so.9"), std::string::npos) << told.notice;
  EXPECT_NE(told.notice.find("pip install nvidia-cudnn-cu13"), std::string::npos)
      << told.notice;
  EXPECT_NE(told.summary.find("cpu (--device auto: "), std::string::npos) << told.summary;
}

TEST(BackendChoice, ACpuOnlyInstallSaysSoInAFewWords) {
  const DeviceDecision d = decideDevice(kAuto, Precision::kFp32, kNoCuda);
  EXPECT_EQ(
      d.notice,
      "--device auto: training on the CPU (this ddprun has no CUDA backend installed)");
  const std::string cuda = refusal(kCuda, Precision::kFp32, kNoCuda);
  EXPECT_NE(cuda.find("CPU-only ddprun"), std::string::npos) << cuda;
  EXPECT_NE(cuda.find("-C ddprun.cuda=true"), std::string::npos) << cuda;
  // With a GPU on the machine, the notice names it and the fix.
  DeviceInventory withGpu = kNoCuda;
  withGpu.driverGpus = 2;
  const DeviceDecision g = decideDevice(kAuto, Precision::kFp32, withGpu);
  EXPECT_NE(
      g.notice.find("2 NVIDIA GPUs are present but this ddprun has no CUDA backend"),
      std::string::npos)
      << g.notice;
  EXPECT_NE(g.notice.find("to use them: this is a CPU-only ddprun"), std::string::npos)
      << g.notice;
}

TEST(BackendChoice, TheChoiceIsSummarised) {
  EXPECT_EQ(decideDevice(kCpu, Precision::kFp32, kGpu).summary, "cpu (--device cpu)");
  EXPECT_EQ(decideDevice(kCpu, Precision::kFp32, kGpu).notice, "");
  EXPECT_EQ(decideDevice(kAuto, Precision::kFp32, kGpu).summary,
            "cuda (--device auto: 2 GPUs visible)");
  EXPECT_EQ(decideDevice(kAuto, Precision::kFp32, kNoGpu).summary,
            "cpu (--device auto: no CUDA GPU is visible: the NVIDIA driver finds none)");
  EXPECT_EQ(decideDevice(kCuda, Precision::kFp32, kGpu).summary, "cuda (--device cuda)");
  EXPECT_NE(
      decideDevice(kAuto, Precision::kFp32, kNoGpu).notice.find("no CUDA GPU is visible"),
      std::string::npos);
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

// The CUDA switches, read in one place (withEnvSwitches): unset keeps what
// the caller chose; each set one applies; a malformed one names itself.
class EnvSwitches : public ::testing::Test {
 protected:
  static constexpr const char* kNames[] = {
      "DDPRUN_CUDNN_DETERMINISTIC", "DDPRUN_CUDA_ACT16",      "DDPRUN_CUDA_OUR_BN",
      "DDPRUN_CUDNN_GRAPH",         "DDPRUN_CUDA_OWN_POOL",   "DDPRUN_CUDNN_BN_FUSION",
      "DDPRUN_CUDA_ALLOCATOR",      "DDPRUN_CUDA_FUSED_STEM", "DDPRUN_CUDA_BN_FOLD",
      "DDPRUN_CUDA_GRAPH",          "DDPRUN_CUDA_RECOMPUTE"};
  void SetUp() override {
    for (const char* n : kNames) unsetenv(n);
  }
  void TearDown() override { SetUp(); }
};

TEST_F(EnvSwitches, UnsetKeepsTheCallersChoice) {
  CudaBackendOptions o{.device = 1, .activations16 = true, .ourBatchNorm = true};
  const CudaBackendOptions got = withEnvSwitches(o);
  EXPECT_EQ(got.device, 1);
  EXPECT_FALSE(got.deterministic);
  EXPECT_TRUE(got.activations16);
  EXPECT_TRUE(got.ourBatchNorm);
  EXPECT_EQ(got.graphConv, CudaBackendOptions::GraphConv::kOff);
  EXPECT_FALSE(got.ownPool);
  EXPECT_FALSE(got.cudnnBnFusion);
  EXPECT_FALSE(got.fusedStem);
  EXPECT_FALSE(got.bnFold);
  EXPECT_FALSE(got.cudaGraph);
  EXPECT_FALSE(got.recompute);
  EXPECT_EQ(got.memory, CudaBackendOptions::Memory::kCaching);
  EXPECT_TRUE(withEnvSwitches({.bnFold = true}).bnFold);
}

TEST_F(EnvSwitches, EachSetOneApplies) {
  setenv("DDPRUN_CUDNN_DETERMINISTIC", "1", 1);
  setenv("DDPRUN_CUDA_ACT16", "0", 1);
  setenv("DDPRUN_CUDA_OUR_BN", "0", 1);
  setenv("DDPRUN_CUDNN_GRAPH", "2", 1);
  setenv("DDPRUN_CUDA_OWN_POOL", "1", 1);
  setenv("DDPRUN_CUDNN_BN_FUSION", "1", 1);
  setenv("DDPRUN_CUDA_ALLOCATOR", "async", 1);
  setenv("DDPRUN_CUDA_FUSED_STEM", "1", 1);
  setenv("DDPRUN_CUDA_BN_FOLD", "1", 1);
  setenv("DDPRUN_CUDA_GRAPH", "1", 1);
  setenv("DDPRUN_CUDA_RECOMPUTE", "1", 1);
  const CudaBackendOptions got =
      withEnvSwitches({.activations16 = true, .ourBatchNorm = true});
  EXPECT_TRUE(got.deterministic);
  EXPECT_FALSE(got.activations16);
  EXPECT_FALSE(got.ourBatchNorm);
  EXPECT_EQ(got.graphConv, CudaBackendOptions::GraphConv::kAll);
  EXPECT_TRUE(got.ownPool);
  EXPECT_TRUE(got.cudnnBnFusion);
  EXPECT_TRUE(got.fusedStem);
  EXPECT_TRUE(got.bnFold);
  EXPECT_TRUE(got.cudaGraph);
  EXPECT_TRUE(got.recompute);
  EXPECT_EQ(got.memory, CudaBackendOptions::Memory::kAsync);
  setenv("DDPRUN_CUDA_ALLOCATOR", "caching", 1);
  EXPECT_EQ(withEnvSwitches({.memory = CudaBackendOptions::Memory::kAsync}).memory,
            CudaBackendOptions::Memory::kCaching);
}

TEST_F(EnvSwitches, AMalformedOneNamesItself) {
  setenv("DDPRUN_CUDA_ALLOCATOR", "pooled", 1);
  try {
    withEnvSwitches({});
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(e.message().find("DDPRUN_CUDA_ALLOCATOR='pooled'"), std::string::npos)
        << e.message();
    EXPECT_NE(e.message().find("caching (the default) or async"), std::string::npos);
  }
  unsetenv("DDPRUN_CUDA_ALLOCATOR");
  setenv("DDPRUN_CUDNN_GRAPH", "3", 1);
  EXPECT_THROW(withEnvSwitches({}), InvalidArgument);
  unsetenv("DDPRUN_CUDNN_GRAPH");
  setenv("DDPRUN_CUDA_BN_FOLD", "2", 1);
  EXPECT_THROW(withEnvSwitches({}), InvalidArgument);
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
