#include "launch_values.h"

#include <climits>
#include <limits>

#include "ddprun/common/error.h"
#include "ddprun/common/net.h"
#include "ddprun/common/strings.h"
#include "ddprun/common/user_input.h"

namespace ddprun::cli {

namespace {
// The smallest double > 0: "> 0" as an inclusive bound.
constexpr double kMinPositive = std::numeric_limits<double>::denorm_min();
// Durations beyond a year are typos (and overflow milliseconds soon after).
constexpr int64_t kMaxSeconds = 365LL * 24 * 3600;
using str::parseInt;
using str::split;
using str::trim;
}  // namespace

void parseNnodes(const std::string& text, int& minNodes, int& maxNodes) {
  auto parts = split(text, ':');
  bool ok = parts.size() == 1 || parts.size() == 2;
  int lo = 0, hi = 0;
  ok = ok && parseInt(parts[0], lo);
  hi = lo;
  if (ok && parts.size() == 2) ok = parseInt(parts[1], hi);
  if (!ok || lo <= 0 || lo > hi)
    DDPRUN_THROW(InvalidArgument, "--nnodes: invalid value '", str::escape(text),
                 "': expected N or MIN:MAX with 0 < MIN <= MAX (e.g. --nnodes 2 or "
                 "--nnodes 1:4)");
  minNodes = lo;
  maxNodes = hi;
}

void parseNprocPerNode(const std::string& text, agent::NprocKind& kind, int& count) {
  if (text == "cpu")
    kind = agent::NprocKind::kCpu;
  else if (text == "gpu")
    kind = agent::NprocKind::kGpu;
  else if (text == "auto")
    kind = agent::NprocKind::kAuto;
  else if (parseInt(text, count) && count > 0)
    kind = agent::NprocKind::kCount;
  else
    DDPRUN_THROW(InvalidArgument, "--nproc-per-node: invalid value '", str::escape(text),
                 "': expected a positive integer, 'cpu', 'gpu' or 'auto'");
}

agent::StdSpec parseStdSpec(const std::string& text, const std::string& flag) {
  const char* forms =
      "': expected 0 (none), 1 (stdout), 2 (stderr), 3 (both) for every rank, or a "
      "per-local-rank map such as 0:1,1:3";
  agent::StdSpec spec;
  int v = 0;
  const std::string shown = str::escape(text);
  if (text.empty())
    DDPRUN_THROW(InvalidArgument, flag, ": invalid value '", shown, forms);
  if (parseInt(text, v)) {
    if (v < 0 || v > 3)
      DDPRUN_THROW(InvalidArgument, flag, ": invalid value '", shown, forms);
    spec.all = static_cast<agent::Std>(v);
    return spec;
  }
  for (const auto& item : split(text, ',')) {
    auto colon = item.find(':');
    int rank = 0, value = 0;
    if (colon == std::string::npos || !parseInt(item.substr(0, colon), rank) ||
        rank < 0 || !parseInt(item.substr(colon + 1), value) || value < 0 || value > 3)
      DDPRUN_THROW(InvalidArgument, flag, ": invalid value '", shown, forms);
    spec.perRank[rank] = static_cast<agent::Std>(value);
  }
  return spec;
}

std::set<int> parseLocalRanksFilter(const std::string& text) {
  std::set<int> out;
  if (text.empty()) return out;
  for (const auto& item : split(text, ',')) {
    int r = 0;
    if (!parseInt(trim(item), r) || r < 0)
      DDPRUN_THROW(InvalidArgument, "--local-ranks-filter: invalid value '",
                   str::escape(text),
                   "': expected comma-separated local ranks, e.g. 0,2");
    out.insert(r);
  }
  return out;
}

std::map<std::string, std::string> parseRdzvConf(const std::string& text) {
  std::map<std::string, std::string> out;
  if (trim(text).empty()) return out;
  for (const auto& item : split(text, ',')) {
    auto eq = item.find('=');
    std::string key = trim(item.substr(0, eq));
    std::string value = eq == std::string::npos ? "" : trim(item.substr(eq + 1));
    if (eq == std::string::npos || key.empty() || value.empty())
      DDPRUN_THROW(InvalidArgument, "--rdzv-conf: invalid entry '", str::escape(item),
                   "' in '", str::escape(text),
                   "': expected KEY=VALUE pairs separated by commas, e.g. "
                   "join_timeout=900,read_timeout=120");
    out[key] = value;
  }
  return out;
}

std::vector<int> parseSignals(const std::string& text) {
  std::vector<int> out;
  if (trim(text).empty())
    DDPRUN_THROW(
        InvalidArgument,
        "--signals-to-handle: empty: expected comma-separated signal names such as "
        "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
  for (const auto& raw : split(text, ',')) {
    std::string name = trim(raw);
    if (!str::startsWith(name, "SIG")) name.insert(0, "SIG");
    int found = agent::signalByName(name).value_or(0);
    if (found == 0 || found == SIGKILL || found == SIGSTOP)
      DDPRUN_THROW(InvalidArgument, "--signals-to-handle: cannot handle '",
                   str::escape(trim(raw)),
                   "': expected comma-separated signal names such as "
                   "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 (SIGKILL and SIGSTOP cannot be "
                   "caught)");
    out.push_back(found);
  }
  return out;
}

std::vector<std::string> parseFilterList(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == ',' && i + 1 < text.size() && text[i + 1] == ',') {
      cur += ',';
      ++i;
    } else if (text[i] == ',') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += text[i];
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

int parseInteger(const std::string& text, const char* flag, int min) {
  return static_cast<int>(
      input::numberFlag<int64_t>(flag, text, min, INT_MAX,
                                 "an integer >= " + std::to_string(min) + " (at most " +
                                     std::to_string(INT_MAX) + ")"));
}

double parseSeconds(const std::string& text, const char* flag) {
  return input::numberFlag<double>(
      flag, text, kMinPositive, kMaxSeconds,
      "a number of seconds > 0 (at most " + std::to_string(kMaxSeconds) + ")");
}

std::string parseHost(const std::string& text, const char* flag) {
  input::refuseControlChars(flag, text, "host name");
  return text;
}

std::string parsePath(const std::string& text, const char* flag) {
  input::refuseControlChars(flag, text, "path");
  return text;
}

std::string parseStatusAddr(const std::string& text) {
  std::string addr = str::trim(text);
  if (addr.size() > 2 && addr.front() == '[' && addr.back() == ']')
    addr = addr.substr(1, addr.size() - 2);
  if (!net::isIpLiteral(addr))
    DDPRUN_THROW(InvalidArgument, "--status-addr: '", str::escape(text),
                 "' is not an IP address; give one such as 127.0.0.1 (the default), "
                 "0.0.0.0 or ::1");
  return addr;
}

}  // namespace ddprun::cli
