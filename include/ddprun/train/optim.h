// Optimizers with torch.optim's update rules, running on the Backend's
// kernels: SGD (momentum, dampening 0, weight decay added to the gradient,
// optionally Nesterov's momentum) and Adam (betas 0.9/0.999, eps 1e-8, no
// amsgrad).
//
// The state (momentum buffers; Adam's moments and step count) is exposed by
// name for checkpoints: "optim.<param>.momentum_buffer",
// "optim.<param>.exp_avg", "optim.<param>.exp_avg_sq".
//
// Memory. A step is one Backend::sgdStep/adamStep call (on a device: one
// multi-tensor launch). By default each parameter is updated where it lives,
// one chunk per parameter. adoptLayout() moves the parameter values and the
// state into flat buffers (one for the values, one per state kind) laid out
// in the reducer's bucket order, each Param::value and state tensor a view
// into them (as the gradients are views into the buckets); a step is then
// one chunk per bucket. While the layout is adopted the parameters' values
// are the optimizer's memory: its destructor gives every parameter its own
// copy back, so the model stays usable after it.
//
// Thread-safety: one training thread. The backend must outlive the optimizer.
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
  // SGD only: torch.optim.SGD(nesterov=True), the step w -= lr*(g' + momentum*buf)
  // with the same momentum buffer (kmath::sgdStep). Needs momentum != 0.
  // Not part of a checkpoint's identity: the buffer means the same with or
  // without it, so a run may resume with the other setting (as PyTorch's
  // optimizer state_dict loads into either), the steps after continuing
  // under the new rule.
  bool nesterov = false;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
};

// What is wrong with `o` as PyTorch would judge it, in one sentence naming
// the option, or "" when nothing is: an unknown kind; nesterov with momentum
// 0 (PyTorch: "Nesterov momentum requires a momentum and zero dampening") or
// with Adam (which has no Nesterov form). For flag parsing; Optimizer::create
// throws InvalidArgument with the same sentence.
std::string optimizerOptionsProblem(const OptimizerOptions& o);

class Optimizer {
 public:
  static const std::vector<std::string>& kinds();
  // Throws InvalidArgument listing the choices for an unknown kind, and for
  // any other optimizerOptionsProblem.
  static std::unique_ptr<Optimizer> create(const OptimizerOptions& o, Backend& be,
                                           std::vector<Param*> params);
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;
  // One update from each Param's grad.
  virtual void step() = 0;
  // The optimizer inside a CUDA graph of the step (Backend::capture). A
  // step recorded once and replayed: before the capture and before each
  // replay, stageStep() hands the backend this step's learning rate and step
  // count (Backend::stageOptimizerStep: what step() would pass); the capture
  // calls step() (which counts the step); each later replay is followed by
  // stepReplayed(), which counts it. The recorded launch keeps its chunks:
  // valid while the layout does not change (adoptLayout), which the trainer's
  // graph plan ties to the reducer's layout version.
  virtual void stageStep() = 0;
  void stepReplayed() { ++steps_; }
  void setLr(float lr) { opts_.lr = lr; }
  float lr() const { return opts_.lr; }
  int64_t steps() const { return steps_; }
  void setSteps(int64_t s) { steps_ = s; }
  // Named state tensors (see the file comment), for checkpoints. The same
  // names, shapes and order with or without adoptLayout(); the tensors are
  // read and written through their data pointers.
  std::vector<std::pair<std::string, Tensor*>> state();

  // Lays the values and the state out flat, bucket after bucket: `buckets`
  // lists, per gradient bucket, the indices of its parameters (into the
  // params given to create()) in memory order, as
  // runtime::Reducer::bucketParams(b) does; every parameter exactly once.
  // Call it with the gradients bound (each Param::grad a view into its
  // bucket): within a bucket the value and state offsets then mirror the
  // gradients' (padding between them included), so a bucket's parameters,
  // gradients and state are parallel contiguous arrays and one chunk covers
  // the bucket. Call it again after the reducer rebuilt its buckets
  // (layoutVersion() changed) and the gradients were re-bound: values and
  // state move to the new order unchanged. The copies run on the backend,
  // ordered with its other work. A step checks every parameter's pointers, so
  // a stale layout (a rebuild not followed by adoptLayout, a value replaced
  // from outside) costs only chunks, never correctness.
  // `weights16`: also keep a 16-bit copy of every parameter in the backend's
  // autocast type (bf16/fp16), written by each step in the same pass: see
  // weights16(). Throws InvalidArgument, before changing anything, when
  // `buckets` is not a partition of the parameters or when `weights16` is
  // asked of a backend that does not compute in bf16/fp16 (the CPU, CUDA in
  // fp32/tf32).
  void adoptLayout(const std::vector<std::vector<size_t>>& buckets, bool weights16 = false);
  bool flatLayout() const { return !groups_.empty(); }
  // Parameter i's 16-bit copy (bf16 or fp16 elements, value's shape), or
  // null without adoptLayout(..., true) or when its value is no longer the
  // optimizer's view. Current after each step() and adoptLayout(); after
  // anything else writes parameter values (a checkpoint or --init load, the
  // broadcast from rank 0), call refreshWeights16().
  const void* weights16(size_t param) const;
  // Rewrites every 16-bit copy from the values (on the backend, ordered with
  // its work). Nothing without 16-bit copies.
  void refreshWeights16();

 protected:
  Optimizer(const OptimizerOptions& o, Backend& be, std::vector<Param*> params)
      : opts_(o), be_(be), params_(std::move(params)) {}
  Tensor& slot(size_t param, const std::string& suffix);
  // The chunks of this step: one per bucket of the adopted layout (or per
  // run of parameters still in it), else one per parameter.
  const std::vector<Backend::OptimChunk>& chunks();

  OptimizerOptions opts_;
  Backend& be_;
  std::vector<Param*> params_;
  int64_t steps_ = 0;
  std::vector<std::pair<std::string, Tensor>> state_;  // created in order: param-major

 private:
  // A bucket in the flat buffers: its parameters and their element offsets
  // relative to `start`.
  struct Group {
    size_t start = 0;
    std::vector<size_t> params, rel;
  };
  size_t stateKinds() const { return params_.empty() ? 0 : state_.size() / params_.size(); }
  Tensor& stateOf(size_t param, size_t kind) { return state_[param * stateKinds() + kind].second; }
  const Tensor& stateOf(size_t param, size_t kind) const {
    return state_[param * stateKinds() + kind].second;
  }
  void checkPartition(const std::vector<std::vector<size_t>>& buckets) const;
  std::vector<size_t> relativeOffsets(const std::vector<size_t>& bucket) const;
  bool inFlat(size_t param) const;
  Backend::OptimChunk ownChunk(size_t param);
  void addMember(size_t param, bool runContinues);
  void giveValuesBack();

  std::vector<Group> groups_;
  std::vector<size_t> offset_;  // per parameter: its offset in the flat buffers
  Tensor flatValues_, flat16_;  // flat16_: 16-bit elements, half as many floats
  bool has16_ = false;
  std::vector<Tensor> flatState_;  // per state kind
  std::vector<Backend::OptimChunk> chunks_;
  bool lastInFlat_ = false;  // chunks_.back() is a flat run that may grow
};

}  // namespace ddprun::train
