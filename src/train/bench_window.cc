#include "bench_window.h"

namespace ddprun::train {

void BenchWindow::start() {
  be_.synchronize();
  be_.resetPeakDeviceBytes();
  open_ = true;
  steps_ = 0;
  syncs0_ = be_.hostSyncs();
  t0_ = Clock::now();
}

void BenchWindow::end() {
  const Backend::HostSyncs s = be_.hostSyncs();  // before the closing wait
  be_.synchronize();
  seconds_ = std::chrono::duration<double>(Clock::now() - t0_).count();
  open_ = false;
  done_ = true;
  syncs_ = {s.calls - syncs0_.calls, s.waits - syncs0_.waits};
  peakAllocated_ = be_.peakDeviceBytes();
  peakReserved_ = be_.peakReservedBytes();
}

nlohmann::json BenchWindow::json() const {
  if (!done_) return nullptr;
  const double steps = static_cast<double>(steps_);
  const double samples = steps * static_cast<double>(samplesPerStep_);
  constexpr double kMiB = 1 << 20;
  return {{"warmup_steps", warmup_},
          {"steps", steps_},
          {"seconds", seconds_},
          {"samples_per_second", seconds_ > 0 ? samples / seconds_ : 0.0},
          {"host_sync_calls", syncs_.calls},
          {"host_sync_waits", syncs_.waits},
          {"host_sync_calls_per_step", steps > 0 ? syncs_.calls / steps : 0.0},
          {"host_sync_waits_per_step", steps > 0 ? syncs_.waits / steps : 0.0},
          {"peak_allocated_mb", static_cast<double>(peakAllocated_) / kMiB},
          {"peak_reserved_mb", static_cast<double>(peakReserved_) / kMiB}};
}

std::string benchFlagsProblem(int64_t warmup, int64_t profile, int64_t runSteps,
                              int64_t leftInEpoch) {
  const auto n = [](int64_t v) { return std::to_string(v); };
  if (profile > runSteps)
    return "--profile-steps " + n(profile) + " is more than the " + n(runSteps) +
           " steps this run trains; give fewer, or more --max-steps/--train-samples";
  if (warmup == 0) return "";
  if (warmup + profile >= runSteps)
    return "--bench-warmup " + n(warmup) + " plus --profile-steps " + n(profile) +
           " leave no timed step of the " + n(runSteps) +
           " steps this run trains; train more steps (--max-steps, --train-samples)";
  if (runSteps - profile > leftInEpoch)
    return "the --bench-warmup window (steps " + n(warmup + 1) + " to " + n(runSteps - profile) +
           ") crosses the end of an epoch after " + n(leftInEpoch) +
           " steps, where evaluation would run inside it; time one epoch (--epochs 1)";
  return "";
}

}  // namespace ddprun::train
