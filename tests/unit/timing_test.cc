#include "timing.h"

#include <gtest/gtest-spi.h>
#include <stdlib.h>

namespace ddprun::testing {
namespace {

// The bound is asserted with DDPRUN_TIMING_ASSERTS=1 only, never otherwise.
TEST(TimingBound, AssertsTheBoundOnlyWhenAsked) {
  using std::chrono::seconds;
  const char* old = std::getenv("DDPRUN_TIMING_ASSERTS");
  const std::string saved = old ? old : "";
  ::unsetenv("DDPRUN_TIMING_ASSERTS");
  EXPECT_FALSE(timingAsserts());
  timingBound("over, not asserted", seconds(2), seconds(1));
  ::setenv("DDPRUN_TIMING_ASSERTS", "0", 1);
  EXPECT_FALSE(timingAsserts());
  ::setenv("DDPRUN_TIMING_ASSERTS", "1", 1);
  EXPECT_TRUE(timingAsserts());
  timingBound("under, asserted", seconds(1), seconds(2));
  EXPECT_NONFATAL_FAILURE(timingBound("over, asserted", seconds(2), seconds(1)),
                          "over, asserted took 2 s");
  if (old)
    ::setenv("DDPRUN_TIMING_ASSERTS", saved.c_str(), 1);
  else
    ::unsetenv("DDPRUN_TIMING_ASSERTS");
}

}  // namespace
}  // namespace ddprun::testing
