// The authentication exchange (auth.h) on ServerState, byte for byte,
// without sockets: what an unauthenticated connection may do, and that only
// the right proof for its own nonce lets it in.
#include <gtest/gtest.h>

#include "ddprun/store/auth.h"
#include "ddprun/store/server_state.h"
#include "store/state_harness.h"

namespace ddprun::store {
namespace {

using namespace testing_harness;

const std::string kSecret = "correct horse battery staple";
const std::string kNonceKey(auth::kNonceKey);
const std::string kProofKey(auth::kProofKey);
const std::string kVerdictKey(auth::kVerdictKey);

class ServerAuthTest : public ::testing::TestWithParam<Dialect> {
 protected:
  // Nonces are injected: "AAAA...", "BBBB...", one per connection that asks.
  ServerAuthTest()
      : state_(ServerLimits{}, outbox_,
               ServerAuth{kSecret, [this] {
                            return std::string(auth::kNonceBytes,
                                               static_cast<char>('A' + nonces_++));
                          }}) {}
  Client client(ConnId id) { return Client(state_, outbox_, id, GetParam()); }
  // The nonce GET; returns the nonce the connection was given.
  std::string nonce(Client& c) {
    EXPECT_EQ(c.send(Command::kGet, {kNonceKey}), "");
    std::string r = c.reply();
    EXPECT_EQ(r.size(), 8 + auth::kNonceBytes);
    return r.substr(8);
  }
  // A connection that has completed the exchange.
  Client authed(ConnId id) {
    Client c = client(id);
    std::string n = nonce(c);
    EXPECT_EQ(c.send(Command::kSet, {kProofKey}, {auth::clientProof(kSecret, n)}), "");
    EXPECT_TRUE(state_.authenticated(id));
    return c;
  }
  int nonces_ = 0;
  FakeOutbox outbox_;
  ServerState state_;
};

TEST_P(ServerAuthTest, AnyOtherRequestBeforeAuthenticatingClosesTheConnection) {
  auto owner = authed(1);
  auto c = client(2);
  EXPECT_FALSE(state_.authenticated(2));
  std::string err = c.send(Command::kSet, {"/k"}, {"v"});
  EXPECT_NE(err.find("before authenticating"), std::string::npos) << err;
  EXPECT_NE(err.find("SET"), std::string::npos) << err;
  owner.send(Command::kGet, {"/k"});
  EXPECT_EQ(owner.reply(), bytes(""));  // nothing was stored
  auto reader = client(3);
  err = reader.send(Command::kGet, {"/k"});
  EXPECT_NE(err.find("before authenticating"), std::string::npos) << err;
  EXPECT_EQ(outbox_.take(3), "");
}

TEST_P(ServerAuthTest, WrongProofClosesTheConnection) {
  auto c = client(1);
  std::string n = nonce(c);
  std::string err = c.send(Command::kSet, {kProofKey}, {auth::clientProof("wrong", n)});
  EXPECT_NE(err.find("wrong authentication proof"), std::string::npos) << err;
  EXPECT_FALSE(state_.authenticated(1));
}

TEST_P(ServerAuthTest, ProofBeforeTheNonceClosesTheConnection) {
  auto c = client(1);
  std::string err = c.send(Command::kSet, {kProofKey},
                           {auth::clientProof(kSecret, std::string(32, 'A'))});
  EXPECT_NE(err, "");
  EXPECT_FALSE(state_.authenticated(1));
}

TEST_P(ServerAuthTest, RightProofServesAndTheServerProvesItselfInReturn) {
  auto c = authed(1);
  c.send(Command::kGet, {kVerdictKey});
  EXPECT_EQ(c.reply(), bytes(auth::serverProof(kSecret, std::string(32, 'A'))));
  EXPECT_EQ(c.send(Command::kSet, {"/k"}, {std::string(100000, 'v')}), "");
  c.send(Command::kGet, {"/k"});
  EXPECT_EQ(c.reply(), bytes(std::string(100000, 'v')));  // full limits now
}

TEST_P(ServerAuthTest, EachConnectionGetsItsOwnNonceAndOnlyItsProofCounts) {
  auto a = client(1);
  auto b = client(2);
  std::string na = nonce(a);
  std::string nb = nonce(b);
  EXPECT_NE(na, nb);
  EXPECT_EQ(nonce(a), na);  // asking again gives the same one
  std::string err = b.send(Command::kSet, {kProofKey}, {auth::clientProof(kSecret, na)});
  EXPECT_NE(err.find("wrong authentication proof"), std::string::npos) << err;
  EXPECT_EQ(a.send(Command::kSet, {kProofKey}, {auth::clientProof(kSecret, na)}), "");
}

TEST_P(ServerAuthTest, TheExchangeWorksFedOneByteAtATime) {
  Client c = client(1);  // VALIDATE (v2) went whole; the rest byte by byte
  std::string get = encoded(GetParam(), Command::kGet, {kNonceKey});
  for (char ch : get) ASSERT_EQ(state_.receive(1, std::string_view(&ch, 1)), "");
  std::string n = c.reply().substr(8);
  std::string rest =
      encoded(GetParam(), Command::kSet, {kProofKey}, {auth::clientProof(kSecret, n)}) +
      encoded(GetParam(), Command::kGet, {kVerdictKey});
  for (char ch : rest) ASSERT_EQ(state_.receive(1, std::string_view(&ch, 1)), "");
  EXPECT_TRUE(state_.authenticated(1));
  EXPECT_EQ(c.reply(), bytes(auth::serverProof(kSecret, n)));
}

TEST_P(ServerAuthTest, AnUnauthenticatedConnectionHoldsOnlyAFewBytes) {
  [[maybe_unused]] auto c = client(1);
  size_t before = state_.stats().memoryBytes;
  // A SET declaring a 1 MiB value is refused at its length field.
  std::string header = encoded(GetParam(), Command::kSet, {kProofKey}, {"x"});
  header.resize(header.size() - 9);  // up to the value's length
  header += std::string("\x00\x00\x10\x00\x00\x00\x00\x00", 8);
  std::string err = state_.receive(1, header);
  EXPECT_NE(err, "");
  EXPECT_LT(state_.stats().memoryBytes - before, 512u);
  // So is a long key, before its bytes arrive.
  [[maybe_unused]] auto d = client(2);
  std::string longKey = encoded(GetParam(), Command::kGet, {std::string(1000, 'k')});
  EXPECT_NE(state_.receive(2, longKey.substr(0, 9)), "");
}

TEST_P(ServerAuthTest, TooManyRequestsBeforeAuthenticatingCloseTheConnection) {
  auto c = client(1);
  std::string err;
  for (int i = 0; i < 20 && err.empty(); ++i) err = c.send(Command::kGet, {kNonceKey});
  EXPECT_NE(err.find("before authenticating"), std::string::npos) << err;
}

INSTANTIATE_TEST_SUITE_P(BothDialects, ServerAuthTest,
                         ::testing::Values(Dialect::kLegacy, Dialect::kV2));

TEST(ServerAuthOpen, AnOpenServerAnswersTheNonceWithAnEmptyValue) {
  FakeOutbox o;
  ServerState s(ServerLimits{}, o);
  Client c(s, o, 1, Dialect::kV2);
  EXPECT_TRUE(s.authenticated(1));
  c.send(Command::kGet, {kNonceKey});
  EXPECT_EQ(c.reply(), bytes(""));
}

TEST(AuthProofs, DependOnSecretNonceAndDirection) {
  std::string n(32, 'n');
  EXPECT_EQ(auth::clientProof("s", n).size(), auth::kProofBytes);
  EXPECT_EQ(auth::clientProof("s", n), auth::clientProof("s", n));
  EXPECT_NE(auth::clientProof("s", n), auth::clientProof("t", n));
  EXPECT_NE(auth::clientProof("s", n), auth::clientProof("s", std::string(32, 'm')));
  EXPECT_NE(auth::clientProof("s", n), auth::serverProof("s", n));
  EXPECT_TRUE(auth::proofEquals("abc", "abc"));
  EXPECT_FALSE(auth::proofEquals("abc", "abd"));
  EXPECT_FALSE(auth::proofEquals("abc", "abcd"));
  EXPECT_NE(auth::newNonce(), auth::newNonce());
}

}  // namespace
}  // namespace ddprun::store
