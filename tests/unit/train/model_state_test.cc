// The end of a run (saveAndHashModel) on a device backend: each parameter and
// buffer is downloaded once per save, whether the model is also written to
// --save or only hashed (before issue 26 the trainer downloaded everything
// twice: one snapshot for the file, another for params_sha256). The device is
// faked: the model's tensors are re-tagged as CUDA views of their host memory,
// and the backend copies and counts the downloads.
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "ddprun/common/error.h"
#include "ddprun/train/checkpoint.h"
#include "ddprun/train/model_state.h"
#include "ddprun/train/models.h"
#include "temp_dir.h"

namespace ddprun::train {
namespace {

// A device backend of which only host copies are used: download() copies
// (the "device" memory is host memory) and counts per source pointer;
// everything else is not expected and throws.
class DownloadCountingBackend final : public Backend {
 public:
  std::map<const float*, int> downloads;
  int total() const {
    int n = 0;
    for (const auto& [p, k] : downloads) n += k;
    return n;
  }

  void download(const float* src, float* host, size_t n) override {
    ++downloads[src];
    std::memcpy(host, src, n * sizeof(float));
  }
  Device device() const override { return Device::kCuda; }
  Allocator& allocator() override { unexpected(); }
  std::string describe() const override { return "download-counting fake device"; }
  std::unique_ptr<Layer> linear(std::string, int64_t, int64_t) override { unexpected(); }
  std::unique_ptr<Layer> conv2d(std::string, const Conv2dSpec&) override { unexpected(); }
  std::unique_ptr<Layer> maxPool2d(std::string, const Pool2dSpec&) override { unexpected(); }
  std::unique_ptr<Layer> globalAvgPool(std::string) override { unexpected(); }
  std::unique_ptr<Layer> relu(std::string) override { unexpected(); }
  std::unique_ptr<Layer> batchNorm2d(std::string, int64_t, runtime::ProcessGroup*) override {
    unexpected();
  }
  double crossEntropy(const Tensor&, const int32_t*, Tensor*, int64_t*, float) override {
    unexpected();
  }
  void sgdUpdate(float*, const float*, float*, size_t, float, float, float, bool, bool) override {
    unexpected();
  }
  void adamUpdate(float*, const float*, float*, float*, size_t, float, float, float, float,
                  float, int64_t) override {
    unexpected();
  }
  void add(const Tensor&, const Tensor&, Tensor&) override { unexpected(); }
  void zero(Tensor&) override { unexpected(); }
  void copy(const Tensor&, Tensor&) override { unexpected(); }
  void resizeBilinear(const Tensor&, int64_t, int64_t, Tensor&) override { unexpected(); }
  bool scaleAndCheckFinite(float*, size_t, float) override { unexpected(); }
  void upload(const float*, float*, size_t) override { unexpected(); }
  void synchronize() override {}
  std::unique_ptr<runtime::GradientMemory> gradientMemory(runtime::ProcessGroup&) override {
    unexpected();
  }

 private:
  [[noreturn]] static void unexpected() {
    DDPRUN_THROW(InvalidArgument, "the end of a run only downloads");
  }
};

// A LeNet-BN built and initialised on the CPU, its parameters and buffers then
// re-tagged as device tensors (views of the same host memory, kept alive by
// `host`), the batch norms' step counters sharing one storage as on CUDA.
struct DeviceModel {
  std::unique_ptr<Backend> cpu = makeCpuBackend(1);
  std::unique_ptr<Model> model = Model::create("lenet-bn", *cpu);
  std::vector<Tensor> host;
  size_t distinct = 0;  // device storages: the downloads one save needs

  DeviceModel() {
    Rng rng(3);
    model->initialize(rng);
    float* counter = nullptr;
    for (Param* p : model->params()) retag(p->value);
    for (Buffer* b : model->buffers()) {
      if (b->isCount && counter) {
        b->value = Tensor::view(counter, b->value.shape(), Device::kCuda);
        continue;
      }
      retag(b->value);
      if (b->isCount) counter = b->value.data();
    }
  }
  void retag(Tensor& t) {
    host.push_back(t);
    t = Tensor::view(t.data(), t.shape(), Device::kCuda);
    ++distinct;
  }
};

TEST(SaveAndHashModel, DownloadsEachDeviceTensorOncePerSave) {
  testing::TempDir dir;
  DeviceModel m;
  ASSERT_GT(m.model->buffers().size(), 3u);  // two batch norms: a shared counter
  DownloadCountingBackend dev;
  const std::string path = dir.file("final.safetensors");
  const std::string hash = saveAndHashModel(*m.model, dev, path, {{"model", "lenet-bn"}});
  EXPECT_EQ(dev.total(), static_cast<int>(m.distinct));
  for (const auto& [src, n] : dev.downloads) EXPECT_EQ(n, 1) << "a tensor downloaded " << n << "x";

  // What was written and hashed is the model's state.
  HostSnapshot reference(*m.cpu);  // identity copies
  EXPECT_EQ(hash, modelSha256(*m.model, reference));
  const SafeTensors st = loadSafetensors(path);
  for (Param* p : m.model->params()) {
    const LoadedTensor* t = st.find(p->name);
    ASSERT_NE(t, nullptr) << p->name;
    ASSERT_EQ(t->bytes.size(), p->value.bytes());
    EXPECT_EQ(std::memcmp(t->bytes.data(), p->value.data(), p->value.bytes()), 0) << p->name;
  }
}

// The ranks other than 0 write nothing and only hash: once each, too.
TEST(SaveAndHashModel, HashOnlyDownloadsEachDeviceTensorOnce) {
  DeviceModel m;
  DownloadCountingBackend dev;
  const std::string hash = saveAndHashModel(*m.model, dev, "", {});
  EXPECT_EQ(dev.total(), static_cast<int>(m.distinct));
  HostSnapshot reference(*m.cpu);  // identity copies
  EXPECT_EQ(hash, modelSha256(*m.model, reference));
}

// A snapshot reads a CPU tensor in place and never downloads it.
TEST(HostSnapshot, ReadsHostTensorsInPlace) {
  DownloadCountingBackend dev;
  Tensor t({4});
  HostSnapshot snap(dev);
  EXPECT_EQ(snap.read(t), t.data());
  EXPECT_EQ(dev.total(), 0);
}

}  // namespace
}  // namespace ddprun::train
