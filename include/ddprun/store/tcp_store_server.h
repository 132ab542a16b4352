// The store server: Boost.Asio networking around ServerState.
//
// One io thread owns all state, so requests are applied in arrival order
// without locks. Each connection speaks the PyTorch dialect it opened with
// (1.13-style or >= 2.2). A connection that sends something malformed or over
// a limit is closed and logged with its peer address (rate-limited); everyone
// else is unaffected. An exception while serving a client (std::bad_alloc
// included) closes that client only. All limits are in ServerLimits.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/store/server_state.h"

namespace ddprun::store {

struct TcpStoreServerOptions {
  // Address to listen on. Empty: every address, IPv6 and IPv4 (dual stack),
  // or IPv4 only where IPv6 is unavailable.
  std::string host;
  uint16_t port = 0;  // 0 picks a free port
  ServerLimits limits;
  // After serving a request, keep polling the sockets (without sleeping) for
  // this long before blocking. A client's next request usually follows within
  // one round trip (PyTorch's get is WAIT then GET), and a sleeping thread
  // costs a wake-up per request, which on virtual machines is tens of
  // microseconds. Costs CPU only right after activity; 0 disables it.
  std::chrono::microseconds busyPoll{100};
  // A connection that holds a partial request for longer than this is
  // closed. Zero (the default, as in PyTorch) disables the check.
  std::chrono::milliseconds idleTimeout{0};
  // Shared secret (auth.h). Empty: open, as PyTorch. Set: a connection may
  // send only the handshake and the authentication exchange until it has
  // proved it knows the secret; anything else closes it, with one
  // rate-limited "unauthenticated client" warning naming the peer.
  std::string authToken{};
  // With a secret: a connection not authenticated this long after it was
  // accepted is closed (one that connects and stays silent holds a slot).
  std::chrono::milliseconds authTimeout{30'000};
  // Keys bound to their connection (server_state.h): the rendezvous hears of
  // an agent's death the moment the kernel closes its connection. A peer's
  // closed end is read from its socket (POLLRDHUP) when a tombstone is read.
  std::vector<LeaseRule> leases{};
  // Length of the kernel's queue of connections not yet accepted (the
  // server empties it at every readiness; see docs/store.md). Linux caps it
  // at net.core.somaxconn (4096 by default since 5.4; raise that sysctl for
  // bigger bursts): a connect that finds the queue full has its SYN dropped
  // and retried by the client 1 s, then 3 s, later. Last, so that positional
  // initialisers of the fields above keep their meaning.
  int listenBacklog{65535};
  // Accept on a thread of its own (it only accepts and hands descriptors to
  // the io thread, which alone touches the store's state). Off: the io
  // thread accepts, emptying the queue at every readiness.
  bool acceptThread{true};
  // A port in use names the process that holds it (a scan of /proc: tens
  // of milliseconds on a host with thousands of sockets). Off for a caller
  // that only tries the port and never shows the error.
  bool nameHolder{true};
};

class TcpStoreServer {
 public:
  // Binds and starts serving on a background thread. Throws IoError whose
  // message names the address and, for a port in use, the process holding it.
  static std::unique_ptr<TcpStoreServer> start(const TcpStoreServerOptions& opts);
  ~TcpStoreServer();  // stops
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  uint16_t port() const;
  // The bound address, e.g. "[::]:29500" or "127.0.0.1:41234".
  std::string address() const;
  // Closes every connection and joins the io thread. Idempotent.
  void stop();
  // ServerState::eraseKeysOutside, run on the io thread between two
  // requests; waits for it and returns how many keys and queues went (0 once
  // stopped). Thread-safe; never call it from the io thread.
  size_t eraseKeysOutside(const std::string& keep);
  // ServerState::eraseKeysUnder, the same way.
  size_t eraseKeysUnder(const std::vector<std::string>& prefixes);
  // Thread-safe snapshot.
  ServerStats stats() const;
  size_t connections() const;

 private:
  class Impl;
  explicit TcpStoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::store
