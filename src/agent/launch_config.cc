#include "ddprun/agent/launch_config.h"

#include <signal.h>

#include <charconv>
#include <cstring>
#include <sstream>

#include "ddprun/common/error.h"

namespace ddprun::agent {

namespace {
bool parseInt(const std::string& text, int& out) {
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return !text.empty() && ec == std::errc() && ptr == text.data() + text.size();
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, sep);) out.push_back(item);
  if (!text.empty() && text.back() == sep) out.emplace_back();
  return out;
}

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t");
  auto e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

struct SignalEntry {
  const char* name;
  int number;
};
constexpr SignalEntry kSignals[] = {
    {"SIGHUP", SIGHUP},   {"SIGINT", SIGINT},   {"SIGQUIT", SIGQUIT}, {"SIGABRT", SIGABRT},
    {"SIGKILL", SIGKILL}, {"SIGSEGV", SIGSEGV}, {"SIGPIPE", SIGPIPE}, {"SIGALRM", SIGALRM},
    {"SIGTERM", SIGTERM}, {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}, {"SIGCONT", SIGCONT},
    {"SIGSTOP", SIGSTOP}, {"SIGTSTP", SIGTSTP}, {"SIGBUS", SIGBUS},   {"SIGFPE", SIGFPE},
    {"SIGILL", SIGILL},   {"SIGTRAP", SIGTRAP}, {"SIGXCPU", SIGXCPU}, {"SIGXFSZ", SIGXFSZ},
    {"SIGCHLD", SIGCHLD}, {"SIGPWR", SIGPWR},   {"SIGSYS", SIGSYS}};
}  // namespace

Std StdSpec::forRank(int localRank) const {
  if (all) return *all;
  auto it = perRank.find(localRank);
  return it == perRank.end() ? Std::kNone : it->second;
}

void parseNnodes(const std::string& text, int& minNodes, int& maxNodes) {
  auto parts = split(text, ':');
  bool ok = parts.size() == 1 || parts.size() == 2;
  int lo = 0, hi = 0;
  ok = ok && parseInt(parts[0], lo);
  hi = lo;
  if (ok && parts.size() == 2) ok = parseInt(parts[1], hi);
  if (!ok || lo <= 0 || lo > hi)
    DDPRUN_THROW(InvalidArgument, "--nnodes: invalid value '", text,
                 "': expected N or MIN:MAX with 0 < MIN <= MAX (e.g. --nnodes 2 or "
                 "--nnodes 1:4)");
  minNodes = lo;
  maxNodes = hi;
}

void parseNprocPerNode(const std::string& text, NprocKind& kind, int& count) {
  if (text == "cpu") kind = NprocKind::kCpu;
  else if (text == "gpu") kind = NprocKind::kGpu;
  else if (text == "auto") kind = NprocKind::kAuto;
  else if (parseInt(text, count) && count > 0) kind = NprocKind::kCount;
  else
    DDPRUN_THROW(InvalidArgument, "--nproc-per-node: invalid value '", text,
                 "': expected a positive integer, 'cpu', 'gpu' or 'auto'");
}

StdSpec parseStdSpec(const std::string& text, const std::string& flag) {
  const char* forms =
      "': expected 0 (none), 1 (stdout), 2 (stderr), 3 (both) for every rank, or a "
      "per-local-rank map such as 0:1,1:3";
  StdSpec spec;
  int v = 0;
  if (parseInt(text, v)) {
    if (v < 0 || v > 3) DDPRUN_THROW(InvalidArgument, flag, ": invalid value '", text, forms);
    spec.all = static_cast<Std>(v);
    return spec;
  }
  for (const auto& item : split(text, ',')) {
    auto colon = item.find(':');
    int rank = 0, value = 0;
    if (colon == std::string::npos || !parseInt(item.substr(0, colon), rank) || rank < 0 ||
        !parseInt(item.substr(colon + 1), value) || value < 0 || value > 3)
      DDPRUN_THROW(InvalidArgument, flag, ": invalid value '", text, forms);
    spec.perRank[rank] = static_cast<Std>(value);
  }
  return spec;
}

std::set<int> parseLocalRanksFilter(const std::string& text) {
  std::set<int> out;
  if (text.empty()) return out;
  for (const auto& item : split(text, ',')) {
    int r = 0;
    if (!parseInt(trim(item), r) || r < 0)
      DDPRUN_THROW(InvalidArgument, "--local-ranks-filter: invalid value '", text,
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
      DDPRUN_THROW(InvalidArgument, "--rdzv-conf: invalid entry '", item, "' in '", text,
                   "': expected KEY=VALUE pairs separated by commas, e.g. "
                   "join_timeout=900,read_timeout=120");
    out[key] = value;
  }
  return out;
}

std::vector<int> parseSignals(const std::string& text) {
  std::vector<int> out;
  for (const auto& raw : split(text, ',')) {
    std::string name = trim(raw);
    if (name.rfind("SIG", 0) != 0) name = "SIG" + name;
    int found = 0;
    for (const auto& s : kSignals)
      if (name == s.name) found = s.number;
    if (found == 0 || found == SIGKILL || found == SIGSTOP)
      DDPRUN_THROW(InvalidArgument, "--signals-to-handle: cannot handle '", trim(raw),
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

std::string signalName(int sig) {
  for (const auto& s : kSignals)
    if (s.number == sig) return s.name;
  return "SIG" + std::to_string(sig);
}

}  // namespace ddprun::agent
