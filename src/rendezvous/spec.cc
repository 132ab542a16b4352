#include "ddprun/rendezvous/spec.h"

namespace ddprun::rendezvous {

const char* toString(RendezvousSpec::Kind kind) {
  switch (kind) {
    case RendezvousSpec::Kind::kLocal: return "local";
    case RendezvousSpec::Kind::kStatic: return "static";
    case RendezvousSpec::Kind::kDynamic: return "c10d";
  }
  return "?";
}

std::unique_ptr<Rendezvous> makeRendezvous(const RendezvousSpec& spec, Rendezvous::Post post) {
  switch (spec.kind) {
    case RendezvousSpec::Kind::kLocal: return makeLocalRendezvous(spec.local, std::move(post));
    case RendezvousSpec::Kind::kStatic: return makeStaticRendezvous(spec.fixed, std::move(post));
    case RendezvousSpec::Kind::kDynamic:
      return makeDynamicRendezvous(spec.dynamic, std::move(post));
  }
  return nullptr;
}

}  // namespace ddprun::rendezvous
