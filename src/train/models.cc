#include "ddprun/train/models.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "ddprun/common/error.h"
#include "resnet.h"

namespace ddprun::train {

const std::vector<std::string>& Model::names() {
  static const std::vector<std::string> n = {"mlp", "lenet", "lenet-bn", "resnet18"};
  return n;
}

const std::vector<std::string>& Model::stems() {
  static const std::vector<std::string> s = {"imagenet", "cifar"};
  return s;
}

namespace {

std::string choices(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& n : v) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

std::unique_ptr<Model> Model::create(const std::string& name, Backend& be,
                                     runtime::ProcessGroup* syncBn, const ModelOptions& o) {
  const auto& known = names();
  if (std::find(known.begin(), known.end(), name) == known.end())
    DDPRUN_THROW(InvalidArgument, "unknown model '", name, "': choose one of ", choices(known));
  if (o.numClasses < 2)
    DDPRUN_THROW(InvalidArgument, "a model needs at least 2 classes (got ", o.numClasses, ")");
  const int64_t k = o.numClasses;
  if (name == "resnet18") {
    std::unique_ptr<Model> m(new Model(name, {}, be));
    m->addResNet18(syncBn, o);
    return m;
  }
  if (o.imageSize != 0 && o.imageSize != 28)
    DDPRUN_THROW(InvalidArgument, "model ", name, " takes 28x28 images (got image size ",
                 o.imageSize, ")");
  std::unique_ptr<Model> m(new Model(name, {1, 28, 28}, be));
  // flatten, then fc1 .. fc3 over widths[0] -> widths[1] -> widths[2] -> k,
  // the first two followed by relu<firstRelu>, relu<firstRelu + 1>.
  const auto addHead = [&](const std::array<int64_t, 3>& widths, int firstRelu) {
    m->add(be.flatten("flatten"));
    for (int j = 0; j < 3; ++j) {
      const std::string n = std::to_string(j + 1);
      m->add(be.linear("fc" + n, widths[j], j < 2 ? widths[j + 1] : k));
      if (j < 2) m->add(be.relu("relu" + std::to_string(firstRelu + j)));
    }
  };
  if (name == "mlp") {
    addHead({784, 256, 256}, 1);
  } else {  // lenet, lenet-bn
    const bool bn = name == "lenet-bn";
    // Two blocks of conv (5x5; the first padded 2) [+ bn] + relu + 2x2 max pool.
    struct Block {
      int64_t in, out;
      int pad;
    };
    int i = 0;
    for (const Block b : {Block{1, 6, 2}, Block{6, 16, 0}}) {
      const std::string n = std::to_string(++i);
      m->add(be.conv2d("conv" + n, b.in, b.out, 5, b.pad));
      if (bn) m->add(be.batchNorm2d("bn" + n, b.out, syncBn));
      m->add(be.relu("relu" + n));
      m->add(be.maxPool2d("pool" + n, 2));
    }
    addHead({400, 120, 84}, 3);
  }
  return m;
}

// torchvision.models.resnet18's layers and names, with a choice of stem.
void Model::addResNet18(runtime::ProcessGroup* syncBn, const ModelOptions& o) {
  const auto& known = stems();
  if (std::find(known.begin(), known.end(), o.stem) == known.end())
    DDPRUN_THROW(InvalidArgument, "unknown resnet18 stem '", o.stem, "': choose one of ",
                 choices(known));
  // Padding lets every layer take any side >= 1 (down to 1x1 from layer4 on).
  if (o.imageSize < 0)
    DDPRUN_THROW(InvalidArgument, "resnet18's image size must be positive (got ", o.imageSize,
                 ")");
  const int64_t side = o.imageSize == 0 ? 32 : o.imageSize;
  inputShape_ = {3, side, side};
  kaimingConvs_ = true;
  Backend& be = backend_;
  if (o.stem == "imagenet") {
    add(be.conv2d("conv1", Conv2dSpec{3, 64, 7, 2, 3, false}));
  } else {
    add(be.conv2d("conv1", Conv2dSpec{3, 64, 3, 1, 1, false}));
  }
  // torchvision's bn1 and relu as one BatchNormAct (no parameters in the
  // ReLU: the state_dict's names do not change), which a device fuses: on
  // the H200 the separate 16-bit ReLU cost 0.5 ms of an 11 ms step.
  // With the ImageNet stem's max pool, a device may fuse all three
  // (batchNormActPool: the same names and arithmetic).
  std::unique_ptr<Layer> fused;
  if (o.stem == "imagenet")
    fused = be.batchNormActPool("bn1", "maxpool", 64, syncBn, Pool2dSpec{3, 2, 1});
  if (fused) {
    add(std::move(fused));
  } else {
    add(be.batchNormAct("bn1", 64, syncBn, false));
    if (o.stem == "imagenet") add(be.maxPool2d("maxpool", Pool2dSpec{3, 2, 1}));
  }
  int64_t in = 64;
  const int64_t widths[4] = {64, 128, 256, 512};
  for (int l = 0; l < 4; ++l) {
    const std::string layer = "layer" + std::to_string(l + 1);
    add(makeBasicBlock(be, layer + ".0", in, widths[l], l == 0 ? 1 : 2, syncBn));
    add(makeBasicBlock(be, layer + ".1", widths[l], widths[l], 1, syncBn));
    in = widths[l];
  }
  add(be.globalAvgPool("avgpool"));
  add(be.linear("fc", 512, o.numClasses));
}

void Model::add(std::unique_ptr<Layer> layer) {
  std::vector<size_t> idx;
  for (Param* p : layer->params()) {
    idx.push_back(params_.size());
    params_.push_back(p);
  }
  for (Buffer* b : layer->buffers()) buffers_.push_back(b);
  layerParams_.push_back(std::move(idx));
  layers_.push_back(std::move(layer));
  acts_.resize(layers_.size() + 1);
  grads_.resize(layers_.size() + 1);
}

size_t Model::numParameters() const {
  size_t n = 0;
  for (const Param* p : params_) n += static_cast<size_t>(p->value.numel());
  return n;
}

void Model::initialize(Rng& rng) {
  float bound = 0.0f;
  std::vector<float> host;
  for (Param* p : params_) {
    const Shape& s = p->value.shape();
    const int64_t n = p->value.numel();
    host.assign(static_cast<size_t>(n), 0.0f);
    const bool isWeight = p->name.size() > 7 && p->name.ends_with(".weight");
    if (s.size() == 1 && isWeight) {  // batch norm: weight 1 (bias follows: 0)
      bound = 0.0f;
      std::fill(host.begin(), host.end(), 1.0f);
    } else if (s.size() == 4 && kaimingConvs_) {  // N(0, 2 / fan_out), no bias follows
      bound = 0.0f;
      const float sd = std::sqrt(2.0f / static_cast<float>(s[0] * s[2] * s[3]));
      for (float& v : host) v = sd * rng.normal();
    } else {
      if (s.size() >= 2) bound = 1.0f / std::sqrt(static_cast<float>(n / s[0]));  // 1/sqrt(fan_in)
      for (float& v : host) v = bound == 0.0f ? 0.0f : rng.uniform(-bound, bound);
    }
    backend_.upload(host.data(), p->value.data(), host.size());
  }
}

const Tensor& Model::forward(const Tensor& x, bool training) {
  const bool release = !training && backend_.releasesActivations();
  acts_[0] = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    // ReLU after a layer whose backward does not read its output (conv,
    // batch norm, linear) overwrites that output: one activation less.
    if (i > 0 && layers_[i]->worksInPlace() && !layers_[i - 1]->backwardReadsOutput())
      acts_[i + 1] = acts_[i];
    if (observer_) observer_(i, false, false);
    layers_[i]->forward(acts_[i], acts_[i + 1], training);
    if (observer_) observer_(i, false, true);
    // No backward follows evaluation: the input is dead once read (the
    // storage lives on while an in-place output shares it).
    if (release) acts_[i] = Tensor();
  }
  return acts_.back();
}

void Model::backward(const Tensor& dlogits, const std::function<void(size_t)>& ready) {
  // On a device, each dL/d(activation) and each activation is given back to
  // the caching allocator once nothing later reads it: layer i's backward is
  // the last reader of its output acts_[i + 1] (layer i + 1's backward, which
  // read it as its input, ran before) and of dL/d acts_[i + 1]. So backward
  // holds the activations below the current layer and two gradients, not
  // every activation of the step. On the CPU both are kept (host allocations
  // are not cached).
  const bool release = backend_.releasesActivations();
  grads_.back() = dlogits;
  for (size_t i = layers_.size(); i-- > 0;) {
    if (observer_) observer_(i, true, false);
    layers_[i]->backward(acts_[i], acts_[i + 1], grads_[i + 1], i == 0 ? nullptr : &grads_[i]);
    if (observer_) observer_(i, true, true);
    if (release) {
      grads_[i + 1] = Tensor();
      acts_[i + 1] = Tensor();
    }
    if (ready)
      for (size_t p : layerParams_[i]) ready(p);
  }
  if (release) acts_[0] = Tensor();  // the input batch: the feed keeps its own handle
}

}  // namespace ddprun::train
