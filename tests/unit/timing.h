// Timing bounds in C++ tests, as DdprunCase.timing_bound on the Python side
// (tests/pyutil/ddprun_case.py): how long something took depends on the
// machine's load (CI machines differ 3x in speed and run tests under CPU
// load), so a bound such as "within the heartbeat timeout" is printed with
// every run and asserted only with DDPRUN_TIMING_ASSERTS=1 (a quiet machine,
// e.g. when measuring for docs/benchmarks.md). What a test asserts
// unconditionally is the outcome, awaited with generous bounds.
//
// Thread-safety: timingBound may be called from any thread (gtest's EXPECT
// is thread-safe on Linux; the line goes to stderr in one write).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace ddprun::testing {

// True when DDPRUN_TIMING_ASSERTS=1.
inline bool timingAsserts() {
  const char* v = std::getenv("DDPRUN_TIMING_ASSERTS");
  return v != nullptr && std::string_view(v) == "1";
}

// Prints "TIMING <what>: <took> s (bound <bound> s)" on stderr (with " OVER
// THE BOUND" when took >= bound); under DDPRUN_TIMING_ASSERTS=1 also
// EXPECTs took < bound.
inline void timingBound(const std::string& what, std::chrono::nanoseconds took,
                        std::chrono::nanoseconds bound) {
  using Seconds = std::chrono::duration<double>;
  const double t = Seconds(took).count(), b = Seconds(bound).count();
  std::fprintf(stderr, "TIMING %s: %.2f s (bound %.1f s)%s\n", what.c_str(), t, b,
               took < bound ? "" : " OVER THE BOUND");
  if (timingAsserts()) {
    EXPECT_LT(took, bound) << what << " took " << t << " s";
  }
}

}  // namespace ddprun::testing
