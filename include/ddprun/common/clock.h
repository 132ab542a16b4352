// Deadlines and retry backoff. Time sources and randomness are injectable so
// that retry logic is testable without sleeping.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <random>
#include <string>

namespace ddprun {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

// "900 s", or "150 ms" below a second (for messages; tests use short timeouts).
std::string formatDuration(Millis d);

// A point in time after which an operation gives up.
class Deadline {
 public:
  explicit Deadline(Millis timeout, Clock::time_point now = Clock::now())
      : end_(now + timeout) {}
  bool expired(Clock::time_point now = Clock::now()) const { return now >= end_; }
  // Time left, never negative.
  Millis remaining(Clock::time_point now = Clock::now()) const;
  Clock::time_point end() const { return end_; }

 private:
  Clock::time_point end_;
};

// Exponential backoff with jitter: the n-th delay is
// min(initial * factor^n, max) scaled by a uniform factor in [1-j, 1+j].
// Not thread-safe; one instance per retry loop.
class Backoff {
 public:
  struct Options {
    Millis initial{50};
    double factor = 1.5;
    Millis max{2000};
    double jitter = 0.5;  // fraction, 0..1
  };
  explicit Backoff(Options opts, uint64_t seed = std::random_device{}());
  Millis next();
  void reset() { attempt_ = 0; }
  int attempts() const { return attempt_; }

 private:
  Options opts_;
  std::mt19937_64 rng_;
  int attempt_ = 0;
};

}  // namespace ddprun
