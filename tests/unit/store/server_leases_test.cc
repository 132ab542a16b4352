// Leases (LeaseRule in server_state.h): keys bound to the connection that set
// them, tombstoned when it closes; no sockets (FakeOutbox says which peers
// closed their end).
#include <gtest/gtest.h>

#include <set>

#include "ddprun/store/server_state.h"
#include "store/state_harness.h"

namespace ddprun::store {
namespace {

using namespace testing_harness;

class PeerOutbox : public FakeOutbox {
 public:
  bool peerClosed(ConnId id) override { return gone.count(id) > 0; }
  std::set<ConnId> gone;
};

class LeaseTest : public ::testing::Test {
 protected:
  LeaseTest() : state_(ServerLimits{}, outbox_) {
    state_.addLeaseRule({"/job/hb/", "/job/gone/",
                         [this](const std::string& name, ConnEnd how) {
                           ended_.push_back(name);
                           how_.push_back(how);
                         }});
  }
  Client client(ConnId id) { return Client(state_, outbox_, id, Dialect::kV2); }
  bool present(Client& c, const std::string& key) {
    c.send(Command::kCheck, {key});
    return c.reply() == u8(wire::kCheckReady);
  }
  PeerOutbox outbox_;
  ServerState state_;
  std::vector<std::string> ended_;
  std::vector<ConnEnd> how_;
};

TEST_F(LeaseTest, ClosingTheOwnerDeletesTheKeyTombstonesItAndTellsTheRule) {
  auto a = client(1);
  auto b = client(2);
  a.send(Command::kSet, {"/job/hb/node-a"}, {"1 100"});
  a.send(Command::kSet, {"/job/other"}, {"x"});  // no rule: not leased
  EXPECT_TRUE(present(b, "/job/hb/node-a"));
  EXPECT_FALSE(present(b, "/job/gone/node-a"));
  state_.closed(a.id());
  EXPECT_FALSE(present(b, "/job/hb/node-a"));
  EXPECT_TRUE(present(b, "/job/gone/node-a"));
  EXPECT_TRUE(present(b, "/job/other"));
  EXPECT_EQ(ended_, std::vector<std::string>{"node-a"});
}

TEST_F(LeaseTest, AWaiterOnTheTombstoneWakesWhenTheOwnerCloses) {
  auto a = client(1);
  auto b = client(2);
  a.send(Command::kSet, {"/job/hb/n"}, {"1 1"});
  b.send(Command::kWait, {"/job/gone/n"});
  EXPECT_EQ(b.reply(), "");  // blocked
  state_.closed(a.id());
  EXPECT_EQ(b.reply(), u8(wire::kStopWaiting));
}

TEST_F(LeaseTest, TheLastWriterOwnsTheKey) {
  auto a = client(1);
  auto b = client(2);
  auto c = client(3);
  a.send(Command::kSet, {"/job/hb/n"}, {"1 1"});
  b.send(Command::kSet, {"/job/hb/n"}, {"2 2"});  // a reconnected as b
  state_.closed(a.id());
  EXPECT_TRUE(present(c, "/job/hb/n"));
  EXPECT_FALSE(present(c, "/job/gone/n"));
  EXPECT_TRUE(ended_.empty());
  state_.closed(b.id());
  EXPECT_TRUE(present(c, "/job/gone/n"));
  EXPECT_EQ(ended_.size(), 1u);
}

TEST_F(LeaseTest, CompareSetAndMultiSetTakeTheLeaseDeleteEndsIt) {
  auto a = client(1);
  auto b = client(2);
  a.send(Command::kCompareSet, {"/job/hb/cs"}, {"", "v"});
  EXPECT_EQ(a.reply(), bytes("v"));
  a.send(Command::kMultiSet, {"/job/hb/m1", "/job/hb/m2"}, {"1", "2"});
  b.send(Command::kSet, {"/job/hb/del"}, {"x"});
  b.send(Command::kDeleteKey, {"/job/hb/del"});
  EXPECT_EQ(b.reply(), i64(1));
  state_.closed(b.id());  // its only key was deleted explicitly: no tombstone
  EXPECT_TRUE(ended_.empty());
  auto c = client(3);
  EXPECT_FALSE(present(c, "/job/gone/del"));
  state_.closed(a.id());
  EXPECT_TRUE(present(c, "/job/gone/cs"));
  EXPECT_TRUE(present(c, "/job/gone/m1"));
  EXPECT_TRUE(present(c, "/job/gone/m2"));
}

// A reader of a tombstone never sees alive a peer whose end is already
// closed, even before the network layer has read that close.
TEST_F(LeaseTest, ReadingATombstoneFirstAsksWhetherTheOwnerClosedItsEnd) {
  auto a = client(1);
  auto b = client(2);
  a.send(Command::kSet, {"/job/hb/n"}, {"1 1"});
  EXPECT_FALSE(present(b, "/job/gone/n"));  // a's end is open
  outbox_.gone.insert(a.id());               // its FIN arrived, unread
  EXPECT_TRUE(present(b, "/job/gone/n"));
  EXPECT_FALSE(present(b, "/job/hb/n"));
  EXPECT_EQ(ended_.size(), 1u);
  state_.closed(a.id());  // the close itself changes nothing more
  EXPECT_EQ(ended_.size(), 1u);
  EXPECT_TRUE(present(b, "/job/gone/n"));
}

TEST_F(LeaseTest, LeasesAreChargedAndReleased) {
  const size_t before = state_.stats().memoryBytes;
  {
    auto a = client(1);
    a.send(Command::kSet, {"/job/hb/n"}, {"1 1"});
    EXPECT_GT(state_.stats().memoryBytes, before);
    state_.closed(a.id());
  }
  // What stays is the tombstone; a new owner takes it away, and its DELETE
  // frees the rest.
  auto b = client(2);
  b.send(Command::kSet, {"/job/hb/n"}, {"2 2"});
  b.send(Command::kDeleteKey, {"/job/hb/n"});
  EXPECT_EQ(b.reply(), i64(1));
  EXPECT_EQ(state_.stats().memoryBytes, before);
}

// Issue 25: a live node whose heartbeat connection was reset beats again on
// a new one. The tombstone of the old connection must go then, or every
// later failure would "drop" that live node as gone, uncounted, forever.
TEST_F(LeaseTest, ATombstoneGoesWhenANewConnectionOwnsTheKeyAgain) {
  auto a = client(1);
  Client watcher(state_, outbox_, 2, Dialect::kLegacy);  // WATCH_KEY is 1.13's
  auto reader = client(3);
  a.send(Command::kSet, {"/job/hb/n"}, {"1 1"});
  state_.closed(a.id(), 0, ConnEnd::kReset);
  EXPECT_TRUE(present(reader, "/job/gone/n"));
  watcher.send(Command::kWatchKey, {"/job/gone/n"});
  EXPECT_EQ(watcher.reply(), u8(wire::kKeyCallbackRegistered));
  auto again = client(4);
  again.send(Command::kSet, {"/job/hb/n"}, {"2 2"});  // the node beats again
  EXPECT_FALSE(present(reader, "/job/gone/n"));
  EXPECT_TRUE(present(reader, "/job/hb/n"));
  std::string note;
  wire::Writer(note).u8(wire::kKeyDeleted).bytes("/job/gone/n").bytes("reset").bytes("");
  EXPECT_EQ(watcher.reply(), note);
  // A waiter on the tombstone waits for the new connection's end, which
  // tombstones the key again.
  reader.send(Command::kWait, {"/job/gone/n"});
  EXPECT_EQ(reader.reply(), "");
  state_.closed(again.id());
  EXPECT_EQ(reader.reply(), u8(wire::kStopWaiting));
  EXPECT_EQ(ended_, (std::vector<std::string>{"n", "n"}));
}

TEST_F(LeaseTest, ACompareSetThatTakesTheKeyAgainAlsoEndsTheTombstone) {
  auto a = client(1);
  a.send(Command::kSet, {"/job/hb/n"}, {"1"});
  state_.closed(a.id());
  auto b = client(2);
  b.send(Command::kCompareSet, {"/job/hb/n"}, {"", "2"});
  EXPECT_EQ(b.reply(), bytes("2"));
  EXPECT_FALSE(present(b, "/job/gone/n"));
}

// No client may forge, alter or erase a tombstone: each write under the
// tombstone prefix closes its connection, naming the key, and changes
// nothing. Reads are served.
TEST_F(LeaseTest, ClientsCannotWriteUnderTheTombstonePrefix) {
  const std::string k = "/job/gone/n";
  const std::vector<wire::Request> writes = {
      wire::makeRequest(Command::kSet, {k}, {""}),
      wire::makeRequest(Command::kCompareSet, {k}, {"", "x"}),
      wire::makeRequest(Command::kAdd, {k}, {}, 1),
      wire::makeRequest(Command::kAppend, {k}, {"x"}),
      wire::makeRequest(Command::kMultiSet, {"/job/ok", k}, {"1", "2"}),
      wire::makeRequest(Command::kDeleteKey, {k}),
      wire::makeRequest(Command::kQueuePush, {k}, {"x"}),
      wire::makeRequest(Command::kQueuePop, {k}),
      wire::makeRequest(Command::kBarrier, {k}, {}, 2),
  };
  ConnId id = 10;
  for (const auto& w : writes) {
    auto c = client(++id);
    const std::string error = c.send(w);
    EXPECT_NE(error.find("'/job/gone/n' refused"), std::string::npos)
        << wire::commandName(w.cmd) << ": " << error;
    EXPECT_NE(error.find("only the store writes"), std::string::npos) << error;
    state_.closed(c.id());  // what the network layer does with an error
  }
  auto reader = client(++id);
  EXPECT_FALSE(present(reader, k));
  EXPECT_FALSE(present(reader, "/job/ok"));  // nothing of a refused request
  // The store's own tombstone stays: no client can erase it.
  auto a = client(++id);
  a.send(Command::kSet, {"/job/hb/n"}, {"1"});
  state_.closed(a.id());
  auto eraser = client(++id);
  EXPECT_NE(eraser.send(Command::kDeleteKey, {k}), "");
  EXPECT_TRUE(present(reader, k));
  reader.send(Command::kGet, {k});
  EXPECT_EQ(reader.reply(), bytes("closed"));
}

// The tombstone and the rule say how the connection ended: "closed" (its
// process closed it: FIN) or "reset" (the network; the process may beat
// again), so that a reader can tell a death from a blip.
TEST_F(LeaseTest, TheTombstoneSaysHowTheConnectionEnded) {
  auto reader = client(9);
  auto a = client(1);
  a.send(Command::kSet, {"/job/hb/a"}, {"1"});
  state_.closed(a.id(), 0, ConnEnd::kClosed);
  auto b = client(2);
  b.send(Command::kSet, {"/job/hb/b"}, {"1"});
  state_.closed(b.id(), 0, ConnEnd::kReset);
  reader.send(Command::kGet, {"/job/gone/a"});
  EXPECT_EQ(reader.reply(), bytes("closed"));
  reader.send(Command::kGet, {"/job/gone/b"});
  EXPECT_EQ(reader.reply(), bytes("reset"));
  EXPECT_EQ(ended_, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(how_, (std::vector<ConnEnd>{ConnEnd::kClosed, ConnEnd::kReset}));
}

// Without lease rules the prefix means nothing: an ordinary key.
TEST(LeaselessStore, KeysThatLookLikeTombstonesAreOrdinary) {
  FakeOutbox outbox;
  ServerState state(ServerLimits{}, outbox);
  Client c(state, outbox, 1, Dialect::kV2);
  EXPECT_EQ(c.send(Command::kSet, {"/job/gone/n"}, {""}), "");
  c.send(Command::kDeleteKey, {"/job/gone/n"});
  EXPECT_EQ(c.reply(), i64(1));
}

}  // namespace
}  // namespace ddprun::store
