// TcpStore client against TcpStoreServer over real sockets.
//
// No sleeps as synchronisation: a test waits for a condition it can observe
// (the server's request counter, its live connections, a connection accepted
// on a listener of its own) with a generous deadline against hangs. Ports are
// chosen by the kernel (port 0) or held for the test's whole life by a bound
// socket, never bound, closed and reused by number. Durations are asserted
// only from below, where the contract is "not before the timeout".
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <thread>

#include "ddprun/common/error.h"
#include "ddprun/store/prefix_store.h"
#include "ddprun/store/tcp_store.h"
#include "ddprun/store/tcp_store_server.h"

namespace ddprun::store {
namespace {

using namespace std::chrono_literals;

// How long a test waits for something that takes milliseconds when all is
// well: a bound against hangs on a loaded machine, never a timing assertion.
constexpr auto kPatience = 30s;

// True as soon as cond() holds; false if it still does not after kPatience.
bool waitUntil(const std::function<bool()>& cond) {
  auto end = std::chrono::steady_clock::now() + kPatience;
  while (!cond()) {
    if (std::chrono::steady_clock::now() >= end) return cond();
    std::this_thread::sleep_for(1ms);  // polling interval, not synchronisation
  }
  return true;
}

// Every server test runs with busy polling on (the default) and off.
class TcpStoreTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    TcpStoreServerOptions opts;
    opts.busyPoll = std::chrono::microseconds(GetParam());
    opts.limits.wire.maxValueBytes = 1 << 20;
    server_ = TcpStoreServer::start(opts);
  }
  std::unique_ptr<TcpStore> client(ClientDialect d = ClientDialect::kAuto,
                                   std::string host = "127.0.0.1") {
    TcpStoreOptions o;
    o.host = host;
    o.port = server_->port();
    o.timeout = 10s;
    o.connectTimeout = 5s;
    o.dialect = d;
    return TcpStore::connect(o);
  }
  std::unique_ptr<TcpStoreServer> server_;
};

TEST_P(TcpStoreTest, EveryCommandRoundTrips) {
  auto s = client();
  EXPECT_EQ(s->dialect(), wire::Dialect::kV2);
  std::string bin("\0\xff\0", 3);
  s->set("bin", bin);
  EXPECT_EQ(s->get("bin"), bin);
  s->set("empty", "");
  EXPECT_EQ(s->get("empty"), "");
  EXPECT_EQ(s->add("n", 5), 5);
  EXPECT_EQ(s->add("n", -2), 3);
  EXPECT_EQ(s->get("n"), "3");
  EXPECT_EQ(s->compareSet("cas", "x", "y"), "x");
  EXPECT_EQ(s->compareSet("cas", "", "y"), "y");
  EXPECT_EQ(s->compareSet("cas", "y", "z"), "z");
  EXPECT_TRUE(s->check({"bin", "n"}));
  EXPECT_FALSE(s->check({"bin", "nope"}));
  EXPECT_TRUE(s->deleteKey("empty"));
  EXPECT_FALSE(s->deleteKey("empty"));
  EXPECT_EQ(s->numKeys(), 3);
  s->append("log", "a");
  s->append("log", "bc");
  EXPECT_EQ(s->get("log"), "abc");
  s->multiSet({"m1", "m2"}, {"1", "2"});
  EXPECT_EQ(s->multiGet({"m2", "m1"}), (std::vector<std::string>{"2", "1"}));
  EXPECT_EQ(s->ping(77), 77u);
  auto keys = s->listKeys();
  EXPECT_EQ(keys.size(), 6u);
  s->queuePush("q", "first");
  s->queuePush("q", "second");
  EXPECT_EQ(s->queueLen("q"), 2);
  EXPECT_EQ(s->queuePop("q", 1s), "first");
  EXPECT_EQ(s->queuePop("q", 1s), "second");
  EXPECT_EQ(s->queueLen("q"), 0);
}

TEST_P(TcpStoreTest, WaitTimeoutLeavesConnectionUsable) {
  for (auto d : {ClientDialect::kV2, ClientDialect::kLegacy}) {
    auto s = client(d);
    auto t0 = std::chrono::steady_clock::now();
    try {
      s->wait({"never"}, 200ms);
      FAIL() << "wait did not time out";
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find("/never"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("200 ms"), std::string::npos) << e.what();
    }
    // Not before its timeout (a lower bound: load can only lengthen it).
    EXPECT_GE(std::chrono::steady_clock::now() - t0, 200ms);
    s->set("after", "ok");
    EXPECT_EQ(s->get("after"), "ok");
    EXPECT_EQ(s->add("after-n", 1), d == ClientDialect::kV2 ? 1 : 2);
  }
}

TEST_P(TcpStoreTest, GetBlocksUntilAnotherClientSets) {
  auto a = client();
  // Requests one client's connect costs (its handshake), measured: the least
  // of three connects, each followed by a round trip so that all of it is
  // counted (the server counts a request before it replies to a later one).
  // A slow machine sometimes adds a request to a connect; the least keeps
  // the target below what four waiters' connects and WAITs really send.
  a->set("sync", "a");
  uint64_t handshake = UINT64_MAX;
  std::vector<std::unique_ptr<TcpStore>> measured;
  for (int i = 0; i < 3; ++i) {
    uint64_t before = server_->stats().requests;
    measured.push_back(client());
    measured.back()->set("sync", "b");
    handshake = std::min<uint64_t>(handshake, server_->stats().requests - before - 1);
  }
  uint64_t start = server_->stats().requests;
  auto waiters = std::vector<std::future<std::string>>();
  for (int i = 0; i < 4; ++i)
    waiters.push_back(std::async(std::launch::async, [this] {
      auto c = client();
      return c->get("late");
    }));
  // get() is WAIT then GET: once the server has served every waiter's
  // handshake and WAIT, all four are registered and blocked.
  ASSERT_TRUE(waitUntil([&] { return server_->stats().requests >= start + 4 * (handshake + 1); }))
      << "the waiters' WAITs did not reach the server: " << server_->stats().requests - start
      << " requests of " << 4 * (handshake + 1) << " expected (a connect costs " << handshake
      << ")";
  for (auto& w : waiters) EXPECT_EQ(w.wait_for(0s), std::future_status::timeout);
  a->set("late", "value");
  for (auto& w : waiters) EXPECT_EQ(w.get(), "value");
}

TEST_P(TcpStoreTest, BarrierReleasesAllArrivals) {
  std::vector<std::future<void>> f;
  for (int i = 0; i < 3; ++i)
    f.push_back(std::async(std::launch::async, [this] { client()->barrier("b", 3, 5s); }));
  for (auto& x : f) x.get();
  auto s = client();
  EXPECT_THROW(s->barrier("lonely", 2, 100ms), TimeoutError);
  EXPECT_EQ(s->ping(1), 1u);  // still in step after the cancelled barrier
}

TEST_P(TcpStoreTest, LegacyDialectClientWorks) {
  auto s = client(ClientDialect::kLegacy);
  EXPECT_EQ(s->dialect(), wire::Dialect::kLegacy);
  s->set("k", "v");
  EXPECT_EQ(s->get("k"), "v");
  s->multiSet({"a", "b"}, {"1", "2"});
  EXPECT_EQ(s->multiGet({"a", "b"}), (std::vector<std::string>{"1", "2"}));
  EXPECT_THROW(s->append("k", "x"), InvalidArgument);
}

TEST_P(TcpStoreTest, IPv6LoopbackReachesDualStackServer) {
  if (server_->address().find('[') == std::string::npos)
    GTEST_SKIP() << "IPv6 unavailable here: server bound " << server_->address();
  auto s = client(ClientDialect::kAuto, "::1");
  s->set("v6", "yes");
  EXPECT_EQ(client()->get("v6"), "yes");
}

TEST_P(TcpStoreTest, PrefixStoreOverTcp) {
  auto base = std::shared_ptr<TcpStore>(client());
  PrefixStore p("/worker/attempt_1", base);
  p.set("x", "1");
  EXPECT_TRUE(base->check({"/worker/attempt_1/x"}));
  EXPECT_EQ(p.get("x"), "1");
}

// Sends raw bytes on a fresh socket; returns true if the server closed it.
bool serverClosesAfter(uint16_t port, const std::string& bytes) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return false;
  ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char c;
  ssize_t n = ::recv(fd, &c, 1, 0);
  ::close(fd);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

TEST_P(TcpStoreTest, BadRequestsCloseOnlyTheirConnection) {
  auto good = client();
  good->set("before", "1");
  EXPECT_TRUE(serverClosesAfter(server_->port(), "\xEE\xEE\xEE"));
  std::string huge("\x01\x02\0\0\0\0\0\0\0/k", 11);
  huge += std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8);  // value length 2^63
  EXPECT_TRUE(serverClosesAfter(server_->port(), std::string("\0\xCE\xF7\x85\x3C", 5) + huge));
  EXPECT_EQ(good->get("before"), "1");
  EXPECT_EQ(server_->stats().connectionsRejected, 2u);
}

TEST_P(TcpStoreTest, ValueOverLimitFailsThatClientOnly) {
  auto s = client();
  EXPECT_THROW(s->set("big", std::string(2 << 20, 'x')); s->numKeys(), IoError);
  // The client reconnects on its next call; the server still serves.
  s->set("small", "ok");
  EXPECT_EQ(s->get("small"), "ok");
}

INSTANTIATE_TEST_SUITE_P(BusyPoll, TcpStoreTest, ::testing::Values(100, 0),
                         [](const auto& info) {
                           return "busyPoll" + std::to_string(info.param) + "us";
                         });

// A socket on 127.0.0.1 with SO_REUSEADDR, closed on destruction.
class LoopbackSocket {
 public:
  explicit LoopbackSocket(uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    socklen_t len = sizeof addr;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~LoopbackSocket() { ::close(fd_); }
  LoopbackSocket(const LoopbackSocket&) = delete;
  LoopbackSocket& operator=(const LoopbackSocket&) = delete;
  bool ok() const { return ok_; }
  uint16_t port() const { return port_; }
  int fd() const { return fd_; }

 private:
  int fd_;
  bool ok_ = false;
  uint16_t port_ = 0;
};

// A port nobody listens on, given to nobody else while held: bound to port
// 0, never listened on (a connect is refused). Servers that set SO_REUSEADDR
// (ours) can still listen on it. Nothing can take it between the test's steps,
// as it could between closing a port and reusing its number.
using HeldPort = LoopbackSocket;

TEST(TcpStoreConnect, UnreachableServerTimesOutNamingTheAddress) {
  HeldPort held(0);
  ASSERT_TRUE(held.ok());
  uint16_t port = held.port();
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.connectTimeout = 600ms;
  auto t0 = std::chrono::steady_clock::now();
  try {
    TcpStore::connect(o);
    FAIL() << "connected to a closed port";
  } catch (const TimeoutError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << msg;
    EXPECT_NE(msg.find("Connection refused"), std::string::npos) << msg;
  }
  // It kept retrying until its connect timeout (a lower bound only).
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 550ms);
}

TEST(TcpStoreConnect, ClientWaitsForALateServer) {
  HeldPort held(0);
  ASSERT_TRUE(held.ok());
  uint16_t port = held.port();
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.connectTimeout = kPatience;
  o.backoff.initial = Millis(20);
  o.dialect = ClientDialect::kV2;  // one handshake: a hang-up means "retry"
  auto fut = std::async(std::launch::async, [&] { return TcpStore::connect(o); });
  {
    // Not yet a store: a listener that hangs up on the client's first
    // attempt, which proves the client is in its retry loop before the
    // server exists.
    LoopbackSocket early(port);
    ASSERT_TRUE(early.ok());
    ASSERT_EQ(::listen(early.fd(), 8), 0);
    pollfd p{early.fd(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, static_cast<int>(kPatience / 1ms)), 1) << "the client never tried";
    ::close(::accept(early.fd(), nullptr, nullptr));
  }
  auto server = TcpStoreServer::start({"127.0.0.1", port, {}});
  auto s = fut.get();
  s->set("k", "v");
  EXPECT_EQ(s->get("k"), "v");
}

// A legacy connection has no CANCEL_WAIT: a timed-out wait reconnects, and
// the new connection must authenticate again or its next request is refused.
TEST(TcpStoreAuth, EveryReconnectAuthenticatesAgain) {
  TcpStoreServerOptions opts;
  opts.authToken = "reconnect-secret";
  auto server = TcpStoreServer::start(opts);
  TcpStoreOptions o;
  o.port = server->port();
  o.dialect = ClientDialect::kLegacy;
  o.authToken = opts.authToken;
  auto s = TcpStore::connect(o);
  EXPECT_TRUE(s->authenticated());
  EXPECT_THROW(s->wait({"never"}, 50ms), TimeoutError);  // drops the connection
  s->set("k", "v");
  EXPECT_EQ(s->get("k"), "v");
  EXPECT_TRUE(s->authenticated());
  EXPECT_EQ(server->stats().connectionsRejected, 0u);
}

TEST(TcpStoreServerBind, PortInUseNamesTheAddressAndHolder) {
  auto first = TcpStoreServer::start({"", 0, {}});
  try {
    TcpStoreServer::start({"", first->port(), {}});
    FAIL() << "second bind succeeded";
  } catch (const IoError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(std::to_string(first->port())), std::string::npos) << msg;
    EXPECT_NE(msg.find("in use"), std::string::npos) << msg;
    EXPECT_NE(msg.find("pid " + std::to_string(::getpid())), std::string::npos) << msg;
  }
}

TEST(TcpStoreServerBind, ConnectionLimitRefusesExtraClients) {
  TcpStoreServerOptions opts;
  opts.host = "127.0.0.1";
  opts.limits.maxConnections = 2;
  auto server = TcpStoreServer::start(opts);
  TcpStoreOptions o;
  o.port = server->port();
  o.connectTimeout = 700ms;
  auto a = TcpStore::connect(o);
  auto b = TcpStore::connect(o);
  EXPECT_THROW(TcpStore::connect(o), TimeoutError);
  a.reset();
  // A slot frees when a client leaves.
  ASSERT_TRUE(waitUntil([&] { return server->connections() <= 1; }))
      << server->connections() << " connections still counted";
  o.connectTimeout = kPatience;
  EXPECT_NO_THROW(TcpStore::connect(o));
}

}  // namespace
}  // namespace ddprun::store
