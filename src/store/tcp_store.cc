#include "ddprun/store/tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "ddprun/common/error.h"
#include "ddprun/common/log.h"
#include "ddprun/common/net.h"
#include "ddprun/store/auth.h"

namespace ddprun::store {

using wire::Command;

// One TCP connection with deadline-bounded blocking I/O. With a cancel token
// its socket is shut down on cancel(), which ends a blocked poll or recv at
// once (the caller then sees EOF or an error and checks the token). The
// callback is removed before the descriptor is closed, so it can never shut
// down a descriptor number reused by someone else.
class TcpStore::Conn {
 public:
  Conn(int fd, std::string addr, std::shared_ptr<CancelToken> cancel)
      : fd_(fd), addr_(std::move(addr)), cancel_(std::move(cancel)) {
    if (cancel_) subscription_ = cancel_->subscribe([fd] { ::shutdown(fd, SHUT_RDWR); });
  }
  ~Conn() {
    if (cancel_) cancel_->unsubscribe(subscription_);
    ::close(fd_);
  }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // Connects to the first address of host:port that accepts. Returns nullptr
  // and sets `err` on failure; never throws for network errors.
  static std::unique_ptr<Conn> open(const std::string& host, uint16_t port,
                                    Deadline deadline, std::string& err,
                                    const std::shared_ptr<CancelToken>& cancel) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (rc != 0) {
      err = std::string("cannot resolve host '") + host + "': " + gai_strerror(rc);
      return nullptr;
    }
    std::unique_ptr<Conn> conn;
    for (addrinfo* ai = res; ai != nullptr && !conn; ai = ai->ai_next)
      conn = tryOne(ai, deadline, err, cancel);
    freeaddrinfo(res);
    if (conn) conn->addr_ = net::formatHostPort(host, port);
    return conn;
  }

  // Sends all bytes or throws IoError. `anySent` (if given) becomes true
  // once a byte has left: the server may have the request.
  void sendAll(std::string_view data, bool* anySent = nullptr) {
    while (!data.empty()) {
      ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        DDPRUN_THROW(IoError, "sending to the store at ", addr_, " failed: ",
                     std::strerror(errno));
      if (n > 0 && anySent) *anySent = true;
      data.remove_prefix(static_cast<size_t>(n));
    }
  }

  // Before a request, when no reply is due: a connection with something to
  // read has been closed or reset by the peer (or carries bytes nobody asked
  // for): IoError, with nothing sent.
  void checkOpen() {
    pollfd p{fd_, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) <= 0) return;
    char byte;
    ssize_t n = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) {
      closedByPeer_ = true;
      DDPRUN_THROW(IoError, "the store at ", addr_, " closed the connection");
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n < 0)
      DDPRUN_THROW(IoError, "the connection to the store at ", addr_,
                   " failed: ", std::strerror(errno));
    broken_ = true;
    DDPRUN_THROW(IoError, "the store at ", addr_, " sent bytes no request asked for");
  }

  // Waits until readable. Returns false on timeout.
  bool waitReadable(Millis timeout) {
    Deadline d(timeout);
    for (;;) {
      pollfd p{fd_, POLLIN, 0};
      // Round up so that poll never returns before the deadline.
      int ms = static_cast<int>(std::min<int64_t>(d.remaining().count() + 1, INT32_MAX));
      int rc = ::poll(&p, 1, ms);
      if (rc > 0) return true;
      if (rc == 0 && d.expired()) return false;
      if (rc == 0) continue;
      if (errno != EINTR)
        DDPRUN_THROW(IoError, "poll on the store connection to ", addr_,
                     " failed: ", std::strerror(errno));
    }
  }

  // Reads exactly n bytes before the deadline.
  void readExact(void* dst, size_t n, Deadline deadline, const char* what) {
    auto* p = static_cast<char*>(dst);
    while (n > 0) {
      if (!waitReadable(deadline.remaining())) {
        broken_ = true;  // a reply may still arrive: this stream is out of step
        DDPRUN_THROW(TimeoutError, "no reply from the store at ", addr_, " to ", what);
      }
      ssize_t got = ::recv(fd_, p, n, 0);
      if (got < 0 && errno == EINTR) continue;
      if (got == 0) {
        closedByPeer_ = true;
        DDPRUN_THROW(IoError, "the store at ", addr_,
                     " closed the connection during ", what);
      }
      if (got < 0)
        DDPRUN_THROW(IoError, "reading from the store at ", addr_, " failed: ",
                     std::strerror(errno));
      p += got;
      n -= static_cast<size_t>(got);
    }
  }
  // Reads one reply to `c` (decoded by wire::ReplyParser), never a byte
  // past it: the parser says how many bytes it still needs.
  wire::Reply readReply(Command c, Deadline d, const char* what, size_t expected = 0) {
    wire::ReplyParser parser(c, expected);
    std::string chunk;
    while (true) {
      auto res = parser.feed(chunk);
      if (res.status == wire::ParseStatus::kOk) {
        ++replies_;
        return std::move(parser.reply());
      }
      if (res.status == wire::ParseStatus::kBad)
        DDPRUN_THROW(ProtocolError, "the store at ", addr_, " sent a bad ", what,
                     " reply (", res.error, ")");
      chunk.resize(std::min<size_t>(parser.wanted(), 1 << 20));
      readExact(chunk.data(), chunk.size(), d, what);
    }
  }
  const std::string& addr() const { return addr_; }
  bool broken() const { return broken_; }
  // The peer closed its end (EOF), as a server does when it refuses a client.
  bool closedByPeer() const { return closedByPeer_; }
  uint64_t replies() const { return replies_; }
  // The numeric IP this end of the connection is bound to ("" if unknown).
  std::string localIp() const { return localEnd(false); }
  // "ip:port" of this end ("" if unknown).
  std::string localEnd(bool withPort = true) const {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "";
    char host[NI_MAXHOST];
    char serv[NI_MAXSERV];
    if (::getnameinfo(reinterpret_cast<sockaddr*>(&a), len, host, sizeof host, serv,
                      sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) != 0)
      return "";
    return withPort ? net::formatHostPort(host, static_cast<uint16_t>(std::stoi(serv)))
                    : std::string(host);
  }

 private:
  // The Conn owns the descriptor from the start, so that cancel() can also
  // end a connect still in progress (shutdown of a connecting socket wakes
  // the poll).
  static std::unique_ptr<Conn> tryOne(addrinfo* ai, Deadline deadline, std::string& err,
                                      const std::shared_ptr<CancelToken>& cancel) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      err = std::strerror(errno);
      return nullptr;
    }
    auto conn = std::make_unique<Conn>(fd, "", cancel);
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = ::poll(&p, 1, static_cast<int>(deadline.remaining().count()));
      if (rc == 0) {
        err = "connect timed out";
        return nullptr;
      }
      int soerr = 0;
      socklen_t len = sizeof soerr;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
      errno = soerr;
      rc = soerr == 0 ? 0 : -1;
    }
    if (cancel && cancel->cancelled()) {
      err = "cancelled";
      return nullptr;
    }
    if (rc != 0) {
      err = std::strerror(errno);
      return nullptr;
    }
    fcntl(fd, F_SETFL, flags);
    net::setNoDelay(fd);
    return conn;
  }

  int fd_;
  std::string addr_;
  std::shared_ptr<CancelToken> cancel_;
  CancelToken::Id subscription_ = 0;
  bool broken_ = false;
  bool closedByPeer_ = false;
  uint64_t replies_ = 0;
};

void CancelToken::cancel() {
  std::lock_guard lock(mu_);
  if (cancelled_) return;
  cancelled_ = true;
  for (auto& [id, fn] : callbacks_) fn();
  cv_.notify_all();
}

bool CancelToken::cancelled() const { return cancelled_.load(); }

CancelToken::Id CancelToken::subscribe(std::function<void()> fn) {
  std::lock_guard lock(mu_);
  if (cancelled_) fn();
  Id id = nextId_++;
  callbacks_.emplace(id, std::move(fn));
  return id;
}

void CancelToken::unsubscribe(Id id) {
  std::lock_guard lock(mu_);
  callbacks_.erase(id);
}

bool CancelToken::sleepFor(Millis d) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, d, [this] { return cancelled_.load(); });
}

namespace {
// Every public key goes on the wire with a leading "/", as PyTorch does.
std::string wireKey(const std::string& key) { return "/" + key; }
std::vector<std::string> wireKeys(const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(wireKey(k));
  return out;
}
std::string joinKeys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) s += (i ? ", " : "") + keys[i];
  if (keys.size() > 8) s += ", ... (" + std::to_string(keys.size()) + " keys)";
  return "[" + s + "]";
}
using wire::makeRequest;
// Requests without a u32 field.
wire::Request request(Command c, std::vector<std::string> keys = {},
                      std::vector<std::string> values = {}, int64_t number = 0) {
  return makeRequest(c, std::move(keys), std::move(values), number);
}
}  // namespace

TcpStore::TcpStore(TcpStoreOptions opts)
    : opts_(std::move(opts)), policy_(opts_.reconnect) {
  timeout_ = opts_.timeout;
}
TcpStore::~TcpStore() = default;

std::string TcpStore::address() const {
  return net::formatHostPort(opts_.host, opts_.port);
}

std::unique_ptr<TcpStore> TcpStore::connect(const TcpStoreOptions& opts) {
  std::unique_ptr<TcpStore> s(new TcpStore(opts));
  s->connectAndHandshake(Deadline(opts.connectTimeout));
  return s;
}

void TcpStore::connectAndHandshake(Deadline deadline) {
  Backoff backoff(opts_.backoff);
  std::string lastErr = "no attempt made";
  // Handshakes to try in order when the dialect is not fixed: a server of
  // the other dialect hangs up on the first, and we move to the next.
  std::vector<wire::Dialect> order;
  if (opts_.dialect != ClientDialect::kLegacy) order.push_back(wire::Dialect::kV2);
  if (opts_.dialect != ClientDialect::kV2) order.push_back(wire::Dialect::kLegacy);
  size_t next = 0;
  bool connected = false;
  while (!deadline.expired()) {
    if (cancelled()) throwCancelled("connecting");
    conn_ = Conn::open(opts_.host, opts_.port, deadline, lastErr, opts_.cancel);
    if (conn_) {
      dialect_ = order[next];
      try {
        std::string hello;
        wire::Request probe;
        if (dialect_ == wire::Dialect::kV2) {
          probe.cmd = Command::kValidate;
          probe.u32 = wire::kValidationMagic;
          wire::encodeRequest(dialect_, probe, hello);
          probe.cmd = Command::kPing;
          probe.u32 = static_cast<uint32_t>(::getpid());
          wire::encodeRequest(dialect_, probe, hello);
          conn_->sendAll(hello);
          auto echo =
              conn_->readReply(Command::kPing, deadline, "the PING handshake").u32;
          if (echo != probe.u32)
            DDPRUN_THROW(ProtocolError, "the store at ", address(),
                         " echoed PING ", echo, " instead of ", probe.u32);
        } else if (opts_.authToken.empty()) {
          // With a token the nonce GET is the legacy probe instead: a
          // server that requires a token refuses anything else before it.
          probe.cmd = Command::kGetNumKeys;
          wire::encodeRequest(dialect_, probe, hello);
          conn_->sendAll(hello);
          conn_->readReply(Command::kGetNumKeys, deadline, "the legacy handshake");
        }
        if (!opts_.authToken.empty()) authenticate(deadline);
        handshakeReplies_ = conn_->replies();
        connected = true;
        break;
      } catch (const IoError& e) {
        // Hung up on our handshake: a server of another dialect.
        lastErr = e.message();
        conn_.reset();
        if (next + 1 < order.size()) {
          ++next;
          continue;
        }
        next = 0;
      } catch (const TimeoutError& e) {
        lastErr = e.message();
        conn_.reset();
        break;
      }
    }
    auto delay = std::min(backoff.next(), deadline.remaining());
    if (!opts_.cancel)
      std::this_thread::sleep_for(delay);
    else if (opts_.cancel->sleepFor(delay))
      throwCancelled("connecting");
  }
  if (connected) {
    DDPRUN_DEBUG("store: ", opts_.name, " client ", conn_->localEnd(), " connected to ",
                 address(), policy_.inOutage() ? " again" : "");
    reown();  // outside the dialect fallback: an IoError here is a broken connection
    return;
  }
  if (cancelled()) throwCancelled("connecting");
  DDPRUN_THROW(TimeoutError, "could not connect to the store at ", address(),
               " within ", opts_.connectTimeout.count(), " ms (last error: ",
               lastErr,
               "); check that the server is running and that host and port are "
               "right");
}

// The client's half of the exchange in auth.h. The nonce GET, proof SET and
// verdict GET are pipelined after the nonce arrives. An IoError before the
// nonce (a server of the other dialect hanging up) is left to the caller's
// dialect fallback; after it, a closed connection means a refused token.
void TcpStore::authenticate(Deadline deadline) {
  std::string out;
  wire::encodeRequest(dialect_, request(Command::kGet, {std::string(auth::kNonceKey)}),
                      out);
  conn_->sendAll(out);
  std::string nonce = std::move(
      conn_->readReply(Command::kGet, deadline, "the authentication nonce").values[0]);
  authenticated_ = false;
  if (nonce.empty()) {
    if (!opts_.allowOpenServer) {
      conn_.reset();
      DDPRUN_THROW(auth::AuthError, "the store at ", address(),
                   " requires no token, so it cannot prove that it is the job's store "
                   "(anyone could pose as it): refusing to send this job's requests "
                   "there. Give the store the same secret (ddprun-store --token-file "
                   "PATH), or, to use a store without authentication anyway, set ",
                   auth::kAllowOpenEnv, "=1");
    }
    if (!warnedOpen_)
      DDPRUN_WARN("the store at ", address(),
                  " requires no token: this client's token "
                  "is not checked, and anyone who can reach the store can use it");
    warnedOpen_ = true;
    return;
  }
  if (nonce.size() != auth::kNonceBytes) {
    conn_.reset();
    DDPRUN_THROW(ProtocolError, "the store at ", address(), " sent a ", nonce.size(),
                 "-byte authentication nonce (expected ", auth::kNonceBytes, ")");
  }
  out.clear();
  wire::encodeRequest(dialect_,
                      request(Command::kSet, {std::string(auth::kProofKey)},
                              {auth::clientProof(opts_.authToken, nonce)}),
                      out);
  wire::encodeRequest(dialect_, request(Command::kGet, {std::string(auth::kVerdictKey)}),
                      out);
  std::string verdict;
  try {
    conn_->sendAll(out);
    verdict = std::move(
        conn_->readReply(Command::kGet, deadline, "the authentication proof").values[0]);
  } catch (const IoError&) {
    conn_.reset();
    DDPRUN_THROW(auth::AuthError, "the store at ", address(),
                 " refused this client's token (it closed the connection on the proof); "
                 "give every node and the store the same secret (ddprun --rdzv-conf "
                 "token_file=PATH, ddprun-store --token-file PATH, or $",
                 auth::kTokenEnv, ")");
  }
  if (!auth::proofEquals(verdict, auth::serverProof(opts_.authToken, nonce))) {
    conn_.reset();
    DDPRUN_THROW(auth::AuthError, "the store at ", address(),
                 " accepted this client's token but could not prove it knows the secret "
                 "itself: is it the store you meant to reach?");
  }
  authenticated_ = true;
}

void TcpStore::ensureConnected() {
  if (conn_) return;
  if (policy_.inOutage())
    reconnect();
  else
    connectAndHandshake(Deadline(opts_.connectTimeout));
}

// Within an outage: connect attempts until the budget's end. Failing, the
// store has been unreachable for the whole budget: an IoError.
void TcpStore::reconnect() {
  try {
    connectAndHandshake(Deadline(std::chrono::duration_cast<Millis>(
        policy_.outageEnd() - Clock::now())));
  } catch (const TimeoutError& e) {
    DDPRUN_THROW(IoError, "the connection to the store at ", address(), " broke (",
                 outageCause_, ") and no new one could be made within ",
                 policy_.options().budget.count(), " ms (", e.message(), ")");
  }
}

// The owned keys go first on a new connection, pipelined (SET has no reply):
// the server binds each to this connection before it reads anything else.
// Runs at the first connect too (nothing owned yet then).
void TcpStore::reown() {
  if (owned_.empty()) return;
  std::string out;
  for (const auto& [key, value] : owned_)
    wire::encodeRequest(dialect_, request(Command::kSet, {wireKey(key)}, {value}), out);
  conn_->sendAll(out);
  DDPRUN_DEBUG("store: ", opts_.name, " client set its ", owned_.size(),
               " own key(s) again on its new connection");
}

void TcpStore::sleepOrCancel(Millis d) {
  if (!opts_.cancel)
    std::this_thread::sleep_for(d);
  else if (opts_.cancel->sleepFor(d))
    throwCancelled("reconnecting");
}

// A request found its connection broken (IoError). Called from the catch
// block: with no retry left, the error is rethrown (or one saying how long
// the store was out of reach); else this pauses and the caller tries again.
// A client without a token whose fresh connection the server closed at its
// first request may be talking to a store that requires one: asked, it says.
void TcpStore::afterBroken(Replay replay, const IoError& e) {
  const bool refusedFresh =
      conn_ && conn_->closedByPeer() && conn_->replies() == handshakeReplies_;
  conn_.reset();
  if (cancelled()) throwCancelled("a store request");
  if (refusedFresh && opts_.authToken.empty() && requiresToken())
    DDPRUN_THROW(auth::AuthError, "the store at ", address(),
                 " requires a token and this client has none (it closed the connection "
                 "at the first request); give every node the store's secret: ddprun "
                 "--rdzv-conf token_file=PATH (a file of mode 0600), or $",
                 auth::kTokenEnv);
  if (!policy_.inOutage()) outageCause_ = e.message();
  switch (policy_.onBroken(replay, sent_, Clock::now())) {
    case ReconnectPolicy::Verdict::kRetry:
      break;
    case ReconnectPolicy::Verdict::kNotReplayable:
      policy_.onSuccess();  // this call ends here; the next starts afresh
      DDPRUN_THROW(IoError, e.message(),
                   " (the request was not sent again: it may have been applied, and "
                   "applying it twice would count twice)");
    case ReconnectPolicy::Verdict::kOutOfTime:
      if (policy_.options().budget.count() <= 0) {
        policy_.onSuccess();
        throw;
      }
      policy_.onSuccess();
      DDPRUN_THROW(IoError, "the connection to the store at ", address(), " broke (",
                   outageCause_, ") and it could not be reached again within ",
                   policy_.options().budget.count(), " ms (last error: ", e.message(), ")");
  }
  DDPRUN_DEBUG("store: ", opts_.name, " connection to ", address(), " broke (",
               e.message(), "); reconnecting");
  sleepOrCancel(policy_.pause(Clock::now()));
}

// Asks a fresh connection for the authentication nonce: a store that
// requires a token sends one (an open ddprun store an empty value). Only on
// the rare path above: a PyTorch server may keep the key it was asked for.
bool TcpStore::requiresToken() {
  try {
    connectAndHandshake(Deadline(std::min(opts_.connectTimeout, timeout_)));
    send(request(Command::kGet, {std::string(auth::kNonceKey)}));
    auto nonce = conn_->readReply(Command::kGet, Deadline(timeout_), "the nonce probe");
    conn_.reset();
    return nonce.values[0].size() == auth::kNonceBytes;
  } catch (const Error&) {
    conn_.reset();
    return false;
  }
}

void TcpStore::throwCancelled(const char* what) const {
  DDPRUN_THROW(CancelledError, what, " (store at ", address(), ") was cancelled");
}

// A cancelled token shuts the socket down, so the interrupted call fails with
// whatever error the dead socket gives: each is turned into CancelledError.
template <typename F>
auto TcpStore::locked(Replay replay, F&& f) {
  std::lock_guard<std::mutex> lock(mu_);
  sent_ = false;
  for (;;) {
    if (cancelled()) throwCancelled("a store request");
    try {
      return attempt(f);
    } catch (const IoError& e) {
      afterBroken(replay, e);  // rethrows, or pauses before the next try
    }
  }
}

// One try of a call: connects if needed (reconnecting within an outage),
// then runs the call on the connection.
template <typename F>
auto TcpStore::attempt(F& f) {
  ensureConnected();
  try {
    conn_->checkOpen();
    auto result = f(*conn_);
    policy_.onSuccess();
    return result;
  } catch (const IoError&) {
    throw;  // afterBroken() decides
  } catch (const ProtocolError&) {
    conn_.reset();
    if (cancelled()) throwCancelled("a store request");
    throw;
  } catch (const TimeoutError&) {
    if (conn_ && conn_->broken()) conn_.reset();  // else a clean, cancelled wait
    if (cancelled()) {
      conn_.reset();
      throwCancelled("a store request");
    }
    throw;
  }
}

void TcpStore::send(const wire::Request& r) {
  sendBuf_.clear();
  wire::encodeRequest(dialect_, r, sendBuf_);
  conn_->sendAll(sendBuf_, replayOf(r.cmd) == Replay::kIfUnsent ? &sent_ : nullptr);
}

void TcpStore::requireV2(const char* op) const {
  if (dialect_ != wire::Dialect::kV2)
    DDPRUN_THROW(InvalidArgument, op, " needs a PyTorch >= 2.2 (or ddprun) store; ",
                 address(), " speaks the ", wire::dialectName(dialect_), " dialect");
}

void TcpStore::set(const std::string& key, std::string_view value) {
  if (!opts_.ownedPrefix.empty() && key.rfind(opts_.ownedPrefix, 0) == 0) {
    std::lock_guard<std::mutex> lock(mu_);
    owned_[key] = std::string(value);
  }
  locked(Replay::kAlways, [&](Conn&) {
    send(request(Command::kSet, {wireKey(key)}, {std::string(value)}));
    return 0;
  });
}

std::string TcpStore::get(const std::string& key) {
  return locked(Replay::kAlways, [&](Conn& c) {
    waitLocked({wireKey(key)}, timeout_, "get");
    send(request(Command::kGet, {wireKey(key)}));
    return std::move(c.readReply(Command::kGet, Deadline(timeout_), "GET").values[0]);
  });
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  return locked(Replay::kIfUnsent, [&](Conn& c) {
    send(request(Command::kAdd, {wireKey(key)}, {}, delta));
    return c.readReply(Command::kAdd, Deadline(timeout_), "ADD").number;
  });
}

std::string TcpStore::compareSet(const std::string& key, std::string_view expected,
                                 std::string_view desired) {
  return locked(Replay::kAlways, [&](Conn& c) {
    send(request(Command::kCompareSet, {wireKey(key)},
                 {std::string(expected), std::string(desired)}));
    return std::move(
        c.readReply(Command::kCompareSet, Deadline(timeout_), "COMPARE_SET").values[0]);
  });
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  return locked(Replay::kAlways, [&](Conn& c) {
    send(request(Command::kCheck, wireKeys(keys)));
    return c.readReply(Command::kCheck, Deadline(timeout_), "CHECK").code ==
           wire::kCheckReady;
  });
}

void TcpStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  locked(Replay::kAlways, [&](Conn&) {
    waitLocked(wireKeys(keys), timeout, "wait");
    return 0;
  });
}

// Sends WAIT and blocks for STOP_WAITING. On timeout a v2 connection is
// brought back in step with CANCEL_WAIT (the server may have sent
// STOP_WAITING just before seeing it); a legacy one is dropped, since only
// closing it clears the server's registration.
void TcpStore::waitLocked(const std::vector<std::string>& keys, Millis timeout,
                          const std::string& what) {
  send(request(Command::kWait, keys));
  if (conn_->waitReadable(timeout)) {
    auto b = conn_->readReply(Command::kWait, Deadline(timeout_), "WAIT").code;
    if (b != wire::kStopWaiting)
      DDPRUN_THROW(ProtocolError, "unexpected reply ", int(b), " to WAIT from ",
                   address());
    return;
  }
  if (dialect_ == wire::Dialect::kV2) {
    send(request(Command::kCancelWait));
    Deadline d(timeout_);
    auto b = conn_->readReply(Command::kCancelWait, d, "CANCEL_WAIT").code;
    if (b == wire::kStopWaiting)
      b = conn_->readReply(Command::kCancelWait, d, "CANCEL_WAIT").code;
    if (b != wire::kWaitCanceled)
      DDPRUN_THROW(ProtocolError, "unexpected reply ", int(b),
                   " to CANCEL_WAIT from ", address());
  } else {
    conn_.reset();
    connectAndHandshake(Deadline(opts_.connectTimeout));
  }
  DDPRUN_THROW(TimeoutError, what, " timed out after ", timeout.count(),
               " ms waiting for keys ", joinKeys(keys), " in the store at ",
               address());
}

bool TcpStore::deleteKey(const std::string& key) {
  return locked(Replay::kAlways, [&](Conn& c) {
    send(request(Command::kDeleteKey, {wireKey(key)}));
    return c.readReply(Command::kDeleteKey, Deadline(timeout_), "DELETE_KEY").number != 0;
  });
}

int64_t TcpStore::numKeys() {
  return locked(Replay::kAlways, [&](Conn& c) {
    send(request(Command::kGetNumKeys));
    return c.readReply(Command::kGetNumKeys, Deadline(timeout_), "GETNUMKEYS").number;
  });
}

void TcpStore::append(const std::string& key, std::string_view value) {
  requireV2("append");
  locked(Replay::kIfUnsent, [&](Conn&) {
    send(request(Command::kAppend, {wireKey(key)}, {std::string(value)}));
    return 0;
  });
}

std::vector<std::string> TcpStore::multiGet(const std::vector<std::string>& keys) {
  return locked(Replay::kAlways, [&](Conn& c) {
    auto wk = wireKeys(keys);
    waitLocked(wk, timeout_, "multiGet");
    std::vector<std::string> out;
    Deadline d(timeout_);
    if (dialect_ == wire::Dialect::kLegacy) {
      for (const auto& k : wk) {
        send(request(Command::kGet, {k}));
        out.push_back(std::move(c.readReply(Command::kGet, d, "GET").values[0]));
      }
      return out;
    }
    send(request(Command::kMultiGet, wk));
    return std::move(c.readReply(Command::kMultiGet, d, "MULTI_GET", wk.size()).values);
  });
}

void TcpStore::multiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values) {
  DDPRUN_CHECK(keys.size() == values.size(), "multiSet got ", keys.size(),
               " keys but ", values.size(), " values");
  locked(Replay::kAlways, [&](Conn&) {
    if (dialect_ == wire::Dialect::kLegacy) {
      for (size_t i = 0; i < keys.size(); ++i)
        send(request(Command::kSet, {wireKey(keys[i])}, {values[i]}));
    } else {
      send(request(Command::kMultiSet, wireKeys(keys), values));
    }
    return 0;
  });
}

uint32_t TcpStore::ping(uint32_t nonce) {
  requireV2("ping");
  return locked(Replay::kAlways, [&](Conn& c) {
    wire::Request r = request(Command::kPing);
    r.u32 = nonce;
    send(r);
    return c.readReply(Command::kPing, Deadline(timeout_), "PING").u32;
  });
}

std::vector<std::string> TcpStore::listKeys() {
  requireV2("listKeys");
  return locked(Replay::kAlways, [&](Conn& c) {
    send(request(Command::kListKeys));
    Deadline d(timeout_);
    std::vector<std::string> out;
    for (auto& k : c.readReply(Command::kListKeys, d, "LIST_KEYS").values)
      if (!k.empty() && k[0] == '/') out.push_back(k.substr(1));
    return out;
  });
}

void TcpStore::queuePush(const std::string& key, std::string_view value) {
  requireV2("queuePush");
  locked(Replay::kIfUnsent, [&](Conn&) {
    send(request(Command::kQueuePush, {wireKey(key)}, {std::string(value)}));
    return 0;
  });
}

std::string TcpStore::queuePop(const std::string& key, Millis timeout) {
  requireV2("queuePop");
  return locked(Replay::kIfUnsent, [&](Conn& c) {
    waitLocked({wireKey(key)}, timeout, "queuePop");
    send(request(Command::kQueuePop, {wireKey(key)}));
    Deadline d(timeout_);
    auto reply = c.readReply(Command::kQueuePop, d, "QUEUE_POP");
    if (reply.number == 0)
      DDPRUN_THROW(ProtocolError, "queue '", key, "' was empty after WAIT");
    return std::move(reply.values[0]);
  });
}

int64_t TcpStore::queueLen(const std::string& key) {
  requireV2("queueLen");
  return locked(Replay::kAlways, [&](Conn& c) {
    send(request(Command::kQueueLen, {wireKey(key)}));
    return c.readReply(Command::kQueueLen, Deadline(timeout_), "QUEUE_LEN").number;
  });
}

void TcpStore::barrier(const std::string& key, int64_t worldSize, Millis timeout) {
  requireV2("barrier");
  DDPRUN_CHECK(worldSize > 0, "barrier world size must be positive");
  locked(Replay::kIfUnsent, [&](Conn& c) {
    send(request(Command::kBarrier, {wireKey(key)}, {}, worldSize));
    if (c.waitReadable(timeout)) {
      if (c.readReply(Command::kBarrier, Deadline(timeout_), "BARRIER").code !=
          wire::kStopWaiting)
        DDPRUN_THROW(ProtocolError, "unexpected reply to BARRIER from ", address());
      return 0;
    }
    send(request(Command::kCancelWait));
    Deadline d(timeout_);
    auto b = c.readReply(Command::kCancelWait, d, "CANCEL_WAIT").code;
    if (b == wire::kStopWaiting)
      b = c.readReply(Command::kCancelWait, d, "CANCEL_WAIT").code;
    DDPRUN_THROW(TimeoutError, "barrier '", key, "' timed out after ",
                 timeout.count(), " ms waiting for ", worldSize,
                 " arrivals in the store at ", address());
  });
}

std::string TcpStore::localAddress() {
  return locked(Replay::kAlways, [](Conn& c) { return c.localIp(); });
}

}  // namespace ddprun::store
