// Leases: keys bound to the connection that set them (LeaseRule in
// server_state.h). Part of ServerState, on the server's one thread.
//
// Bookkeeping: leaseOwner_ maps every leased key to the connection that set
// it last; each connection lists the leased keys it set (Conn::leases), so
// that its close finds them without a scan. A key that passed to another
// connection stays in the first one's list; leaseOwner_ decides whose it
// is. Each leased key is charged kLeaseCost against the memory budget while
// it is leased.
#include <algorithm>

#include "ddprun/store/server_state.h"
#include "server_conn.h"

namespace ddprun::store {

namespace {
// The map node and the key's copy in the owner's list.
size_t leaseCost(const std::string& key) { return 2 * key.size() + 96; }

bool startsWith(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}
}  // namespace

void ServerState::addLeaseRule(LeaseRule rule) { leaseRules_.push_back(std::move(rule)); }

const LeaseRule* ServerState::leaseRuleOf(const std::string& key) const {
  for (const auto& r : leaseRules_)
    if (startsWith(key, r.prefix)) return &r;
  return nullptr;
}

std::string ServerState::bindLease(Conn& c, const std::string& key) {
  if (!leaseRuleOf(key)) return {};
  auto it = leaseOwner_.find(key);
  if (it != leaseOwner_.end()) {
    if (it->second == c.id) return {};
    it->second = c.id;  // the old owner's list entry is now stale
  } else {
    std::string error;
    if (!reserve(leaseCost(key), error)) return error;
    leaseOwner_.emplace(key, c.id);
  }
  c.leases.push_back(key);
  return {};
}

void ServerState::forgetLease(const std::string& key) {
  auto it = leaseOwner_.find(key);
  if (it == leaseOwner_.end()) return;
  leaseOwner_.erase(it);
  release(leaseCost(key));
}

// The connection is gone (or its peer closed its end): every key it still
// owns is deleted and tombstoned, then each rule's onEnded runs.
void ServerState::endLeases(Conn& c) {
  std::vector<std::string> keys = std::move(c.leases);
  c.leases.clear();
  for (const auto& key : keys) {
    auto owner = leaseOwner_.find(key);
    if (owner == leaseOwner_.end() || owner->second != c.id) continue;  // passed on
    forgetLease(key);
    const LeaseRule* rule = leaseRuleOf(key);
    if (!rule) continue;
    const std::string name = key.substr(rule->prefix.size());
    auto kv = kv_.find(key);
    if (kv != kv_.end()) {
      release(key.size() + kv->second.size() + kEntryOverhead);
      if (!watchers_.empty()) notifyWatchers(key, wire::kKeyDeleted, kv->second, "");
      kv_.erase(kv);
    }
    // Refused only when the memory budget is spent: the key is gone all the
    // same, and the callback still runs (readers of the tombstone then see
    // nothing, and fall back on their own timeouts).
    doSet(rule->tombstonePrefix + name, "");
    if (rule->onEnded) rule->onEnded(name);
  }
}

void ServerState::probeTombstones(const Conn& reader, const std::vector<std::string>& keys) {
  for (const auto& k : keys) {
    for (const auto& rule : leaseRules_) {
      if (!startsWith(k, rule.tombstonePrefix)) continue;
      auto owner = leaseOwner_.find(rule.prefix + k.substr(rule.tombstonePrefix.size()));
      if (owner == leaseOwner_.end() || owner->second == reader.id) continue;
      auto conn = conns_.find(owner->second);
      if (conn != conns_.end() && outbox_.peerClosed(owner->second)) endLeases(*conn->second);
    }
  }
}

}  // namespace ddprun::store
