// Placeholder: being rewritten behind the Rendezvous interface (issue 9).
#include "ddprun/rendezvous/static_rendezvous.h"

#include "ddprun/common/error.h"

namespace ddprun::rendezvous {
std::unique_ptr<Rendezvous> makeStaticRendezvous(const StaticOptions&, Rendezvous::Post) {
  DDPRUN_THROW(InvalidArgument, "static rendezvous: not built yet");
}
}  // namespace ddprun::rendezvous
