// Placeholder: implemented on the dynamic branch.
#include "ddprun/rendezvous/dynamic_rendezvous.h"

#include "ddprun/common/error.h"

namespace ddprun::rendezvous {

std::unique_ptr<Rendezvous> makeDynamicRendezvous(const DynamicOptions&, Rendezvous::Post) {
  DDPRUN_THROW(InvalidArgument, "the dynamic rendezvous is not built yet");
}

}  // namespace ddprun::rendezvous
