// What --device auto|cuda checks before it loads a CUDA library
// (backend_choice.h, CudaProbes): the order of the checks against fakes, the
// one cause each message names, and on this machine that a hidden or absent
// GPU maps no CUDA library into the process.
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cuda_plugin.h"
#include "ddprun/common/error.h"
#include "ddprun/common/plugin.h"
#include "ddprun/train/backend_choice.h"

namespace ddprun::train {
namespace {

constexpr const char* kNoLibcuda = "libcuda.so.1 not found by the dynamic loader";
constexpr const char* kNoCudnn =
    "libcudnn.so.9: cannot open shared object file: No such file or directory";

// A machine described by what each check answers; `calls` records the order.
struct FakeMachine {
  std::string missing{};
  std::optional<std::string> visible{};
  std::string driver{};
  CudaProbes::DriverDevices devices{.count = 2};
  std::string backend{};
  int runtime = 2;
  std::vector<std::string> calls{};

  DeviceInventory probe() {
    CudaProbes p;
    p.pluginMissing = [this] { return calls.push_back("plugin"), missing; };
    p.visibleDevices = visible;
    p.loadDriver = [this] { return calls.push_back("libcuda"), driver; };
    p.driverDevices = [this] { return calls.push_back("cuInit"), devices; };
    p.loadBackend = [this] { return calls.push_back("backend"), backend; };
    p.runtimeDevices = [this] { return calls.push_back("runtime"), runtime; };
    p.driverGpus = [] { return 0; };
    return probeDevices(p);
  }
};

using Calls = std::vector<std::string>;

TEST(CudaProbe, ChecksRunCheapestFirstAndStopAtTheFirstThatFails) {
  FakeMachine cpuOnly{.missing =
                          "libddprun_train_cuda.so is not installed (looked in /x)"};
  EXPECT_EQ(cpuOnly.probe().cause, CudaCause::kNotInstalled);
  EXPECT_EQ(cpuOnly.calls, Calls{"plugin"});

  FakeMachine hidden{.visible = "-1"};
  EXPECT_EQ(hidden.probe().cause, CudaCause::kHidden);
  EXPECT_EQ(hidden.calls, Calls{"plugin"});  // not even libcuda

  FakeMachine noDriver{.driver = kNoLibcuda};
  const DeviceInventory nd = noDriver.probe();
  EXPECT_EQ(nd.cause, CudaCause::kNoDriver);
  EXPECT_EQ(nd.detail, kNoLibcuda);
  EXPECT_EQ(noDriver.calls, (Calls{"plugin", "libcuda"}));  // the backend is never loaded

  FakeMachine broken{.devices = {.error = "cuInit: CUDA_ERROR_STUB_LIBRARY (stub)"}};
  EXPECT_EQ(broken.probe().cause, CudaCause::kDriverFailed);
  EXPECT_EQ(broken.calls, (Calls{"plugin", "libcuda", "cuInit"}));

  FakeMachine none{.visible = "7", .devices = {.count = 0}};
  EXPECT_EQ(none.probe().cause, CudaCause::kNoDevice);
  EXPECT_EQ(none.calls, (Calls{"plugin", "libcuda", "cuInit"}));

  FakeMachine noCudnn{.backend = kNoCudnn};
  const DeviceInventory nc = noCudnn.probe();
  EXPECT_EQ(nc.cause, CudaCause::kBackendUnusable);
  EXPECT_EQ(nc.gpus, 2);  // the driver's count
  EXPECT_EQ(noCudnn.calls, (Calls{"plugin", "libcuda", "cuInit", "backend"}));

  FakeMachine oldDriver{.runtime = 0};
  EXPECT_EQ(oldDriver.probe().cause, CudaCause::kRuntimeNoDevice);

  FakeMachine gpu{.devices = {.count = 8},
                  .runtime = 4};  // CUDA_VISIBLE_DEVICES honoured by both
  const DeviceInventory ok = gpu.probe();
  EXPECT_EQ(ok.cause, CudaCause::kUsable);
  EXPECT_EQ(ok.gpus, 4);
  EXPECT_EQ(gpu.calls, (Calls{"plugin", "libcuda", "cuInit", "backend", "runtime"}));
}

std::string refusal(const DeviceInventory& inv) {
  try {
    decideDevice(DeviceChoice::kCuda, Precision::kFp32, inv);
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "";
}

std::string notice(const DeviceInventory& inv) {
  return decideDevice(DeviceChoice::kAuto, Precision::kFp32, inv).notice;
}

TEST(CudaProbe, TheMessageNamesExactlyTheCauseFound) {
  const DeviceInventory hidden{.cause = CudaCause::kHidden, .visibleDevices = ""};
  EXPECT_EQ(notice(hidden),
            "--device auto: training on the CPU (no CUDA GPU is visible: "
            "CUDA_VISIBLE_DEVICES=\"\" "
            "hides every GPU)");
  EXPECT_EQ(
      refusal(hidden),
      "--device cuda: no CUDA GPU is visible: CUDA_VISIBLE_DEVICES=\"\" hides every GPU; "
      "unset CUDA_VISIBLE_DEVICES or set it to the GPUs to use; or use --device cpu");

  const DeviceInventory noDriver{.cause = CudaCause::kNoDriver, .detail = kNoLibcuda};
  EXPECT_EQ(
      notice(noDriver),
      std::string("--device auto: training on the CPU (no CUDA GPU is visible: no NVIDIA "
                  "driver on this machine (") +
          kNoLibcuda + "))");
  EXPECT_EQ(
      refusal(noDriver),
      std::string(
          "--device cuda: no CUDA GPU is visible: no NVIDIA driver on this machine (") +
          kNoLibcuda +
          "); on a machine with an NVIDIA GPU, install the NVIDIA driver; or use "
          "--device cpu");

  const DeviceInventory failed{
      .cause = CudaCause::kDriverFailed,
      .detail = "cuInit: CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (mismatch)"};
  EXPECT_EQ(notice(failed),
            "--device auto: training on the CPU (no CUDA GPU is visible: the NVIDIA "
            "driver does not "
            "start (cuInit: CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (mismatch)))");

  const DeviceInventory noDevice{.cause = CudaCause::kNoDevice};
  EXPECT_EQ(
      notice(noDevice),
      "--device auto: training on the CPU (no CUDA GPU is visible: the NVIDIA driver "
      "finds none)");
  const DeviceInventory noneOfThese{.cause = CudaCause::kNoDevice, .visibleDevices = "7"};
  EXPECT_EQ(
      refusal(noneOfThese),
      "--device cuda: no CUDA GPU is visible: the NVIDIA driver finds none with "
      "CUDA_VISIBLE_DEVICES=\"7\"; check CUDA_VISIBLE_DEVICES against nvidia-smi -L; or "
      "use --device cpu");

  const DeviceInventory noCudnn{
      .cause = CudaCause::kBackendUnusable, .detail = kNoCudnn, .gpus = 2};
  const std::string n = notice(noCudnn);
  EXPECT_NE(n.find(std::string(
                       "2 NVIDIA GPUs are present but the CUDA backend does not load: ") +
                   kNoCudnn +
                   "; to use them: install NVIDIA's package that has it: pip install "
                   "nvidia-cudnn-cu13"),
            std::string::npos)
      << n;

  const DeviceInventory old{.cause = CudaCause::kRuntimeNoDevice, .gpus = 1};
  EXPECT_NE(refusal(old).find(
                "no CUDA GPU is visible: the NVIDIA driver finds 1 GPU but the CUDA "
                "runtime none"),
            std::string::npos)
      << refusal(old);
  EXPECT_NE(refusal(old).find("update the NVIDIA driver"), std::string::npos)
      << refusal(old);

  // Each names only its own cause, not a list of the possible ones.
  for (const DeviceInventory& inv : {hidden, noDriver, failed, noDevice}) {
    EXPECT_EQ(notice(inv).find("backend"), std::string::npos) << notice(inv);
    EXPECT_EQ(notice(inv).find("no device, no driver"), std::string::npos) << notice(inv);
  }
  EXPECT_EQ(notice(noDriver).find("CUDA_VISIBLE_DEVICES"), std::string::npos);
  EXPECT_EQ(notice(noDevice).find("CUDA_VISIBLE_DEVICES"), std::string::npos);
}

TEST(CudaProbe, WhichCudaVisibleDevicesHideEveryGpu) {
  for (const char* v : {"", " ", "-1", "-1,0", "none", "NoDevFiles", ",0"})
    EXPECT_TRUE(visibleDevicesHideAll(v)) << '"' << v << '"';
  for (const char* v :
       {"0", "1,2", " 3 ,4", "GPU-8f6c1f5e-0000", "MIG-GPU-1/2/3", "0,-1"})
    EXPECT_FALSE(visibleDevicesHideAll(v)) << '"' << v << '"';
}

// The CUDA libraries mapped into this process, by file name.
std::vector<std::string> cudaLibrariesMapped(bool withDriver) {
  std::vector<std::string> found;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  std::vector<std::string> names = {
      "libcudart",           "libcublas", "libcudnn", "libnccl", "libddprun_runtime_cuda",
      "libddprun_train_cuda"};
  if (withDriver) names.push_back("libcuda.so");
  while (std::getline(maps, line))
    for (const auto& n : names)
      if (line.find("/" + n) != std::string::npos)
        found.push_back(line.substr(line.rfind(' ') + 1));
  return found;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

TEST(CudaProbe, HiddenDevicesMapNoCudaLibraryAtAll) {
  if (!cudaLibrariesMapped(true).empty())
    GTEST_SKIP() << "an earlier test in this process loaded CUDA: run this test alone "
                    "(ctest does)";
  ::setenv("CUDA_VISIBLE_DEVICES", "", 1);
  const DeviceInventory inv = probeDevices(systemCudaProbes());
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  if (inv.cause == CudaCause::kNotInstalled)
    GTEST_SKIP() << "this build has no CUDA plugin (DDPRUN_CUDA off): " << inv.detail;
  EXPECT_EQ(inv.cause, CudaCause::kHidden);
  EXPECT_EQ(joined(cudaLibrariesMapped(true)), "") << "mapped although no GPU is visible";
}

TEST(CudaProbe, WithoutADriverOrGpuNoCudaLibraryIsLoaded) {
  if (!cudaLibrariesMapped(true).empty())
    GTEST_SKIP() << "an earlier test in this process loaded CUDA: run this test alone "
                    "(ctest does)";
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  const DeviceInventory inv = probeDevices(DeviceChoice::kAuto);
  if (inv.cause == CudaCause::kNotInstalled)
    GTEST_SKIP() << "this build has no CUDA plugin (DDPRUN_CUDA off): " << inv.detail;
  if (inv.cause == CudaCause::kUsable || inv.cause == CudaCause::kBackendUnusable ||
      inv.cause == CudaCause::kRuntimeNoDevice)
    GTEST_SKIP()
        << "this machine has an NVIDIA driver that finds a GPU: loading the backend is "
           "right here";
  // No driver: not even libcuda. A driver without a GPU: libcuda only.
  const bool noDriver = inv.cause == CudaCause::kNoDriver;
  EXPECT_EQ(joined(cudaLibrariesMapped(noDriver)), "") << "cause found: " << inv.detail;
  if (noDriver) {
    EXPECT_NE(inv.detail.find("libcuda.so.1"), std::string::npos) << inv.detail;
  }
  const DeviceDecision d = decideDevice(DeviceChoice::kAuto, Precision::kFp32, inv);
  EXPECT_FALSE(d.cuda);
  EXPECT_EQ(d.notice.find("backend"), std::string::npos) << d.notice;
}

TEST(CudaProbe, TheBuiltPluginsCarryThisBuildsId) {
  const plugin::Found f =
      plugin::find(plugin::defaultSearchDirs(), internal::kCudaBackendPluginFile);
  if (f.path.empty())
    GTEST_SKIP() << "this build has no CUDA plugin (DDPRUN_CUDA off): " << f.error;
  const plugin::Inspection train =
      plugin::inspect(f.path, internal::kCudaBackendPluginEntry);
  EXPECT_TRUE(train.ok) << train.error;
  EXPECT_EQ(train.buildId, plugin::buildId());
  const plugin::Found rt =
      plugin::find(plugin::defaultSearchDirs(), "libddprun_runtime_cuda.so");
  ASSERT_NE(rt.path, "") << rt.error;
  const plugin::Inspection runtime =
      plugin::inspect(rt.path, "ddprun_runtime_cuda_plugin");
  EXPECT_TRUE(runtime.ok) << runtime.error;
  EXPECT_EQ(runtime.buildId, plugin::buildId());
}

}  // namespace
}  // namespace ddprun::train
