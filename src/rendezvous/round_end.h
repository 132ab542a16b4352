// How a round ended, as one string in the agent store (the static and the
// dynamic rendezvous's "round/<r>/end" key): "finished", or
// "<failed|closed|membership>:<node>:<why>" (the reason may contain ':').
// The first writer of a round's end wins (compare_set against "").
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "ddprun/rendezvous/rendezvous.h"
#include "ddprun/store/store.h"

namespace ddprun::rendezvous::detail {

// kFinished encodes as "finished" (node and why ignored); kStoreLost cannot
// be stored (InvalidArgument).
std::string encodeEnd(RoundEnd kind, int node, const std::string& why);
// ProtocolError naming `key` for anything else.
RoundEvent decodeEnd(int round, const std::string& key, const std::string& value);

// A watcher's wait, in two halves: the raw value once `endKey` exists
// (asking again every `slice`, by default every hour: rounds last as long as
// training does), and its decoding (junk there ends the job: kClosed, node
// -1, the ProtocolError's message). `onSlice` (if set) runs every `slice`
// while the key is missing. Store errors and CancelledError propagate.
std::string awaitEndValue(store::Store& store, const std::string& endKey,
                          std::chrono::milliseconds slice = std::chrono::hours(1),
                          const std::function<void()>& onSlice = nullptr);
RoundEvent decodeEndOrClose(int round, const std::string& endKey,
                            const std::string& value);

// Runs `request`, a node's report on a round (its outcome, a peer's death),
// on the rendezvous's task thread. A report that cannot be delivered is
// logged, not thrown: a warning naming `what`, or a debug line when it was
// cancelled (shutdown).
void sendReport(const std::string& what, const std::function<void()>& request);

}  // namespace ddprun::rendezvous::detail
