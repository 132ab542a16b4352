#include "job_keys.h"

#include "ddprun/common/error.h"
#include "ddprun/common/log.h"
#include "ddprun/common/strings.h"
#include "arrivals.h"
#include "round_end.h"
#include "state_cell.h"

namespace ddprun::rendezvous::detail {

net::HostPort parseWorkerStore(const std::string& value, const std::string& key,
                               const std::string& runId) {
  try {
    auto hp = net::parseHostPort(value, 0);
    if (hp.port == 0) throw InvalidArgument("port 0");
    return hp;
  } catch (const InvalidArgument&) {
    DDPRUN_THROW(ProtocolError, "the rendezvous store holds '", str::escape(value), "' under ",
                 key, ", not host:port; is another job using --rdzv-id ", runId,
                 " on this store?");
  }
}

std::string JobKeys::describeTamper(int round, const std::string& why) const {
  return "the rendezvous state under " + stateKey() + " changed while round " +
         std::to_string(round) + " ran (" + why +
         "); another program deleted or overwrote it";
}

void JobKeys::writeEnd(store::Store& store, int round, const std::string& end) const {
  store.compareSet(key(round, "end"), "", end);
  // Nodes still waiting for the round's worker store wake up and see the
  // end (group rank 0 may be the node that was dropped).
  store.compareSet(key(round, "worker_store"), "", kNoWorkerStore);
}

std::optional<State> JobKeys::readState(
    store::Store& store, const std::shared_ptr<store::CancelToken>& token) const {
  StateCell cell(store, stateKey(), lim_, token);
  try {
    State s = cell.refresh();
    if (cell.known()) return s;
  } catch (const ProtocolError&) {
  }
  return std::nullopt;
}

void JobKeys::bury(store::Store& store, const std::string& raw, int round, RoundEnd kind,
                   int node, const std::string& why, const Tamper& t,
                   const std::string& nodeId) const {
  std::string reason = why;
  if (t.invalid) {
    kind = RoundEnd::kClosed, node = -1, reason = t.why;
  } else if (kind != RoundEnd::kFinished) {
    kind = RoundEnd::kClosed, reason = why + "; the job cannot restart: " + t.why;
  }
  const std::string end = encodeEnd(kind, node, reason);
  const State tomb =
      tombstone(round, end, kind == RoundEnd::kFinished ? "it finished" : reason, lim_, nodeId);
  DDPRUN_ERROR("rendezvous: ", t.why, "; round ", round, " ends as ",
               kind == RoundEnd::kFinished ? "finished" : "closed");
  store.compareSet(stateKey(), raw, toJson(tomb));
  writeEnd(store, round, end);
}

RoundEvent JobKeys::awaitTrustedEnd(store::Store& store, int round,
                                    const std::shared_ptr<store::CancelToken>& token,
                                    std::chrono::milliseconds slice,
                                    const std::string& nodeId, bool verify,
                                    const std::function<void()>& onSlice) const {
  const std::string endKey = key(round, "end");
  const auto checkWhileRunning = [&] {
    if (!verify) {
      if (onSlice) onSlice();
      return;
    }
    StateCell cell(store, stateKey(), lim_, token);
    try {
      cell.refresh();
    } catch (const ProtocolError& e) {
      bury(store, cell.raw(), round, RoundEnd::kClosed, -1, "", Tamper{e.message(), true},
           nodeId);
    }
    if (onSlice) onSlice();
  };
  for (;;) {
    const std::string value = awaitEndValue(store, endKey, slice, checkWhileRunning);
    if (!verify) return decodeEndOrClose(round, endKey, value);
    auto trusted = trustedEnd(readState(store, token), round, value);
    if (trusted) return decodeEndOrClose(round, endKey, *trusted);
    DDPRUN_WARN("rendezvous: ", endKey, " holds '", str::escape(value, 80),
                "', but the job's state says round ", round,
                " still runs: another program wrote it; ignored");
    store.deleteKey(endKey);
    // A genuine end recorded meanwhile: its key may have just been deleted.
    if (auto again = readState(store, token); again && again->lastEndedRound == round)
      store.compareSet(endKey, "", again->lastEnd);
  }
}

void JobKeys::publishRound(store::Store& store, const State& s) const {
  std::vector<int> sizes;
  for (const auto& d : s.participants) sizes.push_back(d.nproc);
  store.set(key(s.round, "sizes"), encodeSizes(sizes));
  store.set(key(s.round, "roster"), encodeRoster(s));
  const auto placed = placements(s);
  constexpr size_t kChunk = 4'096;  // keys per MULTI_SET
  for (size_t at = 0; at < placed.size(); at += kChunk) {
    std::vector<std::string> keys, values;
    for (size_t i = at; i < std::min(placed.size(), at + kChunk); ++i) {
      keys.push_back(key(s.round, "rank/" + s.participants[i].id));
      values.push_back(encodePlacement(placed[i]));
    }
    store.multiSet(keys, values);
  }
}

std::optional<std::vector<std::string>> JobKeys::roster(
    store::Store& store, int round, const std::shared_ptr<store::CancelToken>& token) const {
  const std::string k = key(round, "roster");
  if (store.check({k})) return decodeRoster(store.get(k), k, lim_);
  const auto s = readState(store, token);
  if (!s || s->round != round || !s->complete) return std::nullopt;
  std::vector<std::string> ids;
  for (const auto& d : s->participants) ids.push_back(d.id);
  return ids;
}

void JobKeys::forgetRound(store::Store& store, int round) const {
  if (round < 0) return;
  try {
    for (const char* name :
         {"complete", "worker_store", "end", "sizes", "roster", "finishing", "succeeded"})
      store.deleteKey(key(round, name));
  } catch (const Error& e) {
    DDPRUN_DEBUG("rendezvous: round ", round, "'s keys stay: ", e.message());
  }
}

std::string JobKeys::claimNodeId(store::Store& store, const std::string& nodeId) const {
  const std::string claim = jobKey("id/" + nodeId);
  const std::string token = str::randomToken(24);
  if (store.compareSet(claim, "", token) != token)
    DDPRUN_THROW(Error, "another agent already joined job ", runId_, " with this node's id ",
                 nodeId, " (", describeNode(nodeId),
                 "): two agents would merge into one node; this one refuses to join. "
                 "Ids hold a random part, so this means a copied process or a program "
                 "writing the job's keys; start this node again");
  return claim;
}

void JobKeys::sayLeft(store::Store& store, int round, const std::string& nodeId) const {
  try {
    store.set(key(round, "left/" + nodeId), "");
    if (round >= 2) {
      store.deleteKey(key(round - 2, "left/" + nodeId));
      store.deleteKey(key(round - 2, "done/" + nodeId));
    }
  } catch (const Error& e) {
    DDPRUN_DEBUG("rendezvous: could not say goodbye for round ", round, ": ", e.message());
  }
}

}  // namespace ddprun::rendezvous::detail
