// The O(1)-per-join part of the dynamic rendezvous, as pure values (no
// store, no clock): what a joining node writes, what it is told, and how one
// node folds many arrivals into the job's state at once.
//
// A join no longer reads or compare-sets the whole state (O(nodes) bytes,
// O(nodes^2) for a round). Instead (keys: job_keys.h):
//   1. the node takes an arrival number k with one ADD on the job's arrival
//      counter and writes its Arrival under arrival/<k>;
//   2. one node at a time, the folder (fold_lease.h), folds every pending
//      arrival into the state with one compare_set (foldArrivals: the same
//      joinStep as before, in arrival order) and writes each arrival's
//      Verdict under verdict/<k>; it folds in batches that grow with the
//      round (foldTarget), so a round of N nodes costs O(N) bytes and
//      O(log N) folds in all;
//   3. the node that completes a round publishes each participant's
//      Placement under round/<r>/rank/<id>, the nodes' sizes (RLE) and the
//      roster once; each node reads only its own.
// So a node sends and reads a bounded number of small values per join,
// whatever the job's size; the folder's O(N) work is once per batch.
//
// Every value read from the store is bounded and checked before use
// (ProtocolError naming the key): a hostile writer gets an error, never an
// overflow or an allocation of its choosing.
//
// Not thread-safe: plain values and functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/rendezvous/rendezvous.h"
#include "dynamic_state.h"

namespace ddprun::rendezvous::detail {

// What a node writes under arrival/<k>: itself (id, nproc, its arrival
// number in the job once it has one, whether it hosts the store) and its
// settings of the job (a node whose settings differ is told so).
struct Arrival {
  NodeDesc node;
  Limits lim;
};
std::string encodeArrival(const Arrival& a);
// nullopt for "" (a withdrawn arrival); ProtocolError for anything else
// that is not an Arrival.
std::optional<Arrival> decodeArrival(const std::string& text, const std::string& key);

// What the folder tells arrival k (verdict/<k>).
struct Verdict {
  enum Kind : char {
    kForming = 'w',   // joined forming round `round`: wait for its Placement
    kComplete = 'c',  // joined round `round`, which completed: read the Placement
    kWaitEnd = 'e',   // waits for running round `round` to end (spare: no room)
    kFull = 'f',      // refused: too many nodes wait already
    kClosed = 'x',    // the job is over: `text` says why
    kMismatch = 'm',  // other settings than the job's: `text` says which
    kSkipped = 's',   // no arrival was found under that number: arrive again
  };
  Kind kind = kSkipped;
  int round = 0;
  int64_t seq = -1;  // the node's arrival number in the job (kForming/kComplete/kWaitEnd)
  bool spare = false;     // kWaitEnd: on the redundancy list
  bool finished = false;  // kClosed: the job finished (not failed)
  std::string text;
  // kForming: the nodes to watch while the round forms (watchSet at the fold).
  std::vector<std::string> watch;
};
std::string encodeVerdict(const Verdict& v);
Verdict decodeVerdict(const std::string& text, const std::string& key);

// What a participant of a complete round reads under round/<r>/rank/<id>.
struct Placement {
  int round = 0;
  int groupRank = 0;
  int groupWorldSize = 0;
  int64_t baseRank = 0;
  int64_t worldSize = 0;
  int restartCount = 0;
  std::vector<std::string> watch;  // watchSet(): at most kWatchers nodes
};
std::string encodePlacement(const Placement& p);
// Checked against `lim` (group world size within MAX, ranks within it).
Placement decodePlacement(const std::string& text, const std::string& key, const Limits& lim);

// A complete round's participants, placed: group rank i is participants[i]
// (host first, then arrival), base ranks by assignRanks, each node's watch
// set. O(N log N) for the round. Precondition: s.complete.
std::vector<Placement> placements(const State& s);

// The RoundInfo of a node placed at `p` in a round whose sizes `sizes`
// were read under `key` (worker store left empty); ProtocolError if they
// are not sizes, or do not add up to the placement.
RoundInfo roundInfoOf(const Placement& p, const std::string& sizes, const std::string& key);

// The round's local world sizes by group rank as runs ("4x1023,2"): a few
// bytes for a uniform job. decodeSizes checks `count` entries, each in
// 1..kMaxNproc, before it allocates.
std::string encodeSizes(const std::vector<int>& sizes);
std::vector<int> decodeSizes(const std::string& text, const std::string& key, int count);

// The round's participants' ids in group-rank order, one per line (read by
// a node only on the paths that need every peer: a failure, the finish).
std::string encodeRoster(const State& s);
std::vector<std::string> decodeRoster(const std::string& text, const std::string& key,
                                      const Limits& lim);

// Folds arrivals s.folded + 1 ... s.folded + arrivals.size() into `s` at
// `nowMs`, in order (nullopt: no arrival under that number, or withdrawn:
// kSkipped), with joinStep; arrivals whose settings differ from the job's
// get kMismatch and change nothing. Sets s.folded. Arrivals at or below
// s.folded on entry are the caller's to drop (`first`: the number of
// arrivals[0]). A closed state answers kClosed without looking.
std::vector<Verdict> foldArrivals(State& s, int64_t first,
                                  const std::vector<std::optional<Arrival>>& arrivals,
                                  const Limits& lim, int64_t nowMs);

// How many pending arrivals the folder waits for before it folds: one while
// the round is small, then half the round's participants (each fold writes
// the whole state: growing batches keep a round's folds to O(log N) and its
// bytes to a few times the final state), but never more than what
// can complete the round, start its last call, or admit the expected nodes.
// A running or closed round, or no state yet: 1 (fold at once).
int64_t foldTarget(const State& s, const Limits& lim);

// JoinProgress as the folder publishes it (progress key): everything but
// the reader's own waiting time and what it waits for. lastCall is absolute
// wall ms (0: none), turned into seconds by the reader.
std::string encodeProgress(const JoinProgress& p, int64_t lastCallMs);
JoinProgress decodeProgress(const std::string& text, int64_t nowMs);

}  // namespace ddprun::rendezvous::detail
