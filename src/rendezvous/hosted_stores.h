// HostedStores: the store servers one rendezvous node hosts, and how the
// rendezvous hears that a node's heartbeat connection closed. Shared by the
// static backend (node 0 hosts the agent store) and the dynamic one (the
// endpoint's host serves the rendezvous store; group rank 0 the worker
// stores).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddprun/store/tcp_store_server.h"
#include "hosting.h"

namespace ddprun::rendezvous::detail {

// What it is for: the lifecycle of the stores a rendezvous node hosts. The
// rendezvous store (static: node 0's agent store; dynamic: the endpoint's)
// lives from hostRendezvousStore() to stop(); a round's worker store from
// startWorkerStore() to the next call or stop(). In the rendezvous store a
// node's heartbeat key "ddprun/<run>/hb/<name>" is a lease of the connection
// it beats on (store::LeaseRule): when the kernel closes that connection
// (its agent died, or left), the key goes, "ddprun/<run>/gone/<name>"
// appears, and the handler given to watchDepartures() hears <name>.
//
// Thread-safety: the departure handler runs on the rendezvous store's
// thread; watchDepartures() and stop() may run beside it (a mutex guards
// the handler; after stop() returns it is never called again). Every other
// call comes from one thread at a time (the backend's construction, then
// the rendezvous's task thread, then its shutdown). The backends share one
// through a std::shared_ptr captured by their callbacks.
//
// Preconditions: hostRendezvousStore() at most once, before the other
// calls; rendezvousStore() only while hosting().
class HostedStores {
 public:
  // Called with a node's heartbeat name and how its connection ended
  // (store::ConnEnd: closed by its process, or reset); must not block.
  using OnGone = std::function<void(const std::string& name, store::ConnEnd how)>;

  HostedStores() = default;
  ~HostedStores() { stop(); }
  HostedStores(const HostedStores&) = delete;
  HostedStores& operator=(const HostedStores&) = delete;

  // Starts the rendezvous store on bindHost:port (hostStore(): an IoError
  // naming `role`, the port's holder and `fix`), with the heartbeat leases of
  // job `runId`; a non-empty `secret` admits only clients that know it.
  // Returns the port it got (port 0: a free one). On error nothing is hosted.
  // `nameHolder`: see hostStore().
  uint16_t hostRendezvousStore(const std::string& bindHost, uint16_t port,
                               const std::string& role, const std::string& fix,
                               const std::string& secret, const std::string& runId,
                               bool nameHolder = true);
  bool hosting() const { return rendezvous_ != nullptr; }
  store::TcpStoreServer& rendezvousStore() { return *rendezvous_; }

  // Stops the previous round's worker store, if any, and starts a fresh one
  // (a fresh keyspace, open to PyTorch's clients) on a free port of every
  // address; returns its port.
  uint16_t startWorkerStore();

  // Registers who hears of departures (replacing any earlier handler).
  void watchDepartures(OnGone onGone);

  // Forgets the departure handler, then stops the worker store and the
  // rendezvous store. Idempotent.
  void stop();

 private:
  // Held by the lease rule too, so that the store's thread never reaches a
  // destroyed HostedStores.
  struct Relay {
    std::mutex mu;
    OnGone onGone;
  };
  const std::shared_ptr<Relay> relay_ = std::make_shared<Relay>();
  std::unique_ptr<store::TcpStoreServer> rendezvous_;
  std::unique_ptr<store::TcpStoreServer> worker_;
};

// Gives a backend (StaticBackend, DynamicBackend) its hooks on `hosted`:
// watchDepartures where this node hosts the rendezvous store (left empty
// elsewhere), and stopHosted.
template <typename Backend>
void bindHostedStores(Backend& backend, const std::shared_ptr<HostedStores>& hosted) {
  if (hosted->hosting())
    backend.watchDepartures = [hosted](HostedStores::OnGone onGone) {
      hosted->watchDepartures(std::move(onGone));
    };
  backend.stopHosted = [hosted] { hosted->stop(); };
}

}  // namespace ddprun::rendezvous::detail
