// The O(1) join's values and folding (arrivals.h) as pure functions, and
// the folder's lease (fold_lease.h) on an in-memory store: no sockets, no
// sleeps, a fake clock.
#include "arrivals.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <set>

#include "ddprun/common/error.h"
#include "ddprun/store/hash_store.h"
#include "fold_lease.h"
#include "round_end.h"

namespace ddprun::rendezvous::detail {
namespace {

constexpr int64_t kT0 = 1'000'000;

Arrival arrival(int i, int nproc = 1, const Limits& lim = {1, 8, 30'000, 15'000}) {
  Arrival a;
  a.node.id = makeNodeId("10.0.0." + std::to_string(i), 100 + i, "n");
  a.node.nproc = nproc;
  a.lim = lim;
  return a;
}

// Folds `n` new arrivals (numbers s.folded + 1 ...) of nodes first..first+n-1.
std::vector<Verdict> foldNodes(State& s, int first, int n, const Limits& lim,
                               int64_t now = kT0) {
  std::vector<std::optional<Arrival>> batch;
  for (int i = first; i < first + n; ++i) batch.push_back(arrival(i, 1, lim));
  return foldArrivals(s, s.folded + 1, batch, lim, now);
}

TEST(Arrivals, EveryValueRoundTrips) {
  Arrival a = arrival(3, 4, {2, 5, 1'234, 9'000});
  a.node.seq = 17;
  a.node.host = true;
  const auto back = decodeArrival(encodeArrival(a), "k");
  ASSERT_TRUE(back);
  EXPECT_EQ(back->node.id, a.node.id);
  EXPECT_EQ(back->node.nproc, 4);
  EXPECT_EQ(back->node.seq, 17);
  EXPECT_TRUE(back->node.host);
  EXPECT_EQ(back->lim.minNodes, 2);
  EXPECT_EQ(back->lim.maxNodes, 5);
  EXPECT_EQ(back->lim.lastCallMs, 1'234);
  EXPECT_EQ(back->lim.heartbeatMs, 9'000);
  EXPECT_FALSE(decodeArrival("", "k")) << "a withdrawn arrival";

  Verdict v{Verdict::kWaitEnd, 7, 3, true, false, "", {}};
  Verdict w = decodeVerdict(encodeVerdict(v), "k");
  EXPECT_EQ(w.kind, Verdict::kWaitEnd);
  EXPECT_EQ(w.round, 7);
  EXPECT_EQ(w.seq, 3);
  EXPECT_TRUE(w.spare);
  v = Verdict{Verdict::kForming, 2, 0, false, false, "", {arrival(1).node.id}};
  EXPECT_EQ(decodeVerdict(encodeVerdict(v), "k").watch, v.watch);

  Placement p{4, 2, 3, 8, 12, 1, {arrival(1).node.id, arrival(2).node.id}};
  Placement q = decodePlacement(encodePlacement(p), "k", {1, 8, 30'000, 15'000});
  EXPECT_EQ(q.round, 4);
  EXPECT_EQ(q.groupRank, 2);
  EXPECT_EQ(q.groupWorldSize, 3);
  EXPECT_EQ(q.baseRank, 8);
  EXPECT_EQ(q.worldSize, 12);
  EXPECT_EQ(q.restartCount, 1);
  EXPECT_EQ(q.watch, p.watch);
}

TEST(Arrivals, ValuesNotOursAreProtocolErrorsNamingTheKey) {
  const Limits lim{1, 4, 30'000, 15'000};
  for (const std::string& bad : std::vector<std::string>{
           "junk", "{}", R"({"id":"x y","n":1,"s":-1,"j":{"n":"1:4","lc":1,"hb":1}})",
        R"({"id":"a_1_n","n":0,"s":-1,"j":{"n":"1:4","lc":1,"hb":1}})",
        R"({"id":"a_1_n","n":1,"s":-1,"j":{"n":"4:1","lc":1,"hb":1}})",
        std::string(100'000, '[')}) {
    try {
      decodeArrival(bad, "ddprun/j/arrival/3");
      ADD_FAILURE() << "accepted " << bad.substr(0, 60);
    } catch (const ProtocolError& e) {
      EXPECT_NE(e.message().find("ddprun/j/arrival/3"), std::string::npos) << e.message();
    }
  }
  EXPECT_THROW(decodeVerdict(R"({"k":"q","r":0,"s":0})", "k"), ProtocolError);
  EXPECT_THROW(decodeVerdict(R"({"k":"w","r":0,"s":0,"w":["a_1_n","b_1_n","c_1_n","d_1_n"]})",
                             "k"),
               ProtocolError)
      << "at most kWatchers to watch";
  // A placement outside the job's MAX, or a rank outside its round.
  EXPECT_THROW(decodePlacement(R"({"r":0,"g":0,"gw":5,"b":0,"w":5,"rc":0,"t":[]})", "k", lim),
               ProtocolError);
  EXPECT_THROW(decodePlacement(R"({"r":0,"g":3,"gw":3,"b":0,"w":3,"rc":0,"t":[]})", "k", lim),
               ProtocolError);
  EXPECT_THROW(decodePlacement(R"({"r":0,"g":0,"gw":2,"b":0,"w":2,"rc":1,"t":[]})", "k", lim),
               ProtocolError)
      << "more restarts than rounds";
}

TEST(Arrivals, SizesAreRunsCheckedBeforeTheyAllocate) {
  const std::vector<int> uniform(1'000, 8);
  EXPECT_EQ(encodeSizes(uniform), "8x1000");
  EXPECT_EQ(decodeSizes("8x1000", "k", 1'000), uniform);
  const std::vector<int> mixed{4, 4, 2, 8, 8, 8};
  EXPECT_EQ(encodeSizes(mixed), "4x2,2,8x3");
  EXPECT_EQ(decodeSizes(encodeSizes(mixed), "k", 6), mixed);
  for (const std::string bad : {"8x1001", "8x999", "0x1000", "8x2000000000", "8,,8", "",
                                "x", "8x1000,1", "8x1x2"})
    EXPECT_THROW(decodeSizes(bad, "k", 1'000), ProtocolError) << bad;
}

TEST(Arrivals, RosterRoundTripsAndIsBounded) {
  const Limits lim{1, 3, 30'000, 15'000};
  State s;
  foldNodes(s, 0, 3, lim);
  ASSERT_TRUE(s.complete);
  const auto ids = decodeRoster(encodeRoster(s), "k", lim);
  ASSERT_EQ(ids.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(ids[i], s.participants[i].id);
  EXPECT_THROW(decodeRoster(encodeRoster(s) + arrival(9).node.id + "\n", "k", lim),
               ProtocolError)
      << "more nodes than MAX";
  EXPECT_THROW(decodeRoster("not an id\n", "k", lim), ProtocolError);
}

// Folding is joinStep in arrival order: the same state as one node's joins
// one after the other, verdicts in order, the folded count advanced, and
// missing or withdrawn numbers skipped.
TEST(Arrivals, FoldingIsJoinStepInArrivalOrder) {
  const Limits lim{3, 4, 30'000, 15'000};
  State s;
  std::vector<std::optional<Arrival>> batch{arrival(0, 1, lim), std::nullopt,
                                            arrival(1, 1, lim), arrival(2, 1, lim)};
  const auto v = foldArrivals(s, 1, batch, lim, kT0);
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[0].kind, Verdict::kForming);
  EXPECT_EQ(v[1].kind, Verdict::kSkipped);
  EXPECT_EQ(v[2].kind, Verdict::kForming);
  EXPECT_EQ(v[3].kind, Verdict::kForming);
  EXPECT_EQ(s.folded, 4);
  ASSERT_EQ(s.participants.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(s.participants[i].id, arrival(i).node.id);
    EXPECT_EQ(s.participants[i].seq, i) << "the job's arrival order";
  }
  EXPECT_EQ(v[3].seq, 2);
  EXPECT_EQ(s.job.maxNodes, 4) << "the first fold records the job's settings";
  EXPECT_EQ(s.lastCallMs, kT0 + 30'000) << "MIN reached: the last call runs";
  // The fourth completes the round at MAX in the same fold.
  const auto w = foldNodes(s, 3, 1, lim);
  EXPECT_EQ(w[0].kind, Verdict::kComplete);
  EXPECT_TRUE(s.complete);
  EXPECT_EQ(s.folded, 5);
}

TEST(Arrivals, ANodeArrivingAgainKeepsItsNumberAndItsPlace) {
  const Limits lim{2, 4, 30'000, 15'000};
  State s;
  foldNodes(s, 0, 2, lim);
  ASSERT_EQ(s.participants.size(), 2u);
  // Node 0 arrives again without knowing its number (its verdict was lost).
  const auto v = foldNodes(s, 0, 1, lim);
  EXPECT_EQ(v[0].kind, Verdict::kForming);
  EXPECT_EQ(v[0].seq, 0) << "the number the state gave it";
  EXPECT_EQ(s.participants.size(), 2u) << "listed once";
}

TEST(Arrivals, OtherSettingsAreTurnedAwayWithoutChangingTheRound) {
  const Limits lim{2, 4, 30'000, 15'000};
  State s;
  foldNodes(s, 0, 1, lim);
  std::vector<std::optional<Arrival>> odd{arrival(5, 1, {1, 2, 30'000, 15'000})};
  const auto v = foldArrivals(s, s.folded + 1, odd, lim, kT0);
  EXPECT_EQ(v[0].kind, Verdict::kMismatch);
  EXPECT_NE(v[0].text.find("--nnodes 1:2 differs from the job's 2:4"), std::string::npos)
      << v[0].text;
  EXPECT_EQ(s.participants.size(), 1u);
  EXPECT_EQ(s.folded, 2) << "decided all the same";
}

TEST(Arrivals, AClosedJobAnswersClosedAndANewcomerEndsARunningRound) {
  const Limits lim{1, 2, 30'000, 15'000};
  State s;
  foldNodes(s, 0, 2, lim);
  ASSERT_TRUE(s.complete);
  const auto v = foldNodes(s, 2, 1, lim);  // beyond MAX: a spare, the round runs on
  EXPECT_EQ(v[0].kind, Verdict::kWaitEnd);
  EXPECT_TRUE(v[0].spare);
  EXPECT_TRUE(s.complete);
  close(s, "it finished");
  const auto w = foldNodes(s, 3, 1, lim);
  EXPECT_EQ(w[0].kind, Verdict::kClosed);
  EXPECT_EQ(w[0].text, "it finished");
}

// Each fold writes the whole state: batches that grow with the round keep
// the bytes a round's folds write to a few times its final state, whatever
// its size (the O(1)-per-join claim of arrivals.h), and the fold count
// logarithmic.
TEST(Arrivals, GrowingBatchesKeepAFormingRoundsFoldsFewAndTheirBytesLinear) {
  for (int n : {64, 1'000, 4'000}) {
    const Limits lim{n, n, 30'000, 15'000};
    State s;
    int folds = 0;
    size_t written = 0;
    int next = 0;
    while (!s.complete) {
      const auto take = static_cast<int>(foldTarget(s, lim));
      ASSERT_GE(take, 1);
      foldNodes(s, next, take, lim);
      next += take;
      ++folds;
      written += toJson(s).size();
    }
    EXPECT_EQ(next, n) << "never more than what completes the round";
    const size_t final = toJson(s).size();
    EXPECT_LE(written, 8 * final) << n << " nodes: " << folds << " folds";
    EXPECT_LE(folds, 60) << n;
    std::cout << "[ figure ] " << n << " nodes: " << folds << " folds writing "
              << written / final << "x the final state (" << final << " bytes)\n";
  }
}

// A round of 10,000 re-forming after a loss: the survivors arrive in an
// order of their own and are folded in growing batches; the round completes
// at the last expected arrival, at once (no last call). A figure for the
// folder's CPU at that size (no time asserted): a step used to scan the
// participants and, near the end, every expected node against them.
TEST(Arrivals, TenThousandSurvivorsReformInGrowingBatches) {
  constexpr int n = 10'000;
  const Limits lim{1, n, 30'000, 15'000};
  State s;
  foldNodes(s, 0, n, lim);
  ASSERT_TRUE(s.complete);
  ASSERT_TRUE(endRound(s, 0, RoundEnd::kMembershipChanged, 3, "gone",
                       s.participants[3].id));
  ASSERT_EQ(s.expected.size(), size_t{n - 1});
  std::vector<int> survivors;
  for (int i = 0; i < n; ++i)
    if (std::find(s.expected.begin(), s.expected.end(), arrival(i).node.id) != s.expected.end())
      survivors.push_back(i);
  std::reverse(survivors.begin(), survivors.end());  // not the old rank order
  const auto t0 = std::chrono::steady_clock::now();
  size_t next = 0;
  int folds = 0;
  while (!s.complete) {
    ASSERT_LT(next, survivors.size());
    const auto take = std::min<size_t>(static_cast<size_t>(foldTarget(s, lim)),
                                       survivors.size() - next);
    std::vector<std::optional<Arrival>> batch;
    for (size_t i = next; i < next + take; ++i) batch.push_back(arrival(survivors[i], 1, lim));
    foldArrivals(s, s.folded + 1, batch, lim, kT0 + 1);
    next += take;
    ++folds;
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - t0)
                      .count();
  EXPECT_EQ(next, survivors.size()) << "complete at the last expected arrival";
  EXPECT_EQ(s.participants.size(), size_t{n - 1});
  EXPECT_EQ(s.round, 1);
  EXPECT_EQ(s.lastCallMs, 0) << "no last call waited for";
  std::cout << "[ figure ] " << n - 1 << " survivors folded in " << folds << " folds, "
            << ms << " ms of this thread's time\n";
}

TEST(Arrivals, TheFoldTargetStopsAtWhatChangesTheRound) {
  const Limits lim{10, 100, 30'000, 15'000};
  State s;
  foldNodes(s, 0, 8, lim);
  EXPECT_EQ(foldTarget(s, lim), 2) << "two more reach MIN (the last call starts)";
  State expecting = s;
  expecting.expected = {arrival(0).node.id, arrival(50).node.id};
  EXPECT_EQ(foldTarget(expecting, lim), 1) << "one expected node is missing";
  foldNodes(s, 8, 90, lim);
  EXPECT_EQ(foldTarget(s, lim), 2) << "two more reach MAX";
  foldNodes(s, 98, 2, lim);
  ASSERT_TRUE(s.complete);
  EXPECT_EQ(foldTarget(s, lim), 1) << "a running round folds newcomers at once";
}

// Placements are computed once for the round: group ranks host first, then
// arrival; base ranks by the nodes' sizes; each node watched exactly
// kWatchers times, never by itself (the same ring as watchSet()).
TEST(Arrivals, PlacementsOfARound) {
  const int n = 50;
  const Limits lim{n, n, 30'000, 15'000};
  State s;
  std::vector<std::optional<Arrival>> batch;
  for (int i = 0; i < n; ++i) {
    Arrival a = arrival(i, 1 + i % 3, lim);
    a.node.host = i == 7;
    batch.push_back(a);
  }
  foldArrivals(s, 1, batch, lim, kT0);
  ASSERT_TRUE(s.complete);
  const auto placed = placements(s);
  ASSERT_EQ(placed.size(), size_t{n});
  EXPECT_EQ(s.participants[0].id, arrival(7).node.id) << "the host is group rank 0";
  int64_t base = 0;
  std::map<std::string, int> watched;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(placed[r].groupRank, r);
    EXPECT_EQ(placed[r].groupWorldSize, n);
    EXPECT_EQ(placed[r].baseRank, base);
    base += s.participants[r].nproc;
    EXPECT_EQ(placed[r].watch, watchSet(s, s.participants[r].id));
    ASSERT_EQ(placed[r].watch.size(), kWatchers);
    for (const auto& id : placed[r].watch) {
      EXPECT_NE(id, s.participants[r].id);
      ++watched[id];
    }
  }
  EXPECT_EQ(placed[0].worldSize, base);
  for (const auto& [id, times] : watched) EXPECT_EQ(times, static_cast<int>(kWatchers)) << id;
  EXPECT_EQ(watched.size(), size_t{n});
}

TEST(Arrivals, RoundInfoOfAPlacementChecksItsSizes) {
  const Placement p{3, 1, 3, 4, 10, 0, {}};
  const RoundInfo info = roundInfoOf(p, "4,4,2", "k");
  EXPECT_EQ(info.round, 3);
  EXPECT_EQ(info.baseRank, 4);
  EXPECT_EQ(info.worldSize, 10);
  EXPECT_EQ(info.localWorldSizes, (std::vector<int>{4, 4, 2}));
  EXPECT_THROW(roundInfoOf(p, "2x3", "k"), ProtocolError) << "sizes that do not add up";
}

TEST(Arrivals, ProgressRoundTripsAndJunkShowsNothing) {
  JoinProgress p;
  p.round = 2;
  p.joined = 5;
  p.minNodes = 6;
  p.maxNodes = 9;
  p.expected = 7;
  p.missingCount = 2;
  p.missing = {"node a (pid 1)", "node b (pid 2)"};
  p.waitingFor = "1 more node";
  const JoinProgress q = decodeProgress(encodeProgress(p, kT0 + 4'000), kT0);
  EXPECT_EQ(q.round, 2);
  EXPECT_EQ(q.joined, 5);
  EXPECT_EQ(q.missing, p.missing);
  EXPECT_EQ(q.waitingFor, "1 more node");
  EXPECT_DOUBLE_EQ(q.lastCallSeconds, 4.0);
  EXPECT_EQ(decodeProgress("junk", kT0).round, -1);
  EXPECT_LT(decodeProgress(encodeProgress(p, 0), kT0).lastCallSeconds, 0) << "no last call";
}

// The folder's lease on an in-memory store with a fake clock.
TEST(FoldLease, OneHolderAtATimeTakenOverOnceItExpires) {
  store::HashStore store;
  FoldLease a(store, "folder", "a_1_n", 5'000), b(store, "folder", "b_1_n", 5'000);
  EXPECT_TRUE(a.acquire(kT0));
  EXPECT_FALSE(b.acquire(kT0 + 1'000));
  EXPECT_EQ(b.expiresMs(), kT0 + 5'000) << "when b looks again";
  EXPECT_TRUE(a.renew(kT0 + 4'000));
  EXPECT_FALSE(b.acquire(kT0 + 6'000)) << "renewed until kT0 + 9000";
  EXPECT_TRUE(b.acquire(kT0 + 9'001)) << "a stalled: b takes it over";
  EXPECT_FALSE(a.renew(kT0 + 9'002)) << "a learns it lost the lease";
  EXPECT_FALSE(a.held());
  b.release();
  EXPECT_TRUE(a.acquire(kT0 + 9'003)) << "free again at once";
}

TEST(FoldLease, AValueNoFolderWroteDoesNotHoldTheJobUp) {
  store::HashStore store;
  store.set("folder", "something else entirely");
  FoldLease a(store, "folder", "a_1_n", 5'000);
  EXPECT_TRUE(a.acquire(kT0));
}

}  // namespace
}  // namespace ddprun::rendezvous::detail
