// The bundled models: a sequence of layers made by a Backend, with
// parameters registered in model order under PyTorch's state_dict names, so
// checkpoints load into the reference modules of examples/pytorch/lenet.py.
//
//   mlp       flatten, fc1 784-256, relu, fc2 256-256, relu, fc3 256-10
//   lenet     conv1 1-6 5x5 pad 2, relu, pool 2, conv2 6-16 5x5, relu, pool 2,
//             flatten, fc1 400-120, relu, fc2 120-84, relu, fc3 84-10
//   lenet-bn  lenet with bn1/bn2 (BatchNorm2d) after conv1/conv2
//
// Thread-safety: a Model belongs to one training thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/train/layers.h"

namespace ddprun::train {

class Model {
 public:
  static const std::vector<std::string>& names();
  // Throws InvalidArgument listing the choices for an unknown name.
  // `syncBn`: batch norm layers synchronise statistics over this group.
  static std::unique_ptr<Model> create(const std::string& name, Backend& backend,
                                       runtime::ProcessGroup* syncBn = nullptr);

  const std::string& name() const { return name_; }
  // Per-sample input shape, e.g. {1, 28, 28}.
  const Shape& inputShape() const { return inputShape_; }
  const std::vector<Param*>& params() const { return params_; }
  const std::vector<Buffer*>& buffers() const { return buffers_; }
  size_t numParameters() const;  // elements

  // PyTorch's default initialisation drawn from `rng`, in parameter order:
  // weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)); batch norm weight
  // 1, bias 0.
  void initialize(Rng& rng);
  // Runs every layer; returns the logits [N, classes] (valid until the next
  // forward).
  const Tensor& forward(const Tensor& x, bool training);
  // Backward from dL/dlogits through every layer, last first; after a
  // layer's backward, `ready(i)` is called for each of its parameters (index
  // into params()): the reducer's hook.
  void backward(const Tensor& dlogits, const std::function<void(size_t)>& ready);

 private:
  Model(std::string name, Shape input) : name_(std::move(name)), inputShape_(std::move(input)) {}
  void add(std::unique_ptr<Layer> layer);

  std::string name_;
  Shape inputShape_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::vector<size_t>> layerParams_;  // param indices per layer
  std::vector<Param*> params_;
  std::vector<Buffer*> buffers_;
  std::vector<Tensor> acts_;   // acts_[i] = input of layer i; acts_.back() = logits
  std::vector<Tensor> grads_;  // grads_[i] = dL/d acts_[i]
};

}  // namespace ddprun::train
