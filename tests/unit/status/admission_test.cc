// The status endpoint's admission and eviction policy (issue 25, fault 4;
// issue 40), with a fake clock and a fake view of the sockets: time points
// are built by hand, and which connections wait on their clients is a set
// the test fills. Nothing sleeps, nothing opens a socket.
#include "ddprun/status/admission.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <map>
#include <set>

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

// Which connections wait on their clients (idle or half-sent, everything
// they sent read): the server's view, faked.
struct Clients {
  std::set<Id> idle;
  Admission::WaitsOnClient view() const {
    return [this](Id id) { return idle.count(id) > 0; };
  }
};

TEST(StatusAdmission, AdmitsUnderTheLimitsWithoutEvicting) {
  Admission a(limits(4, 4));
  Clients c;
  for (int i = 0; i < 4; ++i) {
    auto r = a.admit("10.0.0.1", at(i), c.view());
    EXPECT_TRUE(r.evicted.empty());
    EXPECT_TRUE(r.read);
  }
  EXPECT_EQ(a.held(), 4u);
  EXPECT_EQ(a.heldFrom("10.0.0.1"), 4u);
  EXPECT_EQ(a.heldFrom("10.0.0.2"), 0u);
  EXPECT_FALSE(a.overCapacity());
}

// Issue 40: a probe whose request arrived (the server has not read it yet)
// is not closed for a newer connection from its own address; the newcomer
// waits instead.
TEST(StatusAdmission, ARequestThatArrivedIsNeverEvictedForANewerOne) {
  Admission a(limits(100, 2));
  Clients c;  // nobody idle: both requests are in the sockets, unread
  const Id flood = a.admit("127.0.0.1", at(0), c.view()).id;
  const Id probe = a.admit("127.0.0.1", at(1), c.view()).id;
  auto next = a.admit("127.0.0.1", at(2), c.view());
  EXPECT_TRUE(next.evicted.empty());
  EXPECT_FALSE(next.read);
  EXPECT_EQ(a.phase(next.id), Phase::kWaiting);
  EXPECT_EQ(a.phase(flood), Phase::kReading);
  EXPECT_EQ(a.phase(probe), Phase::kReading);
  EXPECT_EQ(a.waiting(), 1u);
}

// Issue 25: an address full of idle or half-sent connections still lets a
// new one in: its oldest connection that waits on its client makes room.
TEST(StatusAdmission, IdleConnectionsMakeRoomOldestFirst) {
  Admission a(limits(100, 3));
  Clients c;
  const Id idle1 = a.admit("h", at(0), c.view()).id;
  const Id busy = a.admit("h", at(1), c.view()).id;
  const Id idle2 = a.admit("h", at(2), c.view()).id;
  c.idle = {idle1, idle2};
  auto probe = a.admit("h", at(3), c.view());
  EXPECT_EQ(probe.evicted, std::vector<Id>{idle1});
  EXPECT_TRUE(probe.read);
  EXPECT_EQ(a.admit("h", at(4), c.view()).evicted, std::vector<Id>{idle2});
  // busy and the probe are owed answers; the next one waits.
  auto third = a.admit("h", at(5), c.view());
  EXPECT_TRUE(third.evicted.empty());
  EXPECT_FALSE(third.read);
  EXPECT_TRUE(a.phase(busy).has_value());
  EXPECT_TRUE(a.phase(probe.id).has_value());
}

// Eviction order: answered and lingering first, then waiting on its
// client; never one being answered or with its request unread.
TEST(StatusAdmission, EvictsLingeringThenIdleNeverAnsweringOrUnread) {
  Admission a(limits(100, 4));
  Clients c;
  const Id answering = a.admit("h", at(0), c.view()).id;
  const Id unread = a.admit("h", at(1), c.view()).id;
  const Id idle = a.admit("h", at(2), c.view()).id;
  const Id lingering = a.admit("h", at(3), c.view()).id;
  c.idle = {idle};
  a.answering(answering);
  a.answering(lingering);
  a.lingering(lingering);
  EXPECT_EQ(a.phase(lingering), Phase::kLingering);
  EXPECT_EQ(a.admit("h", at(4), c.view()).evicted, std::vector<Id>{lingering});
  EXPECT_EQ(a.admit("h", at(5), c.view()).evicted, std::vector<Id>{idle});
  auto w = a.admit("h", at(6), c.view());
  EXPECT_TRUE(w.evicted.empty());
  EXPECT_EQ(a.phase(w.id), Phase::kWaiting);
  EXPECT_EQ(a.phase(answering), Phase::kAnswering);
  EXPECT_EQ(a.phase(unread), Phase::kReading);
}

// Waiting connections get the room that appears, first come first served;
// a newcomer queues behind them even when room appeared meanwhile.
TEST(StatusAdmission, WaitingConnectionsArePromotedInOrder) {
  Admission a(limits(100, 2));
  Clients c;
  const Id r1 = a.admit("h", at(0), c.view()).id;
  const Id r2 = a.admit("h", at(1), c.view()).id;
  const Id w1 = a.admit("h", at(2), c.view()).id;
  const Id w2 = a.admit("h", at(3), c.view()).id;
  EXPECT_TRUE(a.promote(c.view()).started.empty());  // no room yet
  a.closed(r1);
  auto late = a.admit("h", at(4), c.view());
  EXPECT_FALSE(late.read);  // behind w1 and w2
  auto p = a.promote(c.view());
  EXPECT_EQ(p.started, std::vector<Id>{w1});
  EXPECT_TRUE(p.evicted.empty());
  EXPECT_EQ(a.phase(w1), Phase::kReading);
  // r2 answered and lingers: it gives way to w2, then nothing more is free.
  a.answering(r2);
  a.lingering(r2);
  p = a.promote(c.view());
  EXPECT_EQ(p.started, std::vector<Id>{w2});
  EXPECT_EQ(p.evicted, std::vector<Id>{r2});
  EXPECT_EQ(a.phase(late.id), Phase::kWaiting);
  // w1 goes idle (a half-sent request): it gives way to `late`.
  c.idle = {w1};
  p = a.promote(c.view());
  EXPECT_EQ(p.started, std::vector<Id>{late.id});
  EXPECT_EQ(p.evicted, std::vector<Id>{w1});
  EXPECT_EQ(a.waiting(), 0u);
}

// One address cannot take another's room: over its own limit it waits or
// evicts its own connections only.
TEST(StatusAdmission, PerAddressLimitConcernsThatAddressOnly) {
  Admission a(limits(100, 2));
  Clients c;
  const Id kubelet = a.admit("10.0.0.9", at(0), c.view()).id;
  c.idle.insert(kubelet);  // even an idle one of another address stays
  const Id a1 = a.admit("10.0.0.1", at(1), c.view()).id;
  a.admit("10.0.0.1", at(2), c.view());
  EXPECT_FALSE(a.admit("10.0.0.1", at(3), c.view()).read);
  c.idle.insert(a1);
  EXPECT_EQ(a.admit("10.0.0.1", at(4), c.view()).read, false);  // behind the waiting one
  auto b = a.admit("10.0.0.2", at(5), c.view());
  EXPECT_TRUE(b.read);
  EXPECT_TRUE(b.evicted.empty());
  EXPECT_TRUE(a.phase(kubelet).has_value());
}

// The endpoint full: the address holding the most gives way, or the next
// one when it has nothing to give.
TEST(StatusAdmission, FullEvictsFromTheAddressHoldingTheMost) {
  Admission a(limits(5, 100));
  Clients c;
  const Id kubelet = a.admit("10.0.0.9", at(0), c.view()).id;  // the oldest of all
  const Id b1 = a.admit("10.0.0.2", at(1), c.view()).id;
  const Id a1 = a.admit("10.0.0.1", at(2), c.view()).id;
  a.admit("10.0.0.1", at(3), c.view());
  a.admit("10.0.0.1", at(4), c.view());
  c.idle = {kubelet, b1, a1};
  EXPECT_EQ(a.admit("10.0.0.3", at(5), c.view()).evicted, std::vector<Id>{a1});
  // 10.0.0.1 has nothing more to give (its requests arrived): the next.
  auto r = a.admit("10.0.0.3", at(6), c.view());
  EXPECT_EQ(r.evicted.size(), 1u);
  EXPECT_TRUE(r.evicted[0] == b1 || r.evicted[0] == kubelet);
  EXPECT_FALSE(a.overCapacity());
}

// Nothing to give anywhere: the newcomer is held over the limit and the
// server accepts no more until a connection ends.
TEST(StatusAdmission, FullWithNothingToGiveGoesOverCapacityOnce) {
  Admission a(limits(2, 100));
  Clients c;
  const Id x = a.admit("h", at(0), c.view()).id;
  a.admit("g", at(1), c.view());
  auto over = a.admit("k", at(2), c.view());
  EXPECT_TRUE(over.evicted.empty());
  EXPECT_TRUE(over.read);
  EXPECT_TRUE(a.overCapacity());
  a.closed(x);
  EXPECT_FALSE(a.overCapacity());
}

// A request must arrive within headerDeadline (waiting for room too); once
// read, the connection has until `deadline` (from its accept) to end.
TEST(StatusAdmission, DeadlinesExpireSlowRequestsAndLongConnections) {
  Admission a(limits(10, 1));
  Clients c;
  const Id slow = a.admit("h", at(0), c.view()).id;
  const Id served = a.admit("g", at(100), c.view()).id;
  const Id waiting = a.admit("h", at(500), c.view()).id;
  EXPECT_EQ(a.phase(waiting), Phase::kWaiting);
  a.answering(served);
  EXPECT_EQ(a.nextDeadline(), at(2'000));
  EXPECT_TRUE(a.expired(at(1'999)).empty());
  EXPECT_EQ(a.expired(at(2'000)), std::vector<Id>{slow});
  EXPECT_EQ(a.expired(at(2'500)), std::vector<Id>{waiting});
  EXPECT_EQ(a.waiting(), 0u);
  EXPECT_EQ(a.nextDeadline(), at(10'100));
  a.lingering(served);
  EXPECT_TRUE(a.expired(at(10'099)).empty());
  EXPECT_EQ(a.expired(at(10'100)), std::vector<Id>{served});
  EXPECT_EQ(a.nextDeadline(), std::nullopt);
  EXPECT_EQ(a.held(), 0u);
}

TEST(StatusAdmission, ExpiredInDeadlineOrder) {
  Admission a(limits(10, 10));
  Clients c;
  const Id answered = a.admit("h", at(0), c.view()).id;
  a.answering(answered);                                  // until 10'000
  const Id late = a.admit("h", at(9'000), c.view()).id;   // until 11'000
  const Id early = a.admit("h", at(1'000), c.view()).id;  // until 3'000
  EXPECT_EQ(a.expired(at(20'000)), (std::vector<Id>{early, answered, late}));
}

TEST(StatusAdmission, ClosedAndUnknownIdsAreForgotten) {
  Admission a(limits(2, 2));
  Clients c;
  const Id x = a.admit("h", at(0), c.view()).id;
  a.closed(x);
  a.closed(x);
  a.answering(x);
  a.lingering(12345);
  EXPECT_EQ(a.held(), 0u);
  EXPECT_EQ(a.heldFrom("h"), 0u);
  EXPECT_EQ(a.phase(x), std::nullopt);
  EXPECT_EQ(a.nextDeadline(), std::nullopt);
  EXPECT_EQ(a.evictOne(c.view()), std::nullopt);
  const Id y = a.admit("h", at(1), c.view()).id;
  EXPECT_NE(x, y);  // ids are never reused
}

// Out of descriptors: the server closes the policy's choice to accept
// again, never a connection it owes an answer.
TEST(StatusAdmission, EvictOneFreesOnlyWhatMayBeClosed) {
  Admission a(limits(10, 10));
  Clients c;
  const Id other = a.admit("10.0.0.9", at(0), c.view()).id;
  const Id a1 = a.admit("10.0.0.1", at(1), c.view()).id;
  const Id a2 = a.admit("10.0.0.1", at(2), c.view()).id;
  a.answering(a1);
  EXPECT_EQ(a.evictOne(c.view()), std::nullopt);  // a2's request is unread
  c.idle = {a2, other};
  EXPECT_EQ(a.evictOne(c.view()), a2);  // of the address holding the most
  EXPECT_EQ(a.evictOne(c.view()), other);
  EXPECT_EQ(a.evictOne(c.view()), std::nullopt);
  EXPECT_EQ(a.held(), 1u);
}

// Many connections from a few addresses, some idle, some answered, some
// owed answers, admitted as the server does (none while over capacity): the
// limits hold, and nothing owed an answer is ever closed.
TEST(StatusAdmission, ManyConnectionsStayWithinTheLimitsAndKeepOwedOnes) {
  Admission a(limits(64, 16));
  Clients c;
  std::map<Id, int> owed;  // their requests arrived (at iteration): never evicted
  size_t admitted = 0;
  for (int i = 0; i < 10'000; ++i) {
    const std::string addr = "10.0.0." + std::to_string(i % 7);
    std::vector<Id> reading;
    if (!a.overCapacity()) {
      auto r = a.admit(addr, at(i), c.view());
      ++admitted;
      for (Id e : r.evicted) ASSERT_EQ(owed.count(e), 0u) << e;
      if (r.read) reading.push_back(r.id);
    }
    auto p = a.promote(c.view());
    for (Id e : p.evicted) ASSERT_EQ(owed.count(e), 0u) << e;
    reading.insert(reading.end(), p.started.begin(), p.started.end());
    for (Id id : reading) {
      if (id % 3 == 0) {
        c.idle.insert(id);  // a slow client
      } else if (id % 3 == 1) {
        owed[id] = i;
      } else {
        a.answering(id);
        a.lingering(id);
      }
    }
    // Answers take a few iterations; then the connection lingers.
    for (auto it = owed.begin(); it != owed.end();) {
      ASSERT_TRUE(a.phase(it->first).has_value()) << it->first;
      if (it->second + 3 > i) {
        ++it;
        continue;
      }
      a.answering(it->first);
      a.lingering(it->first);
      it = owed.erase(it);
    }
    for (Id id : a.expired(at(i))) c.idle.erase(id);
    ASSERT_LE(a.held(), 64u + 1);
  }
  EXPECT_GT(admitted, 5'000u);  // room keeps appearing
  a.expired(at(1'000'000));
  EXPECT_EQ(a.held(), 0u);
  EXPECT_EQ(a.waiting(), 0u);
}

TEST(StatusAdmission, RejectsImpossibleLimits) {
  EXPECT_THROW(Admission(limits(0, 1)), InvalidArgument);
  EXPECT_THROW(Admission(limits(1, 0)), InvalidArgument);
  AdmissionLimits l = limits(1, 1);
  l.headerDeadline = milliseconds(20'000);
  EXPECT_THROW(Admission{l}, InvalidArgument);
}

DescriptorNeeds needs(uint64_t limit, uint64_t open, uint64_t workers, uint64_t nodes) {
  DescriptorNeeds n;
  n.limit = limit;
  n.open = open;
  n.localWorkers = workers;
  n.nodes = nodes;
  return n;
}

// What the agent keeps: what it holds, 16 for what it opens later, per
// local worker 4 (output channels, log files), per worker of the job 2
// (worker store connections), per node 2 (rendezvous), 8 while a worker
// starts (docs/status.md).
TEST(StatusAdmission, ReservationCountsWhatTheWorkersNeed) {
  EXPECT_EQ(reservedDescriptors(needs(1024, 20, 1, 1)), 20u + 16 + 4 + 2 + 2 + 8);
  EXPECT_EQ(reservedDescriptors(needs(1024, 20, 8, 2)), 20u + 16 + 32 + 32 + 4 + 8);
  EXPECT_GT(reservedDescriptors(needs(1024, 20, 9, 1)),
            reservedDescriptors(needs(1024, 20, 8, 1)));
}

TEST(StatusAdmission, CapacityIsTheShareTheAgentLeaves) {
  // Plenty of descriptors: as configured.
  EXPECT_EQ(connectionCapacity(512, needs(1'048'576, 20, 8, 1)), 512u);
  EXPECT_EQ(connectionCapacity(512, needs(1024, 20, 1, 1)), 512u);
  // Between: what is left, less one for the connection over the limit.
  EXPECT_EQ(connectionCapacity(512, needs(256, 20, 4, 1)),
            256u - (20 + 16 + 16 + 8 + 2 + 8) - 1);
  // A job that needs it all (ulimit -n 32): one at a time, never none.
  EXPECT_EQ(connectionCapacity(512, needs(32, 18, 2, 1)), 1u);
  EXPECT_EQ(connectionCapacity(512, needs(2, 0, 1, 1)), 1u);
  // More workers leave the endpoint less.
  EXPECT_LT(connectionCapacity(512, needs(300, 20, 16, 1)),
            connectionCapacity(512, needs(300, 20, 4, 1)));
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
