#include "ddprun/train/optim.h"

#include "ddprun/common/error.h"

namespace ddprun::train {
namespace {

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimizerOptions& o, Backend& be, std::vector<Param*> p) : Optimizer(o, be, std::move(p)) {
    if (opts_.momentum != 0.0f)
      for (size_t i = 0; i < params_.size(); ++i) slot(i, "momentum_buffer");
  }
  void step() override {
    for (size_t i = 0; i < params_.size(); ++i) {
      Param& p = *params_[i];
      float* buf = opts_.momentum != 0.0f ? state_[i].second.data() : nullptr;
      be_.sgdUpdate(p.value.data(), p.grad.data(), buf, static_cast<size_t>(p.value.numel()),
                    opts_.lr, opts_.momentum, opts_.weightDecay, steps_ == 0);
    }
    ++steps_;
  }
};

class Adam final : public Optimizer {
 public:
  Adam(const OptimizerOptions& o, Backend& be, std::vector<Param*> p)
      : Optimizer(o, be, std::move(p)) {
    for (size_t i = 0; i < params_.size(); ++i) {
      slot(i, "exp_avg");
      slot(i, "exp_avg_sq");
    }
  }
  void step() override {
    ++steps_;
    for (size_t i = 0; i < params_.size(); ++i) {
      Param& p = *params_[i];
      be_.adamUpdate(p.value.data(), p.grad.data(), state_[2 * i].second.data(),
                     state_[2 * i + 1].second.data(), static_cast<size_t>(p.value.numel()),
                     opts_.lr, opts_.beta1, opts_.beta2, opts_.eps, opts_.weightDecay, steps_);
    }
  }
};

}  // namespace

const std::vector<std::string>& Optimizer::kinds() {
  static const std::vector<std::string> k = {"sgd", "adam"};
  return k;
}

std::unique_ptr<Optimizer> Optimizer::create(const OptimizerOptions& o, Backend& be,
                                             std::vector<Param*> params) {
  if (o.kind == "sgd") return std::make_unique<Sgd>(o, be, std::move(params));
  if (o.kind == "adam") return std::make_unique<Adam>(o, be, std::move(params));
  DDPRUN_THROW(InvalidArgument, "unknown optimizer '", o.kind, "': choose one of sgd, adam");
}

Tensor& Optimizer::slot(size_t param, const std::string& suffix) {
  state_.emplace_back("optim." + params_[param]->name + "." + suffix,
                      Tensor(params_[param]->value.shape(), be_.allocator()));
  return state_.back().second;
}

std::vector<std::pair<std::string, Tensor*>> Optimizer::state() {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (auto& [name, t] : state_) out.emplace_back(name, &t);
  return out;
}

}  // namespace ddprun::train
