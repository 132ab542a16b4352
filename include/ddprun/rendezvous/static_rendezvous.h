// Static rendezvous across a fixed number of nodes (--nnodes N --node-rank R
// --master-addr A --master-port P), in rounds: one round per attempt, shared by
// every node, so restarts are counted once for the whole job.
//
// Node 0's agent hosts the agent store on A:P for its whole life; every agent
// is a client of it. As under torchrun, the workers share it: RoundInfo's
// worker store is A:P (MASTER_ADDR/MASTER_PORT as given). Each round starts
// with it clean: once every node has joined (no earlier worker runs), node 0
// erases every key outside the rendezvous's own (ddprun/<run_id>/) before
// any node starts its workers. With authSecret the agent store admits only
// agents, so the workers get a fresh store of their own each round, on a
// free port of node 0 (published in the round's keys) instead.
// A watcher waits on the round's end key and turns it into a typed
// RoundEvent (finished; failed or closed by node N, with the reason; store
// lost). The keys are listed in static_rendezvous.cc; a job's are under
// "ddprun/<run_id>/round/<r>/", as in earlier versions.
//
// Liveness: every node beats through the agent store (heartbeat.h) and, while
// a round runs, watches every other node. A node silent for the heartbeat
// timeout (its agent was killed, its host is gone) ends the round as kFailed
// by that node on every surviving node, instead of leaving them to wait for
// as long as their workers run. A node that left cleanly said so first and
// is not declared dead. Node 0's death takes the agent store with it:
// kStoreLost, as before. RoundInfo.restartCount is the job's number of
// failed rounds before this one, kept in the store: the same on every node.
//
// Threading as in rendezvous.h: connecting, waiting for the peers, reports and
// waiting for a round's end run on threads of the rendezvous; cancel() ends
// each of those waits at once (a signal while node 0 waits for its peers, or
// while a node waits for an absent node 0). shutdown() delivers the reports
// already made (they may close the job for the peers), then cancels and joins
// its threads; node 0 first waits, up to leaveTimeout, until every node has
// read the last round's end, so that none finds the store gone instead.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "ddprun/rendezvous/common_options.h"
#include "ddprun/rendezvous/rendezvous.h"

namespace ddprun::rendezvous {

// From CommonOptions: runId; the liveness beat (every node beats from its
// first join until shutdown; a node silent for keepAliveInterval *
// keepAliveMaxAttempt during a round is dead); authSecret (node 0's agent
// store admits only agents that know it).
struct StaticOptions : CommonOptions {
  std::string masterAddr = "127.0.0.1";
  uint16_t masterPort = 29500;
  int nodeRank = 0;
  int nnodes = 1;
  std::chrono::milliseconds timeout{900'000};  // joining a round, waiting for peers
  // shutdown(): the most it waits for reports to go out and (node 0) for the
  // other nodes to read the round's end.
  std::chrono::milliseconds leaveTimeout{5'000};
};

// Node 0 starts listening on A:P at once, on every address (IoError naming
// the holder if the port is taken: a setup error before any worker starts);
// masterPort 0 picks a free port there, which describe() shows. Connecting
// and waiting happen in join(), off the agent's thread, and cancel() ends
// them at once. InvalidArgument unless 0 <= nodeRank < nnodes, and the
// keep-alive interval and attempts are positive.
std::unique_ptr<Rendezvous> makeStaticRendezvous(const StaticOptions& opts,
                                                 Rendezvous::Post post);

}  // namespace ddprun::rendezvous
