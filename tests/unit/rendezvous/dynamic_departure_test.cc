// A node's agent gone where the kernel tells us (its heartbeat connection to
// the store closed: the store then holds "<job>/gone/<id>", store::LeaseRule):
// the host drops it at once, and a failure that followed it is that
// membership change, not a failure. In-memory store, fake clock
// (dynamic_fixture.h); the store's part is simulated by writing the
// tombstone and calling the host's onGone, as the lease's end does.
#include "rendezvous/dynamic_fixture.h"

namespace ddprun::rendezvous {
namespace {

using namespace testing_dynamic;

class DepartureTest : public DynamicRendezvousTest {
 protected:
  // Three nodes, 2:3, the first hosting; returns the id of node `i`.
  std::string formThree(std::vector<std::unique_ptr<Member>>& ms) {
    opts_.minNodes = 2;
    opts_.maxNodes = 3;
    ms.push_back(member(0, /*host=*/true));
    ms.push_back(member(1));
    ms.push_back(member(2));
    joinAll(ms);
    for (const auto& d : state().participants)
      if (d.id.rfind("10.0.0.3_102_", 0) == 0) gone_ = d.id;
    return gone_;
  }
  // What the store does when node `id`'s heartbeat connection ends: its
  // process closed it (its agent died), or it was reset.
  void connectionEnded(Member& host, const std::string& id, store::ConnEnd how) {
    hub_.set("ddprun/job/gone/" + id, store::tombstoneValue(how));
    ASSERT_TRUE(host.onGone) << "the host registered no departure handler";
    host.onGone(id, how);
  }
  void connectionClosed(Member& host, const std::string& id) {
    connectionEnded(host, id, store::ConnEnd::kClosed);
  }
  std::string gone_;
  const std::string why_ =
      "node 10.0.0.3 (pid 102) is gone: its connection to the rendezvous store closed";
};

TEST_F(DepartureTest, TheHostDropsANodeWhoseConnectionClosedAndSaysGoodbyeForIt) {
  std::vector<std::unique_ptr<Member>> ms;
  const std::string dead = formThree(ms);
  const int deadRank = detail::rankOf(state(), dead);
  ASSERT_GE(deadRank, 0);
  ms[2]->rdzv().cancel();  // it stops answering
  connectionClosed(*ms[0], dead);
  for (int i : {0, 1})
    expectEvent(ms[i]->node->awaitEvent(), 0, RoundEnd::kMembershipChanged, deadRank, why_);
  // The host will not wait for its goodbye at the end.
  EXPECT_TRUE(hub_.awaitUntil([&] { return hub_.has(key(0, "left/" + dead)); }));
  expectSurvivorsReformAtOnce(ms);
}

// The survivors' workers fail first (the dead node's workers broke their
// collective) and the report finds the peer gone: the round ends as a
// membership change, even though the report asked to close the job.
TEST_F(DepartureTest, AFailureAfterAPeerIsGoneIsThatMembershipChange) {
  std::vector<std::unique_ptr<Member>> ms;
  const std::string dead = formThree(ms);
  const int deadRank = detail::rankOf(state(), dead);
  ms[2]->rdzv().cancel();
  hub_.set("ddprun/job/gone/" + dead, "closed");  // the store saw it; the host not yet
  EXPECT_TRUE(ms[1]->rdzv().absorbsFailuresOfLostPeers());
  ms[1]->rdzv().reportFailure(0, "rank 1 exited with 1", /*closeJob=*/true);
  for (int i : {0, 1})
    expectEvent(ms[i]->node->awaitEvent(), 0, RoundEnd::kMembershipChanged, deadRank, why_);
  expectSurvivorsReformAtOnce(ms);
}

// Issue 25: a peer whose heartbeat connection was reset beats again on a new
// one. If an old tombstone is still found (a store that kept it), the peer
// beats all the same: it is alive, and the failure is a failure (counted),
// not a membership change that restarts the workers forever.
TEST_F(DepartureTest, AFailureIsAFailureWhenTheGonePeerBeatsAgain) {
  std::vector<std::unique_ptr<Member>> ms;
  const std::string reset = formThree(ms);
  hub_.set("ddprun/job/gone/" + reset, "closed");
  hub_.set("ddprun/job/hb/" + reset, "7 1000");  // its new connection's beat
  ms[1]->rdzv().reportFailure(0, "rank 1 exited with 7", /*closeJob=*/true);
  const int failing = ms[1]->node->info.groupRank;
  for (auto& m : ms)
    expectEvent(m->node->awaitEvent(), 0, RoundEnd::kClosed, failing, "rank 1 exited with 7");
  EXPECT_TRUE(state().closed);
}

// A reset heartbeat connection is no proof of death, even before the node
// beats again: the host does not drop it at once, and a failure beside it is
// a failure (counted), not a membership change.
TEST_F(DepartureTest, AResetConnectionIsNoDeath) {
  std::vector<std::unique_ptr<Member>> ms;
  const std::string reset = formThree(ms);
  connectionEnded(*ms[0], reset, store::ConnEnd::kReset);  // waits for it to beat again
  ms[1]->rdzv().reportFailure(0, "rank 1 exited with 7", /*closeJob=*/true);
  const int failing = ms[1]->node->info.groupRank;
  for (auto& m : ms)
    expectEvent(m->node->awaitEvent(), 0, RoundEnd::kClosed, failing, "rank 1 exited with 7");
  EXPECT_TRUE(state().closed);
}

// With every peer alive, a failure is a failure.
TEST_F(DepartureTest, AFailureWithEveryPeerAliveClosesTheJobAsAsked) {
  std::vector<std::unique_ptr<Member>> ms;
  formThree(ms);
  ms[1]->rdzv().reportFailure(0, "rank 1 exited with 1", /*closeJob=*/true);
  const int failing = ms[1]->node->info.groupRank;
  for (auto& m : ms)
    expectEvent(m->node->awaitEvent(), 0, RoundEnd::kClosed, failing, "rank 1 exited with 1");
  EXPECT_TRUE(state().closed);
}

}  // namespace
}  // namespace ddprun::rendezvous
