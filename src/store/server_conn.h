// ServerState's per-connection record, shared by server_state.cc and
// server_auth.cc (private to the store library).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/store/server_state.h"
#include "ddprun/store/wire.h"

namespace ddprun::store {

// Per-entry bookkeeping cost charged against maxMemoryBytes on top of the
// key and value bytes (hash node, string headers).
inline constexpr size_t kEntryOverhead = 64;

struct ServerState::Conn {
  ConnId id = 0;
  std::string detect;  // first bytes, until the dialect is known (<= 5)
  std::optional<wire::RequestParser> parser;
  std::string held;     // input not processed because of backpressure (charged)
  size_t unsent = 0;    // output charged and not yet reported sent()
  int64_t awaited = 0;  // keys still missing for a pending WAIT/BARRIER
  std::vector<std::string> waitKeys;   // each charged key + overhead
  std::vector<std::string> watchKeys;  // distinct; each charged key + overhead
  bool doomed = false;                 // closeLater() was asked; write nothing more
  bool authed = true;                  // see ServerAuth
  std::string nonce;                   // the challenge sent to it, once asked
  int authRequests = 0;                // requests made before authenticating
  // Keys this connection set under a lease prefix (some may have passed to
  // another connection since: leaseOwner_ decides).
  std::vector<std::string> leases;
};

}  // namespace ddprun::store
