// The raw console's line assembly on a fake clock: whole lines out, the
// unfinished rest held, flushed on size or deadline. No descriptors, no sleeps.
#include "agent/line_assembler.h"

#include <gtest/gtest.h>

#include <string>

namespace ddprun::agent::detail {
namespace {

using namespace std::chrono_literals;
using Clock = LineAssembler::Clock;

const Clock::time_point t0{};  // the fake clock's epoch

TEST(LineAssembler, WholeLinesGoOutAtOnceAndTheRestIsHeld) {
  LineAssembler a(1024, 100ms);
  std::string out;
  a.feed("one\ntwo\nthr", t0, out);
  EXPECT_EQ(out, "one\ntwo\n");
  EXPECT_EQ(a.heldBytes(), 3u);
  out.clear();
  a.feed("ee\nfo", t0 + 1ms, out);
  EXPECT_EQ(out, "three\n") << "the held start goes out with its end";
  a.feed("", t0 + 2ms, out);
  EXPECT_EQ(out, "three\n");
  EXPECT_EQ(a.heldBytes(), 2u);
}

TEST(LineAssembler, APartialLineGoesOutOnceItsDeadlinePasses) {
  LineAssembler a(1024, 100ms);
  std::string out;
  EXPECT_FALSE(a.deadline());
  a.feed("epoch 1: 10%\r", t0, out);
  EXPECT_EQ(out, "");
  ASSERT_TRUE(a.deadline());
  EXPECT_EQ(*a.deadline(), t0 + 100ms);
  // More of the same line does not push the deadline back: a line that
  // trickles in still shows within `delay` of its first byte.
  a.feed("epoch 1: 20%\r", t0 + 60ms, out);
  EXPECT_EQ(*a.deadline(), t0 + 100ms);
  EXPECT_FALSE(a.flushDue(t0 + 99ms, out));
  EXPECT_EQ(out, "");
  EXPECT_TRUE(a.flushDue(t0 + 100ms, out));
  EXPECT_EQ(out, "epoch 1: 10%\repoch 1: 20%\r");
  EXPECT_FALSE(a.deadline());
  EXPECT_FALSE(a.flushDue(t0 + 1s, out)) << "nothing held";
  // A new partial line has a deadline of its own.
  a.feed("x", t0 + 500ms, out);
  EXPECT_EQ(*a.deadline(), t0 + 600ms);
}

TEST(LineAssembler, ALineEndedBeforeItsDeadlineGoesOutWhole) {
  LineAssembler a(1024, 100ms);
  std::string out;
  a.feed("loss=0.", t0, out);
  a.feed("25\n", t0 + 99ms, out);
  EXPECT_EQ(out, "loss=0.25\n");
  EXPECT_FALSE(a.deadline());
}

TEST(LineAssembler, AHeldPartThatGrowsLargeGoesOutAtOnce) {
  LineAssembler a(8, 1h);
  std::string out;
  a.feed("0123456", t0, out);
  EXPECT_EQ(out, "");
  a.feed("78", t0, out);
  EXPECT_EQ(out, "012345678") << "held bytes reached the bound";
  EXPECT_EQ(a.heldBytes(), 0u);
  out.clear();
  a.feed("ab\n0123456789", t0, out);  // a line, then a long unfinished one
  EXPECT_EQ(out, "ab\n0123456789");
}

TEST(LineAssembler, ZeroDelayFlushesAtTheNextCheckAndFlushAllTakesEverything) {
  LineAssembler a(1024, 0ms);
  std::string out;
  a.feed("prompt: ", t0, out);
  EXPECT_TRUE(a.flushDue(t0, out));
  EXPECT_EQ(out, "prompt: ");
  out.clear();
  LineAssembler b(1024, 1h);
  b.feed("a\nlast words", t0, out);
  b.flushAll(out);
  EXPECT_EQ(out, "a\nlast words");
  EXPECT_EQ(b.heldBytes(), 0u);
}

}  // namespace
}  // namespace ddprun::agent::detail
