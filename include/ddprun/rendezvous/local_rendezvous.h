// The rendezvous of a one-node job: nothing to agree on. It hosts the round's
// worker store itself (a fresh server each round, so no worker reads a key
// from an earlier attempt; the previous round's server is stopped first): on
// port 0 (a free port: torchrun 2.x's one-node default and --standalone) or
// on a fixed --master-port. The round is node 0 alone: group rank 0, base
// rank 0, world size = the local world size. reportSuccess() ends the round as
// kFinished (node -1), reportFailure() as kFailed or kClosed (node 0); the
// first report of a round wins.
//
// Everything runs on the agent's thread without blocking; results and events
// are posted all the same. cancel() only marks it cancelled (thread-safe).
#pragma once

#include <memory>

#include "ddprun/rendezvous/rendezvous.h"

namespace ddprun::rendezvous {

struct LocalOptions {
  std::string host = "127.0.0.1";  // MASTER_ADDR given to the workers
  // Where the store listens. "" = every address, IPv6 and IPv4 where the host
  // has both: reachable as "127.0.0.1", "::1" and "localhost" whichever way
  // that resolves (tests/integration/rendezvous_test.cc checks all three).
  std::string bindHost;
  uint16_t port = 0;  // 0: a free port each round
};

// Throws nothing; a store that cannot listen fails the join with IoError
// naming the port, who holds it and the fix (another --master-port, or none).
std::unique_ptr<Rendezvous> makeLocalRendezvous(const LocalOptions& opts,
                                                Rendezvous::Post post);

}  // namespace ddprun::rendezvous
