// Optimizers with torch.optim's update rules, running on the Backend's
// kernels: SGD (momentum, dampening 0, weight decay added to the gradient)
// and Adam (betas 0.9/0.999, eps 1e-8, no amsgrad).
//
// The state (momentum buffers; Adam's moments and step count) is exposed by
// name for checkpoints: "optim.<param>.momentum_buffer",
// "optim.<param>.exp_avg", "optim.<param>.exp_avg_sq".
// Thread-safety: one training thread.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddprun/train/layers.h"

namespace ddprun::train {

struct OptimizerOptions {
  std::string kind = "sgd";  // sgd | adam
  float lr = 0.05f;
  float momentum = 0.9f;
  float weightDecay = 0.0f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
};

class Optimizer {
 public:
  static const std::vector<std::string>& kinds();
  // Throws InvalidArgument listing the choices for an unknown kind.
  static std::unique_ptr<Optimizer> create(const OptimizerOptions& o, Backend& be,
                                           std::vector<Param*> params);
  virtual ~Optimizer() = default;
  // One update from each Param's grad.
  virtual void step() = 0;
  void setLr(float lr) { opts_.lr = lr; }
  float lr() const { return opts_.lr; }
  int64_t steps() const { return steps_; }
  void setSteps(int64_t s) { steps_ = s; }
  // Named state tensors (see the file comment), for checkpoints.
  std::vector<std::pair<std::string, Tensor*>> state();

 protected:
  Optimizer(const OptimizerOptions& o, Backend& be, std::vector<Param*> params)
      : opts_(o), be_(be), params_(std::move(params)) {}
  Tensor& slot(size_t param, const std::string& suffix);

  OptimizerOptions opts_;
  Backend& be_;
  std::vector<Param*> params_;
  int64_t steps_ = 0;
  std::vector<std::pair<std::string, Tensor>> state_;  // created lazily, kept in order
};

}  // namespace ddprun::train
