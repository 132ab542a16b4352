// The bundled models: a sequence of layers made by a Backend, with
// parameters registered in model order under PyTorch's state_dict names, so
// checkpoints load into the reference modules of examples/pytorch/lenet.py.
//
//   mlp       flatten, fc1 784-256, relu, fc2 256-256, relu, fc3 256-10
//   lenet     conv1 1-6 5x5 pad 2, relu, pool 2, conv2 6-16 5x5, relu, pool 2,
//             flatten, fc1 400-120, relu, fc2 120-84, relu, fc3 84-10
//   lenet-bn  lenet with bn1/bn2 (BatchNorm2d) after conv1/conv2
//   resnet18  torchvision's resnet18 (state_dict names included) on 3xSxS
//             images: stem, layer1..layer4 of two BasicBlocks each (64, 128,
//             256, 512 channels, strides 1, 2, 2, 2), avgpool, fc 512-classes.
//             Stem "imagenet": conv1 7x7/2 pad 3, bn1, relu, maxpool 3/2 pad 1
//             (torchvision's); "cifar": conv1 3x3/1 pad 1, bn1, relu (no
//             maxpool, for 32x32 images). Convolutions have no bias.
//
// The model reaches its memory only through the Backend (initialisation
// draws on the host and uploads), so it runs on any backend.
//
// Thread-safety: a Model belongs to one training thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/train/layers.h"

namespace ddprun::train {

// What a model is built for. The defaults build the 28x28 models as they
// always were.
struct ModelOptions {
  int64_t numClasses = 10;        // outputs of the last layer, >= 2
  std::string stem = "imagenet";  // resnet18 only: one of Model::stems()
  int64_t imageSize = 0;          // resnet18's input side (0: 32); the 28x28 models: 0 or 28
};

class Model {
 public:
  static const std::vector<std::string>& names();
  static const std::vector<std::string>& stems();  // resnet18's
  // Throws InvalidArgument listing the choices for an unknown name or stem,
  // and naming the option that does not fit (fewer than 2 classes, an image
  // size the model cannot take). `syncBn`: batch norm layers synchronise
  // statistics over this group. The backend must outlive the model.
  static std::unique_ptr<Model> create(const std::string& name, Backend& backend,
                                       runtime::ProcessGroup* syncBn = nullptr,
                                       const ModelOptions& options = {});

  const std::string& name() const { return name_; }
  // Per-sample input shape, e.g. {1, 28, 28}.
  const Shape& inputShape() const { return inputShape_; }
  const std::vector<Param*>& params() const { return params_; }
  const std::vector<Buffer*>& buffers() const { return buffers_; }
  size_t numParameters() const;  // elements

  // PyTorch's default initialisation drawn from `rng`, in parameter order:
  // weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)); batch norm weight
  // 1, bias 0. resnet18 as torchvision: convolutions
  // kaiming_normal_(mode="fan_out", nonlinearity="relu"), i.e.
  // N(0, 2 / (out channels * k * k)); fc the default above. Values are drawn
  // on the host and uploaded.
  void initialize(Rng& rng);
  // Runs every layer; returns the logits [N, classes] (valid until the next
  // forward). Evaluation (training false) on a backend that releases
  // activations keeps only the last layer's output.
  const Tensor& forward(const Tensor& x, bool training);
  // Backward from dL/dlogits through every layer, last first; after a
  // layer's backward, `ready(i)` is called for each of its parameters (index
  // into params()): the reducer's hook. On a backend that releases
  // activations (Backend::releasesActivations), each layer's output and the
  // gradient flowing into it are given back once its backward has run, so
  // the memory held shrinks as backward proceeds (as autograd frees saved
  // tensors); forward allocates them again.
  void backward(const Tensor& dlogits, const std::function<void(size_t)>& ready);

  // The top-level layers, in forward order (resnet18: conv1, bn1, relu,
  // maxpool, layer1.0, ..., layer4.1, avgpool, fc), for the profile.
  size_t numLayers() const { return layers_.size(); }
  const std::string& layerName(size_t i) const { return layers_.at(i)->name(); }
  // The profile's hook: called right before (end false) and right after (end
  // true) each top-level layer's forward (backward false) and backward
  // (backward true). Empty: none (the default).
  using LayerObserver = std::function<void(size_t layer, bool backward, bool end)>;
  void setObserver(LayerObserver observer) { observer_ = std::move(observer); }

 private:
  Model(std::string name, Shape input, Backend& backend)
      : name_(std::move(name)), inputShape_(std::move(input)), backend_(backend) {}
  void add(std::unique_ptr<Layer> layer);
  void addResNet18(runtime::ProcessGroup* syncBn, const ModelOptions& o);

  std::string name_;
  Shape inputShape_;
  Backend& backend_;
  bool kaimingConvs_ = false;  // resnet18's convolution initialisation
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::vector<size_t>> layerParams_;  // param indices per layer
  std::vector<Param*> params_;
  std::vector<Buffer*> buffers_;
  std::vector<Tensor> acts_;   // acts_[i] = input of layer i; acts_.back() = logits
  std::vector<Tensor> grads_;  // grads_[i] = dL/d acts_[i]
  LayerObserver observer_;
};

}  // namespace ddprun::train
