#include "ddprun/common/clock.h"

#include <gtest/gtest.h>

namespace ddprun {
namespace {

TEST(Backoff, GrowsGeometricallyUpToTheCap) {
  Backoff b({Millis(100), 2.0, Millis(1000), 0.0}, 1);
  EXPECT_EQ(b.next(), Millis(100));
  EXPECT_EQ(b.next(), Millis(200));
  EXPECT_EQ(b.next(), Millis(400));
  EXPECT_EQ(b.next(), Millis(800));
  EXPECT_EQ(b.next(), Millis(1000));
  EXPECT_EQ(b.next(), Millis(1000));
  EXPECT_EQ(b.attempts(), 6);
  b.reset();
  EXPECT_EQ(b.next(), Millis(100));
}

TEST(Backoff, JitterStaysWithinBoundsAndVaries) {
  Backoff b({Millis(1000), 1.0, Millis(1000), 0.5}, 42);
  Millis lo(100000), hi(0);
  for (int i = 0; i < 200; ++i) {
    Millis d = b.next();
    EXPECT_GE(d, Millis(500));
    EXPECT_LE(d, Millis(1500));
    lo = std::min(lo, d);
    hi = std::max(hi, d);
  }
  EXPECT_GT(hi - lo, Millis(500));  // jitter actually spreads the delays
}

TEST(Backoff, SameSeedSameSequence) {
  Backoff a({}, 7), b({}, 7);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next(), b.next());
}

TEST(Deadline, RemainingNeverNegative) {
  auto t0 = Clock::now();
  Deadline d(Millis(100), t0);
  EXPECT_FALSE(d.expired(t0));
  EXPECT_EQ(d.remaining(t0), Millis(100));
  EXPECT_EQ(d.remaining(t0 + Millis(40)), Millis(60));
  EXPECT_TRUE(d.expired(t0 + Millis(100)));
  EXPECT_EQ(d.remaining(t0 + Millis(500)), Millis(0));
}

}  // namespace
}  // namespace ddprun

TEST(FormatDuration, MillisecondsBelowASecondWholeSecondsAbove) {
  EXPECT_EQ(ddprun::formatDuration(ddprun::Millis(150)), "150 ms");
  EXPECT_EQ(ddprun::formatDuration(ddprun::Millis(999)), "999 ms");
  EXPECT_EQ(ddprun::formatDuration(ddprun::Millis(1000)), "1 s");
  EXPECT_EQ(ddprun::formatDuration(ddprun::Millis(900'500)), "900 s");
}
