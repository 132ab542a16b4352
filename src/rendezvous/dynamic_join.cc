#include "dynamic_join.h"

#include <algorithm>
#include <climits>

#include "ddprun/common/error.h"
#include "ddprun/common/log.h"
#include "ddprun/common/clock.h"
#include "ddprun/common/strings.h"
#include "node_lease.h"
#include "round_end.h"

namespace ddprun::rendezvous::detail {
namespace {

// How long a folder waits for the value of an arrival number that was
// taken (its node may have died between its ADD and its SET, or lost the
// ADD's reply): then the number is skipped, and its node, if alive, arrives
// again.
constexpr int64_t kArrivalPatienceMs = 2'000;
// Keys per MULTI_GET / MULTI_SET / WAIT of a fold.
constexpr size_t kKeysPerRequest = 4'096;
// A closed job answers at most this many pending arrivals (older numbers
// are nodes long gone; a live one reads the closed state itself).
constexpr int64_t kClosedAnswers = 1'024;

// A verdict "forming round `round`" (-1: any), for progress while waiting.
Verdict formingIn(int round) {
  Verdict v;
  v.kind = Verdict::kForming;
  v.round = round;
  return v;
}

const char* const kSettingsHint =
    "; every node of a job needs the same --nnodes and --rdzv-conf last_call_timeout, "
    "keep_alive_interval and keep_alive_max_attempt (or another --rdzv-id for another job)";

}  // namespace

int64_t Joiner::leaseMs(const Limits& lim) {
  return std::clamp<int64_t>(lim.heartbeatMs / 3, 1'000, 5'000);
}

std::string Joiner::peek(const std::string& key) { return peekValue(store_, key); }

bool Joiner::due(int64_t& at, int64_t every) {
  const int64_t t = hooks_.now();
  if (t < at) return false;
  at = t + every;
  return true;
}

// The state as a join reads it. A node that has seen this job's state and
// finds it gone or invalid (another program deleted or overwrote it) leaves
// a closed state in its place, so that no node starts the job again over
// the old rounds' keys, and fails with the reason (other job settings in
// the state are tampering then). A node new to the job only reports what it
// found (JobMismatchError or ProtocolError), touching nothing.
State Joiner::readState() {
  std::string why;
  try {
    State s = cell_.refresh();
    if (cell_.known()) lastRound_ = s.round;
    if (cell_.known() || !seenJob_) return s;
    why = "the rendezvous state under " + keys_.stateKey() +
          " was deleted while this node was in the job";
  } catch (const ProtocolError& e) {  // JobMismatchError too
    if (!seenJob_) throw;             // as it is: nothing of ours to protect
    why = e.message();
  }
  keys_.bury(store_, cell_.raw(), lastRound_, RoundEnd::kClosed, -1, "", Tamper{why, true},
             id_);
  DDPRUN_THROW(ProtocolError, why, "; the job ", opts_.runId,
               " is closed: start it again with another --rdzv-id");
}

// The join deadline passed in a forming round: this node leaves it, then
// says who came and who did not.
void Joiner::giveUp(const NodeDesc& me) {
  hooks_.timingOut();
  const State seen = cell_.refresh();
  if (cell_.known())
    cell_.update([&](State& st) {
      removeNode(st, me.id, describeNode(me.id) + " gave up", lim_, hooks_.now());
    });
  DDPRUN_THROW(TimeoutError, "rendezvous round ", seen.round, " of job ", opts_.runId,
               " did not complete within ", formatDuration(opts_.joinTimeout), ": ",
               describeShortfall(seen, lim_),
               ". Start the missing nodes with the same --rdzv-endpoint (", storeAddress_,
               ") and --rdzv-id, or lower --nnodes' minimum");
}

Placement Joiner::join(NodeDesc& me, int64_t deadlineMs) {
  checkSettings();
  const int64_t every = std::max<int64_t>(1, opts_.joinProgressInterval.count());
  nextSay_ = hooks_.now() + every;
  nextLook_ = hooks_.now() + lim_.heartbeatMs;
  for (;;) {
    std::string text;
    const int64_t k = arrive(me, text);
    const Verdict v = awaitVerdict(k, text, me, deadlineMs);
    pending_ = 0;
    for (const auto& key : {keys_.jobKey("arrival/" + std::to_string(k)),
                            keys_.jobKey("verdict/" + std::to_string(k))})
      store_.deleteKey(key);
    if (v.kind != Verdict::kSkipped) seenJob_ = true;
    if (v.seq >= 0) me.seq = v.seq;
    switch (v.kind) {
      case Verdict::kClosed:
        throw ClosedError(::ddprun::detail::concat("the job ", opts_.runId,
                                                   " is already over: ", v.text),
                          __FILE__, __LINE__, v.finished);
      case Verdict::kFull:
        DDPRUN_THROW(InvalidArgument, "job ", opts_.runId, " already has ",
                     waitingCap(lim_.maxNodes),
                     " nodes waiting for a place beyond --nnodes' maximum ", lim_.maxNodes,
                     "; start fewer nodes or raise the maximum");
      case Verdict::kMismatch:
        DDPRUN_THROW(JobMismatchError, v.text, kSettingsHint);
      case Verdict::kSkipped:
        continue;
      case Verdict::kWaitEnd:
        // Redundant, or waiting for a finishing round: no deadline, as torchrun.
        awaitEnd(v.round, v);
        continue;
      case Verdict::kForming:
      case Verdict::kComplete:
        if (!v.watch.empty()) hooks_.watch(v.watch);
        if (auto p = awaitPlacement(v.round, me, deadlineMs)) {
          lastRound_ = std::max(lastRound_, p->round);
          return *p;
        }
        continue;  // dropped, or the round ended before it started: arrive again
    }
  }
}

// A node whose settings differ from the job's is refused before it touches
// anything (the job key holds them once a state exists).
void Joiner::checkSettings() {
  const std::string text = peek(keys_.jobKey("job"));
  if (text.empty()) return;
  const auto job = jobFromText(text);
  if (!job) return;  // not ours: the state's checks decide
  State probe;
  probe.job = *job;
  const std::string mismatch = jobMismatch(probe, lim_);
  if (!mismatch.empty()) DDPRUN_THROW(JobMismatchError, mismatch, kSettingsHint);
  seenJob_ = true;
}

// One ADD for a number, one compare_set (answered, so one whose reply was
// lost is sent again) for the value under it. An ADD whose reply was lost
// may have taken a number: another is taken; the lost one is skipped.
int64_t Joiner::arrive(const NodeDesc& me, std::string& text) {
  text = encodeArrival({me, lim_});
  int64_t k = 0;
  for (int tries = 0;; ++tries) {
    try {
      k = store_.add(keys_.jobKey("arrivals"), 1);
      break;
    } catch (const store::UnconfirmedError&) {
      if (tries >= 3) throw;
    }
  }
  store_.compareSet(keys_.jobKey("arrival/" + std::to_string(k)), "", text);
  pending_ = k;
  pendingText_ = text;
  return k;
}

void Joiner::withdraw(store::Store& via) {
  try {
    if (pending_ > 0)
      via.compareSet(keys_.jobKey("arrival/" + std::to_string(pending_)), pendingText_, "");
  } catch (const Error&) {  // a node that leaves says what it can
  }
  pending_ = 0;
  lease_.release(&via);
}

Verdict Joiner::awaitVerdict(int64_t k, const std::string& text, const NodeDesc& me,
                             int64_t deadlineMs) {
  const std::string key = keys_.jobKey("verdict/" + std::to_string(k));
  const Verdict forming = formingIn(-1);  // any round
  const int64_t every = std::max<int64_t>(1, opts_.joinProgressInterval.count());
  for (;;) {
    // One reading of the clock for the lease and the wait: a lease seen
    // held at t expires after t, so the wait below ends when it does.
    int64_t t = hooks_.now();
    if (lease_.acquire(t)) {
      fold(me, deadlineMs);
      t = hooks_.now();
    }
    if (store_.check({key})) return decodeVerdict(store_.get(key), key);
    if (t >= deadlineMs) {
      // Withdrawn: a fold from now on skips it. One that came first stands.
      store_.compareSet(keys_.jobKey("arrival/" + std::to_string(k)), text, "");
      if (store_.check({key})) return decodeVerdict(store_.get(key), key);
      giveUp(me);
    }
    if (t >= nextLook_) {
      // A folder that died after its fold, before the verdicts: arrive again.
      nextLook_ = t + lim_.heartbeatMs;
      const State s = readState();
      hooks_.afterState(store_, s);
      if (cell_.known() && s.folded >= k && !store_.check({key})) return Verdict{};
    }
    if (due(nextSay_, every)) tellFromProgressKey(forming);
    int64_t until = std::min({deadlineMs, nextSay_, nextLook_});
    until = std::min(until, lease_.expiresMs() > t ? lease_.expiresMs() : t + lease_.leaseMs());
    if (hooks_.waitUntil({key}, until)) return decodeVerdict(store_.get(key), key);
  }
}

std::optional<Placement> Joiner::awaitPlacement(int round, const NodeDesc& me,
                                                int64_t deadlineMs) {
  const std::string rank = keys_.key(round, "rank/" + me.id);
  const std::string complete = keys_.key(round, "complete");
  const Verdict forming = formingIn(round);
  const int64_t every = std::max<int64_t>(1, opts_.joinProgressInterval.count());
  for (;;) {
    // Placements are published before the marker: with the marker there,
    // no placement means the round completed (or ended) without this node.
    const bool completed = store_.check({complete});
    if (store_.check({rank})) {
      Placement p = decodePlacement(store_.get(rank), rank, lim_);
      store_.deleteKey(rank);
      if (p.round != round)
        DDPRUN_THROW(ProtocolError, "the rendezvous store holds a place in round ", p.round,
                     " under ", rank, "; is another job using --rdzv-id ", opts_.runId,
                     " on this store?");
      return p;
    }
    if (completed) return std::nullopt;
    const int64_t t = hooks_.now();
    if (t >= deadlineMs) giveUp(me);
    if (lease_.acquire(t)) {
      fold(me, deadlineMs);
      continue;
    }
    if (t >= nextLook_) {
      // Once per heartbeat timeout, as before: a node dropped from the
      // forming round for a silence finds itself out and arrives again.
      nextLook_ = t + lim_.heartbeatMs;
      const State s = readState();
      hooks_.afterState(store_, s);
      if (!cell_.known() || s.closed || s.round != round) return std::nullopt;
      if (!s.complete && !isListed(s, me.id)) return std::nullopt;
      continue;
    }
    if (due(nextSay_, every)) tellFromProgressKey(forming);
    int64_t until = std::min({deadlineMs, nextSay_, nextLook_});
    until = std::min(until, lease_.expiresMs() > t ? lease_.expiresMs() : t + lease_.leaseMs());
    hooks_.waitUntil({rank}, until);
  }
}

void Joiner::awaitEnd(int round, const Verdict& v) {
  const std::string end = keys_.key(round, "end");
  const int64_t every = std::max<int64_t>(1, opts_.joinProgressInterval.count());
  tellFromProgressKey(v);
  for (;;) {
    if (hooks_.waitUntil({end}, nextSay_)) return;
    if (due(nextSay_, every)) tellFromProgressKey(v);
  }
}

void Joiner::fold(const NodeDesc& me, int64_t untilMs) {
  State s = readState();
  hooks_.afterState(store_, s);
  const std::string counter = keys_.jobKey("arrivals");
  const int64_t every = std::max<int64_t>(1, opts_.joinProgressInterval.count());
  int64_t nextFlush = hooks_.now() + every;
  int64_t lastCallTried = 0;
  for (;;) {
    int64_t t = hooks_.now();
    if (t >= lease_.expiresMs() - lease_.leaseMs() / 2 && !lease_.renew(t)) return;
    const int64_t arrived = store_.add(counter, 0);
    const int64_t pending = arrived - s.folded;
    const bool forming = cell_.known() && !s.complete && !s.closed;
    const bool lastCall = forming && s.lastCallMs != 0 && t >= s.lastCallMs &&
                          s.lastCallMs != lastCallTried;
    if ((pending > 0 && (pending >= foldTarget(s, lim_) || !forming || t >= nextFlush)) ||
        lastCall) {
      if (lastCall) lastCallTried = s.lastCallMs;
      const bool flush = t >= nextFlush;
      s = foldBatch(s, arrived, me);
      if (flush) {
        publishProgress(s, me);
        nextFlush = hooks_.now() + every;
      }
      continue;
    }
    if (t >= nextFlush) {
      publishProgress(s, me);
      nextFlush = t + every;
    }
    if (pending <= 0 && (!forming || s.participants.empty())) {
      // Nothing to fold and no round to complete: the lease goes. An
      // arrival that came meanwhile saw it held, so look once more.
      lease_.release();
      if (store_.add(counter, 0) > s.folded && lease_.acquire(hooks_.now())) continue;
      return;
    }
    if (t >= untilMs) {
      lease_.release();
      return;
    }
    int64_t wake = std::min({untilMs, nextFlush, lease_.expiresMs() - lease_.leaseMs() / 2});
    if (forming && s.lastCallMs != 0 && s.lastCallMs != lastCallTried)
      wake = std::min(wake, s.lastCallMs);
    const int64_t next = s.folded + std::max<int64_t>(1, foldTarget(s, lim_));
    hooks_.waitUntil({keys_.jobKey("arrival/" + std::to_string(next))}, wake);
  }
}

// One compare_set of the state with arrivals seen.folded + 1 ... upTo
// folded in (and the round completed if due), then the round's placements
// (afterState) and the verdicts.
State Joiner::foldBatch(const State& seen, int64_t upTo, const NodeDesc& me) {
  const int64_t first = seen.folded + 1;
  std::vector<std::optional<Arrival>> arrivals;
  if (upTo >= first && !seen.closed) arrivals = collect(first, upTo);  // closed: not read
  std::vector<Verdict> verdicts;
  int64_t from = 0;
  State s = cell_.update(
      [&](State& st) {
        verdicts.clear();
        if (st.job.maxNodes == 0)
          st.job = {lim_.minNodes, lim_.maxNodes, lim_.lastCallMs, lim_.heartbeatMs, me.id};
        from = st.folded + 1;
        if (st.closed) from = std::max(from, upTo - kClosedAnswers + 1);
        if (from <= upTo) {
          std::vector<std::optional<Arrival>> batch;
          batch.reserve(static_cast<size_t>(upTo - from + 1));
          for (int64_t i = from; i <= upTo; ++i)
            batch.push_back(i >= first && i - first < static_cast<int64_t>(arrivals.size())
                                ? arrivals[static_cast<size_t>(i - first)]
                                : std::nullopt);
          verdicts = foldArrivals(st, from, batch, lim_, hooks_.now());
        }
        if (!st.complete && !st.closed) completeIfDue(st, lim_, hooks_.now());
      },
      /*mayCreate=*/!seenJob_);
  seenJob_ = true;
  if (!jobKeyWritten_) {
    store_.compareSet(keys_.jobKey("job"), "", jobToText(s.job));
    jobKeyWritten_ = true;
  }
  hooks_.afterState(store_, s);  // a completed round's placements before any verdict
  for (size_t at = 0; at < verdicts.size(); at += kKeysPerRequest) {
    std::vector<std::string> keys, values;
    for (size_t i = at; i < std::min(verdicts.size(), at + kKeysPerRequest); ++i) {
      keys.push_back(keys_.jobKey("verdict/" + std::to_string(from + static_cast<int64_t>(i))));
      values.push_back(encodeVerdict(verdicts[i]));
    }
    store_.multiSet(keys, values);
  }
  return s;
}

std::vector<std::optional<Arrival>> Joiner::collect(int64_t first, int64_t last) {
  std::vector<std::optional<Arrival>> out;
  out.reserve(static_cast<size_t>(last - first + 1));
  const int64_t patience = hooks_.now() + kArrivalPatienceMs;
  for (int64_t at = first; at <= last; at += static_cast<int64_t>(kKeysPerRequest)) {
    std::vector<std::string> keys;
    for (int64_t i = at; i <= std::min(last, at + int64_t(kKeysPerRequest) - 1); ++i)
      keys.push_back(keys_.jobKey("arrival/" + std::to_string(i)));
    std::vector<std::string> values;
    if (hooks_.waitUntil(keys, patience)) {
      values = store_.multiGet(keys);
    } else {
      for (const auto& key : keys) values.push_back(store_.check({key}) ? store_.get(key) : "");
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      try {
        out.push_back(decodeArrival(values[i], keys[i]));
      } catch (const ProtocolError& e) {  // not a node's: skipped
        DDPRUN_WARN("rendezvous: ", e.message());
        out.push_back(std::nullopt);
      }
    }
  }
  return out;
}

void Joiner::publishProgress(const State& s, const NodeDesc& me) {
  if (!cell_.known() || s.complete || s.closed) return;
  const JoinProgress p = joinProgress(s, me.id, JoinOutcome::kWaitComplete, lim_, hooks_.now());
  store_.set(keys_.jobKey("progress"), encodeProgress(p, s.lastCallMs));
  hooks_.progress(p);
}

void Joiner::tellFromProgressKey(const Verdict& v) {
  JoinProgress p = decodeProgress(peek(keys_.jobKey("progress")), hooks_.now());
  if (p.round < 0 || (v.round >= 0 && p.round != v.round) || v.kind == Verdict::kWaitEnd) {
    // Nothing published for this round (yet): what this node knows.
    p = JoinProgress{};
    p.round = std::max(v.round, 0);
    p.minNodes = lim_.minNodes;
    p.maxNodes = lim_.maxNodes;
  }
  if (v.kind == Verdict::kWaitEnd) p.waitingFor = waitEndText(v.spare, lim_.maxNodes);
  hooks_.progress(p);
}

}  // namespace ddprun::rendezvous::detail
