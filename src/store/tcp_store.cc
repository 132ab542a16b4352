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
#include "tcp_store_conn.h"

namespace ddprun::store {

using wire::Command;

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
      DDPRUN_THROW(UnconfirmedError, e.message(),
                   " (the request was not sent again: it may have been applied, and "
                   "applying it twice would count twice)");
    case ReconnectPolicy::Verdict::kOutOfTime:
      policy_.onSuccess();
      if (policy_.options().budget.count() <= 0) throw;  // a client that never reconnects
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
    // A reconnecting client notices an idle connection the store closed
    // before it sends (so that even an ADD may go again); one that never
    // reconnects pays no extra poll(2) per request.
    if (policy_.options().budget.count() > 0) conn_->checkOpen();
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
