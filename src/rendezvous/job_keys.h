// A dynamic-rendezvous job's keys in the store, and what any node writes or
// reads there on any thread's connection: the markers a state implies, the
// end of a round that the state backs, the tombstone of a round whose state
// another program deleted, changed or made invalid, and the cleanup of old
// rounds. The driver (dynamic_rendezvous.cc) decides when; this says how.
//
// Keys, under "ddprun/<run_id>/":
//   state                   the job's state (dynamic_state.h)
//   hb/<node id>            heartbeats (heartbeat.h)
//   round/<r>/complete      written once round r completed: the forming
//                           round's participants WAIT on it
//   round/<r>/worker_store  "host:port" of the round's worker store (group
//                           rank 0), or kNoWorkerStore once the round ended
//                           without one
//   round/<r>/done/<id>     node <id>'s workers all succeeded (a SET, so a
//                           report whose reply was lost is sent again)
//   round/<r>/end           how round r ended (round_end.h), copied from the
//                           state by whoever wrote the end, or anyone who
//                           finds it missing; the watchers WAIT on it
//   round/<r>/sizes, roster the round's local world sizes (RLE) and node
//                           ids in group-rank order (arrivals.h)
//   round/<r>/rank/<id>     node <id>'s placement in the complete round r
//                           (its reader deletes it)
//   round/<r>/finishing     the first node whose workers succeeded
//   round/<r>/succeeded     how many nodes' workers succeeded (an ADD each)
//   round/<r>/left/<id>     the node read round r's end (the host waits for
//                           these, bounded, before its store goes)
//   Round r-2's keys go when round r completes (group rank 0 deletes them;
//   each node its own left/<id> and done/<id>): a node still in round r-2 was dropped
//   two rounds ago.
//   arrivals                the job's arrival counter (dynamic_join.h)
//   arrival/<k>, verdict/<k> arrival k's node and what the folder decided
//                           (deleted by that node once read)
//   folder                  the folder's lease (fold_lease.h)
//   job, progress           the job's settings, and the forming round's
//                           progress as its folder last published it
//   id/<node id>            the node's claim on its id: a token only that
//                           instance knows (dynamic_rendezvous.cc claimId)
//
// Thread-safety: const and stateless beyond its configuration; every call
// works on the connection it is given.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ddprun/common/net.h"
#include "ddprun/rendezvous/rendezvous.h"
#include "ddprun/store/store.h"
#include "ddprun/store/tcp_store.h"
#include "dynamic_state.h"
#include "node_lease.h"

namespace ddprun::rendezvous::detail {

// What the node ending a round writes under round/<r>/worker_store when group
// rank 0 has not published one: the nodes waiting for it see the end.
inline const std::string kNoWorkerStore = "-";

// The worker store's address as read under `key`; a value that is not
// host:port with a port names the key and the likely cause (another job
// using --rdzv-id `runId` on this store): ProtocolError.
net::HostPort parseWorkerStore(const std::string& value, const std::string& key,
                               const std::string& runId);

// What is wrong with the state for a running round: `invalid`, it cannot be
// parsed or validated; otherwise it was deleted or describes something else.
struct Tamper {
  std::string why;
  bool invalid = false;
};

// Why `node` was dropped when its heartbeat connection closed for good.
inline std::string departedWhy(const std::string& node) {
  return describeNode(node) + " is gone: its connection to the rendezvous store closed";
}

class JobKeys {
 public:
  JobKeys(const std::string& runId, const Limits& lim)
      : runId_(runId), prefix_("ddprun/" + runId + "/"), lim_(lim) {}

  std::string stateKey() const { return prefix_ + "state"; }
  std::string key(int round, const std::string& name) const {
    return prefix_ + "round/" + std::to_string(round) + "/" + name;
  }
  // prefix + name for the job's other keys ("turn", "hb/").
  std::string jobKey(const std::string& name) const { return prefix_ + name; }
  // `node`'s heartbeat key and its tombstone (node_lease.h).
  NodeLeaseKeys leaseKeys(const std::string& node) const {
    return {jobKey("hb/" + node), jobKey("gone/" + node)};
  }

  // "the rendezvous state under K changed while round R ran (why); ...".
  std::string describeTamper(int round, const std::string& why) const;

  // The end key and the empty worker store of a round the state says ended
  // with `end` (first writer wins; a no-op when they exist).
  void writeEnd(store::Store& store, int round, const std::string& end) const;

  // The state for a check; nullopt if missing or invalid.
  std::optional<State> readState(store::Store& store,
                                 const std::shared_ptr<store::CancelToken>& token) const;

  // Ends `round` without its state: a closed state (a tombstone, by
  // `nodeId`) replaces `raw`, what the caller last read there, so that no
  // node starts the job again over the old rounds' keys; then the end key.
  // Invalid: the job closes on every node. Deleted or changed: the workers'
  // outcome decides (finished stays finished; a failure closes the job,
  // which has no state left to restart from). `node`: the caller's group
  // rank in `round`.
  void bury(store::Store& store, const std::string& raw, int round, RoundEnd kind, int node,
            const std::string& why, const Tamper& t, const std::string& nodeId) const;

  // Round `round`'s end as the state backs it (detail::trustedEnd), on a
  // watcher's connection; unless `verify` is false, then as its key says
  // (the state is O(nodes) bytes: at scale only a round's first kWatchers
  // group ranks verify, and the state's tampering is theirs to find). A key the state does not back (it says the round
  // still runs) was written by another program: deleted, then the genuine
  // end is awaited (whoever ends the round writes it again). Once per
  // `slice` while waiting, the state is read: an invalid one buries the
  // round at once (closed on every node), not only when a node's workers
  // end; a deleted or changed one is left to the reports.
  // `onSlice` (if set) runs after that read, every slice.
  RoundEvent awaitTrustedEnd(store::Store& store, int round,
                             const std::shared_ptr<store::CancelToken>& token,
                             std::chrono::milliseconds slice, const std::string& nodeId,
                             bool verify, const std::function<void()>& onSlice = nullptr) const;

  // What each participant of the complete round `s` reads (arrivals.h):
  // round/<r>/sizes and roster, then every participant's rank/<id>.
  // Idempotent; the caller writes round/<r>/complete after it.
  void publishRound(store::Store& store, const State& s) const;
  // Round `round`'s participants in group-rank order: its roster, or the
  // state while it still describes that round complete; nullopt if
  // neither does (another program deleted them).
  std::optional<std::vector<std::string>> roster(
      store::Store& store, int round, const std::shared_ptr<store::CancelToken>& token) const;

  // Deletes the keys of a round that ended two rounds ago (their readers
  // are gone); best effort.
  void forgetRound(store::Store& store, int round) const;
  // Best effort: `nodeId` read round `round`'s end (the host may stop its
  // store once every node has); its goodbye of two rounds ago goes.
  void sayLeft(store::Store& store, int round, const std::string& nodeId) const;

  // Claims id/<nodeId> for this instance: a compare_set of a token only it
  // knows (its reply is the same if it is sent again after a lost reply).
  // Another instance's token there means two agents drew the same id, which
  // must not merge into one node: Error, saying so. Returns the claim key
  // (deleted when the node leaves).
  std::string claimNodeId(store::Store& store, const std::string& nodeId) const;

 private:
  const std::string runId_;
  const std::string prefix_;
  const Limits lim_;
};

}  // namespace ddprun::rendezvous::detail
