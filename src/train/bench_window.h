// The timed window of `train --bench-warmup` (docs/train.md): what the
// benchmark measures of the steps between warm-up and the profile, taken
// without synchronising inside them.
//
// start() drains the device (nothing issued before counts), restarts the
// memory high-water marks and reads the host-synchronisation counters;
// countStep() per step; end() reads the counters first, then drains the
// device, so the closing wait is not counted. json() gives the "bench"
// object of the final summary.
//
// Thread-safety: one training thread. Preconditions: start() before end().
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "ddprun/train/layers.h"

namespace ddprun::train {

class BenchWindow {
 public:
  // `samplesPerStep`: every rank's samples of one step (the global batch).
  BenchWindow(Backend& backend, int64_t warmupSteps, int64_t samplesPerStep)
      : be_(backend), warmup_(warmupSteps), samplesPerStep_(samplesPerStep) {}

  bool open() const { return open_; }
  void start();
  void countStep() {
    if (open_) ++steps_;
  }
  void end();
  // Null until end() ran.
  nlohmann::json json() const;

 private:
  using Clock = std::chrono::steady_clock;
  Backend& be_;
  int64_t warmup_, samplesPerStep_;
  bool open_ = false, done_ = false;
  Clock::time_point t0_;
  double seconds_ = 0;
  int64_t steps_ = 0;
  Backend::HostSyncs syncs0_, syncs_;
  size_t peakAllocated_ = 0, peakReserved_ = 0;
};

// The flags that depend on how many steps this process trains (known only
// after a resume): "" when --bench-warmup `warmup` and --profile-steps
// `profile` fit `runSteps` steps of which `leftInEpoch` remain in the current
// epoch (the window must not cross an epoch's end, where evaluation runs),
// else the error for the user.
std::string benchFlagsProblem(int64_t warmup, int64_t profile, int64_t runSteps,
                              int64_t leftInEpoch);

}  // namespace ddprun::train
