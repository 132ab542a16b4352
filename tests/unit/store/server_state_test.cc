#include "ddprun/store/server_state.h"
#include "ddprun/store/log_limiter.h"
#include "store/state_harness.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>

namespace ddprun::store {
namespace {

using namespace testing_harness;

class ServerStateTest : public ::testing::TestWithParam<Dialect> {
 protected:
  ServerStateTest() : state_(ServerLimits{}, outbox_) {}
  Client client(ConnId id) { return Client(state_, outbox_, id, GetParam()); }
  bool v2() const { return GetParam() == Dialect::kV2; }
  FakeOutbox outbox_;
  ServerState state_;
};

TEST_P(ServerStateTest, SetGetAndMissingKeyIsEmpty) {
  auto c = client(1);
  std::string bin("x\0y", 3);
  EXPECT_EQ(c.send(Command::kSet, {"/k"}, {bin}), "");
  EXPECT_EQ(c.reply(), "");  // SET has no reply
  c.send(Command::kGet, {"/k"});
  EXPECT_EQ(c.reply(), bytes(bin));
  c.send(Command::kGet, {"/missing"});
  EXPECT_EQ(c.reply(), bytes(""));
}

TEST_P(ServerStateTest, AddKeepsDecimalText) {
  auto c = client(1);
  c.send(Command::kAdd, {"init/"}, {}, 1);
  EXPECT_EQ(c.reply(), i64(1));
  c.send(Command::kAdd, {"init/"}, {}, -11);
  EXPECT_EQ(c.reply(), i64(-10));
  c.send(Command::kAdd, {"init/"}, {}, 0);
  EXPECT_EQ(c.reply(), i64(-10));
  c.send(Command::kGet, {"init/"});
  EXPECT_EQ(c.reply(), bytes("-10"));
  c.send(Command::kSet, {"/n"}, {"41"});
  c.send(Command::kAdd, {"/n"}, {}, 1);
  EXPECT_EQ(c.reply(), i64(42));
}

TEST_P(ServerStateTest, AddOnTextClosesOnlyThatConnection) {
  auto a = client(1);
  auto b = client(2);
  a.send(Command::kSet, {"/t"}, {"not a number"});
  std::string err = a.send(Command::kAdd, {"/t"}, {}, 1);
  EXPECT_NE(err.find("not a decimal integer"), std::string::npos);
  EXPECT_EQ(b.send(Command::kGet, {"/t"}), "");
  EXPECT_EQ(b.reply(), bytes("not a number"));
  EXPECT_EQ(state_.stats().connectionsRejected, 1u);
}

TEST_P(ServerStateTest, AddOverflowIsRejected) {
  auto c = client(1);
  c.send(Command::kSet, {"/big"}, {"9223372036854775807"});
  EXPECT_NE(c.send(Command::kAdd, {"/big"}, {}, 1), "");
}

TEST_P(ServerStateTest, CompareSetFollowsPyTorchRules) {
  auto c = client(1);
  // Missing key, non-empty expected: nothing stored, expected returned.
  c.send(Command::kCompareSet, {"/k"}, {"old", "new"});
  EXPECT_EQ(c.reply(), bytes("old"));
  c.send(Command::kCheck, {"/k"});
  EXPECT_EQ(c.reply(), u8(wire::kCheckNotReady));
  // Missing key, empty expected: desired stored and returned.
  c.send(Command::kCompareSet, {"/k"}, {"", "first"});
  EXPECT_EQ(c.reply(), bytes("first"));
  // Present, mismatch: unchanged, current value returned.
  c.send(Command::kCompareSet, {"/k"}, {"nope", "second"});
  EXPECT_EQ(c.reply(), bytes("first"));
  // Present, match: replaced.
  c.send(Command::kCompareSet, {"/k"}, {"first", "second"});
  EXPECT_EQ(c.reply(), bytes("second"));
}

TEST_P(ServerStateTest, WaitBlocksUntilEveryKeyIsWritten) {
  auto waiter = client(1);
  auto writer = client(2);
  waiter.send(Command::kWait, {"/a", "/b"});
  EXPECT_EQ(waiter.reply(), "");
  writer.send(Command::kSet, {"/a"}, {"1"});
  EXPECT_EQ(waiter.reply(), "");
  writer.send(Command::kAdd, {"/b"}, {}, 1);
  EXPECT_EQ(writer.reply(), i64(1));
  EXPECT_EQ(waiter.reply(), u8(wire::kStopWaiting));
  // Already present: immediate.
  waiter.send(Command::kWait, {"/a", "/b"});
  EXPECT_EQ(waiter.reply(), u8(wire::kStopWaiting));
}

TEST_P(ServerStateTest, OneSetWakesEveryWaiter) {
  std::vector<Client> waiters;
  for (ConnId id = 1; id <= 5; ++id) {
    waiters.push_back(client(id));
    waiters.back().send(Command::kWait, {"/go"});
  }
  auto writer = client(99);
  writer.send(Command::kSet, {"/go"}, {""});
  for (auto& w : waiters) EXPECT_EQ(w.reply(), u8(wire::kStopWaiting));
}

TEST_P(ServerStateTest, CompareSetWakesOnlyWhenItWrites) {
  auto waiter = client(1);
  auto writer = client(2);
  waiter.send(Command::kWait, {"/k"});
  writer.send(Command::kCompareSet, {"/k"}, {"x", "y"});  // nothing stored
  writer.reply();
  EXPECT_EQ(waiter.reply(), "");
  writer.send(Command::kCompareSet, {"/k"}, {"", "y"});
  writer.reply();
  EXPECT_EQ(waiter.reply(), u8(wire::kStopWaiting));
}

TEST_P(ServerStateTest, DeleteAndNumKeys) {
  auto c = client(1);
  c.send(Command::kSet, {"/a"}, {"1"});
  c.send(Command::kSet, {"/b"}, {"2"});
  c.send(Command::kGetNumKeys);
  EXPECT_EQ(c.reply(), i64(2));
  c.send(Command::kDeleteKey, {"/a"});
  EXPECT_EQ(c.reply(), i64(1));
  c.send(Command::kDeleteKey, {"/a"});
  EXPECT_EQ(c.reply(), i64(0));
  c.send(Command::kGetNumKeys);
  EXPECT_EQ(c.reply(), i64(1));
}

TEST_P(ServerStateTest, ClosedWaiterIsForgotten) {
  auto waiter = client(1);
  auto writer = client(2);
  waiter.send(Command::kWait, {"/k"});
  state_.closed(waiter.id());
  outbox_.out.erase(waiter.id());
  writer.send(Command::kSet, {"/k"}, {"v"});
  EXPECT_EQ(outbox_.out.count(waiter.id()), 0u);  // nothing sent to the dead
}

TEST_P(ServerStateTest, ByteByByteEqualsAllAtOnce) {
  // A burst of requests fed one byte at a time must give the same replies.
  std::string stream;
  auto enc = [&](Command c, std::vector<std::string> k, std::vector<std::string> v,
                 int64_t n) {
    wire::encodeRequest(GetParam(), wire::makeRequest(c, std::move(k), std::move(v), n),
                        stream);
  };
  if (v2()) {
    wire::Request v;
    v.cmd = Command::kValidate;
    v.u32 = wire::kValidationMagic;
    wire::encodeRequest(Dialect::kV2, v, stream);
  }
  enc(Command::kSet, {"/a"}, {"hello"}, 0);
  enc(Command::kAdd, {"/n"}, {}, 5);
  enc(Command::kGet, {"/a"}, {}, 0);
  enc(Command::kCompareSet, {"/a"}, {"hello", "bye"}, 0);
  enc(Command::kCheck, {"/a", "/n"}, {}, 0);
  enc(Command::kGetNumKeys, {}, {}, 0);

  FakeOutbox o1, o2;
  ServerState whole(ServerLimits{}, o1), bytewise(ServerLimits{}, o2);
  whole.open(1);
  bytewise.open(1);
  ASSERT_EQ(whole.receive(1, stream), "");
  for (char ch : stream) ASSERT_EQ(bytewise.receive(1, std::string_view(&ch, 1)), "");
  EXPECT_EQ(o1.out[1], o2.out[1]);
  EXPECT_EQ(o1.out[1], i64(5) + bytes("hello") + bytes("bye") +
                           u8(wire::kCheckReady) + i64(2));
  EXPECT_EQ(whole.dialectOf(1), GetParam());
}

TEST_P(ServerStateTest, MemoryLimitRefusesAndDeleteFrees) {
  ServerLimits lim;
  lim.maxMemoryBytes = 1000;
  FakeOutbox o;
  ServerState s(lim, o);
  Client c(s, o, 1, GetParam());
  EXPECT_EQ(c.send(Command::kSet, {"/a"}, {std::string(600, 'x')}), "");
  auto err = c.send(Command::kSet, {"/b"}, {std::string(600, 'x')});
  EXPECT_NE(err.find("memory limit"), std::string::npos);
  s.closed(1);  // as the network layer does: frees its partial request
  Client c2(s, o, 2, GetParam());
  c2.send(Command::kDeleteKey, {"/a"});
  EXPECT_EQ(c2.reply(), i64(1));
  EXPECT_EQ(s.stats().memoryBytes, 0u);
  EXPECT_EQ(c2.send(Command::kSet, {"/b"}, {std::string(600, 'x')}), "");
}

TEST_P(ServerStateTest, GarbageClosesOnlyItsConnection) {
  auto good = client(1);
  state_.open(2);
  std::string err = state_.receive(2, "\xEE garbage");
  EXPECT_NE(err, "");
  good.send(Command::kSet, {"/still"}, {"ok"});
  good.send(Command::kGet, {"/still"});
  EXPECT_EQ(good.reply(), bytes("ok"));
}

INSTANTIATE_TEST_SUITE_P(BothDialects, ServerStateTest,
                         ::testing::Values(Dialect::kLegacy, Dialect::kV2),
                         [](const auto& info) {
                           return info.param == Dialect::kV2 ? std::string("V2")
                                                             : std::string("Legacy");
                         });

// Commands that only the >= 2.2 dialect has.
class ServerStateV2Test : public ::testing::Test {
 protected:
  ServerStateV2Test() : state_(ServerLimits{}, outbox_) {}
  Client client(ConnId id) { return Client(state_, outbox_, id, Dialect::kV2); }
  FakeOutbox outbox_;
  ServerState state_;
};

TEST_F(ServerStateV2Test, PingEchoesNonce) {
  auto c = client(1);
  wire::Request p;
  p.cmd = Command::kPing;
  p.u32 = 0xDEADBEEF;
  c.send(p);
  uint32_t v = 0xDEADBEEF;
  EXPECT_EQ(c.reply(), std::string(reinterpret_cast<const char*>(&v), 4));
}

TEST_F(ServerStateV2Test, BadMagicIsRejected) {
  state_.open(1);
  // 00 + wrong magic reads as a legacy SET with an absurd key length.
  std::string bytes("\0\x01\x02\x03\x04\0\0\0\0", 9);
  EXPECT_NE(state_.receive(1, bytes), "");
}

TEST_F(ServerStateV2Test, AppendMultiGetMultiSetWake) {
  auto waiter = client(1);
  auto c = client(2);
  waiter.send(Command::kWait, {"/m1", "/m2", "/ap"});
  c.send(Command::kMultiSet, {"/m1", "/m2"}, {"1", "2"});
  EXPECT_EQ(waiter.reply(), "");
  c.send(Command::kAppend, {"/ap"}, {"x"});
  EXPECT_EQ(waiter.reply(), u8(wire::kStopWaiting));
  c.send(Command::kAppend, {"/ap"}, {"yz"});
  c.send(Command::kMultiGet, {"/m1", "/ap", "/none"});
  EXPECT_EQ(c.reply(), bytes("1") + bytes("xyz") + bytes(""));
}

TEST_F(ServerStateV2Test, CancelWaitAlwaysRepliesAndUnregisters) {
  auto waiter = client(1);
  auto writer = client(2);
  waiter.send(Command::kCancelWait);
  EXPECT_EQ(waiter.reply(), u8(wire::kWaitCanceled));
  waiter.send(Command::kWait, {"/k"});
  waiter.send(Command::kCancelWait);
  EXPECT_EQ(waiter.reply(), u8(wire::kWaitCanceled));
  writer.send(Command::kSet, {"/k"}, {"v"});
  EXPECT_EQ(waiter.reply(), "");  // no stray STOP_WAITING after a cancel
}

TEST_F(ServerStateV2Test, QueuesPushPopLenAndWakeOne) {
  auto w1 = client(1);
  auto w2 = client(2);
  auto c = client(3);
  w1.send(Command::kWait, {"/q"});
  w2.send(Command::kWait, {"/q"});
  c.send(Command::kQueuePush, {"/q"}, {"a"});
  EXPECT_EQ(w1.reply() + w2.reply(), u8(wire::kStopWaiting));  // exactly one woken
  c.send(Command::kQueuePush, {"/q"}, {"b"});
  c.send(Command::kQueueLen, {"/q"});
  EXPECT_EQ(c.reply(), i64(2));
  c.send(Command::kCheck, {"/q"});
  EXPECT_EQ(c.reply(), u8(wire::kCheckReady));
  c.send(Command::kQueuePop, {"/q"});
  EXPECT_EQ(c.reply(), i64(2) + bytes("a"));
  c.send(Command::kQueuePop, {"/q"});
  EXPECT_EQ(c.reply(), i64(1) + bytes("b"));
  c.send(Command::kQueuePop, {"/q"});
  EXPECT_EQ(c.reply(), i64(0));
  c.send(Command::kGetNumKeys);
  EXPECT_EQ(c.reply(), i64(0));  // queues are not keys
}

TEST_F(ServerStateV2Test, ListKeys) {
  auto c = client(1);
  c.send(Command::kSet, {"/a"}, {"1"});
  c.send(Command::kSet, {"init/"}, {"1"});
  c.send(Command::kListKeys);
  std::string r = c.reply();
  ASSERT_GE(r.size(), 8u);
  EXPECT_EQ(r.substr(0, 8), i64(2));
  EXPECT_NE(r.find(bytes("/a")), std::string::npos);
  EXPECT_NE(r.find(bytes("init/")), std::string::npos);
}

TEST_F(ServerStateV2Test, BarrierReleasesEveryoneWhenTheLastArrives) {
  auto a = client(1);
  auto b = client(2);
  auto c = client(3);
  a.send(Command::kBarrier, {"/bar"}, {}, 3);
  b.send(Command::kBarrier, {"/bar"}, {}, 3);
  EXPECT_EQ(a.reply(), "");
  EXPECT_EQ(b.reply(), "");
  c.send(Command::kBarrier, {"/bar"}, {}, 3);
  EXPECT_EQ(a.reply(), u8(wire::kStopWaiting));
  EXPECT_EQ(b.reply(), u8(wire::kStopWaiting));
  EXPECT_EQ(c.reply(), u8(wire::kStopWaiting));
  EXPECT_NE(c.send(Command::kBarrier, {"/bar"}, {}, 0), "");
}

TEST(ServerStateLegacy, WatchKeyPushesChanges) {
  FakeOutbox o;
  ServerState s(ServerLimits{}, o);
  Client watcher(s, o, 1, Dialect::kLegacy);
  Client c(s, o, 2, Dialect::kLegacy);
  watcher.send(Command::kWatchKey, {"/w"});
  EXPECT_EQ(watcher.reply(), u8(wire::kKeyCallbackRegistered));
  c.send(Command::kSet, {"/w"}, {"1"});
  c.send(Command::kSet, {"/w"}, {"2"});
  c.send(Command::kDeleteKey, {"/w"});
  c.reply();
  EXPECT_EQ(watcher.reply(),
            u8(wire::kKeyCreated) + bytes("/w") + bytes("") + bytes("1") +
                u8(wire::kKeyUpdated) + bytes("/w") + bytes("1") + bytes("2") +
                u8(wire::kKeyDeleted) + bytes("/w") + bytes("2") + bytes(""));
}

// The static rendezvous hands its agent store to each round's workers with
// a clean keyspace: everything outside its own prefix goes, as DELETE_KEY.
TEST(ServerStateErase, KeysAndQueuesOutsideThePrefixGoWatchersAreToldWaitersWaitOn) {
  FakeOutbox o;
  ServerState s(ServerLimits{}, o);
  Client c(s, o, 1, Dialect::kV2);
  Client watcher(s, o, 2, Dialect::kLegacy);
  Client waiter(s, o, 3, Dialect::kV2);
  watcher.send(Command::kWatchKey, {"init/"});
  EXPECT_EQ(watcher.reply(), u8(wire::kKeyCallbackRegistered));
  waiter.send(Command::kWait, {"default_pg/0//rank_1"});
  EXPECT_EQ(waiter.reply(), "");  // blocked
  for (const char* k : {"ddprun/job/round/0/node/0", "ddprun/job/hb/node0"})
    c.send(Command::kSet, {k}, {"kept"});
  const size_t kept = s.stats().memoryBytes;
  c.send(Command::kSet, {"default_pg/0//rank_0"}, {"addr"});
  c.send(Command::kAdd, {"init/"}, {}, 4);
  c.send(Command::kSet, {"ddprun/jobX"}, {"x"});  // the prefix, not a key under it
  c.send(Command::kQueuePush, {"q"}, {"entry"});
  c.reply();
  EXPECT_EQ(watcher.reply(),
            u8(wire::kKeyCreated) + bytes("init/") + bytes("") + bytes("4"));
  ASSERT_GT(s.stats().memoryBytes, kept);

  EXPECT_EQ(s.eraseKeysOutside("ddprun/job/"), 4u);  // 3 keys and 1 queue
  EXPECT_EQ(s.stats().keys, 2u);
  EXPECT_EQ(watcher.reply(),
            u8(wire::kKeyDeleted) + bytes("init/") + bytes("4") + bytes(""));
  EXPECT_EQ(s.stats().memoryBytes, kept) << "every erased byte is released";
  for (const char* k : {"default_pg/0//rank_0", "init/", "ddprun/jobX"}) {
    c.send(Command::kCheck, {k});
    EXPECT_EQ(c.reply(), u8(wire::kCheckNotReady)) << k;
  }
  c.send(Command::kQueueLen, {"q"});
  EXPECT_EQ(c.reply(), i64(0));
  c.send(Command::kGet, {"ddprun/job/hb/node0"});
  EXPECT_EQ(c.reply(), bytes("kept"));
  // A key that appears afterwards is new: the waiter wakes on it.
  c.send(Command::kSet, {"default_pg/0//rank_1"}, {"new"});
  EXPECT_EQ(waiter.reply(), u8(wire::kStopWaiting));
  EXPECT_EQ(s.eraseKeysOutside("ddprun/job/"), 1u);
  EXPECT_EQ(s.eraseKeysOutside(""), 0u) << "every key begins with the empty prefix";
  EXPECT_EQ(s.eraseKeysOutside("other/"), 2u);
  EXPECT_EQ(s.stats().keys, 0u);
}

// ---- Hostile and slow clients: one budget, per-connection caps. ----

std::string repeated(const std::string& one, int times) {
  std::string out;
  for (int i = 0; i < times; ++i) out += one;
  return out;
}

TEST(ServerStateLimits, UnreadRepliesPauseAtARequestBoundaryAndResume) {
  ServerLimits lim;
  lim.maxUnsentBytes = 4 << 20;
  FakeOutbox o;
  ServerState s(lim, o);
  Client c(s, o, 1, Dialect::kV2);
  const std::string mib(1 << 20, 'v');
  ASSERT_EQ(c.send(Command::kSet, {"/big"}, {mib}), "");
  // 1,000 GETs of a 1 MiB value in one read: only ~4 MiB of replies are made.
  std::string gets = repeated(encoded(Dialect::kV2, Command::kGet, {"/big"}), 1000);
  ASSERT_EQ(s.receive(1, gets), "");
  EXPECT_TRUE(s.paused(1));
  EXPECT_LE(o.out[1].size(), lim.maxUnsentBytes + mib.size() + 8);
  EXPECT_LE(s.stats().memoryBytes, 2 * lim.maxUnsentBytes + gets.size() + 2 * mib.size());
  // Reading the replies lets the held requests run, a few at a time.
  size_t got = 0;
  for (int rounds = 0;; ++rounds) {
    ASSERT_LT(rounds, 1000);
    got += c.reply().size();
    ASSERT_EQ(s.resume(1), "");
    EXPECT_LE(o.out[1].size(), lim.maxUnsentBytes + mib.size() + 8);
    if (!s.paused(1) && o.out[1].empty()) break;
  }
  EXPECT_EQ(got, 1000 * (mib.size() + 8));
  EXPECT_EQ(s.stats().requests, 2 + 1000u);  // VALIDATE, SET, 1,000 GETs
}

TEST(ServerStateLimits, BudgetClosesTheClientNotTheServer) {
  ServerLimits lim;
  lim.maxMemoryBytes = 8 << 20;
  lim.maxUnsentBytes = 64 << 20;  // only the budget stops this one
  FakeOutbox o;
  ServerState s(lim, o);
  Client c(s, o, 1, Dialect::kV2);
  ASSERT_EQ(c.send(Command::kSet, {"/big"}, {std::string(1 << 20, 'v')}), "");
  std::string err =
      s.receive(1, repeated(encoded(Dialect::kV2, Command::kGet, {"/big"}), 100));
  EXPECT_NE(err.find("--max-memory"), std::string::npos) << err;
  EXPECT_LE(s.stats().memoryBytes, lim.maxMemoryBytes);
  s.closed(1);
  o.take(1);
  Client other(s, o, 2, Dialect::kV2);
  other.send(Command::kGet, {"/big"});
  EXPECT_EQ(other.reply().size(), (1u << 20) + 8);
}

// A slow reader closed while a write of its replies is in flight: those
// bytes stay charged until the write ends (they are still allocated), so the
// budget cannot be handed out twice by a storm of closing readers.
TEST(ServerStateLimits, OutputInFlightStaysChargedUntilItsWriteEnds) {
  ServerLimits lim;
  FakeOutbox o;
  ServerState s(lim, o);
  Client c(s, o, 1, Dialect::kV2);
  ASSERT_EQ(c.send(Command::kSet, {"/big"}, {std::string(1 << 20, 'v')}), "");
  const size_t stored = s.stats().memoryBytes;
  ASSERT_EQ(s.receive(1, encoded(Dialect::kV2, Command::kGet, {"/big"})), "");
  const size_t inFlight = o.out[1].size();  // the network layer began writing it
  ASSERT_GT(inFlight, 1u << 20);
  EXPECT_EQ(s.stats().memoryBytes, stored + inFlight);
  s.closed(1, inFlight);
  EXPECT_EQ(s.stats().memoryBytes, stored + inFlight);
  s.releaseInFlight(inFlight);
  EXPECT_EQ(s.stats().memoryBytes, stored);
}

TEST(ServerStateLimits, OversizedMultiGetReplyClosesItsClient) {
  ServerLimits lim;
  lim.maxReplyBytes = 16 << 20;
  FakeOutbox o;
  ServerState s(lim, o);
  Client c(s, o, 1, Dialect::kV2);
  ASSERT_EQ(c.send(Command::kSet, {"/big"}, {std::string(1 << 20, 'v')}), "");
  size_t stored = s.stats().memoryBytes;
  std::string err = c.send(Command::kMultiGet, std::vector<std::string>(5000, "/big"));
  EXPECT_NE(err.find("--max-reply-bytes"), std::string::npos) << err;
  EXPECT_EQ(c.reply(), "");
  s.closed(1);
  EXPECT_EQ(s.stats().memoryBytes, stored);
  // 10,000 keys of a small value fit (a 10k-rank job's MULTI_GET).
  Client d(s, o, 2, Dialect::kV2);
  std::vector<std::string> keys;
  for (int i = 0; i < 10000; ++i) keys.push_back("/r" + std::to_string(i));
  ASSERT_EQ(d.send(Command::kMultiGet, keys), "");
  EXPECT_EQ(d.reply().size(), 10000u * 8);
}

TEST(ServerStateLimits, PartialRequestIsChargedBeforeItArrives) {
  ServerLimits lim;
  lim.maxMemoryBytes = 16 << 20;
  FakeOutbox o;
  ServerState s(lim, o);
  s.open(1);
  std::string set =
      encoded(Dialect::kV2, Command::kSet, {"/k"}, {std::string(10 << 20, 'x')});
  ASSERT_EQ(s.receive(1, encoded(Dialect::kV2, Command::kValidate).substr(0, 1)), "");
  std::string validate;
  wire::encodeRequest(
      Dialect::kV2,
      wire::makeRequest(Command::kValidate, {}, {}, 0, wire::kValidationMagic), validate);
  ASSERT_EQ(s.receive(1, validate.substr(1)), "");
  ASSERT_EQ(s.receive(1, set.substr(0, 100)), "");
  EXPECT_TRUE(s.partial(1));
  EXPECT_GE(s.stats().memoryBytes, 10u << 20);  // declared, not yet received
  // A second connection declaring another 10 MiB is refused at its header.
  s.open(2);
  ASSERT_EQ(s.receive(2, validate), "");
  EXPECT_NE(s.receive(2, set.substr(0, 100)).find("memory limit"), std::string::npos);
  s.closed(1);
  s.closed(2);
  EXPECT_EQ(s.stats().memoryBytes, 0u);
}

TEST(ServerStateLimits, DuplicateWatchReplacesAndUnreadWatcherIsClosed) {
  ServerLimits lim;
  lim.maxUnsentBytes = 1 << 20;
  lim.maxReplyBytes = 2 << 20;
  FakeOutbox o;
  ServerState s(lim, o);
  Client watcher(s, o, 1, Dialect::kLegacy);
  Client writer(s, o, 2, Dialect::kLegacy);
  std::string watches =
      repeated(encoded(Dialect::kLegacy, Command::kWatchKey, {"/w"}), 3000);
  ASSERT_EQ(s.receive(1, watches), "");
  EXPECT_EQ(watcher.reply(), repeated(u8(wire::kKeyCallbackRegistered), 3000));
  ASSERT_EQ(writer.send(Command::kSet, {"/w"}, {"1"}), "");
  EXPECT_EQ(watcher.reply(),
            u8(wire::kKeyCreated) + bytes("/w") + bytes("") + bytes("1"));
  // The watcher stops reading: 1 MiB updates pile up until its cap, then it
  // is closed, and the writer is never refused.
  for (int i = 0; i < 5; ++i)
    ASSERT_EQ(writer.send(Command::kSet, {"/w"}, {std::string(1 << 20, 'a' + i)}), "");
  ASSERT_EQ(o.doomed.count(1), 1u);
  EXPECT_NE(o.doomed[1].find("does not read"), std::string::npos);
  EXPECT_LE(o.out[1].size(), lim.maxUnsentBytes + lim.maxReplyBytes);
}

TEST(ServerStateLimits, WaitRegistrationsAreCappedAndCharged) {
  ServerLimits lim;
  lim.maxWaitKeys = 100;
  FakeOutbox o;
  ServerState s(lim, o);
  Client c(s, o, 1, Dialect::kV2);
  std::vector<std::string> keys;
  for (int i = 0; i < 60; ++i) keys.push_back("/missing" + std::to_string(i));
  ASSERT_EQ(c.send(Command::kWait, keys), "");
  EXPECT_GE(s.stats().memoryBytes, 60u * 64);
  EXPECT_NE(c.send(Command::kWait, keys).find("--max-wait-keys"), std::string::npos);
  s.closed(1);
  EXPECT_EQ(s.stats().memoryBytes, 0u);
}

TEST(ServerStateLimits, ParsesEachByteOnceHoweverTheRequestIsSplit) {
  std::vector<std::string> keys, values;
  for (int i = 0; i < 1024; ++i) {
    keys.push_back("/k" + std::to_string(i));
    values.push_back(std::string(1000, 'v'));
  }
  std::string req = encoded(Dialect::kV2, Command::kMultiSet, keys, values);
  for (size_t piece : {size_t{1}, size_t{2048}, req.size()}) {
    FakeOutbox o;
    ServerState s(ServerLimits{}, o);
    Client c(s, o, 1, Dialect::kV2);
    uint64_t before = s.stats().bytesParsed;
    for (size_t at = 0; at < req.size(); at += piece)
      ASSERT_EQ(s.receive(1, std::string_view(req).substr(at, piece)), "");
    EXPECT_EQ(s.stats().bytesParsed - before, req.size()) << piece;
    EXPECT_EQ(s.stats().keys, 1024u);
  }
}

TEST(LogLimiter, AdmitsABurstThenCountsTheSuppressed) {
  LogLimiter lim(3, std::chrono::seconds(1));
  auto t = LogLimiter::Clock::time_point{} + std::chrono::hours(1);
  std::string note;
  int admitted = 0;
  for (int i = 0; i < 10; ++i) admitted += lim.admit(t, note);
  EXPECT_EQ(admitted, 3);
  EXPECT_TRUE(lim.admit(t + std::chrono::seconds(1), note));
  EXPECT_EQ(note, " (7 similar lines suppressed)");
  EXPECT_TRUE(lim.admit(t + std::chrono::seconds(1), note));
  EXPECT_EQ(note, "");
}

}  // namespace
}  // namespace ddprun::store
