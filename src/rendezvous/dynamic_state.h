// The dynamic rendezvous's job state and its transitions, as pure values:
// no store, no clock (every transition takes `nowMs`, wall milliseconds), so
// that every rule and timeout is unit-tested with a fake clock.
//
// The state is one JSON document under "ddprun/<run_id>/state", changed only
// by compare_set: a node reads it, applies one of the transitions below to
// its copy, and writes it back against what it read; if the store holds
// something else, the node adopts that and applies the transition again.
//
// A round is forming (complete = false: nodes join; it completes at MAX, when
// every expected node has joined with >= MIN, or at the last-call deadline
// with >= MIN), then running (complete = true: the participants' workers run)
// until it ends. Ending a round records how (lastEnd, the round/<r>/end value)
// and opens the next round at once, forming, expecting the participants that
// remain plus the waiting and redundant nodes. The first end of a round wins.
//
// Fields (JSON names in brackets, short on purpose: 256 nodes must stay a
// few kilobytes):
//   round [r], complete [c], closed [x] + closedReason [why]
//   participants [p]: {id, n: nproc, s: arrival seq, h: hosts the endpoint};
//       join order while forming, group-rank order once complete
//   expected [e]: node ids the forming round waits for (the previous round's
//       survivors, waiting and redundant nodes)
//   waitList [w], redundancy [d]: {id, s} of nodes waiting for a round
//   lastCallMs [lc]: wall ms when a forming round with >= MIN completes (0: none)
//   restartCount [rc]: failed rounds of the job
//   lastEndedRound [er] and lastEnd [end]: the latest ended round and its
//       round/<r>/end value (so any node can write a key whose writer died)
//   nextSeq [ns]: the next arrival number
//
// Not thread-safe: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ddprun/rendezvous/rendezvous.h"

namespace ddprun::rendezvous::detail {

// A node as the state records it. The id is "<addr>_<pid>_<n>", fixed for
// an agent's life.
struct NodeDesc {
  std::string id;
  int nproc = 0;      // participants only
  int64_t seq = -1;   // first arrival in the job; -1: not assigned yet
  bool host = false;  // hosts the endpoint's store: group rank 0
};

struct State {
  int round = 0;
  bool complete = false;
  bool closed = false;
  std::string closedReason;
  std::vector<NodeDesc> participants;
  std::vector<std::string> expected;
  std::vector<NodeDesc> waitList;
  std::vector<NodeDesc> redundancy;
  int64_t lastCallMs = 0;
  int restartCount = 0;
  int lastEndedRound = -1;
  std::string lastEnd;
  int64_t nextSeq = 0;
};

struct Limits {
  int minNodes = 1;
  int maxNodes = 1;
  int64_t lastCallMs = 30'000;  // last_call_timeout
};

// "<addr>_<pid>_<n>"; "node <addr> (pid <pid>)" for messages (the id itself
// if it has not that form).
std::string makeNodeId(const std::string& addr, int64_t pid, int n);
std::string describeNode(const std::string& id);

std::string toJson(const State& s);
// ProtocolError naming `key` for anything that is not a state this code
// wrote (another program, or another job using the same run id).
State fromJson(const std::string& text, const std::string& key);

// Group rank of `id` in the state's participants, -1 if absent.
int rankOf(const State& s, const std::string& id);

// What join() found after one step.
enum class JoinOutcome {
  kClosed,        // the job is over
  kComplete,      // `me` takes part in the complete round s.round
  kWaitComplete,  // `me` joined the forming round s.round: wait for it to complete
  kWaitEnd,       // `me` waits (redundancy list) for the running round s.round to end
};

// One step of a node's join at `nowMs`: joins a forming round if it has room;
// at a running round, goes to the wait list and ends the round (membership)
// when it has room, else to the redundancy list; completes the round if due.
// Assigns me.seq on the first arrival (read it back from the state).
JoinOutcome joinStep(State& s, NodeDesc& me, const Limits& lim, int64_t nowMs);

// Completes the forming round if it is due at `nowMs` (see above): orders the
// participants (host first, then arrival) and clears the last call. True if
// it completed now.
bool completeIfDue(State& s, const Limits& lim, int64_t nowMs);

// Ends the running round `round` (no change, false, if s.round is another
// round, still forming, or already ended). Failed: restartCount + 1; closed
// and finished: the job closes. Opens round + 1, forming, expecting the
// participants other than `gone` plus the waiting and redundant nodes.
bool endRound(State& s, int round, RoundEnd kind, int node, const std::string& why,
              const std::string& gone = "");

// Removes a node that died or left from every list. A running round it took
// part in ends as membership changed with `why`; a forming round no longer
// waits for it (which may complete it, at `nowMs`). False if it was in none.
bool removeNode(State& s, const std::string& id, const std::string& why,
                const Limits& lim, int64_t nowMs);

// Closes the job (the first reason stays). False if already closed.
bool close(State& s, const std::string& reason);

// For a join that timed out: who joined, how many more are needed, who was
// expected but is missing.
std::string describeShortfall(const State& s, const Limits& lim);

}  // namespace ddprun::rendezvous::detail
