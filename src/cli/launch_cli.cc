#include "ddprun/cli/launch_cli.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <iostream>

#include "ddprun/agent/agent.h"
#include "ddprun/agent/worker_spec.h"
#include "ddprun/common/env.h"
#include "ddprun/common/error.h"
#include "ddprun/common/log.h"
#include "ddprun/common/net.h"
#include "ddprun/version.h"

namespace ddprun::cli {

EnvLookup processEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

namespace {

// "nproc_per_node" -> "--nproc-per-node,--nproc_per_node"
std::string spellings(const std::string& dest) {
  std::string dashed = dest;
  std::replace(dashed.begin(), dashed.end(), '_', '-');
  return dashed == dest ? "--" + dest : "--" + dashed + ",--" + dest;
}

std::string petName(const std::string& dest) {
  std::string up = dest;
  std::transform(up.begin(), up.end(), up.begin(), ::toupper);
  return "PET_" + up;
}

// String-valued options are parsed as text and validated afterwards, so that
// PET_* values and flags share one validator with one message each.
struct Raw {
  std::string nnodes = "1:1", nprocPerNode = "1", rdzvConf, maxRestarts = "0",
              monitorInterval = "0.1", redirects = "0", tee = "0", localRanksFilter,
              dupOut, dupErr, nodeRank = "0", masterPort = "29500",
              signals = "SIGTERM,SIGINT,SIGHUP,SIGQUIT", shutdownTimeout;
};

int toInt(const std::string& text, const char* flag, int min) {
  size_t pos = 0;
  int v = 0;
  try {
    v = std::stoi(text, &pos);
  } catch (const std::exception&) {
    pos = std::string::npos;
  }
  if (pos != text.size() || v < min)
    DDPRUN_THROW(InvalidArgument, flag, ": invalid value '", text,
                 "': expected an integer >= ", min);
  return v;
}

void finish(const Raw& raw, const EnvLookup& env, agent::LaunchConfig& c) {
  agent::parseNnodes(raw.nnodes, c.minNodes, c.maxNodes);
  agent::parseNprocPerNode(raw.nprocPerNode, c.nprocKind, c.nprocPerNode);
  c.rdzvConf = agent::parseRdzvConf(raw.rdzvConf);
  c.maxRestarts = toInt(raw.maxRestarts, "--max-restarts", 0);
  c.nodeRank = toInt(raw.nodeRank, "--node-rank", 0);
  c.masterPort = net::parsePort(raw.masterPort, "--master-port");
  try {
    size_t pos = 0;
    c.monitorInterval = std::stod(raw.monitorInterval, &pos);
    if (pos != raw.monitorInterval.size() || !(c.monitorInterval > 0)) throw 0;
  } catch (...) {
    DDPRUN_THROW(InvalidArgument, "--monitor-interval: invalid value '",
                 raw.monitorInterval, "': expected a number of seconds > 0");
  }
  c.redirects = agent::parseStdSpec(raw.redirects, "--redirects");
  c.tee = agent::parseStdSpec(raw.tee, "--tee");
  c.localRanksFilter = agent::parseLocalRanksFilter(raw.localRanksFilter);
  c.duplicateStdoutFilters = agent::parseFilterList(raw.dupOut);
  c.duplicateStderrFilters = agent::parseFilterList(raw.dupErr);
  c.signalsToHandle = agent::parseSignals(raw.signals);
  c.signalsToHandleText = raw.signals;
  std::string shutdown = raw.shutdownTimeout;
  if (shutdown.empty()) shutdown = env("TORCH_ELASTIC_SHUTDOWN_TIMEOUT").value_or("30");
  c.shutdownTimeout = std::chrono::seconds(toInt(shutdown, "--shutdown-timeout", 0));
  if (c.module && c.noPython)
    DDPRUN_THROW(InvalidArgument,
                 "-m/--module and --no-python cannot be used together: --no-python runs "
                 "the program directly, -m runs a Python module");
  if (c.script.empty())
    DDPRUN_THROW(InvalidArgument,
                 "missing training script: usage is ddprun [flags] SCRIPT [args...], e.g. "
                 "ddprun --nproc-per-node=2 train.py --epochs 3");
  if (c.rdzvBackend != "static" && c.rdzvBackend != "c10d")
    DDPRUN_THROW(InvalidArgument, "--rdzv-backend: unsupported backend '", c.rdzvBackend,
                 "': ddprun supports 'static' and 'c10d' (etcd is not supported)");
  if (c.startMethod != "spawn" && c.startMethod != "fork" && c.startMethod != "forkserver")
    DDPRUN_THROW(InvalidArgument, "--start-method: invalid value '", c.startMethod,
                 "': expected spawn, fork or forkserver");
}

}  // namespace

int parseLaunchCli(int argc, const char* const* argv, const EnvLookup& env,
                   agent::LaunchConfig& c) {
  CLI::App app{"ddprun: a native drop-in for torchrun. Starts and watches the workers of a "
               "distributed training job on this node.\n"
               "Every flag may also be given as PET_<FLAG> in the environment."};
  app.set_version_flag("--version", std::string(kVersion));
  app.prefix_command();  // the first positional starts the worker command
  Raw raw;
  std::vector<CLI::Option*> envOpts;
  auto opt = [&](const std::string& dest, std::string& target, const std::string& help,
                 const std::string& extra = "") {
    auto* o = app.add_option(spellings(dest) + extra, target, help);
    envOpts.push_back(o);
    o->envname(petName(dest));
    return o;
  };
  auto flag = [&](const std::string& dest, bool& target, const std::string& help,
                  const std::string& extra = "") {
    auto* o = app.add_flag(spellings(dest) + extra, target, help);
    o->envname(petName(dest));
    return o;
  };
  opt("nnodes", raw.nnodes, "Number of nodes, N or MIN:MAX (default 1:1)");
  opt("nproc_per_node", raw.nprocPerNode, "Workers per node: N, cpu, gpu or auto (default 1)");
  opt("rdzv_backend", c.rdzvBackend, "Rendezvous backend: static or c10d (default static)");
  opt("rdzv_endpoint", c.rdzvEndpoint, "Rendezvous endpoint HOST[:PORT]");
  opt("rdzv_id", c.rdzvId, "Job id shared by every node (default none)");
  opt("rdzv_conf", raw.rdzvConf, "Rendezvous settings KEY=VALUE,...");
  flag("standalone", c.standalone, "Single node: rendezvous on a free local port");
  opt("max_restarts", raw.maxRestarts, "Worker group restarts before failing (default 0)");
  opt("monitor_interval", raw.monitorInterval,
      "Accepted for compatibility; ddprun sees worker exits as they happen");
  opt("start_method", c.startMethod, "spawn, fork or forkserver (compatibility)");
  opt("event_log_handler", c.eventLogHandler, "Events handler name (default null)");
  opt("role", c.role, "Worker role name (default 'default')");
  flag("module", c.module, "Run the script as a Python module (python -m)", ",-m");
  flag("no_python", c.noPython, "Run the script as a program, without python");
  flag("run_path", c.runPath, "Run the script with runpy.run_path");
  opt("log_dir", c.logDir, "Base directory for worker logs");
  opt("redirects", raw.redirects, "Streams redirected to files: 0-3 or RANK:0-3,...", ",-r");
  opt("tee", raw.tee, "Streams copied to files and console: 0-3 or RANK:0-3,...", ",-t");
  opt("local_ranks_filter", raw.localRanksFilter, "Local ranks shown on the console");
  opt("duplicate_stdout_filters", raw.dupOut, "Copy matching stdout lines (,, = comma)");
  opt("duplicate_stderr_filters", raw.dupErr, "Copy matching stderr lines (,, = comma)");
  opt("node_rank", raw.nodeRank, "This node's rank, static rendezvous (default 0)");
  opt("master_addr", c.masterAddr, "Address of node rank 0 (default 127.0.0.1)");
  opt("master_port", raw.masterPort, "Port of node rank 0's store (default 29500)");
  opt("local_addr", c.localAddr, "Address this node advertises");
  opt("logs_specs", c.logsSpecs, "Logs specification (compatibility)");
  opt("numa_binding", c.numaBinding, "NUMA binding (compatibility)");
  opt("signals_to_handle", raw.signals,
      "Signals forwarded to workers (default SIGTERM,SIGINT,SIGHUP,SIGQUIT)");
  opt("shutdown_timeout", raw.shutdownTimeout,
      "Seconds between SIGTERM and SIGKILL when stopping workers (default 30)");
  flag("virtual_local_rank", c.virtualLocalRank, "LOCAL_RANK=0 with one visible GPU each");
  try {
    app.parse(argc, argv);
    auto rest = app.remaining();
    if (!rest.empty() && rest[0].size() > 1 && rest[0][0] == '-')
      DDPRUN_THROW(InvalidArgument, "unknown flag '", rest[0],
                   "'; run 'ddprun --help' for the list of flags");
    if (!rest.empty()) {
      c.script = rest[0];
      c.scriptArgs.assign(rest.begin() + 1, rest.end());
    }
    finish(raw, env, c);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "ddprun: error: " << e.what() << "\nRun 'ddprun --help' for the flags.\n";
    return 2;
  } catch (const InvalidArgument& e) {
    std::cerr << "ddprun: error: " << e.message() << "\n";
    return 2;
  }
  return -1;
}

int runLaunchCli(int argc, const char* const* argv) {
  setLogTag("ddprun");
  auto env = processEnv();
  // Like torchrun, LOGLEVEL sets the agent's log level (default WARNING).
  try {
    setLogLevel(parseLogLevel(env("LOGLEVEL").value_or("warning")));
  } catch (const InvalidArgument&) {
    setLogLevel(LogLevel::kWarning);
  }
  agent::LaunchConfig cfg;
  int rc = parseLaunchCli(argc, argv, env, cfg);
  if (rc >= 0) return rc;
  // `ddprun train`: a bare name that is no file here runs the bundled program
  // beside ddprun, else one on PATH (a miss is reported when workers start).
  agent::resolveWorkerProgram(cfg, agent::ProgramSearch::fromProcess());
  agent::AgentParts parts;
  parts.launcher = std::make_unique<agent::PosixLauncher>();
  parts.environment = env::snapshot();
  agent::Agent a(std::move(cfg), std::move(parts));
  return a.run();
}

}  // namespace ddprun::cli
