// The checks of the elastic rendezvous's options (--nnodes, --rdzv-conf,
// --rdzv-id, --rdzv-endpoint), made before anything binds or connects.
#include <utility>

#include "ddprun/common/error.h"
#include "dynamic_rendezvous_internal.h"
#include "dynamic_state.h"

namespace ddprun::rendezvous::detail {

void validate(const DynamicOptions& o) {
  DDPRUN_CHECK(o.minNodes >= 1 && o.minNodes <= o.maxNodes,
               "--nnodes MIN:MAX needs 1 <= MIN <= MAX, got ", o.minNodes, ":",
               o.maxNodes);
  DDPRUN_CHECK(o.maxNodes <= detail::kMaxNodesEver, "--nnodes MAX must be at most ",
               detail::kMaxNodesEver, ", got ", o.maxNodes);
  for (auto [name, v] : {std::pair{"join_timeout", o.joinTimeout},
                         {"last_call_timeout", o.lastCallTimeout},
                         {"close_timeout", o.closeTimeout},
                         {"read_timeout", o.readTimeout},
                         {"keep_alive_interval", o.keepAliveInterval}})
    DDPRUN_CHECK(v.count() > 0, "--rdzv-conf ", name, " must be positive");
  DDPRUN_CHECK(o.keepAliveMaxAttempt >= 1,
               "--rdzv-conf keep_alive_max_attempt must be at least 1, got ",
               o.keepAliveMaxAttempt);
  DDPRUN_CHECK(!o.runId.empty(), "--rdzv-id must not be empty");
  DDPRUN_CHECK(!o.endpointHost.empty(), "--rdzv-endpoint needs a host");
}

}  // namespace ddprun::rendezvous::detail
