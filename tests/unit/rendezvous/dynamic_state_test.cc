// The dynamic rendezvous's state transitions as pure values: every rule and
// timeout with a fake clock (plain milliseconds), no store.
#include "dynamic_state.h"

#include <gtest/gtest.h>

#include "ddprun/common/error.h"
#include "round_end.h"

namespace ddprun::rendezvous::detail {
namespace {

constexpr int64_t kT0 = 1'000'000;  // "now" at the start of each test

NodeDesc node(const std::string& addr, int nproc = 1, bool host = false) {
  NodeDesc d;
  d.id = makeNodeId(addr, 100, 0);
  d.nproc = nproc;
  d.host = host;
  return d;
}

std::vector<std::string> ids(const std::vector<NodeDesc>& v) {
  std::vector<std::string> out;
  for (const auto& d : v) out.push_back(d.id);
  return out;
}

// Nodes joining `s` in order at `now`; returns each one's last outcome.
std::vector<JoinOutcome> joinAll(State& s, std::vector<NodeDesc>& ns, const Limits& lim,
                                 int64_t now = kT0) {
  std::vector<JoinOutcome> out;
  for (auto& n : ns) out.push_back(joinStep(s, n, lim, now));
  return out;
}

TEST(DynamicStateTest, NodeIdsAndTheirDescriptions) {
  EXPECT_EQ(makeNodeId("10.0.0.2", 42, 0), "10.0.0.2_42_0");
  EXPECT_EQ(describeNode("10.0.0.2_42_0"), "node 10.0.0.2 (pid 42)");
  EXPECT_EQ(describeNode("my_host_7_1"), "node my_host (pid 7)");
  EXPECT_EQ(describeNode("junk"), "node junk");
}

TEST(DynamicStateTest, RoundZeroAtMinWaitsForTheLastCall) {
  Limits lim{1, 2, 30'000};
  State s;
  auto a = node("a");
  EXPECT_EQ(joinStep(s, a, lim, kT0), JoinOutcome::kWaitComplete);
  EXPECT_EQ(a.seq, 0);
  EXPECT_EQ(s.lastCallMs, kT0 + 30'000) << "the MIN-th join starts the last call";
  EXPECT_FALSE(completeIfDue(s, lim, kT0 + 29'999));
  EXPECT_TRUE(completeIfDue(s, lim, kT0 + 30'000));
  EXPECT_TRUE(s.complete);
  EXPECT_EQ(s.lastCallMs, 0);
  EXPECT_EQ(joinStep(s, a, lim, kT0 + 30'000), JoinOutcome::kComplete);
}

TEST(DynamicStateTest, MaxCompletesAtOnce) {
  Limits lim{2, 4, 30'000};
  State s;
  std::vector<NodeDesc> ns = {node("a"), node("b"), node("c"), node("d")};
  auto out = joinAll(s, ns, lim);
  EXPECT_EQ(out[1], JoinOutcome::kWaitComplete);
  EXPECT_EQ(out[3], JoinOutcome::kComplete);
  EXPECT_TRUE(s.complete);
  EXPECT_EQ(s.round, 0);
}

TEST(DynamicStateTest, GroupRanksPutTheHostFirstThenArrival) {
  Limits lim{3, 3, 30'000};
  State s;
  std::vector<NodeDesc> ns = {node("c", 2), node("a", 3), node("b", 1, /*host=*/true)};
  joinAll(s, ns, lim);
  ASSERT_TRUE(s.complete);
  EXPECT_EQ(ids(s.participants), (std::vector<std::string>{ns[2].id, ns[0].id, ns[1].id}));
  EXPECT_EQ(s.participants[1].nproc, 2);
  EXPECT_EQ(rankOf(s, ns[1].id), 2);
  EXPECT_EQ(rankOf(s, "nobody"), -1);
}

TEST(DynamicStateTest, ArrivalOrderIsKeptAcrossRounds) {
  Limits lim{2, 3, 30'000};
  State s;
  std::vector<NodeDesc> ns = {node("a"), node("b"), node("c")};
  joinAll(s, ns, lim);
  ASSERT_TRUE(endRound(s, 0, RoundEnd::kFailed, 1, "rank 1 exited with 1"));
  // The next round's joins come in reverse order; the ranks do not change.
  std::vector<NodeDesc> rev = {ns[2], ns[1], ns[0]};
  joinAll(s, rev, lim);
  ASSERT_TRUE(s.complete) << "every expected node rejoined";
  EXPECT_EQ(ids(s.participants), ids(ns));
}

TEST(DynamicStateTest, ExpectedNodesCompleteTheRoundWithoutTheLastCall) {
  Limits lim{2, 4, 30'000};
  State s;
  std::vector<NodeDesc> ns = {node("a"), node("b"), node("c")};
  joinAll(s, ns, lim);
  ASSERT_TRUE(completeIfDue(s, lim, kT0 + 30'000));
  ASSERT_TRUE(endRound(s, 0, RoundEnd::kFailed, 0, "x"));
  EXPECT_EQ(s.expected, ids(ns));
  EXPECT_EQ(joinStep(s, ns[0], lim, kT0 + 31'000), JoinOutcome::kWaitComplete);
  EXPECT_EQ(joinStep(s, ns[1], lim, kT0 + 31'000), JoinOutcome::kWaitComplete);
  EXPECT_EQ(joinStep(s, ns[2], lim, kT0 + 31'000), JoinOutcome::kComplete);
  EXPECT_EQ(s.round, 1);
}

TEST(DynamicStateTest, FailureCountsARestartMembershipDoesNot) {
  Limits lim{1, 1, 30'000};
  State s;
  auto a = node("a");
  joinStep(s, a, lim, kT0);
  ASSERT_TRUE(endRound(s, 0, RoundEnd::kFailed, 0, "rank 0 exited with 1"));
  EXPECT_EQ(s.restartCount, 1);
  EXPECT_EQ(s.lastEndedRound, 0);
  EXPECT_EQ(s.lastEnd, "failed:0:rank 0 exited with 1");
  EXPECT_FALSE(endRound(s, 0, RoundEnd::kFailed, 0, "again")) << "the first end wins";
  EXPECT_FALSE(endRound(s, 1, RoundEnd::kFailed, 0, "forming")) << "round 1 is not running";
  joinStep(s, a, lim, kT0);
  ASSERT_TRUE(endRound(s, 1, RoundEnd::kMembershipChanged, -1, "x"));
  EXPECT_EQ(s.restartCount, 1);
  EXPECT_FALSE(s.closed);
}

TEST(DynamicStateTest, ClosedAndFinishedRoundsCloseTheJob) {
  Limits lim{1, 1, 30'000};
  State s;
  auto a = node("a");
  joinStep(s, a, lim, kT0);
  ASSERT_TRUE(endRound(s, 0, RoundEnd::kClosed, 0, "rank 0 exited with 1"));
  EXPECT_TRUE(s.closed);
  EXPECT_EQ(s.closedReason, "rank 0 exited with 1");
  auto late = node("late");
  EXPECT_EQ(joinStep(s, late, lim, kT0), JoinOutcome::kClosed);

  State f;
  joinStep(f, a, lim, kT0);
  ASSERT_TRUE(endRound(f, 0, RoundEnd::kFinished, -1, ""));
  EXPECT_TRUE(f.closed);
  EXPECT_EQ(f.lastEnd, "finished");
  EXPECT_FALSE(close(f, "later")) << "the first reason stays";
  EXPECT_EQ(f.closedReason, "it finished");
}

TEST(DynamicStateTest, ANewcomerWithRoomEndsTheRunningRoundAndJoinsTheNext) {
  Limits lim{2, 4, 30'000};
  State s;
  std::vector<NodeDesc> ns = {node("a"), node("b")};
  joinAll(s, ns, lim);
  ASSERT_TRUE(completeIfDue(s, lim, kT0 + 30'000));
  auto c = node("c");
  EXPECT_EQ(joinStep(s, c, lim, kT0 + 40'000), JoinOutcome::kWaitComplete);
  EXPECT_EQ(s.round, 1);
  EXPECT_EQ(s.lastEndedRound, 0);
  RoundEvent e = decodeEnd(0, "k", s.lastEnd);
  EXPECT_EQ(e.kind, RoundEnd::kMembershipChanged);
  EXPECT_EQ(e.node, -1);
  EXPECT_EQ(e.reason, "node c (pid 100) is waiting to join");
  EXPECT_EQ(s.restartCount, 0);
  EXPECT_TRUE(s.waitList.empty()) << "it left the wait list by joining";
  EXPECT_EQ(s.expected, (std::vector<std::string>{ns[0].id, ns[1].id, c.id}));
  joinAll(s, ns, lim, kT0 + 40'000);
  EXPECT_TRUE(s.complete) << "the survivors and the newcomer are all in";
  EXPECT_EQ(ids(s.participants), (std::vector<std::string>{ns[0].id, ns[1].id, c.id}));
}

TEST(DynamicStateTest, BeyondMaxANodeWaitsInTheRedundancyListUntilOneLeaves) {
  Limits lim{1, 2, 30'000};
  State s;
  std::vector<NodeDesc> ns = {node("a"), node("b")};
  joinAll(s, ns, lim);
  ASSERT_TRUE(s.complete);
  auto c = node("c");
  EXPECT_EQ(joinStep(s, c, lim, kT0), JoinOutcome::kWaitEnd);
  EXPECT_EQ(ids(s.redundancy), (std::vector<std::string>{c.id}));
  EXPECT_EQ(s.round, 0) << "no round end for a node beyond MAX";
  EXPECT_EQ(joinStep(s, c, lim, kT0), JoinOutcome::kWaitEnd) << "asking again changes nothing";

  ASSERT_TRUE(removeNode(s, ns[0].id, "node a (pid 100) left", lim, kT0));
  EXPECT_EQ(s.round, 1);
  EXPECT_EQ(decodeEnd(0, "k", s.lastEnd).node, 0);
  EXPECT_EQ(s.expected, (std::vector<std::string>{ns[1].id, c.id}));
  EXPECT_EQ(joinStep(s, c, lim, kT0), JoinOutcome::kWaitComplete);
  EXPECT_TRUE(s.redundancy.empty());
  EXPECT_EQ(joinStep(s, ns[1], lim, kT0), JoinOutcome::kComplete);
  EXPECT_EQ(ids(s.participants), (std::vector<std::string>{ns[1].id, c.id}))
      << "arrival order: b came before c";
}

TEST(DynamicStateTest, ADeadNodeEndsTheRunningRoundAndIsNotExpectedBack) {
  Limits lim{2, 3, 30'000};
  State s;
  std::vector<NodeDesc> ns = {node("a"), node("b"), node("c")};
  joinAll(s, ns, lim);
  ASSERT_TRUE(s.complete);
  const std::string why = "node b (pid 100) missed heartbeats for 15 s";
  ASSERT_TRUE(removeNode(s, ns[1].id, why, lim, kT0));
  RoundEvent e = decodeEnd(0, "k", s.lastEnd);
  EXPECT_EQ(e.kind, RoundEnd::kMembershipChanged);
  EXPECT_EQ(e.node, 1);
  EXPECT_EQ(e.reason, why);
  EXPECT_EQ(s.expected, (std::vector<std::string>{ns[0].id, ns[2].id}));
  joinStep(s, ns[2], lim, kT0 + 1);
  EXPECT_EQ(joinStep(s, ns[0], lim, kT0 + 1), JoinOutcome::kComplete)
      << "the survivors complete at once, without the last call";
  EXPECT_FALSE(removeNode(s, ns[1].id, why, lim, kT0)) << "already gone";
}

TEST(DynamicStateTest, ADeadExpectedNodeNoLongerHoldsUpAFormingRound) {
  Limits lim{2, 3, 30'000};
  State s;
  std::vector<NodeDesc> ns = {node("a"), node("b"), node("c")};
  joinAll(s, ns, lim);
  endRound(s, 0, RoundEnd::kFailed, 0, "x");
  joinStep(s, ns[0], lim, kT0);
  joinStep(s, ns[1], lim, kT0);
  EXPECT_FALSE(s.complete) << "c is expected back";
  ASSERT_TRUE(removeNode(s, ns[2].id, "dead", lim, kT0 + 5));
  EXPECT_TRUE(s.complete) << "everyone still expected is in";
  EXPECT_EQ(s.round, 1);
  EXPECT_EQ(s.lastEndedRound, 0) << "a forming round does not end";
}

TEST(DynamicStateTest, LeavingBelowMinClearsTheLastCall) {
  Limits lim{2, 4, 30'000};
  State s;
  std::vector<NodeDesc> ns = {node("a"), node("b")};
  joinAll(s, ns, lim);
  EXPECT_EQ(s.lastCallMs, kT0 + 30'000);
  ASSERT_TRUE(removeNode(s, ns[0].id, "left", lim, kT0 + 10));
  EXPECT_EQ(s.lastCallMs, 0);
  EXPECT_FALSE(completeIfDue(s, lim, kT0 + 60'000));
  joinStep(s, ns[0], lim, kT0 + 20);
  EXPECT_EQ(s.lastCallMs, kT0 + 30'020) << "a new last call from the new MIN-th join";
}

TEST(DynamicStateTest, ShortfallNamesWhoJoinedAndWhoIsMissing) {
  Limits lim{3, 4, 30'000};
  State s;
  std::vector<NodeDesc> ns = {node("a"), node("b"), node("c")};
  joinAll(s, ns, lim);
  ASSERT_TRUE(completeIfDue(s, lim, kT0 + 30'000));
  endRound(s, 0, RoundEnd::kFailed, 0, "x");
  joinStep(s, ns[0], lim, kT0);
  EXPECT_EQ(describeShortfall(s, lim),
            "1 of at least 3 nodes joined (node a (pid 100)); 2 more needed; expected but "
            "missing: node b (pid 100), node c (pid 100)");
}

TEST(DynamicStateTest, JsonRoundTripsEveryField) {
  Limits lim{1, 2, 30'000};
  State s;
  std::vector<NodeDesc> ns = {node("a", 2, true), node("b", 3)};
  joinAll(s, ns, lim);
  auto c = node("c");
  joinStep(s, c, lim, kT0);
  endRound(s, 0, RoundEnd::kFailed, 1, "rank 3 exited with 1: a:b");
  joinStep(s, ns[1], lim, kT0);
  close(s, "because");
  State t = fromJson(toJson(s), "k");
  EXPECT_EQ(toJson(t), toJson(s));
  EXPECT_EQ(t.round, 1);
  EXPECT_EQ(t.participants[0].nproc, 3);
  EXPECT_EQ(ids(t.redundancy), (std::vector<std::string>{c.id}));
  EXPECT_EQ(t.expected, s.expected);
  EXPECT_EQ(t.lastEnd, "failed:1:rank 3 exited with 1: a:b");
  EXPECT_EQ(t.closedReason, "because");
  EXPECT_EQ(t.restartCount, 1);
  EXPECT_EQ(t.nextSeq, 3);
}

TEST(DynamicStateTest, JunkIsAProtocolErrorNamingTheKey) {
  const std::string key = "ddprun/job/state";
  for (const std::string junk :
       {"", "Y2FuaW1hZGFt", "{}", "[1,2]", R"({"r":"one"})",
        R"({"r":0,"c":false,"x":false,"p":[{"id":"a","s":0,"n":0}],"e":[],"w":[],"d":[],"lc":0,"rc":0,"er":-1,"ns":1})"}) {
    try {
      fromJson(junk, key);
      ADD_FAILURE() << "accepted: " << junk;
    } catch (const ProtocolError& e) {
      EXPECT_NE(e.message().find(key), std::string::npos) << e.message();
      EXPECT_NE(e.message().find("--rdzv-id"), std::string::npos) << e.message();
    }
  }
}

TEST(DynamicStateTest, TheStateStaysCompactAt256Nodes) {
  Limits lim{256, 256, 30'000};
  State s;
  for (int i = 0; i < 256; ++i) {
    NodeDesc d = node("10.0." + std::to_string(i / 256) + "." + std::to_string(i % 256), 8);
    joinStep(s, d, lim, kT0);
  }
  ASSERT_TRUE(s.complete);
  EXPECT_LT(toJson(s).size(), 256u * 60) << "a few tens of bytes per node";
}

}  // namespace
}  // namespace ddprun::rendezvous::detail
