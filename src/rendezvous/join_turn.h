// Joins of a dynamic rendezvous take turns: nodes arriving together would
// otherwise all miss but one at every compare_set of the state, each retry
// parsing and writing the whole state (O(nodes^2) work: seconds for 256
// nodes on two cores). A ticket from a counter orders them; each waits for
// its predecessor's turn key, does its compare_set, and writes its own. Only
// an optimisation: the compare_set stays correct without it, so a
// predecessor that died (or is slow) holds the next one up for `patience`
// at most, and a ticket whose reply was lost costs only the turn.
//
// Not thread-safe: a Turn is used by the thread that took it, on its store.
#pragma once

#include <chrono>
#include <string>

#include "ddprun/store/store.h"

namespace ddprun::rendezvous::detail {

// A turn held: release() (or destruction) writes its key, which lets the
// next ticket's holder go. An empty Turn holds nothing.
class Turn {
 public:
  Turn() = default;
  Turn(store::Store* store, std::string key) : store_(store), key_(std::move(key)) {}
  Turn(Turn&& o) noexcept;
  Turn& operator=(Turn&&) = delete;
  ~Turn() { release(); }
  // Best effort: a store error only makes the next one wait a moment longer.
  void release();

 private:
  store::Store* store_ = nullptr;
  std::string key_;
};

// Takes a ticket from the counter `counterKey` and waits (at most
// `patience`) for the turn key `turnPrefix` + <ticket - 1>. A ticket whose
// outcome is unknown (store::UnconfirmedError: the ADD went out, its reply
// was lost) gives an empty Turn: this node joins without one, and the holder
// of the next ticket waits `patience` for the turn nobody passes on. Other
// store errors (a store out of reach) propagate.
Turn takeTurn(store::Store& store, const std::string& counterKey,
              const std::string& turnPrefix, std::chrono::milliseconds patience);

}  // namespace ddprun::rendezvous::detail
