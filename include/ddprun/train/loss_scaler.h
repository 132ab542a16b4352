// fp16's dynamic loss scale with torch.cuda.amp.GradScaler's rules: the loss
// gradient is multiplied by scale() before backward; after the all-reduce the
// gradients are divided by it and checked. A step whose gradients are not all
// finite is skipped and the scale is halved (never below 1); after
// growthInterval finite steps in a row it is doubled.
//
// Pure state: no device, no environment (the trainer reads DDPRUN_LOSS_SCALE
// and passes the start). Thread-safety: one training thread.
#pragma once

#include <cstdint>

namespace ddprun::train {

struct LossScalerOptions {
  float initScale = 65536.0f;  // GradScaler's 2^16
  int64_t growthInterval = 2000;
};

class LossScaler {
 public:
  // Off: scale() is 1 and update() changes nothing (fp32, tf32, bf16).
  LossScaler() = default;
  explicit LossScaler(LossScalerOptions o) : on_(true), scale_(o.initScale), opts_(o) {}

  bool on() const { return on_; }
  float scale() const { return on_ ? scale_ : 1.0f; }
  // After a step: whether its gradients were all finite (the step ran) or
  // not (it was skipped).
  void update(bool finite);
  int64_t skipped() const { return skipped_; }

 private:
  bool on_ = false;
  float scale_ = 1.0f;
  LossScalerOptions opts_;
  int64_t clean_ = 0, skipped_ = 0;
};

}  // namespace ddprun::train
