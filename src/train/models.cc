#include "ddprun/train/models.h"

#include <cmath>

#include "ddprun/common/error.h"

namespace ddprun::train {

const std::vector<std::string>& Model::names() {
  static const std::vector<std::string> n = {"mlp", "lenet", "lenet-bn"};
  return n;
}

std::unique_ptr<Model> Model::create(const std::string& name, Backend& be,
                                     runtime::ProcessGroup* syncBn) {
  std::unique_ptr<Model> m(new Model(name, {1, 28, 28}));
  if (name == "mlp") {
    m->add(be.flatten("flatten"));
    m->add(be.linear("fc1", 784, 256));
    m->add(be.relu("relu1"));
    m->add(be.linear("fc2", 256, 256));
    m->add(be.relu("relu2"));
    m->add(be.linear("fc3", 256, 10));
  } else if (name == "lenet" || name == "lenet-bn") {
    const bool bn = name == "lenet-bn";
    m->add(be.conv2d("conv1", 1, 6, 5, 2));
    if (bn) m->add(be.batchNorm2d("bn1", 6, syncBn));
    m->add(be.relu("relu1"));
    m->add(be.maxPool2d("pool1", 2));
    m->add(be.conv2d("conv2", 6, 16, 5, 0));
    if (bn) m->add(be.batchNorm2d("bn2", 16, syncBn));
    m->add(be.relu("relu2"));
    m->add(be.maxPool2d("pool2", 2));
    m->add(be.flatten("flatten"));
    m->add(be.linear("fc1", 400, 120));
    m->add(be.relu("relu3"));
    m->add(be.linear("fc2", 120, 84));
    m->add(be.relu("relu4"));
    m->add(be.linear("fc3", 84, 10));
  } else {
    std::string choices;
    for (const auto& n : names()) choices += (choices.empty() ? "" : ", ") + n;
    DDPRUN_THROW(InvalidArgument, "unknown model '", name, "': choose one of ", choices);
  }
  return m;
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
  for (Param* p : params_) {
    const Shape& s = p->value.shape();
    float* d = p->value.data();
    const int64_t n = p->value.numel();
    const bool isWeight = p->name.size() > 7 && p->name.ends_with(".weight");
    if (s.size() == 1 && isWeight) {  // batch norm: weight 1 (bias follows: 0)
      bound = 0.0f;
      std::fill(d, d + n, 1.0f);
      continue;
    }
    if (s.size() >= 2) bound = 1.0f / std::sqrt(static_cast<float>(n / s[0]));  // 1/sqrt(fan_in)
    for (int64_t i = 0; i < n; ++i) d[i] = bound == 0.0f ? 0.0f : rng.uniform(-bound, bound);
  }
}

const Tensor& Model::forward(const Tensor& x, bool training) {
  acts_[0] = x;
  for (size_t i = 0; i < layers_.size(); ++i) layers_[i]->forward(acts_[i], acts_[i + 1], training);
  return acts_.back();
}

void Model::backward(const Tensor& dlogits, const std::function<void(size_t)>& ready) {
  grads_.back() = dlogits;
  for (size_t i = layers_.size(); i-- > 0;) {
    layers_[i]->backward(acts_[i], acts_[i + 1], grads_[i + 1], i == 0 ? nullptr : &grads_[i]);
    if (ready)
      for (size_t p : layerParams_[i]) ready(p);
  }
}

}  // namespace ddprun::train
