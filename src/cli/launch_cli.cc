#include "ddprun/cli/launch_cli.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>

#include "ddprun/agent/agent.h"
#include "ddprun/agent/worker_spec.h"
#include "ddprun/cli/exit_codes.h"
#include "ddprun/cluster/slurm.h"
#include "ddprun/common/env.h"
#include "ddprun/common/error.h"
#include "ddprun/common/log.h"
#include "ddprun/common/main_guard.h"
#include "ddprun/common/net.h"
#include "ddprun/common/strings.h"
#include "ddprun/version.h"
#include "launch_values.h"

namespace ddprun::cli {

EnvLookup processEnv() {
  return [](const std::string& name) { return env::get(name); };
}

namespace {

// ------------------------------------------------------------ words -> values
// What the command line said: the last value of each flag given ("" for a
// switch), then the script and its arguments, verbatim.
struct CommandLine {
  std::map<std::string, std::string> values;  // dest -> value
  std::string immediate;  // help, version or print_completion: act on it and stop
  std::string script;
  std::vector<std::string> scriptArgs;
};

// argparse's rule: "-5" and "-.5" are values (negative numbers), not flags;
// so is "-" alone.
bool looksLikeFlag(const std::string& w) {
  if (w.size() < 2 || w[0] != '-') return false;
  std::string rest = w.substr(1);
  if (rest.find_first_not_of("0123456789.") != std::string::npos) return true;
  return std::count(rest.begin(), rest.end(), '.') > 1 || rest == ".";
}

// "--module" for -m/--module: the spelling messages use.
const std::string& longName(const FlagInfo& f) {
  for (const auto& n : f.names)
    if (str::startsWith(n, "--")) return n;
  return f.names.front();
}

[[noreturn]] void unknownFlag(const std::string& word) {
  DDPRUN_THROW(InvalidArgument, "unknown flag '", str::escape(word),
               "'; run 'ddprun --help' for the list of flags");
}

// An exact spelling, else a unique prefix of a long flag (argparse's
// allow_abbrev; the spellings of one flag count once).
const FlagInfo& findLong(const std::string& name, const std::string& word) {
  std::vector<const FlagInfo*> hits;
  for (const auto& f : launchFlags())
    for (const auto& n : f.names) {
      if (n == name) return f;
      if (name.size() > 2 && str::startsWith(n, name) &&
          std::find(hits.begin(), hits.end(), &f) == hits.end())
        hits.push_back(&f);
    }
  if (hits.size() == 1) return *hits.front();
  if (hits.empty()) unknownFlag(word);
  std::vector<std::string> names;
  for (const auto* f : hits)
    for (const auto& n : f->names)
      if (str::startsWith(n, name)) {
        names.push_back(n);
        break;
      }
  DDPRUN_THROW(InvalidArgument, "ambiguous flag '", str::escape(name), "': it could be ",
               str::join(names, ", "));
}

const FlagInfo* findShort(char letter) {
  for (const auto& f : launchFlags())
    for (const auto& n : f.names)
      if (n.size() == 2 && n[1] == letter) return &f;
  return nullptr;
}

class Tokenizer {
 public:
  Tokenizer(int argc, const char* const* argv)
      : words_(argv + std::min(argc, 1), argv + argc) {}

  CommandLine run() {
    while (i_ < words_.size() && out_.immediate.empty()) {
      const std::string& w = words_[i_];
      if (w == "--") {  // everything after it is the script and its arguments
        ++i_;
        break;
      }
      if (!looksLikeFlag(w)) break;
      ++i_;
      if (str::startsWith(w, "--"))
        longFlag(w);
      else
        shortFlags(w);
    }
    if (out_.immediate.empty() && i_ < words_.size()) {
      out_.script = words_[i_];
      out_.scriptArgs.assign(words_.begin() + static_cast<long>(i_) + 1, words_.end());
    }
    return out_;
  }

 private:
  void longFlag(const std::string& w) {
    auto eq = w.find('=');
    std::string name = w.substr(0, eq);
    const FlagInfo& f = findLong(name, w);
    // Messages name the flag as typed, or in full when abbreviated.
    bool exact = std::find(f.names.begin(), f.names.end(), name) != f.names.end();
    const std::string& shown = exact ? name : longName(f);
    if (eq == std::string::npos)
      take(f, shown, std::nullopt);
    else
      take(f, shown, w.substr(eq + 1));
  }

  // "-m", "-r3", "-r=3", "-r 3", "-mr3" (switches cluster, a value ends it).
  void shortFlags(const std::string& w) {
    for (size_t k = 1; k < w.size(); ++k) {
      const FlagInfo* f = findShort(w[k]);
      if (f == nullptr) unknownFlag(w);
      std::string spelled = std::string("-") + w[k];
      if (!f->takesValue) {
        take(*f, spelled, std::nullopt);
        if (!out_.immediate.empty()) return;
        continue;
      }
      std::string rest = w.substr(k + 1);
      if (rest.empty())
        take(*f, spelled, std::nullopt);
      else
        take(*f, spelled, rest[0] == '=' ? rest.substr(1) : rest);
      return;
    }
  }

  void take(const FlagInfo& f, const std::string& spelled,
            std::optional<std::string> inlineValue) {
    std::string value;
    if (!f.takesValue && inlineValue)
      DDPRUN_THROW(InvalidArgument, spelled, " takes no value (got '",
                   str::escape(*inlineValue), "')");
    if (f.takesValue && inlineValue) {
      value = *inlineValue;
    } else if (f.takesValue) {
      if (i_ >= words_.size() || looksLikeFlag(words_[i_]))
        DDPRUN_THROW(InvalidArgument, spelled, ": expected a value (",
                     f.metavar.empty() ? "VALUE" : f.metavar, ")");
      value = words_[i_++];
    }
    out_.values[f.dest] = value;
    if (f.dest == "help" || f.dest == "version" || f.dest == "print_completion")
      out_.immediate = f.dest;
  }

  std::vector<std::string> words_;
  size_t i_ = 0;
  CommandLine out_;
};

// ------------------------------------------------------------ values -> config
// The value of each flag given on the command line or through its PET_
// variable; a conversion error names where the bad value came from.
class Given {
 public:
  Given(const CommandLine& cl, const EnvLookup& env) {
    for (const auto& f : launchFlags()) {
      auto it = cl.values.find(f.dest);
      if (it != cl.values.end()) {
        add(f, it->second, "");
      } else if (!f.envVar.empty()) {
        if (auto v = env(f.envVar)) add(f, *v, f.envVar);
      }
    }
  }

  // Calls apply(value) when `dest` was given.
  template <typename Fn>
  void with(const std::string& dest, Fn&& apply) const {
    auto it = entries_.find(dest);
    if (it == entries_.end()) return;
    const Entry& e = it->second;
    try {
      if (!e.flag->choices.empty() &&
          std::find(e.flag->choices.begin(), e.flag->choices.end(), e.value) ==
              e.flag->choices.end())
        DDPRUN_THROW(InvalidArgument, longName(*e.flag), ": invalid choice '",
                     str::escape(e.value), "' (choose from ",
                     str::join(e.flag->choices, ", "), ")");
      apply(e.value);
    } catch (const InvalidArgument& err) {
      if (e.origin.empty()) throw;
      DDPRUN_THROW(InvalidArgument, e.origin, ": ", err.message());
    }
  }

  // The value of `dest` when given (command line or PET_*).
  std::optional<std::string> value(const std::string& dest) const {
    auto it = entries_.find(dest);
    if (it == entries_.end()) return std::nullopt;
    return it->second.value;
  }

  // Values a cluster manager's environment supplies, for flags not given.
  void addDefaults(const cluster::ClusterDefaults& d) {
    for (const auto& f : d.flags) {
      if (entries_.count(f.dest)) continue;
      const FlagInfo* info = findFlag(f.dest);
      if (info == nullptr) continue;
      entries_[f.dest] = Entry{info, f.value, "",
                               "'" + str::escape(f.value) + "' taken from " + d.manager +
                                   " (" + f.source + ") for --" +
                                   str::replaceAll(f.dest, "_", "-")};
    }
  }

  // A switch: true when given on the command line; from PET_ as torchrun's
  // check_env reads it, an integer (0 false, else true).
  void setSwitch(const std::string& dest, bool& target) const {
    auto it = entries_.find(dest);
    if (it == entries_.end()) return;
    const Entry& e = it->second;
    if (e.envVar.empty()) {
      target = true;
      return;
    }
    int64_t v = 0;
    if (!str::parseInt(str::trim(e.value), v))
      DDPRUN_THROW(
          InvalidArgument, e.envVar, "='", str::escape(e.value),
          "' is not an integer: torchrun reads PET_ switches as 1 (on) or 0 (off)");
    target = v != 0;
  }

  std::set<std::string> dests() const {
    std::set<std::string> out;
    for (const auto& [dest, e] : entries_) out.insert(dest);
    return out;
  }

 private:
  struct Entry {
    const FlagInfo* flag;
    std::string value;
    std::string envVar;  // "" when from the command line or a cluster manager
    std::string origin;  // where a value not typed on the command line came from
  };
  void add(const FlagInfo& f, const std::string& value, const std::string& envVar) {
    entries_[f.dest] =
        Entry{&f, value, envVar,
              envVar.empty() ? ""
                             : envVar + "='" + str::escape(value) + "' (from the environment)"};
  }
  static const FlagInfo* findFlag(const std::string& dest) {
    for (const auto& f : launchFlags())
      if (f.dest == dest) return &f;
    return nullptr;
  }
  std::map<std::string, Entry> entries_;
};

void applyRendezvous(const Given& g, agent::LaunchConfig& c) {
  g.with("nnodes", [&](const std::string& v) { parseNnodes(v, c.minNodes, c.maxNodes); });
  g.with("nproc_per_node", [&](const std::string& v) {
    parseNprocPerNode(v, c.nprocKind, c.nprocPerNode);
  });
  g.with("rdzv_backend", [&](const std::string& v) { c.rdzvBackend = v; });
  g.with("rdzv_endpoint", [&](const std::string& v) {
    c.rdzvEndpoint = parseHost(str::trim(v), "--rdzv-endpoint");
  });
  g.with("rdzv_id", [&](const std::string& v) {
    agent::checkRunId(v);  // named as given: PET_RDZV_ID or --rdzv-id
    c.rdzvId = v;
  });
  g.with("rdzv_conf", [&](const std::string& v) { c.rdzvConf = parseRdzvConf(v); });
  g.setSwitch("standalone", c.standalone);
  g.with("node_rank",
         [&](const std::string& v) { c.nodeRank = parseInteger(v, "--node-rank", 0); });
  g.with("master_addr",
         [&](const std::string& v) { c.masterAddr = parseHost(v, "--master-addr"); });
  g.with("master_port", [&](const std::string& v) {
    c.masterPort = net::parsePort(v, "--master-port");
  });
  g.with("local_addr",
         [&](const std::string& v) { c.localAddr = parseHost(v, "--local-addr"); });
}

// torchrun's fallback for --shutdown-timeout, when set and not empty.
std::optional<std::string> shutdownTimeoutFromEnv(const EnvLookup& env) {
  auto v = env("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
  if (!v || v->empty()) return std::nullopt;
  return v;
}

void applyWorkers(const Given& g, const EnvLookup& env, agent::LaunchConfig& c) {
  g.with("max_restarts", [&](const std::string& v) {
    c.maxRestarts = parseInteger(v, "--max-restarts", 0);
  });
  g.with("monitor_interval", [&](const std::string& v) {
    c.monitorInterval = parseSeconds(v, "--monitor-interval");
  });
  g.with("start_method", [&](const std::string& v) { c.startMethod = v; });
  g.with("event_log_handler", [&](const std::string& v) { c.eventLogHandler = v; });
  g.with("role", [&](const std::string& v) { c.role = v; });
  g.setSwitch("module", c.module);
  g.setSwitch("no_python", c.noPython);
  g.setSwitch("run_path", c.runPath);
  g.with("signals_to_handle", [&](const std::string& v) {
    c.signalsToHandle = parseSignals(v);
    c.signalsToHandleText = v;
  });
  // --shutdown-timeout, else TORCH_ELASTIC_SHUTDOWN_TIMEOUT (as torchrun), else 30 s.
  bool flagGiven = false;
  g.with("shutdown_timeout", [&](const std::string& v) {
    c.shutdownTimeout = std::chrono::seconds(parseInteger(v, "--shutdown-timeout", 0));
    flagGiven = true;
  });
  auto fromEnv = shutdownTimeoutFromEnv(env);
  if (!flagGiven && fromEnv)
    c.shutdownTimeout =
        std::chrono::seconds(parseInteger(*fromEnv, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", 0));
  g.setSwitch("virtual_local_rank", c.virtualLocalRank);
  g.with("logs_specs", [&](const std::string& v) { c.logsSpecs = v; });
  g.with("numa_binding", [&](const std::string& v) { c.numaBinding = v; });
}

void applyOutput(const Given& g, agent::LaunchConfig& c) {
  g.with("log_dir", [&](const std::string& v) { c.logDir = parsePath(v, "--log-dir"); });
  g.with("redirects",
         [&](const std::string& v) { c.redirects = parseStdSpec(v, "--redirects"); });
  g.with("tee", [&](const std::string& v) { c.tee = parseStdSpec(v, "--tee"); });
  g.with("local_ranks_filter",
         [&](const std::string& v) { c.localRanksFilter = parseLocalRanksFilter(v); });
  g.with("duplicate_stdout_filters",
         [&](const std::string& v) { c.duplicateStdoutFilters = parseFilterList(v); });
  g.with("duplicate_stderr_filters",
         [&](const std::string& v) { c.duplicateStderrFilters = parseFilterList(v); });
  g.with("log_line_prefix_template",
         [&](const std::string& v) { c.logLinePrefixTemplate = v; });
}

// --status-port, --status-addr, --progress-timeout (docs/status.md).
void applyStatus(const Given& g, agent::LaunchConfig& c) {
  g.with("status_port",
         [&](const std::string& v) { c.statusPort = net::parsePort(v, "--status-port"); });
  g.with("status_addr", [&](const std::string& v) { c.statusAddr = parseStatusAddr(v); });
  g.with("progress_timeout", [&](const std::string& v) {
    c.progressTimeout = std::chrono::milliseconds(
        std::max<int64_t>(1, std::llround(parseSeconds(v, "--progress-timeout") * 1000)));
  });
}

// What a cluster manager does with signals, unless the user chose: its
// signals to every process are lived through (not the agent's to handle),
// and no SIGKILL comes before the manager's own at the end of its grace.
void applySignalPolicy(const cluster::ClusterDefaults& d, const Given& g,
                       const EnvLookup& env, agent::LaunchConfig& c) {
  if (d.empty()) return;
  if (!g.value("signals_to_handle"))
    for (int s : d.signalsToEveryProcess)
      if (std::find(c.signalsToHandle.begin(), c.signalsToHandle.end(), s) ==
          c.signalsToHandle.end())
        c.survivedSignals.push_back(s);
  if (d.enforcesGracePeriod && !g.value("shutdown_timeout") && !shutdownTimeoutFromEnv(env))
    c.killAfterSignal = false;
}

// The one line saying what was taken from the cluster manager.
std::string clusterNotice(const cluster::ClusterDefaults& d, const agent::LaunchConfig& c) {
  std::string line = d.summary();
  std::vector<std::string> names;
  for (int s : c.survivedSignals) names.push_back(agent::signalName(s));
  if (!names.empty())
    line += "; " + str::join(names, ", ") + " from " + d.manager +
            " reach the workers directly and do not stop the job";
  if (!c.killAfterSignal)
    line += "; on SIGTERM the workers get " + d.manager +
            "'s grace period (no SIGKILL from ddprun)";
  return line;
}

// --help, --version and --print-completion print to stdout and end the run.
int runImmediate(const CommandLine& cl, agent::LaunchConfig& c) {
  if (cl.immediate == "help") std::cout << launchHelp();
  if (cl.immediate == "version") std::cout << "ddprun " << kVersionDescription << "\n";
  if (cl.immediate == "print_completion") {
    c.printCompletion = true;
    std::cout << completionScript(cl.values.at("print_completion"));
  }
  std::cout.flush();
  return 0;
}

}  // namespace

int parseLaunchCli(int argc, const char* const* argv, const EnvLookup& env,
                   agent::LaunchConfig& c) {
  try {
    CommandLine cl = Tokenizer(argc, argv).run();
    if (!cl.immediate.empty()) return runImmediate(cl, c);
    Given given(cl, env);
    // Inside a Slurm step, the step's layout fills the flags nobody gave.
    cluster::ClusterDefaults fromCluster = cluster::slurmDefaults(
        env, [&](const std::string& dest) { return given.value(dest); }, net::resolves);
    given.addDefaults(fromCluster);
    applyRendezvous(given, c);
    applyWorkers(given, env, c);
    applyOutput(given, c);
    applyStatus(given, c);
    c.explicitFlags = given.dests();
    applySignalPolicy(fromCluster, given, env, c);
    if (!fromCluster.empty()) c.notices.push_back(clusterNotice(fromCluster, c));
    c.script = cl.script;
    c.scriptArgs = cl.scriptArgs;
    agent::finalizeConfig(c);
  } catch (const InvalidArgument& e) {
    std::cerr << "ddprun: error: " << e.message() << "\n";
    return agent::kExitUsage;
  }
  return -1;
}

namespace {
// Parses, then runs the agent; ddprun's own exit code.
int parseAndRun(int argc, const char* const* argv, const EnvLookup& env) {
  agent::LaunchConfig cfg;
  int rc = parseLaunchCli(argc, argv, env, cfg);
  if (rc >= 0) return rc;
  for (const auto& n : cfg.notices) DDPRUN_NOTICE(n);
  try {
    // `ddprun train`: a bare name that is no file here runs the bundled program
    // beside ddprun, else one on PATH (a miss is reported when workers start).
    agent::resolveWorkerProgram(cfg, agent::ProgramSearch::fromProcess());
    agent::AgentParts parts;
    parts.launcher = std::make_unique<agent::PosixLauncher>();
    parts.environment = env::snapshot();
    agent::Agent a(std::move(cfg), std::move(parts));
    return a.run();
  } catch (const Error& e) {
    DDPRUN_DEBUG("agent failed: ", e.what());
    DDPRUN_ERROR(e.message());
  } catch (const std::exception& e) {
    DDPRUN_ERROR(e.what());
  }
  return agent::kExitSetup;
}
}  // namespace

int runLaunchCli(int argc, const char* const* argv) {
  // `ddprun status HOST:PORT` reads an agent's endpoint (a script named
  // `status` runs as `ddprun ./status`).
  if (argc >= 2 && std::string(argv[1]) == "status") return runStatusCli(argc - 1, argv + 1);
  setLogTag("ddprun");
  setLogStyle(LogStyle::kConsole);
  auto env = processEnv();
  // Like torchrun, LOGLEVEL sets the agent's log level (default WARNING).
  try {
    setLogLevel(parseLogLevel(env("LOGLEVEL").value_or("warning")));
  } catch (const InvalidArgument&) {
    setLogLevel(LogLevel::kWarning);
  }
  ExitCodeStyle style;
  try {
    style = parseExitCodeStyle(env(kExitCodesEnv));
  } catch (const InvalidArgument& e) {
    std::cerr << "ddprun: error: " << e.message() << "\n";
    return agent::kExitUsage;
  }
  // Anything escaping (std::bad_alloc included) is an unexpected error, 3,
  // in the style asked for.
  return exitCodeIn(style, runGuarded("ddprun", agent::kExitSetup,
                                      [&] { return parseAndRun(argc, argv, env); }));
}

}  // namespace ddprun::cli
