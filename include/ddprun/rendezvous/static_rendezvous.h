// Static rendezvous across a fixed number of nodes (--nnodes N --node-rank R
// --master-addr A --master-port P), in rounds: one round per attempt, shared by
// every node, so restarts are counted once for the whole job.
//
// Node 0's agent hosts the agent store on A:P for its whole life; every agent
// is a client of it. Node 0 also hosts each round's fresh worker store (port
// 0) and publishes its port in the round's keys. A watcher waits on the
// round's end key and turns it into a typed RoundEvent.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "ddprun/rendezvous/rendezvous.h"

namespace ddprun::rendezvous {

struct StaticOptions {
  std::string masterAddr = "127.0.0.1";
  uint16_t masterPort = 29500;
  int nodeRank = 0;
  int nnodes = 1;
  std::string runId = "none";
  std::chrono::milliseconds timeout{900'000};  // joining a round, waiting for peers
};

// Node 0 starts listening on A:P at once (IoError naming the holder if the
// port is taken); connecting and waiting happen in join(), off the agent's
// thread, and cancel() ends them at once.
std::unique_ptr<Rendezvous> makeStaticRendezvous(const StaticOptions& opts, Rendezvous::Post post);

}  // namespace ddprun::rendezvous
