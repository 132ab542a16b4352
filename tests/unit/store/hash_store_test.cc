#include "ddprun/store/hash_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "ddprun/common/error.h"
#include "ddprun/store/prefix_store.h"

namespace ddprun::store {
namespace {

using namespace std::chrono_literals;

TEST(HashStoreTest, SetGetOverwriteDelete) {
  HashStore s;
  s.set("a", "1");
  EXPECT_EQ(s.get("a"), "1");
  s.set("a", std::string("x\0y", 3));
  EXPECT_EQ(s.get("a"), std::string("x\0y", 3));
  EXPECT_EQ(s.numKeys(), 1);
  EXPECT_TRUE(s.deleteKey("a"));
  EXPECT_FALSE(s.deleteKey("a"));
  EXPECT_EQ(s.numKeys(), 0);
}

TEST(HashStoreTest, CheckNeverBlocks) {
  HashStore s;
  EXPECT_TRUE(s.check({}));
  EXPECT_FALSE(s.check({"a"}));
  s.set("a", "");
  EXPECT_TRUE(s.check({"a"}));  // an empty value is still a key
  EXPECT_FALSE(s.check({"a", "b"}));
}

TEST(HashStoreTest, AddOnDecimalText) {
  HashStore s;
  EXPECT_EQ(s.add("c", 5), 5);  // absent = 0
  EXPECT_EQ(s.add("c", -7), -2);
  EXPECT_EQ(s.get("c"), "-2");
  s.set("d", " 41xyz");  // std::stoll rules: leading space, trailing bytes ignored
  EXPECT_EQ(s.add("d", 1), 42);
  EXPECT_EQ(s.get("d"), "42");
  EXPECT_EQ(s.add("d", 0), 42);
}

TEST(HashStoreTest, AddRefusesTextAndOverflow) {
  HashStore s;
  s.set("t", "abc");
  EXPECT_THROW(s.add("t", 1), InvalidArgument);
  EXPECT_EQ(s.get("t"), "abc");  // unchanged
  s.set("e", "");
  EXPECT_THROW(s.add("e", 1), InvalidArgument);
  s.set("big", "9223372036854775807");
  EXPECT_THROW(s.add("big", 1), InvalidArgument);
  EXPECT_EQ(s.add("big", -1), 9223372036854775806);
  s.set("huge", "99999999999999999999");  // ERANGE
  EXPECT_THROW(s.add("huge", 1), InvalidArgument);
}

TEST(HashStoreTest, CompareSetFollowsPyTorch) {
  HashStore s;
  // Missing key, non-empty expected: nothing stored, expected comes back.
  EXPECT_EQ(s.compareSet("k", "old", "new"), "old");
  EXPECT_FALSE(s.check({"k"}));
  // Missing key, empty expected: created with desired.
  EXPECT_EQ(s.compareSet("k", "", "v1"), "v1");
  EXPECT_EQ(s.get("k"), "v1");
  // Present, matching: replaced.
  EXPECT_EQ(s.compareSet("k", "v1", "v2"), "v2");
  EXPECT_EQ(s.get("k"), "v2");
  // Present, not matching: unchanged, current value comes back.
  EXPECT_EQ(s.compareSet("k", "v1", "v3"), "v2");
  EXPECT_EQ(s.get("k"), "v2");
  // Present, empty expected does not match a non-empty value.
  EXPECT_EQ(s.compareSet("k", "", "v4"), "v2");
  // Present with an empty value: empty expected matches.
  s.set("e", "");
  EXPECT_EQ(s.compareSet("e", "", "filled"), "filled");
}

TEST(HashStoreTest, AppendCreatesThenExtends) {
  HashStore s;
  s.append("l", "ab");
  s.append("l", "cd");
  EXPECT_EQ(s.get("l"), "abcd");
}

TEST(HashStoreTest, MultiSetAndMultiGetKeepOrder) {
  HashStore s;
  s.multiSet({"x", "y", "z"}, {"1", "2", "3"});
  EXPECT_EQ(s.multiGet({"z", "x", "y"}), (std::vector<std::string>{"3", "1", "2"}));
  EXPECT_THROW(s.multiSet({"a"}, {}), InvalidArgument);
}

TEST(HashStoreTest, WaitTimesOutWithTimeoutError) {
  HashStore s;
  s.set("here", "1");
  const auto t0 = std::chrono::steady_clock::now();
  try {
    s.wait({"here", "missing"}, 50ms);
    FAIL() << "wait returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(e.message().find("missing"), std::string::npos) << e.message();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 50ms);
  s.setTimeout(30ms);
  EXPECT_THROW(s.get("missing"), TimeoutError);
  EXPECT_THROW(s.multiGet({"here", "missing"}), TimeoutError);
  EXPECT_NO_THROW(s.wait({"here"}, 0ms));  // present keys: no wait at all
}

TEST(HashStoreTest, HugeTimeoutDoesNotOverflow) {
  HashStore s;
  std::thread t([&] {
    while (s.blockedWaiters() == 0) std::this_thread::yield();  // the wait below blocks
    s.set("k", "v");
  });
  s.wait({"k"}, Millis::max());
  t.join();
  EXPECT_EQ(s.get("k"), "v");
  EXPECT_EQ(s.blockedWaiters(), 0);  // the waiter is no longer counted once it returned
}

TEST(HashStoreTest, GetBlocksUntilAnotherThreadSets) {
  HashStore s;
  s.setTimeout(10s);
  std::atomic<bool> setDone{false};
  std::thread writer([&] {
    while (s.blockedWaiters() == 0) std::this_thread::yield();  // get() below blocks
    setDone = true;
    s.set("late", "value");
  });
  EXPECT_EQ(s.get("late"), "value");
  EXPECT_TRUE(setDone.load());
  writer.join();
}

TEST(HashStoreTest, WaitForSeveralKeysWrittenBySeveralThreads) {
  HashStore s;
  constexpr int kThreads = 8;
  std::vector<std::string> keys;
  for (int i = 0; i < kThreads; ++i) keys.push_back("k" + std::to_string(i));
  std::vector<std::thread> waiters;
  std::atomic<int> woke{0};
  for (int i = 0; i < 4; ++i)
    waiters.emplace_back([&] {
      s.wait(keys, 10s);
      ++woke;
    });
  std::vector<std::thread> writers;
  for (int i = 0; i < kThreads; ++i)
    writers.emplace_back([&, i] {
      if (i % 3 == 0) s.add(keys[i], 1);
      else if (i % 3 == 1) s.append(keys[i], "x");
      else s.compareSet(keys[i], "", "y");
    });
  for (auto& t : writers) t.join();
  for (auto& t : waiters) t.join();
  EXPECT_EQ(woke.load(), 4);
}

TEST(HashStoreTest, ConcurrentAddsAreAtomic) {
  HashStore s;
  constexpr int kThreads = 8, kAdds = 2000;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < kAdds; ++i) s.add("n", 1);
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(s.add("n", 0), kThreads * kAdds);
}

TEST(HashStoreTest, CompareSetElectsExactlyOneWinner) {
  HashStore s;
  constexpr int kThreads = 16;
  std::vector<std::thread> ts;
  std::atomic<int> winners{0};
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      const std::string me = "t" + std::to_string(t);
      if (s.compareSet("leader", "", me) == me) ++winners;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(winners.load(), 1);
}

TEST(HashStoreTest, WorksUnderPrefixStore) {
  auto base = std::make_shared<HashStore>();
  PrefixStore a("a", base), b("b", base);
  a.set("k", "1");
  b.set("k", "2");
  EXPECT_EQ(base->get("a/k"), "1");
  EXPECT_EQ(b.get("k"), "2");
  EXPECT_EQ(a.numKeys(), 2);  // the whole store, as PyTorch reports it
}

}  // namespace
}  // namespace ddprun::store
