// Everything one `ddprun` invocation asks for, validated: the torchrun flag
// set (both spellings, PET_* fallback) turned into typed values.
//
// Life cycle: the command line (src/cli/launch_cli.cc, each flag's value
// parsed by src/cli/launch_values.cc) fills the flag fields, then
// finalizeConfig() checks every rule across flags and fills the derived
// fields. After it, the rendezvous to use follows from three fields:
//   useDynamic:    the dynamic (c10d-style, elastic) rendezvous: its store at
//                  endpointHost:endpointPort, hosted by this agent when
//                  isHost; minNodes..maxNodes nodes; settings in c10d;
//                  localAddr advertised when given;
//   maxNodes == 1: the local rendezvous, its store on masterAddr:masterPort
//                  (port 0: a free port each round);
//   maxNodes  > 1: the static rendezvous (rdzvBackend == "static") on
//                  masterAddr:masterPort with rdzvTimeout.
// --rdzv-backend=c10d takes the dynamic rendezvous when maxNodes > 1 (every
// MIN:MAX range among them), and on one node when this agent does not host
// the endpoint (it is another machine, or is_host=false: e.g. a separate
// ddprun-store). c10d on one node hosting its own endpoint keeps the local
// rendezvous: one node completes at once either way, so torchrun's
// behaviour (one round, a free worker-store port, the run id kept) is the
// same without a store to host. --standalone and torchrun 2.x's one-node
// default are local too.
// A plain value type; not synchronised.
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ddprun/rendezvous/spec.h"

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
// --nproc-per-node on this machine: `count`, the CPUs of the affinity mask
// (as torchrun 2.x counts), the CUDA devices (0 when `gpu` finds none: the
// caller's error), or auto (the GPUs, else the CPUs).
int resolveNproc(NprocKind kind, int count);

// The c10d rendezvous settings of --rdzv-conf (torchrun's names and
// defaults), validated by finalizeConfig. The dynamic rendezvous uses
// join_timeout, last_call_timeout, close_timeout, read_timeout,
// keep_alive_interval (at least 0.05 s: launch_config.cc says why),
// keep_alive_max_attempt and is_host; heartbeat_timeout
// and use_libuv are validated and have no effect; store_type=file is refused
// across nodes (the rendezvous store is a TCP store).
struct C10dSettings {
  std::chrono::milliseconds joinTimeout{600'000};
  std::chrono::milliseconds lastCallTimeout{30'000};
  std::chrono::milliseconds closeTimeout{30'000};
  std::chrono::milliseconds readTimeout{60'000};
  std::chrono::milliseconds heartbeatTimeout{5'000};
  std::chrono::milliseconds keepAliveInterval{5'000};
  int keepAliveMaxAttempt = 3;
  // ddprun's own: how often a waiting join says where it stands (log, status).
  std::chrono::milliseconds joinProgressInterval{5'000};
  std::optional<bool> isHost;     // unset: inferred from the endpoint
  std::string storeType = "tcp";  // tcp | file
  bool useLibuv = true;
  // token_file: a file holding the shared secret of the rendezvous store
  // (docs/rendezvous.md, "Authentication"); $DDPRUN_RDZV_TOKEN otherwise.
  std::string tokenFile;
};

struct LaunchConfig {
  int minNodes = 1;
  int maxNodes = 1;
  NprocKind nprocKind = NprocKind::kCount;
  int nprocPerNode = 1;  // kCount only; resolved later for cpu/gpu/auto
  std::string rdzvBackend = "static";
  std::string rdzvEndpoint;
  std::string rdzvId = "none";
  std::map<std::string, std::string> rdzvConf;  // --rdzv-conf as given (KEY -> VALUE)
  // The rendezvous store's shared secret (from c10d.tokenFile or
  // $DDPRUN_RDZV_TOKEN), empty for an open store. Never printed or logged,
  // and never passed on to the workers.
  std::string rdzvSecret;
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
  uint16_t masterPort = 29500;  // finalizeConfig: 0 (a free port) on the standalone path
  // --local-addr: the address this node advertises (validated: a host name
  // or an IP literal, never reverse-resolved; brackets around IPv6 removed).
  std::string localAddr;
  std::string logsSpecs;
  std::string numaBinding;
  std::vector<int> signalsToHandle{SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  // As given on the command line; exported to workers as
  // TORCHELASTIC_SIGNALS_TO_HANDLE, like torchrun does.
  std::string signalsToHandleText = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  std::chrono::seconds shutdownTimeout{30};
  // Signals the agent lives through without stopping anything: whoever sent
  // them signalled every process of the job (Slurm signals every process of
  // a step, so SIGUSR1/SIGUSR2 preemption warnings reach the workers from
  // Slurm itself). Logged and recorded as an event; not forwarded.
  std::vector<int> survivedSignals;
  // False: after a signal from outside, the agent never SIGKILLs its workers;
  // the sender enforces the grace period (Slurm's KillWait or preemption
  // GraceTime). The shutdown timeout still bounds stops of the agent's own
  // making (a restart after a failure).
  bool killAfterSignal = true;
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
  // --status-port (unset: no status endpoint; 0: a free port) and
  // --status-addr, the IP address it listens on (docs/status.md).
  std::optional<uint16_t> statusPort;
  std::string statusAddr = "127.0.0.1";
  // --progress-timeout (unset: off): a worker that reported progress
  // (DDPRUN_PROGRESS_FILE) and then reports none for this long fails the
  // worker group like a worker failure (docs/status.md).
  std::optional<std::chrono::milliseconds> progressTimeout;

  // Torchrun dests (e.g. "master_port", "rdzv_id") given on the command line
  // or through PET_<DEST>, filled by the CLI: finalizeConfig tells an
  // explicit --master-port from the default this way.
  std::set<std::string> explicitFlags;
  // Lines the CLI prints before the agent starts (what was taken from a
  // cluster manager's environment).
  std::vector<std::string> notices;

  // Derived by finalizeConfig:
  // torchrun 2.x's one-node default took effect (static backend, no
  // --rdzv-endpoint, no --master-port, one node): as --standalone, a free
  // port, a fresh uuid as run id (unless --rdzv-id was given) and
  // MASTER_ADDR=localhost (or --local-addr).
  bool standaloneByDefault = false;
  // Static backend: --rdzv-conf timeout=S (default 900 s, as torchrun):
  // joining a round and waiting for peers.
  std::chrono::milliseconds rdzvTimeout{900'000};
  // c10d backend (and --standalone): the rest of --rdzv-conf.
  C10dSettings c10d;
  // The dynamic rendezvous (see the top of this file), and where it meets:
  // --rdzv-endpoint without brackets (default localhost) and its port
  // (default 29400; 0 = a free port, only when this agent hosts it).
  bool useDynamic = false;
  std::string endpointHost;
  uint16_t endpointPort = 29400;
  // This agent hosts the endpoint's store: --rdzv-conf is_host (explicit),
  // else inferred as torchrun does (net::isThisHost: localhost, a loopback
  // address, this host's name, its canonical name or addresses, or an
  // address of a local interface).
  bool isHost = false;
  bool isHostExplicit = false;
  // Flags accepted for compatibility that this version cannot honour: one
  // warning each, printed once when the agent starts.
  std::vector<std::string> warnings;
};

// Checks every rule across flags (ranges, combinations, backend-specific
// settings such as --rdzv-conf timeout) and fills the derived fields:
// the one-node default of torchrun 2.x, --standalone's run id and port,
// --rdzv-endpoint as master address and port for the static backend, the
// dynamic rendezvous's endpoint and is_host for c10d, one warning per flag
// accepted but not honoured, and one when the status endpoint listens on
// an address other than loopback. Throws InvalidArgument naming
// the flag and the accepted forms (exit 2). Call it once per config.
void finalizeConfig(LaunchConfig& cfg);

// The rendezvous a finalized config asks for: dynamic (c10d-style) with
// useDynamic (the endpoint, is_host, MIN:MAX, the run id, --local-addr and
// the --rdzv-conf c10d settings), local for one node, static otherwise
// (master address and port, node rank, MAX nodes, timeout, keep-alives).
rendezvous::RendezvousSpec rendezvousSpec(const LaunchConfig& cfg);

// torchrun's booleans in --rdzv-conf: 1/true/t/yes/y and 0/false/f/no/n
// (any case); nullopt for anything else.
std::optional<bool> parseConfBool(const std::string& text);

// --rdzv-id: at most kMaxRunIdBytes, no '/' and no control character (a run
// id names the log directory and the store's keys). Empty passes (replaced
// by a uuid on the standalone path). Throws InvalidArgument naming --rdzv-id;
// the CLI checks the flag's value with it, finalizeConfig the final id.
inline constexpr size_t kMaxRunIdBytes = 128;
void checkRunId(const std::string& id);
// The signal's name: "SIGTERM" for 15; "SIG<number>" for one not listed.
std::string signalName(int sig);
// The number of a signal named with its "SIG" prefix ("SIGUSR1"), or
// nullopt for a name not listed (the flag parsers of src/cli read
// --signals-to-handle with it).
std::optional<int> signalByName(const std::string& name);

}  // namespace ddprun::agent
