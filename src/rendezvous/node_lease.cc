#include "node_lease.h"

#include "ddprun/common/error.h"
#include "ddprun/store/server_state.h"

namespace ddprun::rendezvous::detail {

bool leaseEnded(store::Store& store, const NodeLeaseKeys& k) {
  return store.check({k.tombstone}) && !store.check({k.beat});
}

bool lostForGood(store::Store& store, const NodeLeaseKeys& k) {
  if (!leaseEnded(store, k)) return false;
  try {
    return store.get(k.tombstone) != store::tombstoneValue(store::ConnEnd::kReset);
  } catch (const TimeoutError&) {
    return false;  // gone again meanwhile: it beats on a new connection
  }
}

bool beatsWithin(store::Store& store, const std::string& beatKey,
                 std::chrono::milliseconds left) {
  if (store.check({beatKey})) return true;
  if (left.count() <= 0) return false;
  try {
    store.wait({beatKey}, left);
  } catch (const TimeoutError&) {
    return false;
  }
  return true;
}

std::string peekValue(store::Store& store, const std::string& key) {
  static const std::string kSentinel = "\x01";  // never a value of ours
  std::string got = store.compareSet(key, kSentinel, kSentinel);
  return got == kSentinel ? std::string() : got;
}

}  // namespace ddprun::rendezvous::detail
