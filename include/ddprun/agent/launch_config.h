// Everything one `ddprun` invocation asks for, validated: the torchrun flag
// set (both spellings, PET_* fallback) turned into typed values.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace ddprun::agent {

// Which worker streams go to files (redirect) or are also copied to the
// console (tee): torchrun's Std values 0 none, 1 stdout, 2 stderr, 3 both.
enum class Std : int { kNone = 0, kOut = 1, kErr = 2, kAll = 3 };

// A Std for every local rank, or per rank ("0:1,1:2"; unlisted ranks: none).
struct StdSpec {
  std::optional<Std> all;
  std::map<int, Std> perRank;
  Std forRank(int localRank) const;
};

enum class NprocKind { kCount, kCpu, kGpu, kAuto };

struct LaunchConfig {
  int minNodes = 1;
  int maxNodes = 1;
  NprocKind nprocKind = NprocKind::kCount;
  int nprocPerNode = 1;  // kCount only; resolved later for cpu/gpu/auto
  std::string rdzvBackend = "static";
  std::string rdzvEndpoint;
  std::string rdzvId = "none";
  std::map<std::string, std::string> rdzvConf;
  bool standalone = false;
  int maxRestarts = 0;
  double monitorInterval = 0.1;  // accepted for compatibility; exits are events
  std::string startMethod = "spawn";
  std::string eventLogHandler = "null";
  std::string role = "default";
  bool module = false;
  bool noPython = false;
  bool runPath = false;
  std::string logDir;  // empty: a fresh temporary directory
  StdSpec redirects;
  StdSpec tee;
  std::set<int> localRanksFilter;  // empty: every rank
  std::vector<std::string> duplicateStdoutFilters;
  std::vector<std::string> duplicateStderrFilters;
  int nodeRank = 0;
  std::string masterAddr = "127.0.0.1";
  uint16_t masterPort = 29500;
  std::string localAddr;
  std::string logsSpecs;
  std::string numaBinding;
  std::vector<int> signalsToHandle;  // signal numbers
  // As given on the command line; exported to workers as
  // TORCHELASTIC_SIGNALS_TO_HANDLE, like torchrun does.
  std::string signalsToHandleText = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  std::chrono::seconds shutdownTimeout{30};
  bool virtualLocalRank = false;
  std::string script;  // training script, module or program
  // Set by resolveWorkerProgram when no program of that name was found: the
  // error (naming the places searched), raised where the workers would start
  // (exit 3), so that the agent's flag checks (exit 2) still come first.
  std::string programNotFound;
  std::vector<std::string> scriptArgs;

  // --log-line-prefix-template (else TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE).
  std::string logLinePrefixTemplate;
  bool printCompletion = false;  // --print-completion

  // Static rendezvous: how long a node waits for its peers (--rdzv-conf
  // timeout=SECONDS; torchrun's default 900 s).
  std::chrono::milliseconds rdzvTimeout{900'000};

  // Derived by finalizeConfig:
  // torchrun 2.x's one-node default took effect (no --master-port, no
  // rendezvous flag, one node): a free port and a fresh uuid as run id.
  bool standaloneByDefault = false;
  // Flags accepted for compatibility that this version cannot honour: one
  // warning each, printed once when the agent starts.
  std::vector<std::string> warnings;
};

// Checks every rule across flags (ranges, combinations, backend-specific
// settings such as --rdzv-conf timeout) and fills the derived fields:
// the one-node default of torchrun 2.x, --standalone's run id and port,
// --rdzv-endpoint as master address and port for the static backend.
// Throws InvalidArgument naming the flag and the accepted forms (exit 2).
void finalizeConfig(LaunchConfig& cfg);

// Parsers for the flag values; each throws InvalidArgument whose message
// names the flag and the accepted forms.
void parseNnodes(const std::string& text, int& minNodes, int& maxNodes);
void parseNprocPerNode(const std::string& text, NprocKind& kind, int& count);
StdSpec parseStdSpec(const std::string& text, const std::string& flag);
std::set<int> parseLocalRanksFilter(const std::string& text);
std::map<std::string, std::string> parseRdzvConf(const std::string& text);
std::vector<int> parseSignals(const std::string& text);
// Splits a comma list where ",," stands for a literal comma.
std::vector<std::string> parseFilterList(const std::string& text);
// The signal's name without "SIG" prefix handling: "SIGTERM" for 15.
std::string signalName(int sig);

}  // namespace ddprun::agent
