// The hang watchdog's decision (agent/progress_watch.h) under a fake clock.
#include "agent/progress_watch.h"

#include <gtest/gtest.h>

namespace ddprun::agent {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = ProgressWatch::Clock;

const Clock::time_point t0{};  // the fake clock's origin

ProgressReport at(int64_t step, double time,
                  std::optional<int64_t> total = std::nullopt) {
  ProgressReport r;
  r.step = step;
  r.time = time;
  r.totalSteps = total;
  return r;
}

TEST(ProgressWatch, ARankThatNeverReportedIsNeverStalled) {
  ProgressWatch w(seconds(30));
  EXPECT_FALSE(w.stalled(t0 + seconds(3600)));
  EXPECT_EQ(w.rank(0), nullptr);
  EXPECT_FALSE(w.secondsSinceProgress(0, t0 + seconds(5)));
}

TEST(ProgressWatch, SilentPastTheTimeoutIsStalledNamingTheRank) {
  ProgressWatch w(seconds(30));
  EXPECT_TRUE(w.observe(0, at(1, 100), t0));
  EXPECT_TRUE(w.observe(1, at(41, 100), t0));
  // Rank 0 goes on; rank 1 repeats the same report (its file unchanged).
  for (int s = 1; s <= 40; ++s) {
    w.observe(0, at(1 + s, 100 + s), t0 + seconds(s));
    EXPECT_FALSE(w.observe(1, at(41, 100), t0 + seconds(s)));
    if (s < 30) {
      EXPECT_FALSE(w.stalled(t0 + seconds(s))) << s;
    }
  }
  auto st = w.stalled(t0 + seconds(40));
  ASSERT_TRUE(st);
  EXPECT_EQ(st->localRank, 1);
  EXPECT_EQ(st->lastStep, 41);
  EXPECT_EQ(st->silent, seconds(40));
  EXPECT_EQ(*w.secondsSinceProgress(1, t0 + seconds(40)), 40.0);
  EXPECT_EQ(*w.secondsSinceProgress(0, t0 + seconds(40)), 0.0);
}

TEST(ProgressWatch, ExactlyTheTimeoutIsStalled) {
  ProgressWatch w(milliseconds(3000));
  w.observe(0, at(5, 1), t0);
  EXPECT_FALSE(w.stalled(t0 + milliseconds(2999)));
  EXPECT_TRUE(w.stalled(t0 + milliseconds(3000)));
}

TEST(ProgressWatch, ProgressResetsTheSilence) {
  ProgressWatch w(seconds(10));
  w.observe(0, at(1, 50), t0);
  EXPECT_TRUE(w.observe(0, at(2, 51), t0 + seconds(9)));
  EXPECT_FALSE(w.stalled(t0 + seconds(18)));
  EXPECT_TRUE(w.stalled(t0 + seconds(19)));
  // A new time at the same step (a worker that reports while it waits) is
  // progress too; so is a step with the same time (a coarse clock).
  EXPECT_TRUE(w.observe(0, at(2, 52), t0 + seconds(19)));
  EXPECT_FALSE(w.stalled(t0 + seconds(28)));
  EXPECT_TRUE(w.observe(0, at(3, 52), t0 + seconds(28)));
  EXPECT_FALSE(w.stalled(t0 + seconds(37)));
}

TEST(ProgressWatch, OnlyTheLossChangingIsNoProgress) {
  ProgressWatch w(seconds(10));
  ProgressReport r = at(4, 10);
  w.observe(0, r, t0);
  r.loss = 0.25;
  EXPECT_FALSE(w.observe(0, r, t0 + seconds(5)));
  EXPECT_EQ(w.rank(0)->report.loss, 0.25);  // shown, all the same
  EXPECT_TRUE(w.stalled(t0 + seconds(10)));
}

TEST(ProgressWatch, TheWorkersOwnClockDoesNotMatter) {
  // A time far in the past or the future changes nothing: silence is the
  // agent's own clock since it saw the report change.
  ProgressWatch w(seconds(10));
  w.observe(0, at(1, 1e9), t0);
  w.observe(1, at(1, 1.0), t0);
  EXPECT_FALSE(w.stalled(t0 + seconds(9)));
  EXPECT_TRUE(w.stalled(t0 + seconds(10)));
}

TEST(ProgressWatch, ARestartAttemptResets) {
  ProgressWatch w(seconds(10));
  w.observe(0, at(100, 5), t0);
  ASSERT_TRUE(w.stalled(t0 + seconds(20)));
  w.reset();
  EXPECT_FALSE(w.stalled(t0 + seconds(20)));
  EXPECT_EQ(w.rank(0), nullptr);
  // The new attempt's first report (an earlier step: resumed) starts afresh.
  EXPECT_TRUE(w.observe(0, at(40, 30), t0 + seconds(21)));
  EXPECT_FALSE(w.stalled(t0 + seconds(30)));
  EXPECT_TRUE(w.stalled(t0 + seconds(31)));
}

TEST(ProgressWatch, AnExitedRankIsNotWatched) {
  ProgressWatch w(seconds(10));
  w.observe(0, at(9, 1), t0);
  w.exited(0);
  EXPECT_FALSE(w.stalled(t0 + seconds(60)));
  ASSERT_NE(w.rank(0), nullptr);  // its last report stays for the status
  EXPECT_EQ(w.rank(0)->report.step, 9);
}

TEST(ProgressWatch, WithoutATimeoutNothingIsStalled) {
  ProgressWatch w;
  w.observe(0, at(1, 1), t0);
  EXPECT_FALSE(w.stalled(t0 + seconds(1'000'000)));
}

TEST(ProgressWatch, TheLongestSilentRankIsNamedTiesTheLowest) {
  ProgressWatch w(seconds(5));
  w.observe(2, at(1, 1), t0);
  w.observe(1, at(1, 1), t0);
  w.observe(3, at(1, 1), t0 + seconds(1));
  auto st = w.stalled(t0 + seconds(10));
  ASSERT_TRUE(st);
  EXPECT_EQ(st->localRank, 1);
}

TEST(ProgressWatch, EtaFollowsTheSlowestRank) {
  ProgressWatch w;
  EXPECT_FALSE(w.etaSeconds());
  w.observe(0, at(0, 100, 1000), t0);
  w.observe(1, at(0, 100, 1000), t0);
  EXPECT_FALSE(w.etaSeconds());  // one report each: no rate yet
  // Rank 0: 10 steps/s, rank 1: 5 steps/s (their own clocks).
  w.observe(0, at(100, 110, 1000), t0 + seconds(10));
  w.observe(1, at(50, 110, 1000), t0 + seconds(10));
  ASSERT_TRUE(w.etaSeconds());
  EXPECT_DOUBLE_EQ(*w.etaSeconds(), (1000 - 50) / 5.0);
  EXPECT_DOUBLE_EQ(*ProgressWatch::stepsPerSecond(*w.rank(0)), 10.0);
}

TEST(ProgressWatch, EtaNeedsTotalSteps) {
  ProgressWatch w;
  w.observe(0, at(0, 100), t0);
  w.observe(0, at(10, 110), t0 + seconds(10));
  EXPECT_FALSE(w.etaSeconds());
  w.observe(1, at(0, 100, 20), t0);
  w.observe(1, at(30, 110, 20), t0 + seconds(10));  // past the total: done
  EXPECT_EQ(w.etaSeconds(), 0.0);
}

TEST(ProgressWatch, AStepThatGoesBackRebasesTheRate) {
  ProgressWatch w;
  w.observe(0, at(500, 100, 1000), t0);
  w.observe(0, at(10, 200, 1000), t0 + seconds(1));  // restarted from a checkpoint
  EXPECT_FALSE(w.etaSeconds());
  w.observe(0, at(20, 210, 1000), t0 + seconds(2));
  EXPECT_DOUBLE_EQ(*w.etaSeconds(), 980.0);  // 1 step/s
}

}  // namespace
}  // namespace ddprun::agent
