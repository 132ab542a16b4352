// Which rendezvous a node uses, as a value: the configuration (flags, a
// cluster manager's environment) yields a RendezvousSpec, and makeRendezvous
// builds the backend from it. The agent knows only the Rendezvous interface;
// what differs by backend (what a signal means, whether the job spans nodes)
// is asked of the Rendezvous itself. A new backend or a new source of
// configuration touches no agent code.
#pragma once

#include <memory>

#include "ddprun/rendezvous/dynamic_rendezvous.h"
#include "ddprun/rendezvous/local_rendezvous.h"
#include "ddprun/rendezvous/rendezvous.h"
#include "ddprun/rendezvous/static_rendezvous.h"

namespace ddprun::rendezvous {

struct RendezvousSpec {
  enum class Kind {
    kLocal,    // one node: no agent store, a worker store per round
    kStatic,   // a fixed set of nodes (--nnodes N --node-rank R)
    kDynamic,  // c10d-style, elastic (--rdzv-backend c10d, --nnodes MIN:MAX)
  };
  Kind kind = Kind::kLocal;
  LocalOptions local;        // for kLocal
  StaticOptions fixed;       // for kStatic
  DynamicOptions dynamic;    // for kDynamic
};

const char* toString(RendezvousSpec::Kind kind);

// Builds the backend `spec` names; its results are posted through `post`.
// Throws what that backend's factory throws (InvalidArgument for options that
// can never work, IoError for a port that cannot be bound).
std::unique_ptr<Rendezvous> makeRendezvous(const RendezvousSpec& spec, Rendezvous::Post post);

}  // namespace ddprun::rendezvous
