// One interface for every rendezvous backend: how the agents of a job agree,
// round after round, on who takes part, on the ranks, and on the round's
// worker store, and how they learn that a round has ended.
//
// A round is one attempt of the job's workers. The agent calls join(), starts
// its workers with the RoundInfo, and reports how they did; the rendezvous
// tells the agent how the round ended everywhere (finished, failed on some
// node, closed, membership changed) as typed RoundEvents.
//
// Threading: every call is made from the agent's one thread and never blocks
// it for long (at most one store request). Results and events are delivered
// through the `Post` function given to the factory, i.e. on the agent's
// thread. cancel() may be called from any thread. Implementations: local (one
// node: no agent store, it hosts each round's worker store), static (a fixed
// set of nodes), dynamic (c10d-style, elastic: --nnodes MIN:MAX) — the agent
// does not know which one it talks to.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/common/error.h"

namespace ddprun::rendezvous {

// join() found the job over (it finished, or a node closed it after the
// last restart). A node that never joined has nothing to do: the agent
// prints the message and exits 0, as torchrun does on RendezvousClosedError.
// A node that ran workers of this job and is joining again after a round
// ended exits with the job's result: finished() says whether the job's last
// round ended with every node's workers succeeded.
class ClosedError : public Error {
 public:
  ClosedError(const std::string& msg, const char* file = "", int line = 0,
              bool finished = false)
      : Error(msg, file, line), finished_(finished) {}
  bool finished() const { return finished_; }

 private:
  bool finished_;
};

// What a completed join gives this node.
struct RoundInfo {
  int round = 0;           // 0, 1, 2, ... for the whole job
  int groupRank = 0;       // this node's rank in the round
  int groupWorldSize = 1;  // nodes in the round
  int baseRank = 0;        // global rank of this node's local rank 0
  int worldSize = 0;       // workers across all nodes
  std::vector<int> localWorldSizes;  // per group rank
  std::string workerStoreHost;       // MASTER_ADDR for the workers
  uint16_t workerStorePort = 0;      // MASTER_PORT for the workers
  // Failed rounds of the whole job before this one, as the rendezvous keeps
  // it in its store (the same on every node: TORCHELASTIC_RESTART_COUNT);
  // -1 when the backend does not keep one and the agent counts for itself.
  int restartCount = -1;
};

// How a round ended, as seen by every node.
enum class RoundEnd {
  kFinished,           // every node's workers succeeded
  kFailed,             // a node's workers failed: stop and join the next round
  kClosed,             // the job is over (restarts used up, or a node gave up)
  kMembershipChanged,  // nodes arrived, left or died: restart without counting a failure
  kStoreLost,          // the rendezvous store is gone
};

struct RoundEvent {
  int round = 0;
  RoundEnd kind = RoundEnd::kFinished;
  int node = -1;       // the node that caused it (group rank), -1 if none
  std::string reason;  // human-readable: "rank 3 exited with 1", ...
};

const char* toString(RoundEnd kind);

// Where a pending join stands: what the agent's log says every few seconds
// while it waits, and what its status endpoint shows (docs/status.md). A
// plain value, published by the backend at each look at the round it waits
// for (through the Post function: on the agent's thread).
struct JoinProgress {
  int round = -1;       // the round this node waits for
  int joined = 0;       // nodes in it so far
  int minNodes = 0;     // the job's --nnodes
  int maxNodes = 0;
  // Nodes the round waits for by name (the last round's survivors, or the
  // static job's nodes): how many, and the first few that have not joined.
  int expected = 0;
  int missingCount = 0;
  std::vector<std::string> missing;  // "node <addr> (pid P)", at most kListed
  // Seconds until the last call completes the round with whoever joined
  // (elastic, MIN reached); negative: no last call is running.
  double lastCallSeconds = -1;
  double waitingSeconds = 0;  // since this join began
  // What the node waits for, when not simply for nodes: "the running round
  // to end (the job has --nnodes' maximum of nodes)" and the like.
  std::string waitingFor;
  static constexpr size_t kListed = 8;
};

// One line for the log and the status table: "round 2: 3 of 4 nodes joined
// (min 2, max 4); last call in 12 s; expected but missing: node a (pid 1)".
std::string describe(const JoinProgress& p);

class Rendezvous {
 public:
  using Post = std::function<void(std::function<void()>)>;
  // Exactly one of error / info is meaningful: error is null on success.
  using JoinHandler = std::function<void(std::exception_ptr error, RoundInfo info)>;
  using EventHandler = std::function<void(RoundEvent event)>;

  virtual ~Rendezvous() = default;

  // Events of the rounds this node joined are passed to `handler` (on the
  // agent's thread), at most one per round; events a node caused itself are
  // passed too (the agent ignores what it already knows). Call once, first.
  virtual void setEventHandler(EventHandler handler) = 0;
  // While a join waits, `handler` hears where it stands (on the agent's
  // thread) at least every CommonOptions::joinProgressInterval; backends
  // that never wait (one node) never call it. Call before join().
  using JoinProgressHandler = std::function<void(const JoinProgress&)>;
  virtual void setJoinProgressHandler(JoinProgressHandler handler) { (void)handler; }

  // Joins the next round with this node's number of workers. `done` runs on
  // the agent's thread with the round's info, or with an error: TimeoutError
  // (peers missing; the message names them), CancelledError (cancel() was
  // called), IoError (store unreachable), ClosedError (the job is over; see
  // there for the exit code). Never call again before `done` ran.
  virtual void join(int localWorldSize, JoinHandler done) = 0;

  // This node's workers of `round` all succeeded. The round ends as
  // kFinished once every node has said so.
  virtual void reportSuccess(int round) = 0;
  // This node's workers of `round` failed (`why` names the rank and exit);
  // ends the round for everybody, as kClosed when `closeJob` (no restarts
  // left) else kFailed. The first report of a round wins.
  virtual void reportFailure(int round, const std::string& why, bool closeJob) = 0;

  // This node leaves for good (job over, or a signal): no more events;
  // pending joins end with CancelledError. Idempotent.
  virtual void shutdown() = 0;
  // Abandons any blocking wait at once (thread-safe, also from a signal
  // path): a pending join ends with CancelledError. It is for leaving in a
  // hurry and cannot be undone: later joins end with CancelledError, reports
  // are dropped and no more events arrive; call shutdown() next. To leave
  // after reporting (the peers must hear of it), call shutdown() alone.
  virtual void cancel() = 0;

  // Whether a failure reported here may end its round as kMembershipChanged
  // instead, because a peer node of the round is found gone (its workers'
  // failure followed from that loss): the agent then decides what its
  // failure costs only once the round's event arrives. False: the round
  // ends as reported.
  virtual bool absorbsFailuresOfLostPeers() const { return false; }
  // What a signal to this node means for the others: true, the job cannot
  // go on without it (the agent reports a closing failure); false, the node
  // just leaves and the others re-form without it (elastic).
  virtual bool closesJobOnSignal() const { return true; }
  // Whether the job spans nodes (the start line then names the backend).
  virtual bool spansNodes() const { return true; }
  // One line for the start message: "static, node 1 of 2, store 10.0.0.1:29500".
  virtual std::string describe() const = 0;
  // This node's heartbeats that did not reach the store so far (the status
  // endpoint's ddprun_heartbeats_missed_total); 0 for a backend without
  // heartbeats. Thread-safe.
  virtual uint64_t heartbeatsMissed() const { return 0; }
};

// Global rank offsets for nodes with the given local world sizes, in group
// rank order: baseRanks[i] = sum of sizes before i; worldSize = the total.
struct RankLayout {
  std::vector<int> baseRanks;
  int worldSize = 0;
};
RankLayout assignRanks(const std::vector<int>& localWorldSizes);

}  // namespace ddprun::rendezvous
