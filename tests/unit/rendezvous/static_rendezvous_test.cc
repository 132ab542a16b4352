// The static rendezvous's protocol on an in-memory store: nodes are
// rendezvous objects of this process sharing one MemoryHub, their results run
// on the test's thread through PostQueues. No sockets, no sleeps.
#include <gtest/gtest.h>

#include <atomic>
#include <latch>
#include <map>
#include <mutex>
#include <thread>

#include "ddprun/common/error.h"
#include "ddprun/common/strings.h"
#include "heartbeat.h"
#include "rendezvous/memory_hub.h"
#include "rendezvous/post_queue.h"
#include "static_rendezvous_internal.h"

namespace ddprun::rendezvous {
namespace {

using namespace std::chrono_literals;
using testing::MemoryHub;
using testing::Node;

class StaticRendezvousTest : public ::testing::Test {
 protected:
  // Node `rank` of `nnodes` on the hub, master port 29500. Node 0 readies
  // the shared worker store as the real backend does (port 29500), erasing
  // those of workerKeys_ and foreignKeys_ under the prefixes it is given
  // (the hub cannot list keys) and recording each call in readied_. Heartbeats as keepAlive_ says. kill(rank) ends all of the
  // node's connections at once, as kill -9 of its agent would: it falls
  // silent without a word.
  std::unique_ptr<Node> node(int rank, int nnodes, Millis timeout = 60s) {
    StaticOptions o;
    o.masterAddr = "10.0.0.1";
    o.nodeRank = rank;
    o.nnodes = nnodes;
    o.runId = "job";
    o.timeout = timeout;
    o.keepAliveInterval = keepAlive_.interval;
    o.keepAliveMaxAttempt = keepAlive_.maxAttempts;
    detail::StaticBackend b;
    auto killed = kills_[rank] = std::make_shared<store::CancelToken>();
    b.connect = [this, killed](std::shared_ptr<store::CancelToken> cancel, Millis) {
      auto either = std::make_shared<store::CancelToken>();
      cancel->subscribe([either] { either->cancel(); });
      killed->subscribe([either] { either->cancel(); });
      return hub_.connect(std::move(either));
    };
    b.readyWorkerStore = [this, nnodes](const std::vector<std::string>& prefixes) {
      Readied r{prefixes, true, 0};
      const int round = workerStores_;
      for (int i = 0; i < nnodes; ++i)
        r.everyNodeJoined =
            r.everyNodeJoined && hub_.has(key(round, "node/" + std::to_string(i)));
      for (const auto* keys : {&workerKeys_, &foreignKeys_})
        for (const auto& k : *keys) {
          bool under = false;
          for (const auto& p : prefixes) under = under || k.rfind(p, 0) == 0;
          if (!under) continue;
          r.erased += hub_.has(k) ? 1 : 0;
          hub_.erase(k);
        }
      {
        std::lock_guard lock(readiedMu_);
        readied_.push_back(r);
      }
      ++workerStores_;
      return uint16_t{29500};
    };
    b.storeAddress = "memory:1";
    auto n = std::make_unique<Node>();
    n->attach(detail::makeStaticRendezvous(o, n->queue.post(), std::move(b)));
    return n;
  }
  std::vector<std::unique_ptr<Node>> nodes(int nnodes) {
    std::vector<std::unique_ptr<Node>> out;
    for (int i = 0; i < nnodes; ++i) out.push_back(node(i, nnodes));
    return out;
  }
  // Every node joins the next round, with nproc[i] workers (1 if absent).
  static void joinAll(std::vector<std::unique_ptr<Node>>& ns,
                      std::vector<int> nproc = {}) {
    for (size_t i = 0; i < ns.size(); ++i) ns[i]->join(i < nproc.size() ? nproc[i] : 1);
    for (auto& n : ns) {
      n->awaitJoin();
      ASSERT_FALSE(n->error) << "a join failed";
    }
  }
  static std::string key(int round, const std::string& name) {
    return "ddprun/job/round/" + std::to_string(round) + "/" + name;
  }
  void kill(int rank) { kills_.at(rank)->cancel(); }
  // Node `rank`'s heartbeat seq in the store, -1 before its first beat.
  int64_t beats(int rank) {
    int64_t seq = -1, wall = 0;
    auto v = hub_.value("ddprun/job/hb/node" + std::to_string(rank));
    return detail::decodeBeat(v, seq, wall) ? seq : -1;
  }

  MemoryHub hub_;                     // first: outlives the nodes
  std::atomic<int> workerStores_{0};  // calls of readyWorkerStore: one per round
  struct Readied {
    std::vector<std::string> prefixes;
    bool everyNodeJoined;  // the round's barrier was complete at the call
    int erased;            // keys present then and erased
  };
  std::vector<std::string> workerKeys_;   // what the tests' "workers" write
  std::vector<std::string> foreignKeys_;  // what other clients write
  std::mutex readiedMu_;
  std::vector<Readied> readied_;
  // The default keep-alive: nobody is declared dead within a test.
  detail::HeartbeatOptions keepAlive_{5s, 3};
  // A short one, for the liveness tests. A live node's beat thread would
  // have to stall 20 intervals for a false death: not even a loaded machine.
  static constexpr detail::HeartbeatOptions kShortKeepAlive{10ms, 20};
  std::map<int, std::shared_ptr<store::CancelToken>> kills_;
};

void expectEvent(const RoundEvent& e, int round, RoundEnd kind, int node,
                 const std::string& why) {
  EXPECT_EQ(e.round, round);
  EXPECT_EQ(e.kind, kind) << toString(e.kind);
  EXPECT_EQ(e.node, node);
  EXPECT_EQ(e.reason, why);
}

TEST_F(StaticRendezvousTest, NodesWithDifferentWorkerCountsGetDistinctBaseRanks) {
  auto ns = nodes(3);
  joinAll(ns, {2, 3, 1});
  const std::vector<int> base = {0, 2, 5};
  for (int i = 0; i < 3; ++i) {
    const RoundInfo& info = ns[i]->info;
    EXPECT_EQ(info.round, 0);
    EXPECT_EQ(info.groupRank, i);
    EXPECT_EQ(info.groupWorldSize, 3);
    EXPECT_EQ(info.baseRank, base[i]);
    EXPECT_EQ(info.worldSize, 6);
    EXPECT_EQ(info.localWorldSizes, (std::vector<int>{2, 3, 1}));
    EXPECT_EQ(info.workerStoreHost, "10.0.0.1");
    EXPECT_EQ(info.workerStorePort, 29500);  // node 0's store, read by all
  }
  EXPECT_EQ(workerStores_, 1) << "only node 0 readies the worker store";
}

TEST_F(StaticRendezvousTest, EachRoundEndArrivesTypedOnEveryNode) {
  auto ns = nodes(3);
  joinAll(ns);
  for (auto& n : ns) n->rdzv->reportSuccess(0);
  for (auto& n : ns) expectEvent(n->awaitEvent(), 0, RoundEnd::kFinished, -1, "");

  joinAll(ns);
  ns[2]->rdzv->reportFailure(1, "rank 2 exited with 1", /*closeJob=*/false);
  for (auto& n : ns)
    expectEvent(n->awaitEvent(), 1, RoundEnd::kFailed, 2, "rank 2 exited with 1");

  joinAll(ns);
  ns[1]->rdzv->reportFailure(2, "rank 1: signal: SIGKILL", /*closeJob=*/true);
  for (auto& n : ns)
    expectEvent(n->awaitEvent(), 2, RoundEnd::kClosed, 1, "rank 1: signal: SIGKILL");

  for (auto& n : ns) EXPECT_EQ(n->info.round, 2);
  EXPECT_EQ(workerStores_, 3) << "the worker store is readied each round";
}

// The workers share the agent store: what they wrote in a failed round is
// erased by node 0 once every node has joined the next round (so none of
// the old workers runs any more), before any node's join ends (so no new
// worker reads it); nothing else goes: not the rendezvous's own keys, not
// another client's (the real erase: server_state_test.cc,
// tests/integration/rendezvous_test.cc).
TEST_F(StaticRendezvousTest,
       EachRoundsWorkerKeysAreErasedAfterTheBarrierBeforeAnyWorkerStarts) {
  workerKeys_ = {"default_pg/0//rank_0", "init/", "/worker/attempt_0/default_pg/0//rank_1",
                 "ddprun/pg/attempt0/g0/rank0"};
  // A user's keys and a prefix neighbour of the job's namespace: another
  // tenant's, which a restart must leave alone.
  foreignKeys_ = {"user/key", "ddprun/job_x/k", "default_pgX", "worker/attempt_0"};
  for (const auto& k : foreignKeys_) hub_.set(k, "mine");
  auto ns = nodes(2);
  joinAll(ns);
  for (const auto& k : workerKeys_) hub_.set(k, "round 0");
  ns[1]->rdzv->reportFailure(0, "rank 1 exited with 1", false);
  for (auto& n : ns) n->awaitEvent();

  ns[1]->join(1);
  ASSERT_TRUE(hub_.awaitUntil([&] { return hub_.has(key(1, "node/1")); }));
  ASSERT_TRUE(hub_.awaitWaiters(1));  // node 1 waits for node 0
  for (const auto& k : workerKeys_)
    EXPECT_TRUE(hub_.has(k)) << k << " erased before node 0 joined the round";
  ns[0]->join(1);
  for (auto& n : ns) {
    n->awaitJoin();
    ASSERT_FALSE(n->error);
    EXPECT_EQ(n->info.workerStorePort, 29500);
  }
  for (const auto& k : workerKeys_) EXPECT_FALSE(hub_.has(k)) << k;
  for (const auto& k : foreignKeys_) {
    ASSERT_TRUE(hub_.has(k)) << k << ": another client's key was erased";
    EXPECT_EQ(hub_.value(k), "mine");
  }
  EXPECT_TRUE(hub_.has(key(0, "end"))) << "the rendezvous's own keys stay";
  std::lock_guard lock(readiedMu_);
  ASSERT_EQ(readied_.size(), 2u);
  for (const auto& r : readied_) {
    EXPECT_EQ(r.prefixes, detail::workerKeyPrefixes());
    EXPECT_TRUE(r.everyNodeJoined);
  }
  EXPECT_EQ(readied_[1].erased, 4);
}

TEST_F(StaticRendezvousTest, RoundsAreIndependent) {
  auto ns = nodes(3);
  joinAll(ns);
  ns[0]->rdzv->reportSuccess(0);
  ns[1]->rdzv->reportSuccess(0);
  ns[2]->rdzv->reportFailure(0, "rank 2 exited with 3", false);
  for (auto& n : ns)
    expectEvent(n->awaitEvent(), 0, RoundEnd::kFailed, 2, "rank 2 exited with 3");

  // Round 0 counted two successes; round 1 counts afresh and needs all three.
  joinAll(ns);
  ns[0]->rdzv->reportSuccess(1);
  ns[1]->rdzv->reportSuccess(1);
  ASSERT_TRUE(hub_.awaitUntil([&] { return hub_.has(key(1, "done/0")) && hub_.has(key(1, "done/1")); }));
  EXPECT_FALSE(hub_.has(key(1, "done/2")));
  EXPECT_FALSE(hub_.has(key(1, "end")));
  ns[2]->rdzv->reportSuccess(1);
  for (auto& n : ns) expectEvent(n->awaitEvent(), 1, RoundEnd::kFinished, -1, "");
}

// A success report is idempotent (issue 40): one applied twice (a client
// that sent it again after its reply was lost) counts once, so the round
// does not finish before every node has reported.
TEST_F(StaticRendezvousTest, ASuccessReportAppliedTwiceCountsOnce) {
  auto ns = nodes(3);
  joinAll(ns);
  ns[0]->rdzv->reportSuccess(0);
  ns[0]->rdzv->reportSuccess(0);
  ns[1]->rdzv->reportSuccess(0);
  ASSERT_TRUE(hub_.awaitUntil([&] { return hub_.has(key(0, "done/1")); }));
  ns[0]->rdzv->reportSuccess(0);
  ASSERT_TRUE(hub_.awaitUntil([&] { return hub_.has(key(0, "done/0")); }));
  EXPECT_FALSE(hub_.has(key(0, "end"))) << "node 2 has not reported";
  ns[2]->rdzv->reportSuccess(0);
  for (auto& n : ns) expectEvent(n->awaitEvent(), 0, RoundEnd::kFinished, -1, "");
}

TEST_F(StaticRendezvousTest, TheFirstReportOfARoundWins) {
  auto ns = nodes(3);
  joinAll(ns);
  ns[1]->rdzv->reportFailure(0, "first", false);
  ASSERT_TRUE(hub_.awaitUntil([&] { return hub_.has(key(0, "end")); }));
  ns[0]->rdzv->reportFailure(0, "second", true);
  ns[2]->rdzv->reportSuccess(0);
  for (auto& n : ns) expectEvent(n->awaitEvent(), 0, RoundEnd::kFailed, 1, "first");

  // Each node's next join runs after its report; its round-0 watcher is
  // joined before the round-1 watcher starts, so a second round-0 event
  // would come before the round-1 event.
  joinAll(ns);
  EXPECT_EQ(hub_.value(key(0, "end")), "failed:1:first");
  ns[0]->rdzv->reportFailure(1, "next", false);
  for (auto& n : ns) {
    expectEvent(n->awaitEvent(), 1, RoundEnd::kFailed, 0, "next");
    EXPECT_EQ(n->events.size(), 2u);
  }
}

TEST_F(StaticRendezvousTest, PeersSayTheyLeftBeforeTheEventArrives) {
  auto ns = nodes(2);
  joinAll(ns);
  for (auto& n : ns) n->rdzv->reportSuccess(0);
  for (auto& n : ns) n->awaitEvent();
  // Node 0 stops the agent store at shutdown once these exist (or after
  // leaveTimeout): no peer finds it gone before reading the round's end.
  EXPECT_TRUE(hub_.has(key(0, "left/0")));
  EXPECT_TRUE(hub_.has(key(0, "left/1")));
}

TEST_F(StaticRendezvousTest, AJoinTimeoutNamesTheMissingNodeAndTheStore) {
  auto n2 = node(2, 3);
  n2->join(1);
  ASSERT_TRUE(hub_.awaitUntil([&] { return hub_.has(key(0, "node/2")); }));
  auto n0 = node(0, 3, 100ms);
  n0->join(1);
  n0->awaitJoin();
  try {
    n0->rethrow();
    FAIL() << "joined without node 1";
  } catch (const TimeoutError& e) {
    const std::string& m = e.message();
    EXPECT_NE(m.find("node 1 of 3 did not join within 100 ms"), std::string::npos) << m;
    EXPECT_NE(m.find("key ddprun/job/round/0/node/1 is absent"), std::string::npos) << m;
    EXPECT_NE(m.find("memory:1"), std::string::npos) << m;
    EXPECT_EQ(m.find("node/2"), std::string::npos) << m;
  }
}

TEST_F(StaticRendezvousTest, CancelEndsAJoinWaitingForPeers) {
  auto n0 = node(0, 2, 600s);
  n0->join(1);
  ASSERT_TRUE(hub_.awaitWaiters(1));                // node 0 is blocked in the barrier
  std::thread([&] { n0->rdzv->cancel(); }).join();  // thread-safe
  n0->awaitJoin();
  EXPECT_THROW(n0->rethrow(), CancelledError);
  n0->join(1);  // cancelled for good
  n0->awaitJoin();
  EXPECT_THROW(n0->rethrow(), CancelledError);
  EXPECT_EQ(workerStores_, 0);
}

TEST_F(StaticRendezvousTest, CancelEndsAJoinStillConnecting) {
  std::latch connecting(1);
  StaticOptions o;
  o.nodeRank = 1;
  o.nnodes = 2;
  detail::StaticBackend b;
  // Node 0 never comes up: connecting goes on until cancelled.
  b.connect = [&](std::shared_ptr<store::CancelToken> cancel,
                  Millis) -> std::unique_ptr<store::Store> {
    connecting.count_down();
    if (cancel->sleepFor(600s)) DDPRUN_THROW(CancelledError, "connecting was cancelled");
    DDPRUN_THROW(TimeoutError, "node 0 never came up");
  };
  b.readyWorkerStore = [](const std::vector<std::string>&) { return uint16_t{0}; };
  Node n;
  n.attach(detail::makeStaticRendezvous(o, n.queue.post(), std::move(b)));
  n.join(1);
  connecting.wait();
  n.rdzv->cancel();
  n.awaitJoin();
  EXPECT_THROW(n.rethrow(), CancelledError);
}

TEST_F(StaticRendezvousTest, ShutdownEndsAPendingJoin) {
  auto n0 = node(0, 2, 600s);
  n0->join(1);
  ASSERT_TRUE(hub_.awaitWaiters(1));
  n0->rdzv->shutdown();  // returns: the blocked wait was cancelled and joined
  n0->awaitJoin();
  EXPECT_THROW(n0->rethrow(), CancelledError);
}

TEST_F(StaticRendezvousTest, AJunkWorkerCountIsAProtocolErrorNamingTheKey) {
  hub_.set(key(0, "node/1"), "two");
  auto n0 = node(0, 2);
  n0->join(1);
  n0->awaitJoin();
  try {
    n0->rethrow();
    FAIL() << "joined with a junk worker count";
  } catch (const ProtocolError& e) {
    EXPECT_NE(e.message().find("'two' under ddprun/job/round/0/node/1"),
              std::string::npos)
        << e.message();
  }
}

TEST_F(StaticRendezvousTest, AJunkEndValueClosesTheJob) {
  auto ns = nodes(2);
  joinAll(ns);
  hub_.set(key(0, "end"), "exploded");
  for (auto& n : ns) {
    RoundEvent e = n->awaitEvent();
    EXPECT_EQ(e.kind, RoundEnd::kClosed);
    EXPECT_EQ(e.node, -1);
    EXPECT_NE(e.reason.find("'exploded' under ddprun/job/round/0/end"), std::string::npos)
        << e.reason;
  }
}

TEST_F(StaticRendezvousTest, ALostStoreReachesEveryNode) {
  auto ns = nodes(2);
  joinAll(ns);
  hub_.fail();
  for (auto& n : ns) {
    RoundEvent e = n->awaitEvent();
    EXPECT_EQ(e.round, 0);
    EXPECT_EQ(e.kind, RoundEnd::kStoreLost);
    EXPECT_NE(e.reason.find("memory:1 is gone"), std::string::npos) << e.reason;
  }
}

TEST_F(StaticRendezvousTest, DescribesItself) {
  auto n = node(1, 2);
  EXPECT_EQ(n->rdzv->describe(), "static, node 1 of 2, store memory:1");
}

TEST_F(StaticRendezvousTest, AKilledNodeEndsTheRoundAsFailedOnEveryOtherNode) {
  keepAlive_ = kShortKeepAlive;
  auto ns = nodes(3);
  joinAll(ns);
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(hub_.awaitUntil([&] { return beats(i) >= 0; }))
        << "node " << i << " beats";
  kill(2);
  const std::string why = "node 2's agent missed heartbeats for ";
  for (int i = 0; i < 2; ++i) {
    RoundEvent e = ns[i]->awaitEvent();
    EXPECT_EQ(e.round, 0);
    EXPECT_EQ(e.kind, RoundEnd::kFailed) << toString(e.kind);
    EXPECT_EQ(e.node, 2);
    EXPECT_TRUE(str::startsWith(e.reason, why)) << e.reason;
  }
  EXPECT_TRUE(str::startsWith(hub_.value(key(0, "end")), "failed:2:" + why));
  EXPECT_TRUE(ns[2]->events.empty()) << "a dead node hears nothing";
  // Said for the dead node, right after the end: node 0 does not wait for
  // its goodbye at shutdown.
  EXPECT_TRUE(hub_.awaitUntil([&] { return hub_.has(key(0, "left/2")); }));
}

TEST_F(StaticRendezvousTest, ANodeThatLeftIsNotTakenForDead) {
  keepAlive_ = kShortKeepAlive;
  auto ns = nodes(3);
  joinAll(ns);
  ns[1]->rdzv->shutdown();  // says it left, then stops beating
  ASSERT_TRUE(hub_.has(key(0, "left/1")));
  // Many timeouts pass (node 0's own beats mark the time) ...
  const int64_t then = beats(0);
  ASSERT_TRUE(hub_.awaitUntil([&] { return beats(0) >= then + 3 * 20; }));
  EXPECT_FALSE(hub_.has(key(0, "end")));
  // ... and the watchers are alive: a node that really dies is reported, and
  // it is node 2, not node 1, although node 1 fell silent first.
  kill(2);
  RoundEvent e = ns[0]->awaitEvent();
  EXPECT_EQ(e.kind, RoundEnd::kFailed) << toString(e.kind);
  EXPECT_EQ(e.node, 2) << e.reason;
}

TEST_F(StaticRendezvousTest, NobodyIsWatchedBetweenRounds) {
  keepAlive_ = kShortKeepAlive;
  auto ns = nodes(2);
  joinAll(ns);
  ns[1]->rdzv->reportFailure(0, "rank 1 exited with 1", false);
  for (auto& n : ns) n->awaitEvent();
  // Node 1 is slow to come back (its workers take long to stop): it beats,
  // but even silent it would not be declared dead before the next round.
  kill(1);
  const int64_t then = beats(0);
  ASSERT_TRUE(hub_.awaitUntil([&] { return beats(0) >= then + 3 * 20; }));
  EXPECT_EQ(hub_.value(key(0, "end")), "failed:1:rank 1 exited with 1");
  EXPECT_FALSE(hub_.has(key(1, "end")));
  EXPECT_EQ(ns[0]->events.size(), 1u);
}

TEST_F(StaticRendezvousTest, TheRestartCountIsTheJobsFailedRoundsOnEveryNode) {
  auto ns = nodes(3);
  for (int round = 0; round < 3; ++round) {
    joinAll(ns);
    for (auto& n : ns) EXPECT_EQ(n->info.restartCount, round) << "round " << round;
    EXPECT_EQ(hub_.value(key(round, "restarts")), std::to_string(round));
    ns[round % 3]->rdzv->reportFailure(round, "rank exited with 1", false);
    for (auto& n : ns) n->awaitEvent();
  }
}

TEST_F(StaticRendezvousTest, TheFirstRestartCountWrittenWins) {
  hub_.set(key(0, "restarts"), "5");  // say, an older agent's
  auto ns = nodes(2);
  joinAll(ns);
  for (auto& n : ns) EXPECT_EQ(n->info.restartCount, 5);
  ns[0]->rdzv->reportFailure(0, "rank 0 exited with 1", false);
  for (auto& n : ns) n->awaitEvent();
  joinAll(ns);
  for (auto& n : ns) EXPECT_EQ(n->info.restartCount, 6);
}

TEST_F(StaticRendezvousTest, AJunkRestartCountIsAProtocolErrorNamingTheKey) {
  hub_.set(key(0, "restarts"), "lots");
  auto n0 = node(0, 1);
  n0->join(1);
  n0->awaitJoin();
  try {
    n0->rethrow();
    FAIL() << "joined with a junk restart count";
  } catch (const ProtocolError& e) {
    EXPECT_NE(e.message().find("'lots' under ddprun/job/round/0/restarts"),
              std::string::npos)
        << e.message();
  }
}

TEST(StaticRendezvousOptions, ANodeRankOutsideTheJobIsRejected) {
  StaticOptions o;
  o.nnodes = 2;
  for (int rank : {-1, 2}) {
    o.nodeRank = rank;
    // Checked before node 0 would bind anything.
    EXPECT_THROW(makeStaticRendezvous(o, [](std::function<void()>) {}), InvalidArgument);
  }
}

TEST(StaticRendezvousOptions, AKeepAliveMustBePositive) {
  StaticOptions o;
  o.nnodes = 2;
  o.nodeRank = 1;
  o.keepAliveInterval = 0ms;
  EXPECT_THROW(makeStaticRendezvous(o, [](std::function<void()>) {}), InvalidArgument);
  o.keepAliveInterval = 5s;
  o.keepAliveMaxAttempt = 0;
  EXPECT_THROW(makeStaticRendezvous(o, [](std::function<void()>) {}), InvalidArgument);
}

TEST(CancelToken, RunsCallbacksOnceAndAtOnceWhenLate) {
  store::CancelToken t;
  int early = 0, removed = 0, late = 0;
  t.subscribe([&] { ++early; });
  auto id = t.subscribe([&] { ++removed; });
  t.unsubscribe(id);
  EXPECT_FALSE(t.cancelled());
  t.cancel();
  t.cancel();
  EXPECT_TRUE(t.cancelled());
  t.subscribe([&] { ++late; });
  EXPECT_EQ(early, 1);
  EXPECT_EQ(removed, 0);
  EXPECT_EQ(late, 1);
  EXPECT_TRUE(t.sleepFor(600s));  // already cancelled: no sleep
}

TEST(CancelToken, CancelFromAnotherThreadEndsASleep) {
  store::CancelToken t;
  std::thread canceller([&] { t.cancel(); });
  EXPECT_TRUE(t.sleepFor(600s));
  canceller.join();
}

}  // namespace
}  // namespace ddprun::rendezvous
