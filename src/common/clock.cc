#include "ddprun/common/clock.h"

#include <algorithm>
#include <cmath>

namespace ddprun {

std::string formatDuration(Millis d) {
  if (d.count() < 1000) return std::to_string(d.count()) + " ms";
  return std::to_string(d.count() / 1000) + " s";
}

Millis Deadline::remaining(Clock::time_point now) const {
  if (now >= end_) return Millis(0);
  return std::chrono::duration_cast<Millis>(end_ - now);
}

Backoff::Backoff(Options opts, uint64_t seed) : opts_(opts), rng_(seed) {}

Millis Backoff::next() {
  double base = static_cast<double>(opts_.initial.count()) *
                std::pow(opts_.factor, attempt_);
  base = std::min(base, static_cast<double>(opts_.max.count()));
  ++attempt_;
  std::uniform_real_distribution<double> dist(1.0 - opts_.jitter,
                                              1.0 + opts_.jitter);
  return Millis(std::max<int64_t>(1, std::llround(base * dist(rng_))));
}

}  // namespace ddprun
