// Rate limit for one kind of repeated log line (refused connections, closed
// clients), so a hostile peer cannot flood the log.
//
// At most `perWindow` lines per window are admitted; the first line admitted
// after some were dropped reports how many. Time is passed in, so tests use a
// fake clock. Not thread-safe (the server's io thread owns it).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ddprun::store {

class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  explicit LogLimiter(uint64_t perWindow = 10,
                      Clock::duration window = std::chrono::seconds(1))
      : perWindow_(perWindow), window_(window) {}

  // Whether to log a line now. When it returns true and lines were dropped
  // since the last admitted one, `note` is " (K similar lines suppressed)"
  // (else empty), to append to the line.
  bool admit(Clock::time_point now, std::string& note) {
    note.clear();
    if (now - windowStart_ >= window_) {
      windowStart_ = now;
      inWindow_ = 0;
    }
    if (inWindow_ >= perWindow_) {
      ++suppressed_;
      return false;
    }
    ++inWindow_;
    if (suppressed_ > 0) {
      note = " (" + std::to_string(suppressed_) + " similar lines suppressed)";
      suppressed_ = 0;
    }
    return true;
  }

 private:
  uint64_t perWindow_;
  Clock::duration window_;
  Clock::time_point windowStart_{};
  uint64_t inWindow_ = 0;
  uint64_t suppressed_ = 0;
};

}  // namespace ddprun::store
