// ReconnectPolicy and replayOf (reconnect.h) on a fake clock: no sockets, no
// sleeps.
#include "ddprun/store/reconnect.h"

#include <gtest/gtest.h>

namespace ddprun::store {
namespace {

using wire::Command;
using V = ReconnectPolicy::Verdict;

Clock::time_point at(int64_t ms) { return Clock::time_point{} + Millis(ms); }

ReconnectOptions budget(int64_t ms) {
  ReconnectOptions o;
  o.budget = Millis(ms);
  o.backoff = {Millis{20}, 2.0, Millis{1000}, 0.0};  // no jitter: exact pauses
  return o;
}

TEST(ReplayTest, ReadsAndWholeValueWritesAreReplayedCountersAreNot) {
  for (Command c : {Command::kGet, Command::kCheck, Command::kWait, Command::kMultiGet,
                    Command::kGetNumKeys, Command::kListKeys, Command::kPing,
                    Command::kQueueLen, Command::kSet, Command::kMultiSet,
                    Command::kDeleteKey, Command::kCancelWait, Command::kCompareSet})
    EXPECT_EQ(replayOf(c), Replay::kAlways) << wire::commandName(c);
  for (Command c : {Command::kAdd, Command::kAppend, Command::kQueuePush,
                    Command::kQueuePop, Command::kBarrier, Command::kWatchKey})
    EXPECT_EQ(replayOf(c), Replay::kIfUnsent) << wire::commandName(c);
}

TEST(ReconnectPolicyTest, NoBudgetFailsAtOnceAsBeforeReconnects) {
  ReconnectPolicy p(budget(0), 1);
  EXPECT_EQ(p.onBroken(Replay::kAlways, false, at(0)), V::kOutOfTime);
  EXPECT_EQ(p.onBroken(Replay::kIfUnsent, true, at(0)), V::kOutOfTime);
}

TEST(ReconnectPolicyTest, RetriesWithGrowingPausesUntilTheBudgetEnds) {
  ReconnectPolicy p(budget(1000), 1);
  EXPECT_FALSE(p.inOutage());
  EXPECT_EQ(p.onBroken(Replay::kAlways, false, at(100)), V::kRetry);
  EXPECT_TRUE(p.inOutage());
  EXPECT_EQ(p.outageEnd(), at(1100));  // the budget counts from the first break
  EXPECT_EQ(p.pause(at(100)), Millis(20));
  EXPECT_EQ(p.pause(at(120)), Millis(40));
  EXPECT_EQ(p.onBroken(Replay::kAlways, false, at(600)), V::kRetry);
  EXPECT_EQ(p.outageEnd(), at(1100));  // a later break does not extend it
  EXPECT_EQ(p.pause(at(1090)), Millis(10));  // never past the budget's end
  EXPECT_EQ(p.onBroken(Replay::kAlways, false, at(1100)), V::kOutOfTime);
}

TEST(ReconnectPolicyTest, ASuccessEndsTheOutageAndResetsTheBackoff) {
  ReconnectPolicy p(budget(1000), 1);
  EXPECT_EQ(p.onBroken(Replay::kAlways, false, at(0)), V::kRetry);
  EXPECT_EQ(p.pause(at(0)), Millis(20));
  EXPECT_EQ(p.pause(at(0)), Millis(40));
  p.onSuccess();
  EXPECT_FALSE(p.inOutage());
  // A break long after the first outage gets a whole budget again.
  EXPECT_EQ(p.onBroken(Replay::kAlways, false, at(50'000)), V::kRetry);
  EXPECT_EQ(p.outageEnd(), at(51'000));
  EXPECT_EQ(p.pause(at(50'000)), Millis(20));
}

TEST(ReconnectPolicyTest, ACounterIsSentAgainOnlyIfNoByteOfItLeft) {
  ReconnectPolicy p(budget(1000), 1);
  EXPECT_EQ(p.onBroken(Replay::kIfUnsent, false, at(0)), V::kRetry);
  EXPECT_EQ(p.onBroken(Replay::kIfUnsent, true, at(10)), V::kNotReplayable);
  EXPECT_EQ(p.onBroken(Replay::kAlways, true, at(10)), V::kRetry);
}

}  // namespace
}  // namespace ddprun::store
