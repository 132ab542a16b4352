// The settings every multi-node rendezvous backend takes alike: the job's run
// id, the liveness beat and the store's shared secret. StaticOptions and
// DynamicOptions derive from it, so a source of configuration
// (agent::rendezvousSpec) fills these fields once for either backend and the
// backends read them as their own (opts.runId). A plain value type.
#pragma once

#include <chrono>
#include <string>

namespace ddprun::rendezvous {

struct CommonOptions {
  // --rdzv-id: names the job's keys in the store ("ddprun/<run_id>/...").
  std::string runId = "none";
  // Liveness (--rdzv-conf keep_alive_interval, keep_alive_max_attempt):
  // every node beats this often; a node silent for keepAliveInterval *
  // keepAliveMaxAttempt is dead (what follows is the backend's: see its
  // header).
  std::chrono::milliseconds keepAliveInterval{5'000};
  int keepAliveMaxAttempt = 3;
  // A node waiting in join says where the round stands this often (a log
  // line and its status endpoint: Rendezvous::setJoinProgressHandler).
  std::chrono::milliseconds joinProgressInterval{5'000};
  // The rendezvous store's shared secret (--rdzv-conf token_file, else
  // $DDPRUN_RDZV_TOKEN): the store admits only clients that know it, and
  // every connection of this agent proves it (docs/rendezvous.md,
  // "Authentication"); empty: open, as torchrun's. Never logged.
  std::string authSecret;
};

}  // namespace ddprun::rendezvous
