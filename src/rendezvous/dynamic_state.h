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
//   folded [af]: the job's arrivals (arrivals.h) folded into the state so
//       far: arrival numbers 1..af are decided (0 when absent)
//   finishing [f]: a node of the running round succeeded (only when true)
//   job [j]: the job-wide settings, recorded by the node that created the
//       state: {n: "MIN:MAX", lc: last_call_timeout ms, hb: heartbeat
//       timeout ms, by: node id}; a node whose own differ is refused
//
// Everything read from the store is checked before use: the raw value's
// size against what MAX nodes can need (before parsing), every integer as
// int64 against explicit bounds (never narrowed, never wrapped), then the
// whole against this job's settings (validate()).
//
// Not thread-safe: plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddprun/rendezvous/rendezvous.h"

namespace ddprun::rendezvous::detail {

// A node as the state records it. The id is "<addr>_<pid>_<nonce>"
// (makeNodeId), fixed for an agent's life.
struct NodeDesc {
  std::string id;
  int nproc = 0;      // participants only
  int64_t seq = -1;   // first arrival in the job; -1: not assigned yet
  bool host = false;  // hosts the endpoint's store: group rank 0
};

// The settings every node of a job must share (see job [j] above).
struct JobSettings {
  int minNodes = 0;  // 0: not recorded (a state that was never written)
  int maxNodes = 0;
  int64_t lastCallMs = 0;
  int64_t heartbeatMs = 0;
  std::string by;  // the node that created the state
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
  int64_t folded = 0;
  // A node of the running round reported that its workers succeeded: the
  // round is ending (finished, or failed), so a newcomer waits for that end
  // instead of ending the round (that would re-run finished workers).
  bool finishing = false;
  JobSettings job;
};

// This node's settings of the job (see JobSettings).
struct Limits {
  int minNodes = 1;
  int maxNodes = 1;
  int64_t lastCallMs = 30'000;   // last_call_timeout
  int64_t heartbeatMs = 15'000;  // keep_alive_interval * keep_alive_max_attempt
};

// Bounds on what a state may hold. Rounds stop (the job closes) at kMaxRound
// rather than wrap; nproc, sequence numbers, ids and texts are bounded so
// that no sum or increment of them overflows.
constexpr int64_t kMaxRound = 2'147'483'646;   // INT32_MAX - 1
constexpr int64_t kMaxNproc = 4'096;           // workers of one node
constexpr int64_t kMaxSeq = int64_t{1} << 40;  // arrivals in one job
constexpr size_t kMaxIdBytes = 256;            // a node id
constexpr size_t kMaxTextBytes = 4'096;        // a closed reason, a round's end
// Nodes that may wait (wait list + redundancy list) beyond the MAX
// participants; a node beyond these is refused (JoinOutcome::kFull).
int64_t waitingCap(int maxNodes);
// The largest state a job of `maxNodes` can legitimately write: a raw value
// above it is refused before it is parsed.
size_t maxStateBytes(int maxNodes);

// "<addr>_<pid>_<nonce>": the address and pid for the humans, the nonce (a
// random token per rendezvous instance, kNodeNonceChars of [a-z0-9]) so that
// two agents with the same address and pid (containers with host
// networking, each running ddprun as PID 1) never share an id.
// describeNode: "node <addr> (pid <pid>)" for messages (the id itself if it
// has not that form).
constexpr size_t kNodeNonceChars = 12;  // 36^12: about 62 bits
std::string makeNodeId(const std::string& addr, int64_t pid, const std::string& nonce);
// What a state accepts as a node id: 1 to kMaxIdBytes of [A-Za-z0-9._:%[]-].
bool isValidNodeId(const std::string& id);
std::string describeNode(const std::string& id);

std::string toJson(const State& s);
// ProtocolError naming `key` (and what is wrong) for anything that is not a
// state this code wrote (another program, or another job using the same run
// id): junk, a value larger than maxStateBytes(lim.maxNodes) (checked before
// parsing), an integer out of its bounds. Does not check the state against
// the job's settings: see jobMismatch() and validate().
State fromJson(const std::string& text, const std::string& key, const Limits& lim);
// For tests and tools: with a bound of kMaxNodesEver nodes.
State fromJson(const std::string& text, const std::string& key);
constexpr int kMaxNodesEver = 65'536;

// The job's settings alone (the job key, job_keys.h: a joining node checks
// its own against them without reading the state). jobFromText: nullopt
// for anything that is not such a value (the state then decides).
std::string jobToText(const JobSettings& job);
std::optional<JobSettings> jobFromText(const std::string& text);

// How this node's settings differ from the job's recorded in `s` ("" if they
// do not, or none are recorded): "--nnodes 1:2 differs from the job's 3:4
// (set by node X (pid P))".
std::string jobMismatch(const State& s, const Limits& lim);
// Whether `s` is a state this job can be in, given its settings (assumes no
// jobMismatch): participant counts within MIN..MAX, ids unique, at most one
// host, seqs below the next one, rounds and the restart count consistent,
// the last end decodable, the sum of nproc a valid WORLD_SIZE. "" if valid,
// else the first thing wrong.
std::string validate(const State& s, const Limits& lim);

// Group rank of `id` in the state's participants, -1 if absent.
int rankOf(const State& s, const std::string& id);

// Whether `id` is in any of the state's lists (participants, expected, wait
// list, redundancy): a node the job still counts on, or waits for.
bool isListed(const State& s, const std::string& id);

// What join() found after one step.
enum class JoinOutcome {
  kClosed,        // the job is over
  kComplete,      // `me` takes part in the complete round s.round
  kWaitComplete,  // `me` joined the forming round s.round: wait for it to complete
  kWaitEnd,       // `me` waits (redundancy list) for the running round s.round to end
  kFull,          // waitingCap nodes already wait: `me` is refused, s unchanged
};

// One step of a node's join at `nowMs`: joins a forming round if it has room;
// at a running round, goes to the wait list and ends the round (membership)
// when it has room (only waits, when the round is finishing), else to the
// redundancy list; completes the round if due.
// Assigns me.seq on the first arrival (read it back from the state). The
// first join of a job records the job's settings (`lim`, by `me`).
// Precondition: jobMismatch(s, lim) is "".
JoinOutcome joinStep(State& s, NodeDesc& me, const Limits& lim, int64_t nowMs);
// The same, for a caller that knows whether `me` is among s.participants
// (a fold of thousands of arrivals keeps a set: the lookup is the only
// O(N) part of a step).
JoinOutcome joinStep(State& s, NodeDesc& me, const Limits& lim, int64_t nowMs,
                     bool participant);

// Completes the forming round if it is due at `nowMs` (see above): orders the
// participants (host first, then arrival) and clears the last call. True if
// it completed now.
bool completeIfDue(State& s, const Limits& lim, int64_t nowMs);

// Ends the running round `round` (no change, false, if s.round is another
// round, still forming, or already ended). Failed: restartCount + 1; closed
// and finished: the job closes. Opens round + 1, forming, expecting the
// participants other than `gone` plus the waiting and redundant nodes; the
// job closes when round + 1 reaches kMaxRound. `why` is cut to kMaxTextBytes.
bool endRound(State& s, int round, RoundEnd kind, int node, const std::string& why,
              const std::string& gone = "");

// Removes a node that died or left from every list. A running round it took
// part in ends as membership changed with `why`; a forming round no longer
// waits for it (which may complete it, at `nowMs`). False if it was in none.
bool removeNode(State& s, const std::string& id, const std::string& why,
                const Limits& lim, int64_t nowMs);

// A node's workers of the running round `round` succeeded: marks it
// finishing (see State). False if it already was, or `round` is not running.
bool markFinishing(State& s, int round);

// Closes the job (the first reason stays). False if already closed.
bool close(State& s, const std::string& reason);

// Whether `s` (nullopt: no state in the store) still describes the running
// round `round` that `me` takes part in, or its legitimate end: "" if so (the
// round runs, or the state records that it ended), else what is wrong ("the
// state was deleted", "the state says round 0 is forming"...). A state
// changed that way means something else than this job's nodes wrote it.
std::string roundTampered(const std::optional<State>& s, int round,
                          const std::string& me);

// What ended round `round` if its end key holds `value`, checked against
// the state (nullopt: missing or invalid, nothing to check against): the
// state's own record when it has one for that round (a different key value
// was forged), nullopt when the state says the round is still running (the
// key was forged: every genuine end is recorded in the state before its
// key is written), else `value`.
std::optional<std::string> trustedEnd(const std::optional<State>& s, int round,
                                      const std::string& value);

// The state left behind once tampering ended round `round` (its state was
// deleted, changed or invalid): closed with `why`, round `round` ended as
// `end`, the job's settings `lim` (by `me`). Later joins get a ClosedError
// naming `why`, never a state that cannot be parsed.
State tombstone(int round, const std::string& end, const std::string& why,
                const Limits& lim, const std::string& me);

// For a join that timed out: who joined, how many more are needed, who was
// expected but is missing (each list cut to its first
// JoinProgress::kListed nodes and a count of the rest).
std::string describeShortfall(const State& s, const Limits& lim);

// The nodes `me` watches for liveness in `s`: of the round's participants
// and expected nodes (and `me`), the kWatchers that follow `me` in the order
// of a hash of their ids, wrapping around; every other node when there are
// at most kWatchers + 1 in all. So each node is watched by kWatchers others
// (its predecessors in that order) and each watcher reads kWatchers beats
// per interval, whatever the job's size (watching everyone was N^2 reads a
// heartbeat interval across the job). The hash order spreads a node's
// watchers over machines, so that one rack's loss leaves few of its nodes
// without a live watcher; a node whose watchers all died too is noticed
// by the re-formed round's watchers. In `s`'s order of participants then
// expected when everyone is watched.
constexpr size_t kWatchers = 3;
std::vector<std::string> watchSet(const State& s, const std::string& me);

// watchSet's order built once for many nodes (a fold, a round's placement):
// O(N log N) to build, O(log N) per node.
class WatchRing {
 public:
  // The state's participants, then its expected nodes, each once.
  explicit WatchRing(const State& s);
  WatchRing(const WatchRing&) = delete;  // ring_ points into ids_
  WatchRing& operator=(const WatchRing&) = delete;
  // watchSet(s, me) for the state it was built from.
  std::vector<std::string> targets(const std::string& me) const;

 private:
  std::vector<std::string> ids_;  // in the state's order
  std::vector<std::pair<uint64_t, std::string_view>> ring_;  // by hash, then id
};

// Where `me`'s join stands in `s` after a step that returned `outcome`
// (kWaitComplete or kWaitEnd), at `nowMs`; waitingSeconds is the caller's.
JoinProgress joinProgress(const State& s, const std::string& me, JoinOutcome outcome,
                          const Limits& lim, int64_t nowMs);
// JoinProgress::waitingFor of a node waiting for a running round's end (a
// spare, or the round is finishing), and of one waiting for `more` nodes
// ("" when none are needed).
std::string waitEndText(bool spare, int maxNodes);
std::string moreNodesText(int more);

}  // namespace ddprun::rendezvous::detail
