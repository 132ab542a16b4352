#include "dynamic_state.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "ddprun/common/error.h"
#include "ddprun/common/strings.h"
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

NodeDesc nodeFromJson(const json& j, bool withNproc) {
  NodeDesc d;
  d.id = j.at("id").get<std::string>();
  d.seq = j.at("s").get<int64_t>();
  d.host = j.value("h", false);
  if (withNproc) d.nproc = j.at("n").get<int>();
  if (d.id.empty() || d.seq < 0 || (withNproc && d.nproc < 1))
    throw std::invalid_argument("bad node entry");
  return d;
}
std::vector<NodeDesc> listFromJson(const json& a, bool withNproc) {
  std::vector<NodeDesc> v;
  for (const auto& j : a) v.push_back(nodeFromJson(j, withNproc));
  return v;
}

// Whether every expected node has joined (false when none is expected:
// round 0, or all expected ones died, waits for the last call).
bool expectedAllIn(const State& s) {
  if (s.expected.empty()) return false;
  return std::all_of(s.expected.begin(), s.expected.end(),
                     [&](const std::string& id) { return hasId(s.participants, id); });
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
  if (count(s) >= lim.maxNodes) {  // cannot happen (MAX completes): be safe
    if (!hasId(s.redundancy, me.id)) s.redundancy.push_back({me.id, 0, me.seq, me.host});
    return JoinOutcome::kWaitEnd;
  }
  eraseId(s.redundancy, me.id);
  assignSeq(s, me);
  s.participants.push_back(me);
  updateLastCall(s, lim, nowMs);
  return completeIfDue(s, lim, nowMs) ? JoinOutcome::kComplete : JoinOutcome::kWaitComplete;
}

}  // namespace

std::string makeNodeId(const std::string& addr, int64_t pid, int n) {
  return addr + "_" + std::to_string(pid) + "_" + std::to_string(n);
}

std::string describeNode(const std::string& id) {
  // From the right: an address may hold '_' (a host name), pid and n never.
  auto last = id.rfind('_');
  auto mid = last == std::string::npos || last == 0 ? std::string::npos
                                                    : id.rfind('_', last - 1);
  if (mid == std::string::npos) return "node " + id;
  return "node " + id.substr(0, mid) + " (pid " + id.substr(mid + 1, last - mid - 1) + ")";
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
            {"ns", s.nextSeq}};
  if (s.closed) j["why"] = s.closedReason;
  if (s.lastEndedRound >= 0) j["end"] = s.lastEnd;
  return j.dump();
}

State fromJson(const std::string& text, const std::string& key) {
  State s;
  try {
    json j = json::parse(text);
    s.round = j.at("r").get<int>();
    s.complete = j.at("c").get<bool>();
    s.closed = j.at("x").get<bool>();
    if (s.closed) s.closedReason = j.at("why").get<std::string>();
    s.participants = listFromJson(j.at("p"), true);
    s.expected = j.at("e").get<std::vector<std::string>>();
    s.waitList = listFromJson(j.at("w"), false);
    s.redundancy = listFromJson(j.at("d"), false);
    s.lastCallMs = j.at("lc").get<int64_t>();
    s.restartCount = j.at("rc").get<int>();
    s.lastEndedRound = j.at("er").get<int>();
    if (s.lastEndedRound >= 0) s.lastEnd = j.at("end").get<std::string>();
    s.nextSeq = j.at("ns").get<int64_t>();
    if (s.round < 0 || s.restartCount < 0 || s.lastEndedRound >= s.round)
      throw std::invalid_argument("inconsistent rounds");
  } catch (const std::exception&) {  // nlohmann's errors and ours alike
    DDPRUN_THROW(ProtocolError, "the rendezvous store holds '", str::escape(text, 80),
                 "' under ", key,
                 ", which is not a ddprun dynamic rendezvous state; is another job or "
                 "program using this --rdzv-id on this store?");
  }
  return s;
}

int rankOf(const State& s, const std::string& id) {
  for (size_t i = 0; i < s.participants.size(); ++i)
    if (s.participants[i].id == id) return static_cast<int>(i);
  return -1;
}

JoinOutcome joinStep(State& s, NodeDesc& me, const Limits& lim, int64_t nowMs) {
  if (s.closed) return JoinOutcome::kClosed;
  if (hasId(s.participants, me.id)) {
    if (!s.complete) completeIfDue(s, lim, nowMs);
    return s.complete ? JoinOutcome::kComplete : JoinOutcome::kWaitComplete;
  }
  if (!s.complete) return joinForming(s, me, lim, nowMs);
  // A running round: a newcomer with room makes it restart to admit it (the
  // end opens the next round, which it joins in the same step).
  if (hasId(s.waitList, me.id) || hasId(s.redundancy, me.id)) return JoinOutcome::kWaitEnd;
  assignSeq(s, me);
  if (count(s) >= lim.maxNodes) {
    s.redundancy.push_back({me.id, 0, me.seq, me.host});
    return JoinOutcome::kWaitEnd;
  }
  s.waitList.push_back({me.id, 0, me.seq, me.host});
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
  s.lastEnd = encodeEnd(kind, node, why);
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
  s.lastCallMs = 0;
  s.round = round + 1;
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
  s.closedReason = reason;
  return true;
}

std::string describeShortfall(const State& s, const Limits& lim) {
  std::vector<std::string> joined, missing;
  for (const auto& d : s.participants) joined.push_back(describeNode(d.id));
  for (const auto& id : s.expected)
    if (!hasId(s.participants, id)) missing.push_back(describeNode(id));
  std::string out = std::to_string(joined.size()) + " of at least " +
                    std::to_string(lim.minNodes) + " nodes joined";
  if (!joined.empty()) out += " (" + str::join(joined, ", ") + ")";
  const int more = lim.minNodes - count(s);
  if (more > 0) out += "; " + std::to_string(more) + " more needed";
  if (!missing.empty()) out += "; expected but missing: " + str::join(missing, ", ");
  return out;
}

}  // namespace ddprun::rendezvous::detail
