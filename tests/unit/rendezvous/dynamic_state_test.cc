// The dynamic rendezvous's state transitions as pure values: every rule and
// timeout with a fake clock (plain milliseconds), no store.
#include "dynamic_state.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "ddprun/common/error.h"
#include "round_end.h"

namespace ddprun::rendezvous::detail {
namespace {

constexpr int64_t kT0 = 1'000'000;  // "now" at the start of each test

NodeDesc node(const std::string& addr, int nproc = 1, bool host = false) {
  NodeDesc d;
  d.id = makeNodeId(addr, 100, "0");
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
  EXPECT_EQ(makeNodeId("10.0.0.2", 42, "0"), "10.0.0.2_42_0");
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
  EXPECT_EQ(ids(s.participants),
            (std::vector<std::string>{ns[2].id, ns[0].id, ns[1].id}));
  EXPECT_EQ(s.participants[1].nproc, 2);
  EXPECT_EQ(rankOf(s, ns[1].id), 2);
  EXPECT_EQ(rankOf(s, "nobody"), -1);
}

// The departures handler grants a listed node time to beat again; one that
// left (or was dropped) is in no list and gets none.
TEST(DynamicStateTest, IsListedCoversEveryListAndNothingElse) {
  Limits lim{2, 2, 30'000};
  State s;
  std::vector<NodeDesc> ns = {node("a"), node("b")};
  joinAll(s, ns, lim);
  ASSERT_TRUE(s.complete);
  EXPECT_TRUE(isListed(s, ns[0].id));
  EXPECT_FALSE(isListed(s, "nobody"));
  NodeDesc late = node("c");
  joinStep(s, late, lim, 0);  // a running, full round: c waits
  EXPECT_TRUE(isListed(s, late.id));
  ASSERT_TRUE(endRound(s, 0, RoundEnd::kFailed, 1, "rank 1 exited with 1"));
  EXPECT_TRUE(isListed(s, ns[1].id));  // expected in the next round
  EXPECT_TRUE(removeNode(s, ns[1].id, "b left", lim, 0));
  EXPECT_FALSE(isListed(s, ns[1].id));
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
  EXPECT_FALSE(endRound(s, 1, RoundEnd::kFailed, 0, "forming"))
      << "round 1 is not running";
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

// Ending a round whose nodes are succeeding would re-run finished workers:
// the newcomer waits for the round's own end (finished: the job is over for it).
TEST(DynamicStateTest, ANewcomerDoesNotEndARoundThatIsFinishing) {
  Limits lim{2, 4, 30'000};
  State s;
  std::vector<NodeDesc> ns = {node("a"), node("b")};
  joinAll(s, ns, lim);
  ASSERT_TRUE(completeIfDue(s, lim, kT0 + 30'000));
  EXPECT_FALSE(markFinishing(s, 1)) << "not the running round";
  EXPECT_TRUE(markFinishing(s, 0));
  EXPECT_FALSE(markFinishing(s, 0)) << "only the first success writes";
  EXPECT_TRUE(fromJson(toJson(s), "k").finishing);
  auto c = node("c");
  EXPECT_EQ(joinStep(s, c, lim, kT0 + 40'000), JoinOutcome::kWaitEnd);
  EXPECT_EQ(s.round, 0) << "the finishing round runs on";
  EXPECT_EQ(ids(s.waitList), (std::vector<std::string>{c.id}));
  ASSERT_TRUE(endRound(s, 0, RoundEnd::kFinished, -1, ""));
  EXPECT_FALSE(s.finishing);
  EXPECT_EQ(joinStep(s, c, lim, kT0 + 41'000), JoinOutcome::kClosed);
}

// A finishing round that fails instead admits the waiting node next round.
TEST(DynamicStateTest, AFinishingRoundThatFailsAdmitsTheWaitingNode) {
  Limits lim{2, 4, 30'000};
  State s;
  std::vector<NodeDesc> ns = {node("a"), node("b")};
  joinAll(s, ns, lim);
  ASSERT_TRUE(completeIfDue(s, lim, kT0 + 30'000));
  ASSERT_TRUE(markFinishing(s, 0));
  auto c = node("c");
  ASSERT_EQ(joinStep(s, c, lim, kT0 + 40'000), JoinOutcome::kWaitEnd);
  ASSERT_TRUE(endRound(s, 0, RoundEnd::kFailed, 1, "rank 1 exited with 1"));
  EXPECT_EQ(s.restartCount, 1);
  EXPECT_EQ(joinStep(s, c, lim, kT0 + 41'000), JoinOutcome::kWaitComplete);
  joinAll(s, ns, lim, kT0 + 41'000);
  EXPECT_TRUE(s.complete);
  EXPECT_EQ(s.participants.size(), 3u);
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
  EXPECT_EQ(joinStep(s, c, lim, kT0), JoinOutcome::kWaitEnd)
      << "asking again changes nothing";

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
  EXPECT_EQ(
      describeShortfall(s, lim),
      "1 of at least 3 nodes joined (node a (pid 100)); 2 more needed; expected but "
      "missing: node b (pid 100), node c (pid 100)");
}

TEST(DynamicStateTest, ShortfallListsAtMostEightNodesOfEachKind) {
  Limits lim{20, 24, 30'000};
  State s;
  std::vector<NodeDesc> ns;
  for (int i = 0; i < 12; ++i) ns.push_back(node("n" + std::to_string(i)));
  joinAll(s, ns, lim);
  const std::string text = describeShortfall(s, lim);
  EXPECT_NE(text.find("12 of at least 20 nodes joined"), std::string::npos) << text;
  EXPECT_NE(text.find("node n7 (pid 100) and 4 more); 8 more needed"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("node n8 "), std::string::npos) << "the ninth is counted, not named";
}

TEST(DynamicStateTest, JoinProgressOfAFormingRound) {
  Limits lim{2, 4, 30'000};
  State s;
  auto a = node("a");
  ASSERT_EQ(joinStep(s, a, lim, kT0), JoinOutcome::kWaitComplete);
  JoinProgress p = joinProgress(s, a.id, JoinOutcome::kWaitComplete, lim, kT0 + 5);
  EXPECT_EQ(p.round, 0);
  EXPECT_EQ(p.joined, 1);
  EXPECT_EQ(p.minNodes, 2);
  EXPECT_EQ(p.maxNodes, 4);
  EXPECT_LT(p.lastCallSeconds, 0) << "no last call below MIN";
  EXPECT_EQ(p.waitingFor, "1 more node");
  EXPECT_EQ(describe(p), "round 0: 1 of 4 nodes joined (at least 2 needed); waiting for 1 more node");
  auto b = node("b");
  joinStep(s, b, lim, kT0 + 1000);
  p = joinProgress(s, a.id, JoinOutcome::kWaitComplete, lim, kT0 + 11'000);
  EXPECT_EQ(p.joined, 2);
  EXPECT_DOUBLE_EQ(p.lastCallSeconds, 20.0) << "started at the MIN-th join, 30 s";
  EXPECT_EQ(p.waitingFor, "");
  EXPECT_EQ(describe(p), "round 0: 2 of 4 nodes joined (at least 2 needed); the last call "
                         "completes it in 20 s");
}

TEST(DynamicStateTest, JoinProgressNamesTheExpectedNodesMissing) {
  Limits lim{3, 3, 30'000};
  State s;
  std::vector<NodeDesc> ns = {node("a"), node("b"), node("c")};
  joinAll(s, ns, lim);
  ASSERT_TRUE(s.complete);
  endRound(s, 0, RoundEnd::kFailed, 0, "x");
  joinStep(s, ns[1], lim, kT0);
  JoinProgress p = joinProgress(s, ns[1].id, JoinOutcome::kWaitComplete, lim, kT0);
  EXPECT_EQ(p.round, 1);
  EXPECT_EQ(p.expected, 3);
  EXPECT_EQ(p.missingCount, 2);
  EXPECT_EQ(p.missing, (std::vector<std::string>{"node a (pid 100)", "node c (pid 100)"}));
  EXPECT_EQ(describe(p), "round 1: 1 of 3 nodes joined; waiting for 2 more nodes; expected "
                         "but missing: node a (pid 100), node c (pid 100)");
}

TEST(DynamicStateTest, JoinProgressOfASpareSaysSo) {
  Limits lim{1, 1, 30'000};
  State s;
  auto a = node("a");
  auto b = node("b");
  ASSERT_EQ(joinStep(s, a, lim, kT0), JoinOutcome::kComplete);
  ASSERT_EQ(joinStep(s, b, lim, kT0), JoinOutcome::kWaitEnd);
  JoinProgress p = joinProgress(s, b.id, JoinOutcome::kWaitEnd, lim, kT0);
  EXPECT_NE(p.waitingFor.find("this node is a spare"), std::string::npos) << p.waitingFor;
  EXPECT_NE(describe(p).find("round 0: 1 of 1 nodes joined; waiting for a place"),
            std::string::npos)
      << describe(p);
}

TEST(DynamicStateTest, SmallRoundsWatchEveryone) {
  Limits lim{4, 4, 30'000};
  State s;
  std::vector<NodeDesc> ns = {node("a"), node("b"), node("c"), node("d")};
  joinAll(s, ns, lim);
  EXPECT_EQ(watchSet(s, ns[1].id), (std::vector<std::string>{ns[0].id, ns[2].id, ns[3].id}));
}

TEST(DynamicStateTest, LargeRoundsWatchAFixedNumberEachWatchedAsOften) {
  Limits lim{1000, 1000, 30'000};
  State s;
  std::vector<NodeDesc> ns;
  for (int i = 0; i < 1000; ++i) ns.push_back(node("10.0." + std::to_string(i / 256) + "." +
                                                  std::to_string(i % 256)));
  joinAll(s, ns, lim);
  ASSERT_TRUE(s.complete);
  std::map<std::string, int> watchers;
  for (const auto& n : ns) {
    auto set = watchSet(s, n.id);
    ASSERT_EQ(set.size(), kWatchers);
    EXPECT_EQ(std::set<std::string>(set.begin(), set.end()).size(), kWatchers) << n.id;
    EXPECT_EQ(std::count(set.begin(), set.end(), n.id), 0) << "never itself";
    EXPECT_EQ(set, watchSet(s, n.id)) << "the same on every look";
    for (const auto& w : set) ++watchers[w];
  }
  ASSERT_EQ(watchers.size(), ns.size()) << "every node is watched";
  for (const auto& [id, count] : watchers) EXPECT_EQ(count, int(kWatchers)) << id;
  // Neighbours by address (one rack) are not each other's only watchers.
  auto set = watchSet(s, ns[0].id);
  EXPECT_FALSE(set == (std::vector<std::string>{ns[1].id, ns[2].id, ns[3].id}));
}

TEST(DynamicStateTest, AFormingRoundWatchesTheExpectedNodesToo) {
  Limits lim{2, 8, 30'000};
  State s;
  std::vector<NodeDesc> ns;
  for (int i = 0; i < 8; ++i) ns.push_back(node("n" + std::to_string(i)));
  joinAll(s, ns, lim);
  ASSERT_TRUE(s.complete);
  endRound(s, 0, RoundEnd::kFailed, 0, "x");
  joinStep(s, ns[0], lim, kT0);  // 1 participant, 8 expected
  std::map<std::string, int> watchers;
  for (const auto& n : ns)
    for (const auto& w : watchSet(s, n.id)) ++watchers[w];
  ASSERT_EQ(watchers.size(), 8u) << "the expected nodes that have not joined yet too";
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
  for (
      const std::string junk :
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
    NodeDesc d =
        node("10.0." + std::to_string(i / 256) + "." + std::to_string(i % 256), 8);
    joinStep(s, d, lim, kT0);
  }
  ASSERT_TRUE(s.complete);
  EXPECT_LT(toJson(s).size(), 256u * 60) << "a few tens of bytes per node";
}

// A valid one-node running state of a 1:2 job at round `round`, as JSON,
// with `patch` applied (issue 16: values a rogue client may write).
std::string stateWith(const std::function<void(nlohmann::json&)>& patch) {
  Limits lim{1, 2, 30'000, 15'000};
  State s;
  auto a = node("a", 2);
  joinStep(s, a, lim, kT0);
  completeIfDue(s, lim, kT0 + 30'000);
  auto j = nlohmann::json::parse(toJson(s));
  patch(j);
  return j.dump();
}

std::string refusal(const std::string& text, const Limits& lim) {
  try {
    State s = fromJson(text, "ddprun/job/state", lim);
    std::string bad = jobMismatch(s, lim);
    if (bad.empty()) bad = validate(s, lim);
    return bad.empty() ? "accepted" : bad;
  } catch (const ProtocolError& e) {
    return e.message();
  }
}

TEST(DynamicStateTest, IntegersAreBoundedNeverWrapped) {
  const Limits lim{1, 2, 30'000, 15'000};
  EXPECT_EQ(refusal(stateWith([](auto&) {}), lim), "accepted");
  struct Case {
    std::function<void(nlohmann::json&)> patch;
    std::string says;
  };
  const std::vector<Case> cases = {
      {[](auto& j) { j["r"] = 2147483647; },
       "\"r\" = 2147483647 is outside [0, 2147483646]"},
      {[](auto& j) { j["r"] = -1; }, "\"r\" = -1 is outside"},
      {[](auto& j) { j["p"][0]["n"] = 2147483647; },
       "\"n\" = 2147483647 is outside [1, 4096]"},
      {[](auto& j) { j["p"][0]["n"] = 0; }, "\"n\" = 0 is outside"},
      {[](auto& j) { j["p"][0]["s"] = -1; }, "\"s\" = -1 is outside"},
      {[](auto& j) { j["ns"] = 18446744073709551615ull; }, "\"ns\" is not an integer"},
      {[](auto& j) { j["rc"] = 5; }, "\"rc\" = 5 is outside [0, 0]"},
      {[](auto& j) { j["er"] = 0; }, "\"er\" = 0 is outside [-1, -1]"},
      {[](auto& j) { j["p"][0]["n"] = 2.5; }, "\"n\" is not an integer"},
      {[](auto& j) { j["p"][0]["id"] = "a\"b"; }, "is not <addr>_<pid>_<nonce>"},
      {[](auto& j) { j["p"].push_back(j["p"][0]); }, "takes part twice"},
      {[](auto& j) {
         for (int i = 0; i < 2; ++i) {
           auto d = j["p"][0];
           d["id"] = "b_1_" + std::to_string(i);
           j["p"].push_back(d);
         }
       },
       "\"p\" is not a list of at most 2 nodes"},
      {[](auto& j) {
         j["j"]["n"] = "1:3";
         auto d = j["p"][0];
         d["id"] = "b_1_0";
         j["p"].push_back(d);
         j["p"].push_back(d);
       },
       "--nnodes 1:2 differs from the job's 1:3"},
      {[](auto& j) { j["p"][0]["s"] = 7; }, "an arrival number not yet given"},
      {[](auto& j) { j["f"] = true, j["c"] = false; },
       "a forming round that is finishing"},
      {[](auto& j) { j["r"] = 1, j["er"] = 0, j["end"] = "exploded"; },
       "is not a round's end"},
      {[](auto& j) { j["r"] = 1, j["er"] = 0, j["end"] = "failed:9:x"; }, "names node 9"},
      {[](auto& j) { j["j"]["n"] = "3:4"; },
       "--nnodes 1:2 differs from the job's 3:4 (set by node a (pid 100))"},
      {[](auto& j) { j.erase("j"); }, "not a ddprun dynamic rendezvous state"},
  };
  for (const auto& c : cases) {
    const std::string text = stateWith(c.patch);
    const std::string got = refusal(text, lim);
    EXPECT_NE(got.find(c.says), std::string::npos) << text << "\n -> " << got;
  }
}

TEST(DynamicStateTest, NodeIdsAreCheckedBothWays) {
  EXPECT_TRUE(isValidNodeId(makeNodeId("10.0.0.2", 42, "0")));
  EXPECT_TRUE(isValidNodeId(makeNodeId("fe80::1%eth0", 42, "0")));
  EXPECT_TRUE(isValidNodeId(makeNodeId("my_host-1.example.com", 42, "0")));
  EXPECT_FALSE(isValidNodeId(makeNodeId("a b", 42, "0")));
  EXPECT_FALSE(isValidNodeId(makeNodeId("x\"y", 42, "0")));
  EXPECT_FALSE(isValidNodeId(makeNodeId(std::string(kMaxIdBytes, 'a'), 42, "0")));
  EXPECT_FALSE(isValidNodeId(""));
}

TEST(DynamicStateTest, AnOversizedValueIsRefusedBeforeItIsParsed) {
  const Limits lim{1, 2, 30'000, 15'000};
  // Far more than 2 nodes can need, and not even JSON past the first
  // bytes: refused by its size alone, before any parsing.
  std::string huge = "{\"p\":[" + std::string(maxStateBytes(2), '[');
  const std::string got = refusal(huge, lim);
  EXPECT_NE(got.find(std::to_string(huge.size()) + " bytes under ddprun/job/state"),
            std::string::npos)
      << got;
  EXPECT_LT(maxStateBytes(2), 1u << 20) << "a 2-node job's state stays well under 1 MB";
  // The largest legitimate state fits: MAX participants with long ids,
  // every waiting place taken, long texts.
  Limits big{1, 256, 30'000, 15'000};
  State s;
  const std::string pad(200, 'x');
  for (int i = 0; i < 256; ++i) {
    NodeDesc d{makeNodeId(pad + std::to_string(i), 4'194'304, std::string(kNodeNonceChars, 'z')), 8, -1, false};
    joinStep(s, d, big, kT0);
  }
  for (int64_t i = 0; i < waitingCap(256); ++i) {
    NodeDesc d{makeNodeId(pad + "w" + std::to_string(i), 4'194'304, std::string(kNodeNonceChars, 'z')), 1, -1, false};
    EXPECT_EQ(joinStep(s, d, big, kT0), JoinOutcome::kWaitEnd);
  }
  NodeDesc extra = node("one-too-many");
  EXPECT_EQ(joinStep(s, extra, big, kT0), JoinOutcome::kFull);
  close(s, std::string(10'000, '\x01'));  // cut to kMaxTextBytes, escaped 6x
  EXPECT_LE(toJson(s).size(), maxStateBytes(256));
  EXPECT_EQ(refusal(toJson(s), big), "accepted");
}

TEST(DynamicStateTest, TheJobsSettingsAreRecordedByTheFirstJoin) {
  Limits lim{3, 4, 30'000, 15'000};
  State s;
  auto a = node("a");
  joinStep(s, a, lim, kT0);
  EXPECT_EQ(s.job.minNodes, 3);
  EXPECT_EQ(s.job.maxNodes, 4);
  EXPECT_EQ(s.job.by, a.id);
  EXPECT_EQ(jobMismatch(s, lim), "");
  EXPECT_EQ(jobMismatch(s, Limits{1, 2, 30'000, 15'000}),
            "--nnodes 1:2 differs from the job's 3:4 (set by node a (pid 100))");
  EXPECT_NE(
      jobMismatch(s, Limits{3, 4, 1'000, 15'000}).find("last_call_timeout (1000 ms)"),
      std::string::npos);
  EXPECT_NE(jobMismatch(s, Limits{3, 4, 30'000, 600}).find("heartbeat timeout"),
            std::string::npos);
  State t = fromJson(toJson(s), "k", lim);
  EXPECT_EQ(t.job.by, a.id);
  EXPECT_EQ(t.job.heartbeatMs, 15'000);
}

TEST(DynamicStateTest, RoundsStopAtTheLimitInsteadOfWrapping) {
  Limits lim{1, 1, 30'000, 15'000};
  State s;
  auto a = node("a");
  joinStep(s, a, lim, kT0);
  s.round = static_cast<int>(kMaxRound) - 1;
  s.restartCount = 7;
  ASSERT_TRUE(endRound(s, s.round, RoundEnd::kFailed, 0, "x"));
  EXPECT_EQ(s.round, kMaxRound);
  EXPECT_TRUE(s.closed);
  EXPECT_NE(s.closedReason.find("limit"), std::string::npos);
  EXPECT_EQ(refusal(toJson(s), lim), "accepted");
  EXPECT_EQ(joinStep(s, a, lim, kT0), JoinOutcome::kClosed);
}

TEST(DynamicStateTest, ATamperedStateIsToldFromARoundThatRunsOrEnded) {
  Limits lim{1, 2, 30'000, 15'000};
  State s;
  std::vector<NodeDesc> ns = {node("a"), node("b")};
  joinAll(s, ns, lim);
  ASSERT_TRUE(s.complete);
  EXPECT_EQ(roundTampered(s, 0, ns[0].id), "");
  EXPECT_EQ(roundTampered(std::nullopt, 0, ns[0].id), "the state was deleted");
  EXPECT_NE(roundTampered(State{}, 0, ns[0].id).find("round 0 is forming"),
            std::string::npos);
  EXPECT_NE(roundTampered(s, 0, node("z").id).find("without this node"),
            std::string::npos);
  // A forged end is not backed by the state: the round still runs there.
  EXPECT_EQ(trustedEnd(s, 0, "finished"), std::nullopt);
  EXPECT_EQ(trustedEnd(std::nullopt, 0, "finished"), "finished") << "nothing to check";
  State ended = s;
  endRound(ended, 0, RoundEnd::kFailed, 1, "rank 1 exited with 1");
  EXPECT_EQ(roundTampered(ended, 0, ns[0].id), "") << "it ended: the first end won";
  EXPECT_EQ(trustedEnd(ended, 0, "failed:1:rank 1 exited with 1"),
            "failed:1:rank 1 exited with 1");
  EXPECT_EQ(trustedEnd(ended, 0, "finished"), "failed:1:rank 1 exited with 1")
      << "the state's record wins over a rewritten key";
  State tomb = tombstone(0, "finished", "it finished", lim, ns[0].id);
  EXPECT_EQ(refusal(toJson(tomb), lim), "accepted");
  EXPECT_TRUE(tomb.closed);
  EXPECT_EQ(trustedEnd(tomb, 0, "finished"), "finished");
  EXPECT_EQ(roundTampered(tomb, 0, ns[0].id), "");
}

}  // namespace
}  // namespace ddprun::rendezvous::detail
