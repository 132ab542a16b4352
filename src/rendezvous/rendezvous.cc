#include "ddprun/rendezvous/rendezvous.h"

#include "ddprun/common/error.h"

namespace ddprun::rendezvous {

const char* toString(RoundEnd kind) {
  switch (kind) {
    case RoundEnd::kFinished: return "finished";
    case RoundEnd::kFailed: return "failed";
    case RoundEnd::kClosed: return "closed";
    case RoundEnd::kMembershipChanged: return "membership changed";
    case RoundEnd::kStoreLost: return "store lost";
  }
  return "unknown";
}

RankLayout assignRanks(const std::vector<int>& localWorldSizes) {
  RankLayout layout;
  for (int n : localWorldSizes) {
    DDPRUN_CHECK(n > 0, "a node reported ", n, " local workers");
    layout.baseRanks.push_back(layout.worldSize);
    layout.worldSize += n;
  }
  return layout;
}

}  // namespace ddprun::rendezvous
