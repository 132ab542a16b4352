// The dynamic rendezvous with its store, clock and liveness injected, so that
// its protocol (state compare_set, completion and end keys, heartbeats, wait
// and redundancy lists, timeouts) runs on an in-memory store with a fake
// clock in unit tests. makeDynamicRendezvous() builds the TCP backend: the
// endpoint's store (hosted or not), TcpStore clients sharing a CancelToken,
// each round's worker store and the Heartbeat of heartbeat.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/rendezvous/dynamic_rendezvous.h"
#include "ddprun/store/server_state.h"
#include "ddprun/store/store.h"
#include "ddprun/store/tcp_store.h"
#include "heartbeat.h"

namespace ddprun::rendezvous::detail {

// What the rendezvous needs of a Heartbeat (see there): tests declare nodes
// dead by calling the OnDead they were given. Thread-safe.
class Liveness {
 public:
  virtual ~Liveness() = default;
  virtual void setPeers(std::vector<std::string> peers, Heartbeat::OnDead onDead) = 0;
  virtual void setOnLost(Heartbeat::OnLost onLost) = 0;
  virtual void stop() = 0;
};

struct DynamicBackend {
  // Opens a new client of the endpoint's store, for one thread of the
  // rendezvous; `timeout` bounds connecting. Every blocking call, connecting
  // included, must end with CancelledError once `cancel` is cancelled.
  // Errors: IoError, TimeoutError.
  std::function<std::unique_ptr<store::Store>(std::shared_ptr<store::CancelToken> cancel,
                                              std::chrono::milliseconds timeout)>
      connect;
  // This node's address as the endpoint sees it (the local IP of `store`'s
  // connection), for a node with no --local-addr that does not host.
  std::function<std::string(store::Store& store)> localAddress;
  // Group rank 0: stops the previous round's worker store, starts a fresh one
  // and returns its port.
  std::function<uint16_t()> startWorkerStore;
  // Beats for `self` under the job's heartbeat prefix, watching nobody yet.
  std::function<std::unique_ptr<Liveness>(const std::string& self)> startLiveness;
  // The host only (empty elsewhere): registers `onGone`, called with a
  // node's id and how it ended the moment the connection its heartbeat beats
  // on ends (closed: the kernel ended its agent, or it left; reset: the
  // network, and it may beat again on a new one), on the store's thread: it
  // must not block. The store then holds "<job>/gone/<node id>" (JobKeys), which any
  // node may read. Called once, before the first join.
  std::function<void(std::function<void(const std::string& node, store::ConnEnd how)> onGone)>
      watchDepartures;
  // Called once at shutdown, after the rendezvous's threads have ended:
  // stops the stores this node hosts. May be empty.
  std::function<void()> stopHosted;
  // Wall milliseconds: the last-call and join deadlines.
  WallClock clock = systemWallMs;
  // Blocks until every key exists (true) or the wall clock reaches `untilMs`
  // (false); CancelledError once cancelled. Empty: store.wait with the time
  // left on `clock`. Tests wait on their fake clock.
  std::function<bool(store::Store& store, const std::vector<std::string>& keys,
                     int64_t untilMs)>
      waitUntil;
  bool hosting = false;      // this node serves the endpoint: group rank 0
  int64_t pid = 0;           // for the node id; 0: getpid()
  std::string nonce;         // the node id's random part; "": a fresh one (tests fix it)
  std::string storeAddress;  // the endpoint, for messages: "10.0.0.1:29400"
  // This node's failed beats so far (Rendezvous::heartbeatsMissed); may be
  // null (tests).
  std::shared_ptr<std::atomic<uint64_t>> missedBeats;
};

// Preconditions: valid options (InvalidArgument, as makeDynamicRendezvous),
// backend.connect, startWorkerStore and startLiveness set.
std::unique_ptr<Rendezvous> makeDynamicRendezvous(const DynamicOptions& opts,
                                                  Rendezvous::Post post,
                                                  DynamicBackend backend);

// Opens one client of the endpoint's store from the options the backend
// made for it (name "rendezvous" or "heartbeat", its cancel token, timeouts,
// owned keys): TcpStore::connect, or a wrapper of it (src/bench/rdzv_sim.cc
// adds latency, counts requests and bytes, and cuts a node off). The same
// contract as DynamicBackend::connect.
using EndpointConnect =
    std::function<std::unique_ptr<store::Store>(const store::TcpStoreOptions& opts)>;

// The real backend. A host binds the endpoint's port here (explicit: IoError
// naming the holder; inferred: a port in use makes it a client) and, for
// port 0, writes the port it got into opts; opts.isHost says whether it hosts.
// Every client of the endpoint (the rendezvous's and the heartbeat's) is
// opened through `via` when set. A wrapped client is no TcpStore: give such
// a node opts.localAddr.
DynamicBackend makeDynamicTcpBackend(DynamicOptions& opts, EndpointConnect via = {});

// InvalidArgument for options that can never work.
void validate(const DynamicOptions& opts);

}  // namespace ddprun::rendezvous::detail
