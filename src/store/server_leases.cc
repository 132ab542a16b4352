// Leases: keys bound to the connection that set them (LeaseRule in
// server_state.h). Part of ServerState, on the server's one thread.
//
// Bookkeeping: leaseOwner_ maps every leased key to the connection that set
// it last; each connection lists the leased keys it set (Conn::leases), so
// that its close finds them without a scan. A key that passed to another
// connection stays in the first one's list; leaseOwner_ decides whose it
// is. Each leased key is charged kLeaseCost against the memory budget while
// it is leased.
//
// A tombstone describes one connection's end: it exists only while no
// connection owns the key, so it goes (as DELETE_KEY would) when a new
// connection takes the key, and no client may write under a tombstone prefix.
#include <algorithm>

#include "ddprun/common/strings.h"
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
  const LeaseRule* rule = leaseRuleOf(key);
  if (!rule) return {};
  auto it = leaseOwner_.find(key);
  if (it != leaseOwner_.end()) {
    if (it->second == c.id) return {};
    it->second = c.id;  // the old owner's list entry is now stale
  } else {
    std::string error;
    if (!reserve(leaseCost(key), error)) return error;
    leaseOwner_.emplace(key, c.id);
    // Owned again (the node beats on a new connection): the end of its last
    // connection is history, not news.
    eraseKey(rule->tombstonePrefix + key.substr(rule->prefix.size()));
  }
  c.leases.push_back(key);
  return {};
}

const LeaseRule* ServerState::tombstoneRuleOf(const std::string& key) const {
  for (const auto& r : leaseRules_)
    if (startsWith(key, r.tombstonePrefix)) return &r;
  return nullptr;
}

// Tombstones are the server's word on a connection's end: a client that
// could write one would make a live node look dead (or a dead one alive).
std::string ServerState::refuseTombstoneWrite(const wire::Request& r) const {
  switch (r.cmd) {
    case wire::Command::kSet:
    case wire::Command::kCompareSet:
    case wire::Command::kAdd:
    case wire::Command::kAppend:
    case wire::Command::kMultiSet:
    case wire::Command::kDeleteKey:
    case wire::Command::kQueuePush:
    case wire::Command::kQueuePop:
    case wire::Command::kBarrier: break;
    default: return {};
  }
  for (const auto& k : r.keys) {
    const LeaseRule* rule = tombstoneRuleOf(k);
    if (!rule) continue;
    return std::string(wire::commandName(r.cmd)) + " of key '" + str::escape(k, 128) +
           "' refused: keys under '" + str::escape(rule->tombstonePrefix, 128) +
           "' are lease tombstones that only the store writes (write elsewhere)";
  }
  return {};
}

void ServerState::forgetLease(const std::string& key) {
  auto it = leaseOwner_.find(key);
  if (it == leaseOwner_.end()) return;
  leaseOwner_.erase(it);
  release(leaseCost(key));
}

const char* tombstoneValue(ConnEnd how) { return how == ConnEnd::kReset ? "reset" : "closed"; }

// The connection is gone (or its peer closed its end): every key it still
// owns is deleted and tombstoned with how it ended, then each rule's onEnded
// runs.
void ServerState::endLeases(Conn& c, ConnEnd how) {
  std::vector<std::string> keys = std::move(c.leases);
  c.leases.clear();
  for (const auto& key : keys) {
    auto owner = leaseOwner_.find(key);
    if (owner == leaseOwner_.end() || owner->second != c.id) continue;  // passed on
    forgetLease(key);
    const LeaseRule* rule = leaseRuleOf(key);
    if (!rule) continue;
    const std::string name = key.substr(rule->prefix.size());
    eraseKey(key);
    // Refused only when the memory budget is spent: the key is gone all the
    // same, and the callback still runs (readers of the tombstone then see
    // nothing, and fall back on their own timeouts).
    doSet(rule->tombstonePrefix + name, tombstoneValue(how));
    if (rule->onEnded) rule->onEnded(name, how);
  }
}

void ServerState::probeTombstones(const Conn& reader, const std::vector<std::string>& keys) {
  for (const auto& k : keys) {
    for (const auto& rule : leaseRules_) {
      if (!startsWith(k, rule.tombstonePrefix)) continue;
      auto owner = leaseOwner_.find(rule.prefix + k.substr(rule.tombstonePrefix.size()));
      if (owner == leaseOwner_.end() || owner->second == reader.id) continue;
      auto conn = conns_.find(owner->second);
      if (conn != conns_.end() && outbox_.peerClosed(owner->second))
        endLeases(*conn->second, outbox_.peerEnd(owner->second));
    }
  }
}

}  // namespace ddprun::store
