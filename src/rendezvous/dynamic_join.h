// A dynamic-rendezvous node's join, O(1) store requests and bytes per join
// (arrivals.h): it arrives (one ADD, one value of its own), waits for its
// verdict and its place in the round on keys of its own, and folds the
// job's pending arrivals into the state itself when it holds the folder's
// lease (fold_lease.h). The rendezvous (dynamic_rendezvous.cc) gives it the
// task thread's connection, state cell and hooks, and turns its Placement
// into a RoundInfo.
//
// Not thread-safe: it runs on the rendezvous's task thread, on that
// thread's connection.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "arrivals.h"
#include "ddprun/rendezvous/dynamic_rendezvous.h"
#include "ddprun/store/store.h"
#include "dynamic_state.h"
#include "fold_lease.h"
#include "job_keys.h"
#include "state_cell.h"

namespace ddprun::rendezvous::detail {

struct JoinHooks {
  std::function<int64_t()> now;  // wall ms
  // Waits until every key exists (true) or wall ms `untilMs` (false).
  std::function<bool(const std::vector<std::string>& keys, int64_t untilMs)> waitUntil;
  // After every state read or write: the markers and the placements of a
  // complete round that nobody published (its folder died).
  std::function<void(store::Store& store, const State& s)> afterState;
  // The nodes to watch while a round forms.
  std::function<void(std::vector<std::string> peers)> watch;
  // Where the join stands (the rendezvous logs it and tells the agent).
  std::function<void(const JoinProgress& p)> progress;
  // The join deadline passed: the TimeoutError that follows is the join's
  // own (nodes are missing), not a store request's.
  std::function<void()> timingOut;
};

class Joiner {
 public:
  // For node `id` on the task thread's `store` and `cell`; `storeAddress`
  // for messages.
  Joiner(store::Store& store, StateCell& cell, const JobKeys& keys, const Limits& lim,
         const DynamicOptions& opts, const std::string& id, std::string storeAddress,
         JoinHooks hooks)
      : store_(store), cell_(cell), keys_(keys), lim_(lim), opts_(opts), id_(id),
        storeAddress_(std::move(storeAddress)), hooks_(std::move(hooks)),
        lease_(store, keys.jobKey("folder"), id, leaseMs(lim)) {}

  // Joins as `me` (id, nproc, host; seq is updated) until it takes part in
  // a complete round: its Placement. Throws ClosedError (the job is over),
  // InvalidArgument (too many nodes wait), JobMismatchError (other
  // settings), TimeoutError at `deadlineMs` (having left the forming round:
  // who came and who did not), ProtocolError (the state deleted or made
  // invalid under this node: the job is closed), CancelledError and store
  // errors.
  Placement join(NodeDesc& me, int64_t deadlineMs);

  // Whether this node has read anything of the job (then a missing state
  // is tampering, not a new job).
  bool seenJob() const { return seenJob_; }
  void setSeenJob() { seenJob_ = true; }

  // The folder's lease, given back at once (a join that failed).
  void releaseLease() { lease_.release(); }
  // At shutdown, on a connection of the leave's own: the arrival still
  // waiting for its verdict is withdrawn (a later fold skips it) and the
  // lease given back. Best effort.
  void withdraw(store::Store& via);

  // How long a folder's lease lasts: a stalled or dead folder is replaced
  // after it.
  static int64_t leaseMs(const Limits& lim);

 private:
  State readState();
  [[noreturn]] void giveUp(const NodeDesc& me);
  void checkSettings();
  int64_t arrive(const NodeDesc& me, std::string& text);
  Verdict awaitVerdict(int64_t k, const std::string& text, const NodeDesc& me,
                       int64_t deadlineMs);
  std::optional<Placement> awaitPlacement(int round, const NodeDesc& me, int64_t deadlineMs);
  void awaitEnd(int round, const Verdict& v);
  // Folds while this node holds the lease: until no arrival is pending and
  // no forming round has anyone in it, or `untilMs`.
  void fold(const NodeDesc& me, int64_t untilMs);
  State foldBatch(const State& seen, int64_t upTo, const NodeDesc& me);
  std::vector<std::optional<Arrival>> collect(int64_t first, int64_t last);
  void publishProgress(const State& s, const NodeDesc& me);
  void tellFromProgressKey(const Verdict& v);
  std::string peek(const std::string& key);
  bool due(int64_t& at, int64_t every);

  store::Store& store_;
  StateCell& cell_;
  const JobKeys& keys_;
  const Limits lim_;
  const DynamicOptions& opts_;
  const std::string id_;
  const std::string storeAddress_;
  const JoinHooks hooks_;
  FoldLease lease_;
  bool seenJob_ = false;
  bool jobKeyWritten_ = false;
  int64_t nextLook_ = 0;  // the next state read of a waiting node
  int64_t nextSay_ = 0;   // the next progress told
  int lastRound_ = 0;     // the latest round of a state read
  int64_t pending_ = 0;   // the arrival waiting for its verdict (0: none), and its value
  std::string pendingText_;
};

}  // namespace ddprun::rendezvous::detail
