// The rendezvous of a one-node job: nothing to agree on. It hosts the round's
// worker store itself (a fresh server each round, so no worker reads a key
// from an earlier attempt): on port 0 (a free port: torchrun 2.x's one-node
// default and --standalone) or on a fixed --master-port.
#pragma once

#include <memory>

#include "ddprun/rendezvous/rendezvous.h"

namespace ddprun::rendezvous {

struct LocalOptions {
  std::string host = "127.0.0.1";  // MASTER_ADDR given to the workers
  std::string bindHost;            // where the store listens ("" = every address)
  uint16_t port = 0;               // 0: a free port each round
};

// Throws nothing; a store that cannot listen fails the join with IoError
// naming the port and who holds it.
std::unique_ptr<Rendezvous> makeLocalRendezvous(const LocalOptions& opts, Rendezvous::Post post);

}  // namespace ddprun::rendezvous
