// The status endpoint's admission and eviction policy (issue 25, fault 4),
// with a fake clock: time points are built by hand, nothing sleeps.
#include "ddprun/status/admission.h"

#include <gtest/gtest.h>

#include <cerrno>

#include "ddprun/common/error.h"

namespace ddprun::status {
namespace {

using std::chrono::milliseconds;
using Id = Admission::Id;
using Phase = Admission::Phase;

const Admission::TimePoint t0{};
Admission::TimePoint at(int ms) { return t0 + milliseconds(ms); }

AdmissionLimits limits(size_t total, size_t perAddress) {
  AdmissionLimits l;
  l.maxConnections = total;
  l.maxPerAddress = perAddress;
  l.headerDeadline = milliseconds(2'000);
  l.deadline = milliseconds(10'000);
  return l;
}

TEST(StatusAdmission, AdmitsUnderTheLimitsWithoutEvicting) {
  Admission a(limits(4, 4));
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(a.admit("10.0.0.1", at(i)).evicted.empty());
  EXPECT_EQ(a.held(), 4u);
  EXPECT_EQ(a.heldFrom("10.0.0.1"), 4u);
  EXPECT_EQ(a.heldFrom("10.0.0.2"), 0u);
}

// The starvation of issue 25: the endpoint full of half-sent requests. A new
// connection is still admitted; the oldest unfinished one makes room.
TEST(StatusAdmission, FullEvictsTheOldestUnfinishedAndAlwaysAdmits) {
  Admission a(limits(3, 100));
  const Id first = a.admit("10.0.0.1", at(0)).id;
  const Id second = a.admit("10.0.0.1", at(1)).id;
  a.admit("10.0.0.1", at(2));
  auto probe = a.admit("10.0.0.1", at(3));
  EXPECT_EQ(probe.evicted, std::vector<Id>{first});
  EXPECT_EQ(a.phase(probe.id), Phase::kReading);
  EXPECT_EQ(a.admit("10.0.0.1", at(4)).evicted, std::vector<Id>{second});
  EXPECT_EQ(a.held(), 3u);
}

// A client that opens connections without end keeps evicting its own oldest:
// a newer connection (the probe) lives through maxConnections - 1 more.
TEST(StatusAdmission, AFloodEvictsOnlyOlderConnections) {
  Admission a(limits(8, 100));
  for (int i = 0; i < 8; ++i) a.admit("10.0.0.1", at(i));
  const Id probe = a.admit("10.0.0.1", at(8)).id;
  for (int i = 0; i < 7; ++i) {
    for (Id e : a.admit("10.0.0.1", at(9 + i)).evicted) EXPECT_NE(e, probe);
  }
  EXPECT_TRUE(a.phase(probe).has_value());
  EXPECT_EQ(a.admit("10.0.0.1", at(20)).evicted, std::vector<Id>{probe});
}

// Eviction order: answered and lingering first, then still reading, then
// being answered (its answer is under way); the oldest first among equals.
TEST(StatusAdmission, EvictsLingeringThenReadingThenAnswering) {
  Admission a(limits(3, 100));
  const Id answering = a.admit("h", at(0)).id;
  const Id reading = a.admit("h", at(1)).id;
  const Id lingering = a.admit("h", at(2)).id;
  a.answering(answering);
  a.answering(lingering);
  a.lingering(lingering);
  EXPECT_EQ(a.phase(lingering), Phase::kLingering);
  const Id third = a.admit("h", at(3)).id;
  EXPECT_EQ(a.phase(lingering), std::nullopt);  // evicted for `third`
  const Id fourth = a.admit("h", at(4)).id;
  EXPECT_EQ(a.phase(reading), std::nullopt);  // the older of the two reading
  EXPECT_EQ(a.phase(third), Phase::kReading);
  a.answering(third);
  a.answering(fourth);
  EXPECT_EQ(a.admit("h", at(5)).evicted, std::vector<Id>{answering});
}

TEST(StatusAdmission, AllAnsweringEvictsTheOldest) {
  Admission a(limits(2, 100));
  const Id old = a.admit("h", at(0)).id;
  const Id young = a.admit("h", at(1)).id;
  a.answering(old);
  a.answering(young);
  EXPECT_EQ(a.admit("h", at(2)).evicted, std::vector<Id>{old});
}

// One address cannot take another's room: over its own limit it evicts its
// own connections only, and when the endpoint is full the address holding
// the most gives way.
TEST(StatusAdmission, PerAddressLimitEvictsOnlyThatAddress) {
  Admission a(limits(100, 2));
  const Id kubelet = a.admit("10.0.0.9", at(0)).id;
  const Id a1 = a.admit("10.0.0.1", at(1)).id;
  a.admit("10.0.0.1", at(2));
  EXPECT_EQ(a.admit("10.0.0.1", at(3)).evicted, std::vector<Id>{a1});
  EXPECT_EQ(a.heldFrom("10.0.0.1"), 2u);
  EXPECT_TRUE(a.phase(kubelet).has_value());
}

TEST(StatusAdmission, FullEvictsFromTheAddressHoldingTheMost) {
  Admission a(limits(4, 100));
  const Id kubelet = a.admit("10.0.0.9", at(0)).id;  // the oldest of all
  const Id a1 = a.admit("10.0.0.1", at(1)).id;
  a.admit("10.0.0.1", at(2));
  a.admit("10.0.0.1", at(3));
  EXPECT_EQ(a.admit("10.0.0.2", at(4)).evicted, std::vector<Id>{a1});
  EXPECT_TRUE(a.phase(kubelet).has_value());
}

// A request must arrive within headerDeadline; once read, the connection has
// until `deadline` (from its accept) to end.
TEST(StatusAdmission, DeadlinesExpireSlowRequestsAndLongConnections) {
  Admission a(limits(10, 10));
  const Id slow = a.admit("h", at(0)).id;
  const Id served = a.admit("h", at(100)).id;
  a.answering(served);
  EXPECT_EQ(a.nextDeadline(), at(2'000));
  EXPECT_TRUE(a.expired(at(1'999)).empty());
  EXPECT_EQ(a.expired(at(2'000)), std::vector<Id>{slow});
  EXPECT_EQ(a.nextDeadline(), at(10'100));
  a.lingering(served);
  EXPECT_TRUE(a.expired(at(10'099)).empty());
  EXPECT_EQ(a.expired(at(10'100)), std::vector<Id>{served});
  EXPECT_EQ(a.nextDeadline(), std::nullopt);
  EXPECT_EQ(a.held(), 0u);
}

TEST(StatusAdmission, ExpiredInDeadlineOrder) {
  Admission a(limits(10, 10));
  const Id answered = a.admit("h", at(0)).id;
  a.answering(answered);                        // until 10'000
  const Id late = a.admit("h", at(9'000)).id;   // until 11'000
  const Id early = a.admit("h", at(1'000)).id;  // until 3'000
  EXPECT_EQ(a.expired(at(20'000)), (std::vector<Id>{early, answered, late}));
}

TEST(StatusAdmission, ClosedAndUnknownIdsAreForgotten) {
  Admission a(limits(2, 2));
  const Id x = a.admit("h", at(0)).id;
  a.closed(x);
  a.closed(x);
  a.answering(x);
  a.lingering(12345);
  EXPECT_EQ(a.held(), 0u);
  EXPECT_EQ(a.heldFrom("h"), 0u);
  EXPECT_EQ(a.phase(x), std::nullopt);
  EXPECT_EQ(a.nextDeadline(), std::nullopt);
  EXPECT_EQ(a.evictOne(), std::nullopt);
  const Id y = a.admit("h", at(1)).id;
  EXPECT_NE(x, y);  // ids are never reused
}

// Out of descriptors: the server closes the policy's choice to accept again.
TEST(StatusAdmission, EvictOneFreesTheWorstOfTheBusiestAddress) {
  Admission a(limits(10, 10));
  a.admit("10.0.0.9", at(0));
  const Id a1 = a.admit("10.0.0.1", at(1)).id;
  const Id a2 = a.admit("10.0.0.1", at(2)).id;
  a.answering(a1);
  EXPECT_EQ(a.evictOne(), a2);
  EXPECT_EQ(a.held(), 2u);
}

TEST(StatusAdmission, ManyConnectionsStayWithinTheLimits) {
  Admission a(limits(64, 16));
  for (int i = 0; i < 10'000; ++i) {
    const std::string addr = "10.0.0." + std::to_string(i % 7);
    auto r = a.admit(addr, at(i));
    ASSERT_LE(a.held(), 64u);
    ASSERT_LE(a.heldFrom(addr), 16u);
    ASSERT_TRUE(a.phase(r.id).has_value());
    if (i % 3 == 0) a.answering(r.id);
  }
  size_t expired = a.expired(at(1'000'000)).size();
  EXPECT_EQ(expired, 64u);
  EXPECT_EQ(a.held(), 0u);
}

TEST(StatusAdmission, RejectsImpossibleLimits) {
  EXPECT_THROW(Admission(limits(0, 1)), InvalidArgument);
  EXPECT_THROW(Admission(limits(1, 0)), InvalidArgument);
  AdmissionLimits l = limits(1, 1);
  l.headerDeadline = milliseconds(20'000);
  EXPECT_THROW(Admission{l}, InvalidArgument);
}

TEST(StatusAdmission, CapacityIsBoundedByTheDescriptorLimit) {
  EXPECT_EQ(connectionCapacity(512, 1'048'576), 512u);
  EXPECT_EQ(connectionCapacity(512, 1024), 256u);
  EXPECT_EQ(connectionCapacity(512, 2), 1u);
}

// EMFILE must neither spin nor end the acceptor; a connection's own error
// (reset before accept) must not delay the next one.
TEST(StatusAdmission, AcceptErrors) {
  EXPECT_EQ(acceptAction(EMFILE), AcceptAction::kFreeDescriptor);
  EXPECT_EQ(acceptAction(ENFILE), AcceptAction::kFreeDescriptor);
  EXPECT_EQ(acceptAction(ENOBUFS), AcceptAction::kFreeDescriptor);
  EXPECT_EQ(acceptAction(ENOMEM), AcceptAction::kFreeDescriptor);
  EXPECT_EQ(acceptAction(ECONNABORTED), AcceptAction::kAgain);
  EXPECT_EQ(acceptAction(EPROTO), AcceptAction::kAgain);
  EXPECT_EQ(acceptAction(EINTR), AcceptAction::kAgain);
  EXPECT_EQ(acceptAction(EBADF), AcceptAction::kWait);
  EXPECT_EQ(acceptAction(EINVAL), AcceptAction::kWait);
}

}  // namespace
}  // namespace ddprun::status
