// The static rendezvous with its stores injected, so that its protocol (keys,
// ranks, round ends, cancellation) runs on an in-memory store in unit tests.
// makeStaticRendezvous() builds the TCP backend: node 0's agent store server,
// TcpStore clients sharing a CancelToken, and readying each round's worker
// store.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/rendezvous/static_rendezvous.h"
#include "ddprun/store/server_state.h"
#include "ddprun/store/store.h"
#include "ddprun/store/tcp_store.h"

namespace ddprun::rendezvous::detail {

struct StaticBackend {
  // Opens a new client of the agent store, for one thread of the rendezvous
  // (join and reports, or a round's watcher); `timeout` bounds connecting.
  // Every blocking call, connecting included, must end with CancelledError
  // once `cancel` is cancelled. Errors: IoError, TimeoutError.
  std::function<std::unique_ptr<store::Store>(std::shared_ptr<store::CancelToken> cancel,
                                              std::chrono::milliseconds timeout)>
      connect;
  // Node 0, once every node has joined the round: readies the round's
  // worker store and returns its port. No key under `workerPrefixes` (what
  // the job's workers write, workerKeyPrefixes()) written in an earlier
  // round may be readable there; every other key stays (the rendezvous's
  // own, and any other client's: the store is not the job's alone). Runs on
  // the rendezvous's thread.
  std::function<uint16_t(const std::vector<std::string>& workerPrefixes)> readyWorkerStore;
  // Node 0 only (empty elsewhere): registers `onGone`, called with a
  // node's heartbeat name ("node<i>") and how it ended the moment the
  // connection it beats on ends (closed: its agent died, or left; reset: the
  // network, and the agent may beat again on a new one), on the store's
  // thread: it must not block. Called once, before the first join.
  std::function<void(std::function<void(const std::string& beat, store::ConnEnd how)> onGone)>
      watchDepartures;
  // Called once at shutdown, after the rendezvous's threads have ended:
  // stops the stores this node hosts. May be empty.
  std::function<void()> stopHosted;
  // The agent store's address, for messages: "10.0.0.1:29500".
  std::string storeAddress;
};

// What the job's workers write in the agent store they share, as key
// prefixes a client names (the server sees each with a leading '/'):
// PyTorch's env:// client: "init/" (TCPStore's join counter), "default_pg/"
// (the default group, its barriers and subgroups; PyTorch >= 2.6 uses no
// other prefix), "/worker/attempt_" (PyTorch <= 2.5 puts everything under
// /worker/attempt_<restart count>); ddprun's runtime: "ddprun/pg/". Only
// these are erased between rounds: a user's own keys stay, as under
// torchrun, which erases nothing.
inline const std::vector<std::string>& workerKeyPrefixes() {
  static const std::vector<std::string> prefixes = {"init/", "default_pg/",
                                                    "/worker/attempt_", "ddprun/pg/"};
  return prefixes;
}

// Preconditions: 0 <= opts.nodeRank < opts.nnodes (InvalidArgument), and
// backend.connect and backend.readyWorkerStore set.
std::unique_ptr<Rendezvous> makeStaticRendezvous(const StaticOptions& opts,
                                                 Rendezvous::Post post,
                                                 StaticBackend backend);

// The real backend. Node 0 binds the agent store here (IoError naming the
// port's holder) and, for opts.masterPort 0, writes the port it got back
// into opts (tests read it to point their other nodes there). The workers
// share the agent store (torchrun's MASTER_PORT), cleared each round of
// the keys under workerKeyPrefixes() only; with opts.authSecret they get a fresh
// store of their own each round instead (PyTorch cannot authenticate).
StaticBackend makeTcpBackend(StaticOptions& opts);

}  // namespace ddprun::rendezvous::detail
