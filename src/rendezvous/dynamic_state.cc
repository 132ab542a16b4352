#include "dynamic_state.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string_view>
#include <unordered_set>

#include "ddprun/common/error.h"
#include "ddprun/common/hash.h"
#include "ddprun/common/strings.h"
#include "json_fields.h"
#include "round_end.h"

namespace ddprun::rendezvous::detail {
namespace {

using nlohmann::json;

bool hasId(const std::vector<NodeDesc>& v, const std::string& id) {
  return std::any_of(v.begin(), v.end(), [&](const NodeDesc& d) { return d.id == id; });
}
bool eraseId(std::vector<NodeDesc>& v, const std::string& id) {
  return std::erase_if(v, [&](const NodeDesc& d) { return d.id == id; }) > 0;
}
bool eraseId(std::vector<std::string>& v, const std::string& id) {
  return std::erase(v, id) > 0;
}
int count(const State& s) { return static_cast<int>(s.participants.size()); }

json nodeToJson(const NodeDesc& d, bool withNproc) {
  json j = {{"id", d.id}, {"s", d.seq}};
  if (withNproc) j["n"] = d.nproc;
  if (d.host) j["h"] = true;
  return j;
}
json listToJson(const std::vector<NodeDesc>& v, bool withNproc) {
  json a = json::array();
  for (const auto& d : v) a.push_back(nodeToJson(d, withNproc));
  return a;
}

// What a state field is wrong with (json_fields.h); fromJson turns it into a
// ProtocolError.
using Bad = BadField;

// Node ids are "<addr>_<pid>_<nonce>": printable, no quotes or controls.
std::string idIn(const json& j) {
  std::string id = j.is_string() ? j.get<std::string>() : textIn(j, "id", kMaxIdBytes);
  if (!isValidNodeId(id))
    throw Bad("a node id \"" + str::escape(id, 40) + "\" is not <addr>_<pid>_<nonce>");
  return id;
}

NodeDesc nodeFromJson(const json& j, bool withNproc) {
  NodeDesc d;
  d.id = idIn(j);
  d.seq = intIn(j, "s", 0, kMaxSeq);
  d.host = j.value("h", false);
  if (withNproc) d.nproc = static_cast<int>(intIn(j, "n", 1, kMaxNproc));
  return d;
}
std::vector<NodeDesc> listFromJson(const json& a, bool withNproc, size_t most,
                                   const char* name) {
  if (!a.is_array() || a.size() > most)
    throw Bad(std::string("\"") + name + "\" is not a list of at most " +
              std::to_string(most) + " nodes");
  std::vector<NodeDesc> v;
  v.reserve(a.size());
  for (const auto& j : a) v.push_back(nodeFromJson(j, withNproc));
  return v;
}

JobSettings jobFromJson(const json& j) {
  JobSettings job;
  const std::string n = textIn(j, "n", 32);
  const auto parts = str::split(n, ':');
  if (parts.size() != 2 || !str::parseInt(parts[0], job.minNodes, 1, kMaxNodesEver) ||
      !str::parseInt(parts[1], job.maxNodes, job.minNodes, kMaxNodesEver))
    throw Bad("the job's \"n\" = \"" + str::escape(n, 40) + "\" is not MIN:MAX");
  job.lastCallMs = intIn(j, "lc", 1, INT64_MAX / 4);
  job.heartbeatMs = intIn(j, "hb", 1, INT64_MAX / 4);
  job.by = idIn(j.at("by"));
  return job;
}

// Lists are bounded by the job's own MAX as the state records it (a node
// whose MAX differs must still be told so: jobMismatch); the raw size was
// bounded by this node's MAX before parsing, and validate() then checks
// the counts against this node's settings.
State parseState(const json& j) {
  State s;
  s.job = jobFromJson(j.at("j"));
  const size_t most = static_cast<size_t>(s.job.maxNodes);
  const size_t waiting = static_cast<size_t>(waitingCap(s.job.maxNodes));
  s.round = static_cast<int>(intIn(j, "r", 0, kMaxRound));
  s.complete = j.at("c").get<bool>();
  s.closed = j.at("x").get<bool>();
  if (s.closed) s.closedReason = textIn(j, "why", kMaxTextBytes);
  s.participants = listFromJson(j.at("p"), true, most, "p");
  const json& e = j.at("e");
  if (!e.is_array() || e.size() > most + waiting)
    throw Bad("\"e\" is not a list of at most " + std::to_string(most + waiting) +
              " ids");
  for (const auto& id : e) s.expected.push_back(idIn(id));
  s.waitList = listFromJson(j.at("w"), false, waiting, "w");
  s.redundancy = listFromJson(j.at("d"), false, waiting, "d");
  s.lastCallMs = intIn(j, "lc", 0, INT64_MAX / 4);
  s.restartCount = static_cast<int>(intIn(j, "rc", 0, s.round));
  s.lastEndedRound = static_cast<int>(intIn(j, "er", -1, int64_t{s.round} - 1));
  if (s.lastEndedRound >= 0) s.lastEnd = textIn(j, "end", kMaxTextBytes);
  s.nextSeq = intIn(j, "ns", 0, kMaxSeq);
  if (j.contains("af")) s.folded = intIn(j, "af", 0, kMaxSeq);
  s.finishing = j.value("f", false);
  return s;
}

json jobToJson(const JobSettings& job) {
  return {{"n", std::to_string(job.minNodes) + ":" + std::to_string(job.maxNodes)},
          {"lc", job.lastCallMs},
          {"hb", job.heartbeatMs},
          {"by", job.by}};
}

std::string cut(const std::string& text) {
  return text.size() <= kMaxTextBytes ? text : text.substr(0, kMaxTextBytes);
}

// Whether every expected node has joined (false when none is expected:
// round 0, or all expected ones died, waits for the last call). Called at
// every arrival a fold applies (arrivals.h), so never O(N^2): fewer
// participants than expected nodes answers at once (a round re-forming
// after a loss, until its last arrivals; expected ids are distinct by
// construction, and a state where they were not would only wait for its
// last call), else one pass with a set.
bool expectedAllIn(const State& s) {
  if (s.expected.empty() || s.participants.size() < s.expected.size()) return false;
  std::unordered_set<std::string_view> in;
  in.reserve(s.participants.size());
  for (const auto& d : s.participants) in.insert(d.id);
  return std::all_of(s.expected.begin(), s.expected.end(),
                     [&](const std::string& id) { return in.count(id) > 0; });
}

// A forming round below MIN has no last call; reaching MIN starts it.
void updateLastCall(State& s, const Limits& lim, int64_t nowMs) {
  if (count(s) < lim.minNodes)
    s.lastCallMs = 0;
  else if (s.lastCallMs == 0)
    s.lastCallMs = nowMs + lim.lastCallMs;
}

void assignSeq(State& s, NodeDesc& me) {
  if (me.seq < 0) me.seq = s.nextSeq++;
  // A node that arrived in an earlier state of the job keeps its place, but
  // numbers must stay unique if the state was rebuilt.
  s.nextSeq = std::max(s.nextSeq, me.seq + 1);
}

JoinOutcome joinForming(State& s, NodeDesc& me, const Limits& lim, int64_t nowMs) {
  eraseId(s.waitList, me.id);
  assignSeq(s, me);
  if (count(s) >= lim.maxNodes) {  // cannot happen (MAX completes): be safe
    if (!hasId(s.redundancy, me.id)) s.redundancy.push_back({me.id, 0, me.seq, me.host});
    return JoinOutcome::kWaitEnd;
  }
  eraseId(s.redundancy, me.id);
  s.participants.push_back(me);
  updateLastCall(s, lim, nowMs);
  return completeIfDue(s, lim, nowMs) ? JoinOutcome::kComplete
                                      : JoinOutcome::kWaitComplete;
}

}  // namespace

bool isValidNodeId(const std::string& id) {
  return !id.empty() && id.size() <= kMaxIdBytes &&
         std::all_of(id.begin(), id.end(), [](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) ||
                  std::string_view("._-:%[]").find(c) != std::string_view::npos;
         });
}

std::string makeNodeId(const std::string& addr, int64_t pid, const std::string& nonce) {
  return addr + "_" + std::to_string(pid) + "_" + nonce;
}

std::string describeNode(const std::string& id) {
  // From the right: an address may hold '_' (a host name), pid and n never.
  auto last = id.rfind('_');
  auto mid = last == std::string::npos || last == 0 ? std::string::npos
                                                    : id.rfind('_', last - 1);
  if (mid == std::string::npos) return "node " + id;
  return "node " + id.substr(0, mid) + " (pid " + id.substr(mid + 1, last - mid - 1) +
         ")";
}

int64_t waitingCap(int maxNodes) { return 2 * int64_t{maxNodes} + 256; }

size_t maxStateBytes(int maxNodes) {
  // Each node entry at most an id and a few numbers; a node can be listed
  // twice (a participant or waiting, and expected); two texts of at most
  // kMaxTextBytes, each escaped at worst to 6 bytes a byte; and the rest.
  const int64_t entries = 2 * (int64_t{maxNodes} + waitingCap(maxNodes));
  return static_cast<size_t>(entries * int64_t(kMaxIdBytes + 64) +
                             2 * 6 * int64_t(kMaxTextBytes) + 1024);
}

std::string toJson(const State& s) {
  json j = {{"r", s.round},
            {"c", s.complete},
            {"x", s.closed},
            {"p", listToJson(s.participants, true)},
            {"e", s.expected},
            {"w", listToJson(s.waitList, false)},
            {"d", listToJson(s.redundancy, false)},
            {"lc", s.lastCallMs},
            {"rc", s.restartCount},
            {"er", s.lastEndedRound},
            {"ns", s.nextSeq},
            {"j", jobToJson(s.job)}};
  if (s.closed) j["why"] = s.closedReason;
  if (s.lastEndedRound >= 0) j["end"] = s.lastEnd;
  if (s.finishing) j["f"] = true;
  if (s.folded) j["af"] = s.folded;
  return j.dump();
}

State fromJson(const std::string& text, const std::string& key, const Limits& lim) {
  const char* const what = "which is not a ddprun dynamic rendezvous state";
  const char* const hint =
      "; is another job or program using this --rdzv-id on this store?";
  const size_t most = maxStateBytes(lim.maxNodes);
  if (text.size() > most)  // before parsing: its memory is what an attacker wants
    DDPRUN_THROW(ProtocolError, "the rendezvous store holds ", text.size(),
                 " bytes under ", key, ", more than a state of --nnodes at most ",
                 lim.maxNodes, " can take (", most, ")", hint);
  try {
    return parseState(json::parse(text));
  } catch (const Bad& e) {
    DDPRUN_THROW(ProtocolError, "the rendezvous store holds '", str::escape(text, 80),
                 "' under ", key, ", ", what, " (", e.what(), ")", hint);
  } catch (const std::exception&) {  // nlohmann's errors
    DDPRUN_THROW(ProtocolError, "the rendezvous store holds '", str::escape(text, 80),
                 "' under ", key, ", ", what, hint);
  }
}

State fromJson(const std::string& text, const std::string& key) {
  return fromJson(text, key, Limits{1, kMaxNodesEver, 1, 1});
}

std::string jobToText(const JobSettings& job) { return jobToJson(job).dump(); }

std::optional<JobSettings> jobFromText(const std::string& text) {
  if (text.size() > 1024) return std::nullopt;
  try {
    return jobFromJson(json::parse(text));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::string jobMismatch(const State& s, const Limits& lim) {
  const JobSettings& j = s.job;
  if (j.maxNodes == 0) return "";
  const std::string by = " (set by " + describeNode(j.by) + ")";
  if (j.minNodes != lim.minNodes || j.maxNodes != lim.maxNodes)
    return "--nnodes " + std::to_string(lim.minNodes) + ":" +
           std::to_string(lim.maxNodes) + " differs from the job's " +
           std::to_string(j.minNodes) + ":" + std::to_string(j.maxNodes) + by;
  if (j.lastCallMs != lim.lastCallMs)
    return "--rdzv-conf last_call_timeout (" + std::to_string(lim.lastCallMs) +
           " ms) differs from the job's (" + std::to_string(j.lastCallMs) + " ms)" + by;
  if (j.heartbeatMs != lim.heartbeatMs)
    return "the heartbeat timeout (--rdzv-conf keep_alive_interval * "
           "keep_alive_max_attempt: " +
           std::to_string(lim.heartbeatMs) + " ms) differs from the job's (" +
           std::to_string(j.heartbeatMs) + " ms)" + by;
  return "";
}

std::string validate(const State& s, const Limits& lim) {
  const int64_t n = count(s);
  if (n > lim.maxNodes)
    return std::to_string(n) + " participants, more than --nnodes' maximum " +
           std::to_string(lim.maxNodes);
  if (s.complete && n < lim.minNodes)
    return "a complete round of " + std::to_string(n) + " participants, fewer than " +
           std::to_string(lim.minNodes);
  if (int64_t(s.waitList.size() + s.redundancy.size()) > waitingCap(lim.maxNodes))
    return "more than " + std::to_string(waitingCap(lim.maxNodes)) + " waiting nodes";
  if (int64_t(s.expected.size()) > lim.maxNodes + waitingCap(lim.maxNodes))
    return std::to_string(s.expected.size()) + " expected nodes";
  std::set<std::string> ids;
  int64_t world = 0, hosts = 0;
  for (const auto& d : s.participants) {
    if (!ids.insert(d.id).second) return "node " + d.id + " takes part twice";
    world += d.nproc;  // each at most kMaxNproc: no overflow
    hosts += d.host ? 1 : 0;
  }
  if (world > INT32_MAX) return "a WORLD_SIZE of " + std::to_string(world);
  if (hosts > 1) return std::to_string(hosts) + " nodes hosting the store";
  for (const auto* list : {&s.participants, &s.waitList, &s.redundancy})
    for (const auto& d : *list)
      if (d.seq >= s.nextSeq)
        return "node " + d.id + " has an arrival number not yet given";
  if (s.round == kMaxRound && !s.closed) return "an open job at the last round";
  if (s.finishing && !s.complete) return "a forming round that is finishing";
  if (s.complete && s.lastCallMs != 0) return "a complete round with a last call";
  if (s.lastEndedRound >= 0) {
    try {
      RoundEvent e = decodeEnd(s.lastEndedRound, "end", s.lastEnd);
      if (e.node < -1 || e.node >= lim.maxNodes)
        return "the last end names node " + std::to_string(e.node);
    } catch (const ProtocolError&) {
      return "the last end '" + str::escape(s.lastEnd, 40) + "' is not a round's end";
    }
  }
  return "";
}

bool isListed(const State& s, const std::string& id) {
  const auto named = [&](const std::string& other) { return other == id; };
  return hasId(s.participants, id) || std::any_of(s.expected.begin(), s.expected.end(), named) ||
         hasId(s.waitList, id) || hasId(s.redundancy, id);
}

int rankOf(const State& s, const std::string& id) {
  for (size_t i = 0; i < s.participants.size(); ++i)
    if (s.participants[i].id == id) return static_cast<int>(i);
  return -1;
}

JoinOutcome joinStep(State& s, NodeDesc& me, const Limits& lim, int64_t nowMs) {
  return joinStep(s, me, lim, nowMs, hasId(s.participants, me.id));
}

JoinOutcome joinStep(State& s, NodeDesc& me, const Limits& lim, int64_t nowMs,
                     bool participant) {
  if (s.closed) return JoinOutcome::kClosed;
  if (s.job.maxNodes == 0)
    s.job = {lim.minNodes, lim.maxNodes, lim.lastCallMs, lim.heartbeatMs, me.id};
  if (participant) {
    if (!s.complete) completeIfDue(s, lim, nowMs);
    return s.complete ? JoinOutcome::kComplete : JoinOutcome::kWaitComplete;
  }
  if (!s.complete) return joinForming(s, me, lim, nowMs);
  // A running round: a newcomer with room makes it restart to admit it (the
  // end opens the next round, which it joins in the same step).
  if (hasId(s.waitList, me.id) || hasId(s.redundancy, me.id))
    return JoinOutcome::kWaitEnd;
  if (int64_t(s.waitList.size() + s.redundancy.size()) >= waitingCap(lim.maxNodes))
    return JoinOutcome::kFull;
  assignSeq(s, me);
  if (count(s) >= lim.maxNodes) {
    s.redundancy.push_back({me.id, 0, me.seq, me.host});
    return JoinOutcome::kWaitEnd;
  }
  s.waitList.push_back({me.id, 0, me.seq, me.host});
  if (s.finishing) return JoinOutcome::kWaitEnd;  // its end admits us or closes the job
  endRound(s, s.round, RoundEnd::kMembershipChanged, -1,
           describeNode(me.id) + " is waiting to join");
  return joinForming(s, me, lim, nowMs);
}

bool completeIfDue(State& s, const Limits& lim, int64_t nowMs) {
  if (s.complete || s.closed || count(s) < lim.minNodes) return false;
  bool due = count(s) >= lim.maxNodes || expectedAllIn(s) ||
             (s.lastCallMs != 0 && nowMs >= s.lastCallMs);
  if (!due) return false;
  std::stable_sort(s.participants.begin(), s.participants.end(),
                   [](const NodeDesc& a, const NodeDesc& b) {
                     if (a.host != b.host) return a.host;
                     return a.seq < b.seq;
                   });
  s.complete = true;
  s.lastCallMs = 0;
  s.expected.clear();
  return true;
}

bool endRound(State& s, int round, RoundEnd kind, int node, const std::string& why,
              const std::string& gone) {
  if (s.round != round || !s.complete) return false;
  s.lastEndedRound = round;
  s.lastEnd = cut(encodeEnd(kind, node, why));
  if (kind == RoundEnd::kFailed) ++s.restartCount;
  if (kind == RoundEnd::kClosed) close(s, why);
  if (kind == RoundEnd::kFinished) close(s, "it finished");
  s.expected.clear();
  for (const auto& d : s.participants)
    if (d.id != gone) s.expected.push_back(d.id);
  for (const auto* list : {&s.waitList, &s.redundancy})
    for (const auto& d : *list) s.expected.push_back(d.id);
  s.participants.clear();
  s.complete = false;
  s.finishing = false;
  s.lastCallMs = 0;
  s.round = round + 1;
  if (s.round >= kMaxRound)  // refuse rather than wrap
    close(s, "its rounds reached the limit of " + std::to_string(kMaxRound));
  return true;
}

bool markFinishing(State& s, int round) {
  if (s.round != round || !s.complete || s.finishing) return false;
  s.finishing = true;
  return true;
}

bool removeNode(State& s, const std::string& id, const std::string& why,
                const Limits& lim, int64_t nowMs) {
  const int rank = rankOf(s, id);
  // A participant of a running round is in no other list; the end leaves it
  // out of the next round's expected nodes.
  if (rank >= 0 && s.complete)
    return endRound(s, s.round, RoundEnd::kMembershipChanged, rank, why, id);
  bool changed = eraseId(s.participants, id);
  changed = eraseId(s.expected, id) || changed;
  changed = eraseId(s.waitList, id) || changed;
  changed = eraseId(s.redundancy, id) || changed;
  if (changed && !s.complete) {
    updateLastCall(s, lim, nowMs);
    completeIfDue(s, lim, nowMs);
  }
  return changed;
}

bool close(State& s, const std::string& reason) {
  if (s.closed) return false;
  s.closed = true;
  s.closedReason = cut(reason);
  return true;
}

std::string roundTampered(const std::optional<State>& s, int round,
                          const std::string& me) {
  if (!s) return "the state was deleted";
  if (s->lastEndedRound >= round) return "";  // it ended: the first end won
  if (s->round == round && s->complete && rankOf(*s, me) >= 0) return "";  // running
  return "the state says round " + std::to_string(s->round) + " is " +
         (s->closed     ? "closed"
          : s->complete ? "running"
                        : "forming") +
         (s->round == round && s->complete ? " without this node" : "") +
         ", though this node runs round " + std::to_string(round);
}

std::optional<std::string> trustedEnd(const std::optional<State>& s, int round,
                                      const std::string& value) {
  if (!s) return value;
  if (s->lastEndedRound == round) return s->lastEnd;
  if (s->lastEndedRound > round) return value;
  return std::nullopt;
}

State tombstone(int round, const std::string& end, const std::string& why,
                const Limits& lim, const std::string& me) {
  State s;
  s.round = round + 1;
  s.lastEndedRound = round;
  s.lastEnd = cut(end);
  s.job = {lim.minNodes, lim.maxNodes, lim.lastCallMs, lim.heartbeatMs, me};
  close(s, why);
  return s;
}

namespace {
// The first JoinProgress::kListed of `items`, then "and N more".
std::string listCut(const std::vector<std::string>& items) {
  const size_t shown = std::min(items.size(), JoinProgress::kListed);
  std::string out =
      str::join(std::vector<std::string>(items.begin(), items.begin() + shown), ", ");
  if (items.size() > shown) out += " and " + std::to_string(items.size() - shown) + " more";
  return out;
}

std::vector<std::string> missingIds(const State& s) {
  std::vector<std::string> missing;
  for (const auto& id : s.expected)
    if (!hasId(s.participants, id)) missing.push_back(id);
  return missing;
}
}  // namespace

std::string describeShortfall(const State& s, const Limits& lim) {
  std::vector<std::string> joined, missing;
  for (const auto& d : s.participants) joined.push_back(describeNode(d.id));
  for (const auto& id : missingIds(s)) missing.push_back(describeNode(id));
  std::string out = std::to_string(joined.size()) + " of at least " +
                    std::to_string(lim.minNodes) + " nodes joined";
  if (!joined.empty()) out += " (" + listCut(joined) + ")";
  const int more = lim.minNodes - count(s);
  if (more > 0) out += "; " + std::to_string(more) + " more needed";
  if (!missing.empty()) out += "; expected but missing: " + listCut(missing);
  return out;
}

WatchRing::WatchRing(const State& s) {
  std::unordered_set<std::string_view> seen;
  const auto add = [&](const std::string& id) {
    if (seen.insert(id).second) ids_.push_back(id);
  };
  ids_.reserve(s.participants.size() + s.expected.size());
  for (const auto& d : s.participants) add(d.id);
  for (const auto& id : s.expected) add(id);
  ring_.reserve(ids_.size());
  for (const auto& id : ids_) ring_.emplace_back(fnv1a(id), id);
  std::sort(ring_.begin(), ring_.end());
}

std::vector<std::string> WatchRing::targets(const std::string& me) const {
  const bool listed = std::find(ids_.begin(), ids_.end(), me) != ids_.end();
  const size_t others = ids_.size() - (listed ? 1 : 0);
  std::vector<std::string> out;
  if (others <= kWatchers) {
    for (const auto& id : ids_)
      if (id != me) out.push_back(id);
    return out;
  }
  // The kWatchers after me in the ring (me by hash, ties by id), wrapping.
  const std::pair<uint64_t, std::string_view> self{fnv1a(me), me};
  size_t at = static_cast<size_t>(std::upper_bound(ring_.begin(), ring_.end(), self) -
                                  ring_.begin());
  for (size_t i = 0; out.size() < kWatchers; ++i) {
    const auto& id = ring_[(at + i) % ring_.size()].second;
    if (id != me) out.emplace_back(id);
  }
  return out;
}

std::vector<std::string> watchSet(const State& s, const std::string& me) {
  return WatchRing(s).targets(me);
}

JoinProgress joinProgress(const State& s, const std::string& me, JoinOutcome outcome,
                          const Limits& lim, int64_t nowMs) {
  JoinProgress p;
  p.round = s.round;
  p.joined = count(s);
  p.minNodes = lim.minNodes;
  p.maxNodes = lim.maxNodes;
  p.expected = static_cast<int>(s.expected.size());
  const auto missing = missingIds(s);
  p.missingCount = static_cast<int>(missing.size());
  for (size_t i = 0; i < missing.size() && i < JoinProgress::kListed; ++i)
    p.missing.push_back(describeNode(missing[i]));
  if (s.lastCallMs != 0 && !s.complete)
    p.lastCallSeconds = static_cast<double>(std::max<int64_t>(0, s.lastCallMs - nowMs)) / 1000.0;
  if (outcome == JoinOutcome::kWaitEnd)
    p.waitingFor = waitEndText(hasId(s.redundancy, me), lim.maxNodes);
  else
    p.waitingFor = moreNodesText(lim.minNodes - p.joined);
  return p;
}

std::string waitEndText(bool spare, int maxNodes) {
  if (spare)
    return "a place: the running round has --nnodes' maximum of " + std::to_string(maxNodes) +
           " nodes (this node is a spare)";
  return "the running round to end (its nodes are finishing)";
}

std::string moreNodesText(int more) {
  if (more <= 0) return "";
  return std::to_string(more) + " more node" + (more == 1 ? "" : "s");
}

}  // namespace ddprun::rendezvous::detail
