// Client of a c10d TCPStore server: ours (TcpStoreServer, ddprun-store) or
// PyTorch's. Like PyTorch's client it prepends "/" to every key, so keys set
// here are visible under the same name to PyTorch's TCPStore and vice versa.
//
// Thread-safe: requests on the one connection are serialised by a mutex.
// A connection that breaks (reset, aborted, closed by the server) is replaced
// within the call under TcpStoreOptions::reconnect (reconnect.h: backoff, a
// budget, only requests that cannot apply twice are sent again); with no
// budget the call fails and the next one reconnects. A CancelToken
// (TcpStoreOptions::cancel) lets another thread end a blocking call at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "ddprun/common/clock.h"
#include "ddprun/common/error.h"
#include "ddprun/store/reconnect.h"
#include "ddprun/store/store.h"
#include "ddprun/store/wire.h"

namespace ddprun::store {

// Lets another thread abandon blocking store calls at once: an agent waiting
// for its peers when a signal arrives. A TcpStore given the token shuts its
// socket down on cancel() (which wakes a blocked poll or recv) and stops
// retrying to connect; the interrupted call, and every later one, throws
// CancelledError. One token may serve several clients, and any other
// cancellable wait through subscribe(). Cancellation cannot be undone.
// Thread-safe; cancel() is idempotent.
class CancelToken {
 public:
  using Id = uint64_t;
  void cancel();
  bool cancelled() const;  // lock-free
  // Runs `fn` on cancel(), or at once (on this thread) if already cancelled.
  // `fn` runs under the token's lock: keep it short and never call the
  // token from it.
  Id subscribe(std::function<void()> fn);
  // When it returns, the callback is not running and never will.
  void unsubscribe(Id id);
  // Sleeps up to `d`; returns early, with true, once cancelled.
  bool sleepFor(Millis d);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> cancelled_{false};  // written under mu_; read without it
  Id nextId_ = 1;
  std::map<Id, std::function<void()>> callbacks_;
};

enum class ClientDialect {
  kAuto,    // v2 handshake (VALIDATE + PING); if the server hangs up, legacy
  kV2,      // PyTorch >= 2.5 servers and ours
  kLegacy,  // PyTorch <= 2.0 servers: no CANCEL_WAIT, APPEND or MULTI_*
};

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 29500;
  Millis timeout = kDefaultTimeout;  // for every request and for get()/wait()
  Millis connectTimeout{30'000};     // total time to keep retrying connect
  Backoff::Options backoff{};        // between connect attempts
  ClientDialect dialect = ClientDialect::kAuto;
  // Null: calls end only by their timeouts. Set: see CancelToken.
  std::shared_ptr<CancelToken> cancel;
  // Shared secret (auth.h). Set: connect() and every reconnect prove it to
  // the server and check the server's proof in return; a server that
  // refuses it (or cannot prove it knows it) is an auth::AuthError, never
  // retried. A server that requires no token (PyTorch's, or an open
  // ddprun-store) is refused too (an auth::AuthError: anyone could pose as
  // it), unless allowOpenServer is set: then it is used, with one warning,
  // and authenticated() says so. Without a token, a server that requires one
  // is an auth::AuthError saying so (told apart from a network fault by a
  // probe when it closes a fresh connection at its first request).
  std::string authToken{};
  bool allowOpenServer = false;
  // Reconnects within a call (reconnect.h). The default, no budget, fails a
  // request whose connection broke at once.
  ReconnectOptions reconnect{};
  // Keys under this prefix that this client SETs are its own: bound to its
  // connection (a lease, store::LeaseRule). After every reconnect each is SET
  // again, with its last value, before anything else, so the new connection
  // owns it. Empty: none. Meant for a few keys (a heartbeat's one).
  std::string ownedPrefix{};
  // What the client is for ("rendezvous", "heartbeat"): its debug log lines
  // say it, with its local address, at every (re)connect.
  std::string name{"store"};
};

class TcpStore : public Store {
 public:
  // Connects (retrying with backoff until connectTimeout) and handshakes.
  // Throws TimeoutError naming the address when the server cannot be reached,
  // CancelledError once opts.cancel is cancelled.
  static std::unique_ptr<TcpStore> connect(const TcpStoreOptions& opts);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, std::string_view value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compareSet(const std::string& key, std::string_view expected,
                         std::string_view desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  using Store::wait;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  void append(const std::string& key, std::string_view value) override;
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::string>& values) override;

  // v2-only commands (ddprun-store and recent PyTorch servers).
  uint32_t ping(uint32_t nonce);
  // Every key in the store whose wire name starts with "/", without it.
  std::vector<std::string> listKeys();
  void queuePush(const std::string& key, std::string_view value);
  // Waits up to `timeout` for an element, then pops it.
  std::string queuePop(const std::string& key, Millis timeout);
  int64_t queueLen(const std::string& key);
  // Counts arrivals at key; returns when worldSize clients have arrived.
  void barrier(const std::string& key, int64_t worldSize, Millis timeout);

  wire::Dialect dialect() const { return dialect_; }
  // True when the server checked this client's token (and proved its own).
  // False with no token, or against a server that requires none.
  bool authenticated() const { return authenticated_; }
  std::string address() const;
  // The numeric IP of this client's end of the connection (getsockname; never
  // resolved to a name): the address by which the server's host reaches this
  // one. Connects first if needed; "" if the system cannot tell.
  std::string localAddress();

 private:
  explicit TcpStore(TcpStoreOptions opts);
  class Conn;
  void ensureConnected();
  void connectAndHandshake(Deadline deadline);
  void reconnect();
  void reown();
  void afterBroken(Replay replay, const IoError& e);
  bool requiresToken();
  void sleepOrCancel(Millis d);
  void authenticate(Deadline deadline);
  std::string roundTripPrefix() const;
  void send(const wire::Request& r);
  void waitLocked(const std::vector<std::string>& wireKeys, Millis timeout,
                  const std::string& what);
  template <typename F>
  auto locked(Replay replay, F&& f);
  template <typename F>
  auto attempt(F& f);
  void requireV2(const char* op) const;
  bool cancelled() const { return opts_.cancel && opts_.cancel->cancelled(); }
  [[noreturn]] void throwCancelled(const char* what) const;

  TcpStoreOptions opts_;
  wire::Dialect dialect_ = wire::Dialect::kV2;
  bool authenticated_ = false;
  bool warnedOpen_ = false;  // "the server requires no token" was logged
  std::unique_ptr<Conn> conn_;
  std::mutex mu_;
  std::string sendBuf_;
  ReconnectPolicy policy_;
  std::string outageCause_;  // what broke the connection first in this outage
  // A kIfUnsent request of the current call may have left this host.
  bool sent_ = false;
  // Replies read on conn_ by the end of its handshake: none since means the
  // connection has served no request yet.
  uint64_t handshakeReplies_ = 0;
  std::map<std::string, std::string> owned_;  // ownedPrefix keys SET, last value
};

}  // namespace ddprun::store
