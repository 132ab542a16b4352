// The agent's HTTP status endpoint (docs/status.md): a Boost.Beast server on
// a thread of its own that answers from the latest published Snapshot.
//
// The job never depends on it: the agent's thread only publishes (a pointer
// swap under a mutex); the server's failures are logged as warnings and end
// nothing but the connection concerned. Limits, so that no client can hurt
// the agent or starve another: one request per connection (Connection:
// close); headers of at most maxHeaderBytes (431 beyond), a body of at most
// maxBodyBytes (413); the request must arrive within requestDeadline and the
// connection end within `deadline`; connections are accepted once they carry
// data (TCP_DEFER_ACCEPT, up to requestDeadline), and at most maxConnections
// (bounded by the descriptors the agent leaves it: connectionCapacity) and
// maxConnectionsPerAddress are held: beyond them, a connection that waits on
// its client makes room, and a request that arrived is never closed
// unanswered (the policy is Admission, admission.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "ddprun/status/snapshot.h"

namespace ddprun::status {

// The latest snapshot, shared between the agent's thread (publish) and the
// server's (latest). Thread-safe.
class Publisher {
 public:
  Publisher() : latest_(std::make_shared<const Snapshot>()) {}
  void publish(Snapshot s) {
    auto next = std::make_shared<const Snapshot>(std::move(s));
    std::lock_guard lock(mu_);
    latest_.swap(next);
  }
  std::shared_ptr<const Snapshot> latest() const {
    std::lock_guard lock(mu_);
    return latest_;
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const Snapshot> latest_;
};

struct ServerOptions {
  std::string address = "127.0.0.1";  // an IP literal; loopback unless told otherwise
  uint16_t port = 0;                  // 0: a free port (port() says which)
  size_t maxHeaderBytes = 8 * 1024;
  size_t maxBodyBytes = 1024;
  std::chrono::milliseconds requestDeadline{2'000};  // accept -> request read
  std::chrono::milliseconds deadline{10'000};        // accept -> closed
  int maxConnections = 512;
  int maxConnectionsPerAddress = 64;
  // What the agent runs, for the descriptors it keeps for itself
  // (DescriptorNeeds in admission.h): its local workers and the most nodes.
  int localWorkers = 1;
  int nodes = 1;
};

// Owns its thread and io_context. Not copyable; the destructor stops it.
class StatusServer {
 public:
  // Binds and starts serving. Throws IoError (cannot listen: the message
  // names the address and why) or InvalidArgument (not an IP address).
  StatusServer(ServerOptions opts, std::shared_ptr<const Publisher> publisher);
  ~StatusServer();
  StatusServer(const StatusServer&) = delete;
  StatusServer& operator=(const StatusServer&) = delete;

  uint16_t port() const;
  // "http://127.0.0.1:8080" ([v6] in brackets).
  std::string url() const;
  // Stops accepting, closes every connection, joins the thread. Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::status
