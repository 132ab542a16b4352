// Reading a node's heartbeat lease (node_lease.h) over an in-memory store:
// which tombstones make a node lost, and whether it beats again.
#include "node_lease.h"

#include <gtest/gtest.h>

#include <thread>

#include "ddprun/store/hash_store.h"

namespace ddprun::rendezvous::detail {
namespace {

const NodeLeaseKeys kKeys{"job/hb/n", "job/gone/n"};

TEST(NodeLease, EndedOnlyWithATombstoneAndNoBeat) {
  store::HashStore s;
  EXPECT_FALSE(leaseEnded(s, kKeys));  // never ended
  s.set(kKeys.tombstone, "closed");
  EXPECT_TRUE(leaseEnded(s, kKeys));
  s.set(kKeys.beat, "2 200");  // a new connection beats for it
  EXPECT_FALSE(leaseEnded(s, kKeys));
}

TEST(NodeLease, OnlyAConnectionItsProcessClosedMakesANodeLost) {
  store::HashStore s;
  s.set(kKeys.tombstone, "reset");
  EXPECT_TRUE(leaseEnded(s, kKeys));
  EXPECT_FALSE(lostForGood(s, kKeys));  // a reset is no proof of death
  s.set(kKeys.tombstone, "closed");
  EXPECT_TRUE(lostForGood(s, kKeys));
  s.set(kKeys.beat, "3 300");
  EXPECT_FALSE(lostForGood(s, kKeys));
}

TEST(NodeLease, BeatsWithinSeesABeatNowOrOneThatComesWhileItWaits) {
  store::HashStore s;
  EXPECT_FALSE(beatsWithin(s, kKeys.beat, std::chrono::milliseconds(0)));
  EXPECT_FALSE(beatsWithin(s, kKeys.beat, std::chrono::milliseconds(-5)));
  std::thread beat([&] { s.set(kKeys.beat, "1 100"); });
  EXPECT_TRUE(beatsWithin(s, kKeys.beat, std::chrono::minutes(10)));  // ends at the write
  beat.join();
  EXPECT_TRUE(beatsWithin(s, kKeys.beat, std::chrono::milliseconds(0)));
}

}  // namespace
}  // namespace ddprun::rendezvous::detail
