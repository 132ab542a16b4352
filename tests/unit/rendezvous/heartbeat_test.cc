// Liveness: LivenessTracker's rules on a fake clock, and Heartbeat's two
// threads on the in-memory store with a tiny real interval. No sockets, no
// sleeps, no timing assertions: the Heartbeat tests wait on conditions
// (beats written, reads made, deaths reported) with generous bounds.
#include "heartbeat.h"

#include <gtest/gtest.h>

#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "ddprun/common/error.h"
#include "rendezvous/memory_hub.h"

namespace ddprun::rendezvous::detail {
namespace {

using namespace std::chrono_literals;
using testing::MemoryHub;
using Strings = std::vector<std::string>;

// interval 1 s, 3 attempts: a node is dead 3000 ms after its last beat.
HeartbeatOptions opts1s() { return {1000ms, 3}; }

TEST(Beat, RoundTripsAndRejectsJunk) {
  int64_t seq = -1, wall = -1;
  ASSERT_TRUE(decodeBeat(encodeBeat(7, 1700000000123), seq, wall));
  EXPECT_EQ(seq, 7);
  EXPECT_EQ(wall, 1700000000123);
  for (const char* junk : {"", "7", "7 ", " 7 8", "7 8 9", "x 8", "7 y", "-1 8", "7 -8",
                           "7  8", "99999999999999999999 8"})
    EXPECT_FALSE(decodeBeat(junk, seq, wall)) << "'" << junk << "'";
}

TEST(LivenessTracker, ANodeThatNeverBeatsGetsAFullTimeout) {
  LivenessTracker t(opts1s());
  t.watch({"a"}, 1000);
  EXPECT_EQ(t.nextExpiry(), 4000);
  EXPECT_TRUE(t.expired(3999).empty());
  EXPECT_EQ(t.expired(4000), Strings{"a"});
  EXPECT_EQ(t.silentFor("a", 4000), 3000);
}

TEST(LivenessTracker, ANewSeqRenewsAsOfTheBeatsWallTime) {
  LivenessTracker t(opts1s());
  t.watch({"a"}, 0);
  t.observe("a", encodeBeat(0, 500), 600);
  EXPECT_EQ(t.nextExpiry(), 3500);
  EXPECT_TRUE(t.expired(3499).empty());
  EXPECT_EQ(t.expired(3500), Strings{"a"});
  t.observe("a", encodeBeat(1, 3000), 3400);
  EXPECT_EQ(t.nextExpiry(), 6000);
  EXPECT_EQ(t.silentFor("a", 3400), 400);
}

TEST(LivenessTracker, TheSameSeqJunkOrAnAbsentKeyChangeNothing) {
  LivenessTracker t(opts1s());
  t.watch({"a"}, 0);
  t.observe("a", encodeBeat(4, 500), 600);
  for (const std::string& v : {encodeBeat(4, 2000), std::string("junk"), std::string(""),
                               std::string("5"), std::string("5 2000 1")})
    t.observe("a", v, 2100);
  EXPECT_EQ(t.nextExpiry(), 3500);
  EXPECT_EQ(t.expired(3500), Strings{"a"});
}

TEST(LivenessTracker, AnyOtherSeqIsNewSoARestartedSenderRenews) {
  LivenessTracker t(opts1s());
  t.watch({"a"}, 0);
  t.observe("a", encodeBeat(9, 500), 600);
  t.observe("a", encodeBeat(0, 2000), 2100);  // the sender started over
  EXPECT_EQ(t.nextExpiry(), 5000);
}

TEST(LivenessTracker, ASenderAheadIsRenewedAsOfTheWatchersClock) {
  LivenessTracker t(opts1s());
  t.watch({"a"}, 0);
  t.observe("a", encodeBeat(0, 1'000'000), 1000);  // its clock is far ahead
  EXPECT_EQ(t.nextExpiry(), 4000);
  t.observe("a", encodeBeat(1, 2'000'000), 3000);
  EXPECT_EQ(t.nextExpiry(), 6000) << "never declared dead while it beats";
  EXPECT_TRUE(t.expired(5999).empty());
}

TEST(LivenessTracker, ASenderBehindIsRenewedAsOfTheWatchersClock) {
  LivenessTracker t(opts1s());
  t.watch({"a"}, 100'000);
  t.observe("a", encodeBeat(0, 50'000), 101'000);  // 51 s behind
  EXPECT_EQ(t.nextExpiry(), 104'000);
  t.observe("a", encodeBeat(1, 52'000), 103'000);
  EXPECT_EQ(t.nextExpiry(), 106'000);
  EXPECT_TRUE(t.expired(105'999).empty());
}

TEST(LivenessTracker, ABeatAtMostOneIntervalOldIsTrusted) {
  LivenessTracker t(opts1s());
  t.watch({"a"}, 0);
  t.observe("a", encodeBeat(0, 4000), 5000);  // exactly one interval old
  EXPECT_EQ(t.nextExpiry(), 7000);
  t.observe("a", encodeBeat(1, 5999), 7000);  // 1001 ms old: as of now
  EXPECT_EQ(t.nextExpiry(), 10000);
}

TEST(LivenessTracker, AStaleBeatCannotCutTheFirstTimeout) {
  LivenessTracker t(opts1s());
  t.watch({"a"}, 1000);
  t.observe("a", encodeBeat(3, 900), 1500);  // written before watch()
  EXPECT_EQ(t.nextExpiry(), 4000);
}

TEST(LivenessTracker, WatchForgetsUnlistedNodesAndKeepsTheOthers) {
  LivenessTracker t(opts1s());
  t.watch({"a", "b"}, 0);
  t.observe("a", encodeBeat(0, 100), 100);
  t.watch({"b", "c"}, 2000);
  EXPECT_EQ(t.watched(), (Strings{"b", "c"}));
  EXPECT_EQ(t.silentFor("a", 2000), 0) << "forgotten";
  EXPECT_EQ(t.nextExpiry(), 3000) << "b keeps its silence since 0";
  EXPECT_EQ(t.expired(3000), Strings{"b"});
  t.observe("a", encodeBeat(1, 2100), 2100);  // not watched: ignored
  t.watch({"a", "b", "c"}, 2500);
  EXPECT_EQ(t.silentFor("a", 2500), 0) << "a new node counts as alive at watch()";
  EXPECT_EQ(t.expired(5000), (Strings{"b", "c"}));
  EXPECT_EQ(t.expired(5500), (Strings{"a", "b", "c"}));
}

TEST(LivenessTracker, ExpiredKeepsTheWatchOrderAndDuplicatesCountOnce) {
  LivenessTracker t(opts1s());
  t.watch({"c", "a", "c", "b"}, 0);
  EXPECT_EQ(t.watched(), (Strings{"c", "a", "b"}));
  EXPECT_EQ(t.expired(3000), (Strings{"c", "a", "b"}));
}

TEST(LivenessTracker, NobodyWatchedNeverExpires) {
  LivenessTracker t(opts1s());
  EXPECT_EQ(t.nextExpiry(), INT64_MAX);
  t.watch({"a"}, 0);
  t.watch({}, 10);
  EXPECT_EQ(t.nextExpiry(), INT64_MAX);
  EXPECT_TRUE(t.expired(INT64_MAX / 2).empty());
}

// ---------------------------------------------------------------------------
// Heartbeat on the in-memory store.

// A store that forwards to a hub view, counting MULTI_GETs (the watcher's
// reads once its peers' keys exist).
class CountingStore : public store::Store {
 public:
  CountingStore(std::unique_ptr<store::Store> inner, std::atomic<int>& multiGets)
      : inner_(std::move(inner)), multiGets_(multiGets) {}
  void set(const std::string& k, std::string_view v) override { inner_->set(k, v); }
  std::string get(const std::string& k) override { return inner_->get(k); }
  int64_t add(const std::string& k, int64_t d) override { return inner_->add(k, d); }
  std::string compareSet(const std::string& k, std::string_view e,
                         std::string_view d) override {
    return inner_->compareSet(k, e, d);
  }
  bool check(const std::vector<std::string>& ks) override { return inner_->check(ks); }
  void wait(const std::vector<std::string>& ks, Millis t) override {
    inner_->wait(ks, t);
  }
  using Store::wait;
  bool deleteKey(const std::string& k) override { return inner_->deleteKey(k); }
  int64_t numKeys() override { return inner_->numKeys(); }
  void append(const std::string& k, std::string_view v) override { inner_->append(k, v); }
  std::vector<std::string> multiGet(const std::vector<std::string>& ks) override {
    ++multiGets_;
    return inner_->multiGet(ks);
  }
  void multiSet(const std::vector<std::string>& ks,
                const std::vector<std::string>& vs) override {
    inner_->multiSet(ks, vs);
  }

 protected:
  std::unique_ptr<store::Store> inner_;
  std::atomic<int>& multiGets_;
};

// Every request blocks until cancelled (a store that stopped answering).
class HungStore : public CountingStore {
 public:
  using CountingStore::CountingStore;
  void set(const std::string&, std::string_view) override { hang(); }
  bool check(const std::vector<std::string>&) override {
    hang();
    return false;
  }
  std::vector<std::string> multiGet(const std::vector<std::string>&) override {
    hang();
    return {};
  }

 private:
  void hang() { inner_->wait({"never"}, 600s); }
};

// Beats go through; every read fails (counted in multiGets).
class UnreadableStore : public CountingStore {
 public:
  using CountingStore::CountingStore;
  bool check(const std::vector<std::string>&) override { fail(); }
  std::vector<std::string> multiGet(const std::vector<std::string>&) override { fail(); }

 private:
  [[noreturn]] void fail() {
    ++multiGets_;
    DDPRUN_THROW(IoError, "reading is broken");
  }
};

class HeartbeatTest : public ::testing::Test {
 protected:
  Heartbeat::Connect connect() {
    return [this](std::shared_ptr<store::CancelToken> cancel) {
      return std::make_unique<CountingStore>(hub_.connect(std::move(cancel)), multiGets_);
    };
  }
  std::unique_ptr<Heartbeat> beating(const std::string& self, HeartbeatOptions o) {
    return std::make_unique<Heartbeat>(o, connect(), "hb/", self);
  }
  int64_t seqOf(const std::string& node) {
    int64_t seq = -1, wall = 0;
    return decodeBeat(hub_.value("hb/" + node), seq, wall) ? seq : -1;
  }
  // A dead-node log, read by the test under its lock.
  struct Deaths {
    std::mutex mu;
    std::vector<std::pair<std::string, int64_t>> seen;
    Heartbeat::OnDead callback() {
      return [this](const std::string& node, int64_t silent) {
        std::lock_guard lock(mu);
        seen.emplace_back(node, silent);
      };
    }
    size_t count() {
      std::lock_guard lock(mu);
      return seen.size();
    }
  };

  MemoryHub hub_;  // first: outlives the heartbeats
  std::atomic<int> multiGets_{0};
};

TEST_F(HeartbeatTest, BeatsAtOnceAndThenEveryInterval) {
  auto a = beating("a", {5ms, 3});
  ASSERT_TRUE(hub_.awaitUntil([&] { return seqOf("a") >= 0; }));
  ASSERT_TRUE(hub_.awaitUntil([&] { return seqOf("a") >= 3; }));
  a->stop();
  const int64_t last = seqOf("a");
  EXPECT_GE(last, 3);
  a->stop();  // idempotent
  EXPECT_EQ(seqOf("a"), last) << "the last beat stays and no more come";
}

TEST_F(HeartbeatTest, APeerThatStopsBeatingIsReportedOnce) {
  auto a = beating("a", {5ms, 3});
  auto b = beating("b", {5ms, 3});
  Deaths deaths;
  a->setPeers({"a", "b"}, deaths.callback());  // self is ignored
  ASSERT_TRUE(hub_.awaitUntil([&] { return seqOf("b") >= 2; }));
  b->stop();
  ASSERT_TRUE(hub_.awaitUntil([&] { return deaths.count() >= 1; }));
  // Many timeouts later (a's own beats mark the time), still one report.
  const int64_t then = seqOf("a");
  ASSERT_TRUE(hub_.awaitUntil([&] { return seqOf("a") >= then + 20; }));
  std::lock_guard lock(deaths.mu);
  ASSERT_EQ(deaths.seen.size(), 1u);
  EXPECT_EQ(deaths.seen[0].first, "b");
  EXPECT_GE(deaths.seen[0].second, 15) << "silent for at least the timeout";
}

TEST_F(HeartbeatTest, ABeatingPeerIsNotReported) {
  // A long timeout in beats (1000 intervals): a loaded machine cannot starve
  // b's thread that long; the watcher reads every interval meanwhile.
  auto a = beating("a", {5ms, 1000});
  auto b = beating("b", {5ms, 1000});
  Deaths deaths;
  a->setPeers({"b"}, deaths.callback());
  ASSERT_TRUE(hub_.awaitUntil([&] { return seqOf("b") >= 0; }));
  const int reads = multiGets_;
  ASSERT_TRUE(hub_.awaitUntil([&] { return multiGets_ >= reads + 30; }));
  EXPECT_EQ(deaths.count(), 0u);
  a->stop();
  b->stop();
}

TEST_F(HeartbeatTest, ANodeThatNeverBeatsIsReportedOncePerSetPeers) {
  auto a = beating("a", {5ms, 3});
  Deaths first, second;
  // The callback may replace the peers itself (here: with the ghost again,
  // and another callback); the ghost then gets a fresh full timeout.
  a->setPeers({"ghost"}, [&](const std::string& node, int64_t silent) {
    first.callback()(node, silent);
    a->setPeers({"ghost"}, second.callback());
  });
  ASSERT_TRUE(hub_.awaitUntil([&] { return second.count() >= 1; }));
  const int64_t then = seqOf("a");
  ASSERT_TRUE(hub_.awaitUntil([&] { return seqOf("a") >= then + 20; }));
  EXPECT_EQ(first.count(), 1u);
  EXPECT_EQ(second.count(), 1u);
  EXPECT_FALSE(hub_.has("hb/ghost"));
}

TEST_F(HeartbeatTest, AnEmptyPeerListWatchesNobody) {
  // The watcher's clock stands still until both calls are made, so the ghost
  // cannot expire in between however slowly this thread runs.
  std::atomic<int64_t> now{0};
  Heartbeat a({5ms, 3}, connect(), "hb/", "a", [&] { return now.load(); });
  Deaths deaths;
  a.setPeers({"ghost"}, deaths.callback());
  a.setPeers({}, {});
  now = 1'000'000;
  const int64_t then = seqOf("a");
  ASSERT_TRUE(hub_.awaitUntil([&] { return seqOf("a") >= then + 20; }));
  EXPECT_EQ(deaths.count(), 0u);
}

TEST_F(HeartbeatTest, AFailedReadDeclaresNobodyDead) {
  std::atomic<int64_t> now{0};
  Heartbeat a(
      {5ms, 3},
      [this](std::shared_ptr<store::CancelToken> cancel) {
        return std::make_unique<UnreadableStore>(hub_.connect(std::move(cancel)),
                                                 multiGets_);
      },
      "hb/", "a", [&] { return now.load(); });
  Deaths deaths;
  a.setPeers({"ghost"}, deaths.callback());
  now = 1'000'000;  // long expired, if only it could be read
  const int64_t then = seqOf("a");
  ASSERT_TRUE(hub_.awaitUntil([&] { return seqOf("a") >= then + 20; }));
  a.stop();
  EXPECT_GE(multiGets_, 1) << "the watcher tried to read";
  EXPECT_EQ(deaths.count(), 0u);
}

TEST_F(HeartbeatTest, StopReturnsWhileBothThreadsAreBlockedInTheStore) {
  Heartbeat a(
      {5ms, 3},
      [this](std::shared_ptr<store::CancelToken> cancel) {
        return std::make_unique<HungStore>(hub_.connect(std::move(cancel)), multiGets_);
      },
      "hb/", "a");
  a.setPeers({"b"}, {});
  ASSERT_TRUE(hub_.awaitWaiters(2)) << "the beater and the watcher are blocked";
  auto stopped = std::async(std::launch::async, [&] { a.stop(); });
  EXPECT_EQ(stopped.wait_for(60s), std::future_status::ready);
}

// Beats that cannot be written for the timeout (a fake clock moved past
// it while the store fails) are reported once, with the silence.
//
// The fake clock stands still while the store works and moves 15 ms (the
// timeout) at every read once it fails: a beat already past the store when it
// failed may still record its success after that, and a clock moved once
// would then never show a silence (seen under AddressSanitizer).
TEST_F(HeartbeatTest, BeatsThatFailForTheTimeoutAreReportedLostOnce) {
  std::atomic<int64_t> now{0};
  std::atomic<bool> failing{false};
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int64_t> lost;
  Heartbeat a({5ms, 3}, connect(), "hb/", "a",
              [&] { return failing ? now.fetch_add(15) + 15 : now.load(); });
  a.setOnLost([&](int64_t silent) {
    std::lock_guard lock(mu);
    lost.push_back(silent);
    cv.notify_all();
  });
  ASSERT_TRUE(hub_.awaitUntil([&] { return seqOf("a") >= 2; }));
  {
    std::lock_guard lock(mu);
    EXPECT_TRUE(lost.empty()) << "beats that go through are never lost";
  }
  failing = true;  // from now on every clock read is the timeout (5 ms x 3) later
  hub_.fail();
  std::unique_lock lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, 60s, [&] { return !lost.empty(); }));
  EXPECT_GE(lost[0], 15);
  lock.unlock();
  a.stop();  // many timeouts later, still failing: told once
  EXPECT_EQ(lost.size(), 1u);
}

// The status endpoint's heartbeats missed: beats that went through count
// nothing; each beat the store refused counts one.
TEST_F(HeartbeatTest, BeatsThatFailAreCountedAsMissed) {
  std::atomic<int64_t> now{0};
  std::atomic<bool> failing{false};  // the clock as in the test above
  std::atomic<uint64_t> missed{0};
  std::mutex mu;
  std::condition_variable cv;
  bool lost = false;
  HeartbeatOptions o{5ms, 3};
  o.missed = &missed;
  Heartbeat a(o, connect(), "hb/", "a",
              [&] { return failing ? now.fetch_add(15) + 15 : now.load(); });
  a.setOnLost([&](int64_t) {
    std::lock_guard lock(mu);
    lost = true;
    cv.notify_all();
  });
  ASSERT_TRUE(hub_.awaitUntil([&] { return seqOf("a") >= 2; }));
  EXPECT_EQ(missed.load(), 0u);
  failing = true;
  hub_.fail();  // a failed beat now also reports the node lost: wait for that
  std::unique_lock lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, 60s, [&] { return lost; }));
  lock.unlock();
  a.stop();
  EXPECT_GE(missed.load(), 1u);
}

TEST_F(HeartbeatTest, StoreErrorsAreRetriedNotFatal) {
  auto a = beating("a", {5ms, 3});
  ASSERT_TRUE(hub_.awaitUntil([&] { return seqOf("a") >= 0; }));
  hub_.fail();  // every request now fails; the threads go on trying
  a->stop();
}

// ---------------------------------------------------------------------------
// Cost at scale (issue 16: thousands of watched nodes).

// Counts the watcher's requests (its CHECKs: any but of the beater's own key
// "hb/a"; its MULTI_GETs, one per wake-up once a key was seen), and runs
// `afterMultiGet` after each MULTI_GET, on the calling thread.
struct WatchCounts {
  std::atomic<int> multiGets{0};
  std::atomic<int> checks{0};
  // CHECKs of at least `whole` keys: with every key absent, one per wake-up.
  size_t whole = SIZE_MAX;
  std::atomic<int> wholeChecks{0};
  std::function<void()> afterMultiGet;
};

class WatchCountingStore : public CountingStore {
 public:
  WatchCountingStore(std::unique_ptr<store::Store> inner, std::atomic<int>& unused,
                     WatchCounts& counts)
      : CountingStore(std::move(inner), unused), counts_(counts) {}
  bool check(const std::vector<std::string>& ks) override {
    if (ks != Strings{"hb/a"}) ++counts_.checks;
    if (ks.size() >= counts_.whole) ++counts_.wholeChecks;
    return inner_->check(ks);
  }
  std::vector<std::string> multiGet(const std::vector<std::string>& ks) override {
    ++counts_.multiGets;
    auto values = inner_->multiGet(ks);
    if (counts_.afterMultiGet) counts_.afterMultiGet();
    return values;
  }

 private:
  WatchCounts& counts_;
};

class HeartbeatScaleTest : public HeartbeatTest {
 protected:
  Heartbeat::Connect countingConnect() {
    return [this](std::shared_ptr<store::CancelToken> cancel) {
      {
        std::lock_guard lock(tokensMu_);
        tokens_[std::this_thread::get_id()] = cancel;
      }
      return std::make_unique<WatchCountingStore>(hub_.connect(std::move(cancel)),
                                                  multiGets_, counts_);
    };
  }
  // The token stop() cancels for the calling thread's connection.
  std::shared_ptr<store::CancelToken> myToken() {
    std::lock_guard lock(tokensMu_);
    return tokens_.at(std::this_thread::get_id());
  }
  static Strings names(const std::string& stem, int n) {
    Strings out;
    for (int i = 0; i < n; ++i) out.push_back(stem + std::to_string(i));
    return out;
  }
  void beatAll(const Strings& nodes, int64_t seq, int64_t wallMs) {
    for (const auto& n : nodes) hub_.set("hb/" + n, encodeBeat(seq, wallMs));
  }
  // Returns once a whole wake-up has run after this call: the second
  // MULTI_GET from now began after the first one's decisions.
  void awaitWakeUp() {
    const int from = counts_.multiGets;
    ASSERT_TRUE(hub_.awaitUntil([&] { return counts_.multiGets >= from + 2; }));
  }

  WatchCounts counts_;
  std::mutex tokensMu_;
  std::map<std::thread::id, std::shared_ptr<store::CancelToken>> tokens_;
};

// 10,000 watched nodes on a fake clock: the 5,000 that never beat are
// reported once each when their timeout passes, the 5,000 that beat never.
TEST_F(HeartbeatScaleTest, AtTenThousandNodesTheDeadAreReportedOnceTheLiveNever) {
  const Strings live = names("live", 5000), ghosts = names("ghost", 5000);
  Strings all = live;
  all.insert(all.end(), ghosts.begin(), ghosts.end());
  std::atomic<int64_t> now{0};
  Heartbeat a({5ms, 3}, countingConnect(), "hb/", "a", [&] { return now.load(); });
  Deaths deaths;
  beatAll(live, 0, 0);
  a.setPeers(all, deaths.callback());
  awaitWakeUp();
  now = 10;
  awaitWakeUp();  // every wake-up that can read the next beats reads the clock at 10
  beatAll(live, 1, 10);  // live again at 10: expires at 25
  awaitWakeUp();
  now = 15;  // the timeout since setPeers: the ghosts expire
  ASSERT_TRUE(hub_.awaitUntil([&] { return deaths.count() >= ghosts.size(); }));
  awaitWakeUp();
  awaitWakeUp();
  a.stop();
  std::lock_guard lock(deaths.mu);
  ASSERT_EQ(deaths.seen.size(), ghosts.size()) << "each dead node once";
  std::set<std::string> reported;
  for (const auto& [node, silent] : deaths.seen) {
    reported.insert(node);
    EXPECT_EQ(silent, 15) << node;
  }
  EXPECT_EQ(reported, std::set<std::string>(ghosts.begin(), ghosts.end()));
}

// The store requests of a wake-up do not grow with the watched nodes: of
// 10,000, 5,000 never beat (no key), and still each wake-up makes one
// MULTI_GET and one CHECK of the keyless nodes, after a first probe of at
// most 1 + kProbeChecks CHECKs (the old reader CHECKed each absent key at
// every wake-up: 5,000 requests).
TEST_F(HeartbeatScaleTest, AWakeUpMakesBoundedRequestsWhateverTheNumberOfNodes) {
  const Strings live = names("live", 5000), ghosts = names("ghost", 5000);
  Strings all = live;
  all.insert(all.end(), ghosts.begin(), ghosts.end());
  Heartbeat a({5ms, 3}, countingConnect(), "hb/", "a", [] { return int64_t{0}; });
  beatAll(live, 0, 0);
  a.setPeers(all, {});  // the clock stands still: nobody expires
  ASSERT_TRUE(hub_.awaitUntil([&] { return counts_.multiGets >= 6; }));
  a.stop();
  const int wakeUps = counts_.multiGets;
  EXPECT_LE(counts_.checks, 1 + Heartbeat::kProbeChecks + wakeUps + 1)
      << counts_.checks << " CHECKs in " << wakeUps << " wake-ups";
}

// As above with no key at all (nothing found by the first probe): the
// nodes probed in vain are not probed one by one again, each later wake-up
// CHECKs them as one group.
TEST_F(HeartbeatScaleTest, AWakeUpMakesBoundedRequestsWhenNoWatchedKeyExists) {
  counts_.whole = 10000;
  Heartbeat a({5ms, 3}, countingConnect(), "hb/", "a", [] { return int64_t{0}; });
  a.setPeers(names("ghost", 10000), {});
  ASSERT_TRUE(hub_.awaitUntil([&] { return counts_.wholeChecks >= 6; }));
  a.stop();
  const int wakeUps = counts_.wholeChecks;
  EXPECT_EQ(counts_.multiGets, 0);
  EXPECT_LE(counts_.checks, 1 + Heartbeat::kProbeChecks + wakeUps + 1)
      << counts_.checks << " CHECKs in " << wakeUps << " wake-ups";
}

// The watcher stuck anywhere in a wake-up (here: in a clock read just after
// a MULTI_GET, where the old code held its lock to decide) holds no lock
// that setOnLost() or setPeers() wait for.
TEST_F(HeartbeatScaleTest, SettersDoNotWaitForAWakeUp) {
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<std::thread::id> watcher{};
  std::atomic<bool> armed{false};
  counts_.afterMultiGet = [&] {
    if (watcher.load() != std::thread::id()) return;
    watcher = std::this_thread::get_id();
    armed = true;
  };
  auto clock = [&]() -> int64_t {
    if (armed && std::this_thread::get_id() == watcher.load() && armed.exchange(false)) {
      entered.set_value();
      released.wait();
    }
    return 0;
  };
  Heartbeat a({5ms, 3}, countingConnect(), "hb/", "a", clock);
  hub_.set("hb/b", encodeBeat(0, 0));
  a.setPeers({"b"}, {});
  ASSERT_EQ(entered.get_future().wait_for(60s), std::future_status::ready);
  auto setters = std::async(std::launch::async, [&] {
    a.setOnLost([](int64_t) {});
    a.setPeers({"b", "c"}, [](const std::string&, int64_t) {});
  });
  const auto status = setters.wait_for(60s);
  release.set_value();  // only now does the wake-up go on
  EXPECT_EQ(status, std::future_status::ready) << "a setter waited for the wake-up";
  setters.wait();
  a.stop();
}

// stop() during a wake-up's callbacks waits for the one running, not for
// the others: 1,000 nodes die at once, the first onDead blocks until stop()
// cancels the watcher's store, and no further onDead runs after it.
TEST_F(HeartbeatScaleTest, StopDoesNotWaitForTheRestOfAWakeUpsCallbacks) {
  std::atomic<int64_t> now{0};
  Heartbeat a({5ms, 3}, countingConnect(), "hb/", "a", [&] { return now.load(); });
  std::promise<void> entered;
  std::atomic<int> calls{0};
  a.setPeers(names("ghost", 1000), [&](const std::string&, int64_t) {
    if (++calls > 1) return;
    entered.set_value();
    myToken()->sleepFor(60s);  // a store request in flight, until cancelled
  });
  now = 15;
  ASSERT_EQ(entered.get_future().wait_for(60s), std::future_status::ready);
  a.stop();
  EXPECT_EQ(calls, 1) << "stop() let the wake-up report the other dead nodes";
}

TEST(HeartbeatOptions, NeedAPositiveIntervalAndAttempts) {
  MemoryHub hub;
  auto connect = [&](std::shared_ptr<store::CancelToken> c) { return hub.connect(c); };
  EXPECT_THROW(Heartbeat({0ms, 3}, connect, "hb/", "a"), InvalidArgument);
  EXPECT_THROW(Heartbeat({5ms, 0}, connect, "hb/", "a"), InvalidArgument);
}

}  // namespace
}  // namespace ddprun::rendezvous::detail
