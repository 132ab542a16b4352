// The profile of the last few training steps (train --profile-steps): where
// a step's device time goes, layer by layer, without synchronising inside
// the steps.
//
// The loop reports points of each profiled step (its start, the end of the
// data upload, the loss, the reducer, the optimizer, its end), the Model's
// observer reports each top-level layer's forward and backward boundaries,
// and the reducer hook reports each parameter's gradient becoming final. Each
// point becomes a Backend::mark(): a timing event on the compute stream (the
// CPU: the wall clock), so the profiled steps keep the order and overlap of
// the others. finish() reads the marks once (one wait for the device, after
// the steps) and averages every interval over the steps.
//
// Thread-safety: one training thread. Preconditions: a step's points arrive
// in the order the step runs them; bucket membership (setBuckets) is fixed
// while the profile runs.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ddprun/runtime/reducer.h"
#include "ddprun/train/layers.h"

namespace ddprun::train {

class StepProfile {
 public:
  enum class Point : uint8_t {
    kStepStart,
    kDataEnd,
    kLossStart,
    kLossEnd,
    kReducerStart,
    kReducerEnd,
    kOptimizerStart,
    kOptimizerEnd,
    kStepEnd,
    kCount
  };

  // `layerNames`: the model's top-level layers in forward order.
  StepProfile(Backend& backend, std::vector<std::string> layerNames);

  // Which gradient bucket each parameter is in (bucket -> parameter indices,
  // in launch order), with each bucket's bytes; a bucket is "ready" when its
  // last parameter's gradient is final.
  void setBuckets(const std::vector<std::vector<size_t>>& bucketParams,
                  const std::vector<size_t>& bucketBytes);
  // The same, read from the reducer's current layout (float32 bytes).
  void setBuckets(const runtime::Reducer& reducer);

  void point(Point p);
  void layer(size_t index, bool backward, bool end);
  void paramReady(size_t param);

  size_t steps() const { return steps_.size(); }
  // Averages over the recorded steps (waits for the device once), then
  // forgets them. Empty object when no step was recorded.
  nlohmann::json finish();

 private:
  static constexpr size_t kNone = static_cast<size_t>(-1);
  struct Step {
    size_t points[static_cast<size_t>(Point::kCount)];
    std::vector<size_t> fwdStart, fwdEnd, bwdStart, bwdEnd;  // mark per layer
    std::vector<size_t> bucketReady;                         // mark per bucket
    std::chrono::steady_clock::time_point wallStart, wallEnd;
  };

  Backend& be_;
  std::vector<std::string> layers_;
  std::vector<size_t> bucketOf_;     // parameter -> bucket
  std::vector<size_t> bucketSize_;   // parameters per bucket
  std::vector<size_t> bucketBytes_;
  std::vector<size_t> pending_;      // this step's unready parameters per bucket
  std::vector<Step> steps_;
};

// The communication of one synchronised iteration, from the reducer's device
// timestamps: the "comm" object of the profile (ms from its first bucket's
// readiness).
nlohmann::json commProfile(const runtime::DeviceTimings& t);

}  // namespace ddprun::train
