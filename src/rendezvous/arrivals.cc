#include "arrivals.h"

#include <algorithm>
#include <climits>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string_view>
#include <unordered_set>

#include "ddprun/common/error.h"
#include "ddprun/common/strings.h"
#include "json_fields.h"
#include "round_end.h"

namespace ddprun::rendezvous::detail {
namespace {

using nlohmann::json;

using Bad = BadField;  // json_fields.h: the decoders turn it into a ProtocolError

// Values a node reads are small: a verdict or a placement holds a few ids.
constexpr size_t kMaxSmallValue = 4 * kMaxIdBytes + 2 * 6 * kMaxTextBytes + 512;

std::string idOf(const json& j) {
  std::string id = j.get<std::string>();
  if (!isValidNodeId(id)) throw Bad("\"" + str::escape(id, 40) + "\" is not a node id");
  return id;
}
std::vector<std::string> idsIn(const json& j, const char* name) {
  std::vector<std::string> out;
  if (!j.contains(name)) return out;
  const json& a = j.at(name);
  if (!a.is_array() || a.size() > kWatchers)
    throw Bad(std::string("\"") + name + "\" is not a list of at most " +
              std::to_string(kWatchers) + " ids");
  for (const auto& id : a) out.push_back(idOf(id));
  return out;
}

// Parses `text` under `key` with `parse`, turning anything wrong (junk, a
// value over `most` bytes, checked before parsing) into a ProtocolError.
template <typename Parse>
auto decode(const std::string& text, const std::string& key, size_t most, const char* what,
            Parse parse) {
  const char* const hint = "; is another job or program using this --rdzv-id on this store?";
  if (text.size() > most)
    DDPRUN_THROW(ProtocolError, "the rendezvous store holds ", text.size(), " bytes under ",
                 key, ", more than ", what, " can take (", most, ")", hint);
  try {
    return parse(json::parse(text));
  } catch (const Bad& e) {
    DDPRUN_THROW(ProtocolError, "the rendezvous store holds '", str::escape(text, 80),
                 "' under ", key, ", which is not ", what, " (", e.what(), ")", hint);
  } catch (const json::exception&) {
    DDPRUN_THROW(ProtocolError, "the rendezvous store holds '", str::escape(text, 80),
                 "' under ", key, ", which is not ", what, hint);
  }
}


// The arrival number the state gives node `id` (-1: none).
int64_t seqOf(const State& s, const std::string& id) {
  for (const auto* list : {&s.participants, &s.waitList, &s.redundancy})
    for (const auto& d : *list)
      if (d.id == id) return d.seq;
  return -1;
}

Verdict verdictOf(const State& s, JoinOutcome outcome, const NodeDesc& me,
                  const WatchRing* ring) {
  Verdict v;
  v.round = s.round;
  v.seq = me.seq;
  switch (outcome) {
    case JoinOutcome::kClosed:
      v.kind = Verdict::kClosed;
      v.text = s.closedReason;
      v.finished = s.lastEnd == encodeEnd(RoundEnd::kFinished, -1, "");
      break;
    case JoinOutcome::kComplete:
      v.kind = Verdict::kComplete;
      break;
    case JoinOutcome::kWaitComplete:
      v.kind = Verdict::kForming;
      if (ring) v.watch = ring->targets(me.id);
      break;
    case JoinOutcome::kWaitEnd:
      v.kind = Verdict::kWaitEnd;
      v.spare = std::any_of(s.redundancy.begin(), s.redundancy.end(),
                            [&](const NodeDesc& d) { return d.id == me.id; });
      break;
    case JoinOutcome::kFull:
      v.kind = Verdict::kFull;
      break;
  }
  return v;
}

}  // namespace

std::string encodeArrival(const Arrival& a) {
  json j = {{"id", a.node.id},
            {"n", a.node.nproc},
            {"s", a.node.seq},
            {"j",
             {{"n", std::to_string(a.lim.minNodes) + ":" + std::to_string(a.lim.maxNodes)},
              {"lc", a.lim.lastCallMs},
              {"hb", a.lim.heartbeatMs}}}};
  if (a.node.host) j["h"] = true;
  return j.dump();
}

std::optional<Arrival> decodeArrival(const std::string& text, const std::string& key) {
  if (text.empty()) return std::nullopt;
  return decode(text, key, kMaxSmallValue, "a node's arrival", [](const json& j) {
    Arrival a;
    a.node.id = idOf(j.at("id"));
    a.node.nproc = static_cast<int>(intIn(j, "n", 1, kMaxNproc));
    a.node.seq = intIn(j, "s", -1, kMaxSeq - 1);
    a.node.host = j.value("h", false);
    const json& lim = j.at("j");
    const std::string n = textIn(lim, "n", 32);
    const auto parts = str::split(n, ':');
    if (parts.size() != 2 || !str::parseInt(parts[0], a.lim.minNodes, 1, kMaxNodesEver) ||
        !str::parseInt(parts[1], a.lim.maxNodes, a.lim.minNodes, kMaxNodesEver))
      throw Bad("\"n\" is not MIN:MAX");
    a.lim.lastCallMs = intIn(lim, "lc", 1, INT64_MAX / 4);
    a.lim.heartbeatMs = intIn(lim, "hb", 1, INT64_MAX / 4);
    return std::optional<Arrival>(std::move(a));
  });
}

std::string encodeVerdict(const Verdict& v) {
  json j = {{"k", std::string(1, static_cast<char>(v.kind))}, {"r", v.round}, {"s", v.seq}};
  if (v.spare) j["sp"] = true;
  if (v.finished) j["fin"] = true;
  if (!v.text.empty()) j["t"] = v.text;
  if (!v.watch.empty()) j["w"] = v.watch;
  return j.dump();
}

Verdict decodeVerdict(const std::string& text, const std::string& key) {
  return decode(text, key, kMaxSmallValue, "a join's verdict", [](const json& j) {
    Verdict v;
    const std::string k = textIn(j, "k", 1);
    if (k.size() != 1 || std::string_view("wcefxms").find(k[0]) == std::string_view::npos)
      throw Bad("\"k\" is not a verdict");
    v.kind = static_cast<Verdict::Kind>(k[0]);
    v.round = static_cast<int>(intIn(j, "r", 0, kMaxRound));
    v.seq = intIn(j, "s", -1, kMaxSeq - 1);
    v.spare = j.value("sp", false);
    v.finished = j.value("fin", false);
    if (j.contains("t")) v.text = textIn(j, "t", 2 * kMaxTextBytes);
    v.watch = idsIn(j, "w");
    return v;
  });
}

std::string encodePlacement(const Placement& p) {
  json j = {{"r", p.round},  {"g", p.groupRank},  {"gw", p.groupWorldSize},
            {"b", p.baseRank}, {"w", p.worldSize}, {"rc", p.restartCount},
            {"t", p.watch}};
  return j.dump();
}

Placement decodePlacement(const std::string& text, const std::string& key,
                          const Limits& lim) {
  return decode(text, key, kMaxSmallValue, "a node's place in a round", [&](const json& j) {
    Placement p;
    p.round = static_cast<int>(intIn(j, "r", 0, kMaxRound));
    p.groupWorldSize = static_cast<int>(intIn(j, "gw", 1, lim.maxNodes));
    p.groupRank = static_cast<int>(intIn(j, "g", 0, p.groupWorldSize - 1));
    p.worldSize = intIn(j, "w", p.groupWorldSize, INT32_MAX);
    p.baseRank = intIn(j, "b", 0, p.worldSize - 1);
    p.restartCount = static_cast<int>(intIn(j, "rc", 0, p.round));
    p.watch = idsIn(j, "t");
    return p;
  });
}

std::vector<Placement> placements(const State& s) {
  std::vector<int> sizes;
  sizes.reserve(s.participants.size());
  for (const auto& d : s.participants) sizes.push_back(d.nproc);
  const RankLayout layout = assignRanks(sizes);
  const WatchRing ring(s);
  std::vector<Placement> out(s.participants.size());
  for (size_t i = 0; i < out.size(); ++i) {
    Placement& p = out[i];
    p.round = s.round;
    p.groupRank = static_cast<int>(i);
    p.groupWorldSize = static_cast<int>(out.size());
    p.baseRank = layout.baseRanks[i];
    p.worldSize = layout.worldSize;
    p.restartCount = s.restartCount;
    p.watch = ring.targets(s.participants[i].id);
  }
  return out;
}

RoundInfo roundInfoOf(const Placement& p, const std::string& sizes, const std::string& key) {
  RoundInfo info;
  info.round = p.round;
  info.groupRank = p.groupRank;
  info.groupWorldSize = p.groupWorldSize;
  info.restartCount = p.restartCount;
  info.localWorldSizes = decodeSizes(sizes, key, p.groupWorldSize);
  const RankLayout layout = assignRanks(info.localWorldSizes);
  info.baseRank = layout.baseRanks[static_cast<size_t>(p.groupRank)];
  info.worldSize = layout.worldSize;
  if (info.baseRank != p.baseRank || info.worldSize != p.worldSize)
    DDPRUN_THROW(ProtocolError, "round ", p.round, "'s sizes under ", key,
                 " do not add up to this node's place (base rank ", p.baseRank, " of ",
                 p.worldSize, "); is another job or program using this --rdzv-id on this "
                 "store?");
  return info;
}

std::string encodeSizes(const std::vector<int>& sizes) {
  std::string out;
  for (size_t i = 0; i < sizes.size();) {
    size_t j = i;
    while (j < sizes.size() && sizes[j] == sizes[i]) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(sizes[i]);
    if (j - i > 1) {
      out += 'x';
      out += std::to_string(j - i);
    }
    i = j;
  }
  return out;
}

std::vector<int> decodeSizes(const std::string& text, const std::string& key, int count) {
  const auto bad = [&] {
    DDPRUN_THROW(ProtocolError, "the rendezvous store holds '", str::escape(text, 80),
                 "' under ", key, ", which is not the sizes of ", count,
                 " nodes; is another job or program using this --rdzv-id on this store?");
  };
  std::vector<int> out;
  if (count <= 0 || text.size() > 16 * static_cast<size_t>(count)) bad();
  for (const auto& run : str::split(text, ',')) {
    const auto parts = str::split(run, 'x');
    int size = 0, times = 1;
    if (parts.empty() || parts.size() > 2 || !str::parseInt(parts[0], size, 1, kMaxNproc) ||
        (parts.size() == 2 && !str::parseInt(parts[1], times, 2, count)) ||
        times > count - static_cast<int>(out.size()))
      bad();
    out.insert(out.end(), static_cast<size_t>(times), size);
  }
  if (static_cast<int>(out.size()) != count) bad();
  return out;
}

std::string encodeRoster(const State& s) {
  std::string out;
  for (const auto& d : s.participants) out += d.id + "\n";
  return out;
}

std::vector<std::string> decodeRoster(const std::string& text, const std::string& key,
                                      const Limits& lim) {
  std::vector<std::string> out;
  const size_t most = static_cast<size_t>(lim.maxNodes) * (kMaxIdBytes + 1);
  bool ok = text.size() <= most;
  if (ok)
    for (const auto& line : str::split(text, '\n')) {
      if (line.empty()) continue;
      if (!isValidNodeId(line) || static_cast<int>(out.size()) >= lim.maxNodes) {
        ok = false;
        break;
      }
      out.push_back(line);
    }
  if (!ok)
    DDPRUN_THROW(ProtocolError, "the rendezvous store holds '", str::escape(text, 80),
                 "' under ", key, ", which is not a round's list of at most ", lim.maxNodes,
                 " nodes; is another job or program using this --rdzv-id on this store?");
  return out;
}

std::vector<Verdict> foldArrivals(State& s, int64_t first,
                                  const std::vector<std::optional<Arrival>>& arrivals,
                                  const Limits& lim, int64_t nowMs) {
  std::vector<Verdict> out;
  out.reserve(arrivals.size());
  std::unique_ptr<WatchRing> ring;  // rebuilt only when a forming verdict needs it
  int ringRound = -1;
  size_t ringCount = 0;
  // The participants' ids, kept beside the state: a step's one O(N) part.
  std::unordered_set<std::string> present;
  const auto index = [&] {
    present.clear();
    for (const auto& d : s.participants) present.insert(d.id);
  };
  index();
  for (size_t i = 0; i < arrivals.size(); ++i) {
    const auto& a = arrivals[i];
    Verdict v;
    if (s.closed) {
      v.kind = Verdict::kClosed;
      v.round = s.round;
      v.text = s.closedReason;
      v.finished = s.lastEnd == encodeEnd(RoundEnd::kFinished, -1, "");
    } else if (!a) {
      v.kind = Verdict::kSkipped;
      v.round = s.round;
    } else {
      State probe;  // the job's settings, or (no state yet) the folder's
      probe.job = s.job.maxNodes ? s.job
                                 : JobSettings{lim.minNodes, lim.maxNodes, lim.lastCallMs,
                                               lim.heartbeatMs, "the_folder_0"};
      const std::string mismatch = jobMismatch(probe, a->lim);
      if (!mismatch.empty()) {
        v.kind = Verdict::kMismatch;
        v.round = s.round;
        v.text = mismatch;
      } else {
        NodeDesc me = a->node;
        const int round = s.round;
        const size_t before = s.participants.size();
        const JoinOutcome outcome = joinStep(s, me, lim, nowMs, present.count(me.id) > 0);
        if (s.round != round || s.participants.size() < before)
          index();  // the round ended: its participants moved on
        else if (s.participants.size() > before)
          present.insert(me.id);
        if (me.seq < 0) me.seq = seqOf(s, me.id);  // listed already: its number
        const WatchRing* r = nullptr;
        if (outcome == JoinOutcome::kWaitComplete) {
          // The ring at this arrival; rebuilt when the round grew by a
          // quarter (a node's watch set while forming is a hint, and the
          // complete round's placement sets it again).
          if (!ring || ringRound != s.round || s.participants.size() > ringCount + ringCount / 4 + 4) {
            ring = std::make_unique<WatchRing>(s);
            ringRound = s.round;
            ringCount = s.participants.size();
          }
          r = ring.get();
        }
        v = verdictOf(s, outcome, me, r);
      }
    }
    out.push_back(std::move(v));
  }
  s.folded = std::max(s.folded, first + static_cast<int64_t>(arrivals.size()) - 1);
  return out;
}

int64_t foldTarget(const State& s, const Limits& lim) {
  if (s.job.maxNodes == 0 || s.closed || s.complete) return 1;
  const int64_t joined = static_cast<int64_t>(s.participants.size());
  int64_t target = std::max<int64_t>(1, joined / 2);
  target = std::min<int64_t>(target, std::max<int64_t>(1, lim.maxNodes - joined));
  if (joined < lim.minNodes) target = std::min<int64_t>(target, lim.minNodes - joined);
  if (!s.expected.empty()) {  // O(N): a set, not a scan per expected node
    std::unordered_set<std::string_view> in;
    in.reserve(s.participants.size());
    for (const auto& d : s.participants) in.insert(d.id);
    int64_t missing = 0;
    for (const auto& id : s.expected) missing += in.count(id) ? 0 : 1;
    target = std::min<int64_t>(target, std::max<int64_t>(1, missing));
  }
  return target;
}

std::string encodeProgress(const JoinProgress& p, int64_t lastCallMs) {
  json j = {{"r", p.round},       {"j", p.joined},          {"min", p.minNodes},
            {"max", p.maxNodes},  {"e", p.expected},        {"mc", p.missingCount},
            {"m", p.missing},     {"lc", lastCallMs}};
  if (!p.waitingFor.empty()) j["wf"] = p.waitingFor;
  return j.dump();
}

JoinProgress decodeProgress(const std::string& text, int64_t nowMs) {
  JoinProgress p;
  if (text.size() > kMaxSmallValue) return p;
  try {
    const json j = json::parse(text);
    p.round = static_cast<int>(intIn(j, "r", 0, kMaxRound));
    p.joined = static_cast<int>(intIn(j, "j", 0, kMaxNodesEver));
    p.minNodes = static_cast<int>(intIn(j, "min", 0, kMaxNodesEver));
    p.maxNodes = static_cast<int>(intIn(j, "max", 0, kMaxNodesEver));
    p.expected = static_cast<int>(intIn(j, "e", 0, 4 * int64_t{kMaxNodesEver}));
    p.missingCount = static_cast<int>(intIn(j, "mc", 0, 4 * int64_t{kMaxNodesEver}));
    const json& m = j.at("m");
    if (!m.is_array() || m.size() > JoinProgress::kListed) throw Bad("\"m\"");
    for (const auto& name : m) {
      std::string t = name.get<std::string>();
      if (t.size() > kMaxIdBytes + 32) throw Bad("\"m\"");
      p.missing.push_back(std::move(t));
    }
    if (j.contains("wf")) p.waitingFor = textIn(j, "wf", 256);
    const int64_t lc = intIn(j, "lc", 0, INT64_MAX / 4);
    if (lc != 0) p.lastCallSeconds = static_cast<double>(std::max<int64_t>(0, lc - nowMs)) / 1000.0;
  } catch (const std::exception&) {  // progress is for humans: junk shows nothing
    return JoinProgress{};
  }
  return p;
}

}  // namespace ddprun::rendezvous::detail
