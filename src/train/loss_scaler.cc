#include "ddprun/train/loss_scaler.h"

#include <algorithm>

namespace ddprun::train {

void LossScaler::update(bool finite) {
  if (!on_) return;
  if (!finite) {
    ++skipped_;
    scale_ = std::max(scale_ * 0.5f, 1.0f);
    clean_ = 0;
  } else if (++clean_ == opts_.growthInterval) {
    scale_ *= 2.0f;
    clean_ = 0;
  }
}

}  // namespace ddprun::train
