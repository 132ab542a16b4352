// Static rendezvous across a fixed number of nodes (--nnodes N --node-rank R
// --master-addr A --master-port P), in rounds: one round per attempt, shared by
// every node, so restarts are counted once for the whole job.
//
// Node 0's agent hosts the agent store on A:P for its whole life; every agent
// is a client of it. Keys live under "ddprun/<run_id>/round/<r>/":
//   node/<i>      local world size of node i (the barrier of the round)
//   worker_store  port of the round's fresh worker store, hosted by node 0
//   done          nodes whose workers all succeeded (counter)
//   end           "finished" once every node is done; "failed:<node>:<why>"
//                 (every node stops and restarts into the next round) or
//                 "closed:<node>:<why>" (every node stops and exits). First wins.
// Not thread-safe except waitEnd(), which uses its own connection.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "ddprun/store/tcp_store.h"
#include "ddprun/store/tcp_store_server.h"

namespace ddprun::rendezvous {

using Millis = std::chrono::milliseconds;

struct StaticOptions {
  std::string masterAddr = "127.0.0.1";
  uint16_t masterPort = 29500;
  int nodeRank = 0;
  int nnodes = 1;
  std::string runId = "none";
  Millis timeout{900'000};  // joining a round, waiting for peers
};

struct RoundInfo {
  int groupRank = 0;
  int groupWorldSize = 1;
  int baseRank = 0;
  int worldSize = 0;
  std::string workerStoreHost;
  uint16_t workerStorePort = 0;
};

class StaticRendezvous {
 public:
  // Node 0 starts the agent store (IoError naming the holder if the port is
  // taken); every node connects to it (TimeoutError naming the address).
  static std::unique_ptr<StaticRendezvous> create(const StaticOptions& opts);

  // Announces this node's local world size for `round`, waits for every
  // node, and returns the ranks and the round's worker store. Node 0 starts
  // that store (port 0: a fresh one each round).
  RoundInfo join(int round, int localWorldSize);
  // Ends the round for everybody with kind "failed" or "closed" (see above),
  // unless it has already ended.
  void announceEnd(int round, const std::string& kind, const std::string& why);
  // Counts this node as done; the last one ends the round as "finished".
  void announceSuccess(int round);
  // Blocks until the round ends and returns the end value. Thread-safe: it
  // opens its own connection. Throws TimeoutError after opts.timeout.
  std::string waitEnd(int round) const;

  const StaticOptions& options() const { return opts_; }

 private:
  explicit StaticRendezvous(StaticOptions opts) : opts_(std::move(opts)) {}
  std::string key(int round, const std::string& name) const;
  store::TcpStoreOptions clientOptions() const;

  StaticOptions opts_;
  std::unique_ptr<store::TcpStoreServer> agentStore_;   // node 0 only
  std::unique_ptr<store::TcpStoreServer> workerStore_;  // node 0 only, per round
  std::unique_ptr<store::TcpStore> client_;
};

}  // namespace ddprun::rendezvous
