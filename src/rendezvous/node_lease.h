// What the store says of a node's heartbeat lease (store::LeaseRule): its
// beat key "<job>hb/<node>", owned by the connection it beats on, and the
// tombstone "<job>gone/<node>" the store sets when that connection ends
// ("closed" by the node's process, or "reset"). Shared by the static and the
// dynamic rendezvous, which read it on the failure path and when a node's
// heartbeat connection ends.
//
// Each call is a few requests on the given store client; not thread-safe
// beyond that client's own guarantees. Cancellation is the client's
// (CancelledError propagates).
#pragma once

#include <chrono>
#include <string>

#include "ddprun/store/store.h"

namespace ddprun::rendezvous::detail {

struct NodeLeaseKeys {
  std::string beat;       // "<job>hb/<node>"
  std::string tombstone;  // "<job>gone/<node>"
};

// The node's heartbeat connection ended and no connection beats for it now.
// The tombstone is read first: the store then reads a closed owner's end.
bool leaseEnded(store::Store& store, const NodeLeaseKeys& k);

// leaseEnded, and the connection was closed by the node's process: a reset
// connection is no proof of death.
bool lostForGood(store::Store& store, const NodeLeaseKeys& k);

// Whether a connection beats for the node (its beat key exists) now or
// within `left` (<= 0: now only).
// The value under `key` in one request that never blocks ("" when it is
// missing): a compare_set that can never match returns the value, or (the
// store's answer for a missing key) the expected sentinel itself.
std::string peekValue(store::Store& store, const std::string& key);

bool beatsWithin(store::Store& store, const std::string& beatKey, std::chrono::milliseconds left);

}  // namespace ddprun::rendezvous::detail
