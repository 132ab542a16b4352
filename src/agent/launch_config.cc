#include "ddprun/agent/launch_config.h"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "ddprun/agent/launcher.h"
#include "ddprun/common/cpus.h"
#include "ddprun/common/error.h"
#include "ddprun/common/net.h"
#include "ddprun/common/strings.h"
#include "ddprun/common/user_input.h"
#include "ddprun/store/auth.h"

namespace ddprun::agent {

int resolveNproc(NprocKind kind, int count) {
  switch (kind) {
    case NprocKind::kCount: return count;
    case NprocKind::kCpu: return availableCpus();
    case NprocKind::kGpu: return countCudaDevices();
    case NprocKind::kAuto: {
      const int gpus = countCudaDevices();
      return gpus > 0 ? gpus : availableCpus();
    }
  }
  return count;
}

namespace {
using str::trim;

struct SignalEntry {
  const char* name;
  int number;
};
constexpr SignalEntry kSignals[] = {
    {"SIGHUP", SIGHUP},   {"SIGINT", SIGINT},   {"SIGQUIT", SIGQUIT},
    {"SIGABRT", SIGABRT}, {"SIGKILL", SIGKILL}, {"SIGSEGV", SIGSEGV},
    {"SIGPIPE", SIGPIPE}, {"SIGALRM", SIGALRM}, {"SIGTERM", SIGTERM},
    {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}, {"SIGCONT", SIGCONT},
    {"SIGSTOP", SIGSTOP}, {"SIGTSTP", SIGTSTP}, {"SIGBUS", SIGBUS},
    {"SIGFPE", SIGFPE},   {"SIGILL", SIGILL},   {"SIGTRAP", SIGTRAP},
    {"SIGXCPU", SIGXCPU}, {"SIGXFSZ", SIGXFSZ}, {"SIGCHLD", SIGCHLD},
    {"SIGPWR", SIGPWR},   {"SIGSYS", SIGSYS}};
}  // namespace

Std StdSpec::forRank(int localRank) const {
  if (all) return *all;
  auto it = perRank.find(localRank);
  return it == perRank.end() ? Std::kNone : it->second;
}

void checkRunId(const std::string& id) {
  if (id.size() > kMaxRunIdBytes)
    DDPRUN_THROW(InvalidArgument, "--rdzv-id: a run id of ", id.size(),
                 " bytes; run ids have at most ", kMaxRunIdBytes,
                 " (they name the log directory and the store's keys), e.g. a job name or "
                 "number");
  for (unsigned char ch : id)
    if (ch == '/' || ch < 0x20 || ch == 0x7f)
      DDPRUN_THROW(InvalidArgument, "--rdzv-id: '", str::escape(id), "' holds ",
                   ch == '/' ? std::string("'/'") : "a control character",
                   "; a run id names a directory and the store's keys: use letters, "
                   "digits, '.', '_' or '-'");
}

std::string signalName(int sig) {
  for (const auto& s : kSignals)
    if (s.number == sig) return s.name;
  return "SIG" + std::to_string(sig);
}

std::optional<int> signalByName(const std::string& name) {
  for (const auto& s : kSignals)
    if (name == s.name) return s.number;
  return std::nullopt;
}

std::optional<bool> parseConfBool(const std::string& text) {
  std::string t = trim(text);
  std::transform(t.begin(), t.end(), t.begin(),
                 [](unsigned char ch) { return std::tolower(ch); });
  if (t == "1" || t == "true" || t == "t" || t == "yes" || t == "y") return true;
  if (t == "0" || t == "false" || t == "f" || t == "no" || t == "n") return false;
  return std::nullopt;
}

// ------------------------------------------------------------ finalizeConfig
namespace {

constexpr int64_t kMaxTimeoutSeconds =
    365LL * 24 * 3600;  // beyond: a typo, and ms overflow

bool given(const LaunchConfig& c, const char* dest) {
  return c.explicitFlags.count(dest) > 0;
}

void warn(LaunchConfig& c, std::string message) {
  c.warnings.push_back(std::move(message));
}

void checkProgram(const LaunchConfig& c) {
  if (c.script.empty())
    DDPRUN_THROW(
        InvalidArgument,
        "missing training script: usage is ddprun [flags] SCRIPT [args...], e.g. "
        "ddprun --nproc-per-node=2 train.py --epochs 3");
  // torchrun checks this only when it execs a program: --run-path wins over both.
  if (c.module && c.noPython && !c.runPath)
    DDPRUN_THROW(InvalidArgument,
                 "-m/--module and --no-python cannot be used together: --no-python runs "
                 "the program directly, -m runs a Python module");
}

// --standalone replaces the backend, so a bad --rdzv-backend is ignored with
// it, as in torchrun.
void checkBackend(const LaunchConfig& c) {
  if (c.standalone || c.rdzvBackend == "static" || c.rdzvBackend == "c10d") return;
  if (c.rdzvBackend == "etcd" || c.rdzvBackend == "etcd-v2")
    DDPRUN_THROW(InvalidArgument, "--rdzv-backend: '", c.rdzvBackend,
                 "' is not supported: ddprun has no etcd client; for an elastic job use "
                 "--rdzv-backend c10d --rdzv-endpoint HOST[:PORT] (the agent on HOST hosts "
                 "the rendezvous, no etcd server needed), or the static rendezvous "
                 "(--nnodes N --node-rank R --master-addr A --master-port P), or "
                 "--standalone on one node");
  DDPRUN_THROW(InvalidArgument, "--rdzv-backend: unknown backend '",
               str::escape(c.rdzvBackend), "': expected static or c10d");
}

void checkNodes(const LaunchConfig& c) {
  if (c.standalone && c.maxNodes > 1)
    DDPRUN_THROW(
        InvalidArgument, "--standalone runs one node, but --nnodes is ",
        c.minNodes == c.maxNodes
            ? std::to_string(c.maxNodes)
            : std::to_string(c.minNodes) + ":" + std::to_string(c.maxNodes),
        ": drop --standalone and give --rdzv-backend=c10d --rdzv-endpoint HOST[:PORT] "
        "(elastic) or --node-rank, --master-addr and --master-port (static rendezvous)");
  // A range with the static rendezvous runs with MAX nodes, as in torchrun
  // (takeStaticPath warns).
}

// --local-addr is advertised as given (never resolved), so it must be a
// host name or an address literal, without a port.
void checkLocalAddr(LaunchConfig& c) {
  if (c.localAddr.empty()) return;
  std::string a = c.localAddr;
  if (a.size() > 2 && a.front() == '[' && a.back() == ']') a = a.substr(1, a.size() - 2);
  const bool nameChars = !a.empty() && a.size() <= 253 && a.front() != '-' &&
                         a.front() != '.' &&
                         std::all_of(a.begin(), a.end(), [](unsigned char ch) {
                           return std::isalnum(ch) || ch == '-' || ch == '.' || ch == '_';
                         });
  if (!net::isIpLiteral(a) && !nameChars)
    DDPRUN_THROW(InvalidArgument, "--local-addr '", str::escape(c.localAddr),
                 "': expected this node's host name or IP address, without a port (e.g. "
                 "--local-addr 10.0.0.5 or --local-addr node3.cluster)");
  c.localAddr = a;
}

// ------------------------------------------------------------ --rdzv-conf
// The floor of keep_alive_interval. A node is declared dead when its beats
// stop for interval * keep_alive_max_attempt, measured in milliseconds; an
// ordinary scheduling delay (milliseconds, tens under load) plus a store
// round trip must fit well inside one interval, or live nodes are declared
// dead and no round holds (1e-320 s was accepted once). 50 ms keeps that
// margin, costs each node 20 store writes a second, and stays below the
// fastest settings in use (0.1-0.2 s in tests and benchmarks; torchrun
// reads whole seconds, so its tightest is 1 s).
constexpr double kMinKeepAliveSeconds = 0.05;

// A --rdzv-conf duration in seconds: > 0, or >= `floor` when one is given.
std::chrono::milliseconds confSeconds(const std::string& key, const std::string& value,
                                      double floor = 0) {
  constexpr double kMinPositive = std::numeric_limits<double>::denorm_min();
  double s = 0;
  auto problem = input::parseNumber(value, s, floor > 0 ? floor : kMinPositive,
                                    static_cast<double>(kMaxTimeoutSeconds));
  if (problem == input::NumberProblem::kNone)
    return std::chrono::milliseconds(std::max<int64_t>(1, std::llround(s * 1000.0)));
  if (floor > 0)
    DDPRUN_THROW(InvalidArgument, "--rdzv-conf ", key, "='", str::escape(value),
                 "': ", input::describe(problem),
                 "; expected a number of seconds >= ", floor, " (at most ",
                 kMaxTimeoutSeconds, "), e.g. ", key, "=5; below ",
                 std::llround(floor * 1000),
                 " ms, scheduling and network delays would get live nodes declared dead");
  DDPRUN_THROW(InvalidArgument, "--rdzv-conf ", key, "='", str::escape(value),
               "': ", input::describe(problem),
               "; expected a number of seconds > 0 (at most ", kMaxTimeoutSeconds,
               "), e.g. ", key, "=60");
}

bool confBool(const std::string& key, const std::string& value) {
  auto b = parseConfBool(value);
  if (!b)
    DDPRUN_THROW(InvalidArgument, "--rdzv-conf ", key, "='", str::escape(value),
                 "': expected a boolean: 1, true, t, yes, y or 0, false, f, no, n");
  return *b;
}

// One c10d key into `out`; false when `key` is not a c10d key.
bool parseC10dKey(const std::string& key, const std::string& value, C10dSettings& out) {
  using Ms = std::chrono::milliseconds;
  const std::pair<const char*, Ms*> timeouts[] = {
      {"join_timeout", &out.joinTimeout},
      {"last_call_timeout", &out.lastCallTimeout},
      {"close_timeout", &out.closeTimeout},
      {"read_timeout", &out.readTimeout},
      {"heartbeat_timeout", &out.heartbeatTimeout},
      {"join_progress_interval", &out.joinProgressInterval}};
  for (const auto& [name, field] : timeouts)
    if (key == name) {
      *field = confSeconds(key, value);
      return true;
    }
  if (key == "keep_alive_interval") {
    out.keepAliveInterval = confSeconds(key, value, kMinKeepAliveSeconds);
  } else if (key == "keep_alive_max_attempt") {
    int64_t n = 0;
    auto problem = input::parseNumber(value, n, 1, 1'000'000);
    if (problem != input::NumberProblem::kNone)
      DDPRUN_THROW(
          InvalidArgument, "--rdzv-conf keep_alive_max_attempt='", str::escape(value),
          "': ", input::describe(problem),
          "; expected an integer from 1 to 1000000, e.g. keep_alive_max_attempt=3");
    out.keepAliveMaxAttempt = static_cast<int>(n);
  } else if (key == "is_host") {
    out.isHost = confBool(key, value);
  } else if (key == "use_libuv") {
    out.useLibuv = confBool(key, value);
  } else if (key == "token_file") {
    if (value.empty())
      DDPRUN_THROW(InvalidArgument,
                   "--rdzv-conf token_file='': expected the path of a file holding the "
                   "rendezvous store's shared secret, e.g. token_file=/etc/ddprun/job.token");
    input::refuseControlChars("--rdzv-conf token_file", value, "path");
    out.tokenFile = value;
  } else if (key == "store_type") {
    if (value != "tcp" && value != "file")
      DDPRUN_THROW(InvalidArgument, "--rdzv-conf store_type='", str::escape(value),
                   "': expected tcp or file");
    out.storeType = value;
  } else {
    return false;
  }
  return true;
}

// Every known key is validated whatever the backend (a bad value is a
// mistake either way); unknown keys are ignored, as torchrun does, with one
// warning so that a misspelt key does not go unnoticed.
void parseRdzvSettings(LaunchConfig& c) {
  std::vector<std::string> unknown;
  for (const auto& [key, value] : c.rdzvConf) {
    if (key == "timeout") {
      int64_t s = 0;
      auto problem = input::parseNumber(value, s, 1, kMaxTimeoutSeconds);
      if (problem != input::NumberProblem::kNone)
        DDPRUN_THROW(InvalidArgument, "--rdzv-conf timeout='", str::escape(value),
                     "': ", input::describe(problem),
                     "; expected a whole number of seconds > 0 (at most ",
                     kMaxTimeoutSeconds, "), e.g. timeout=900");
      c.rdzvTimeout = std::chrono::seconds(s);
    } else if (key != "rank" && !parseC10dKey(key, value, c.c10d)) {
      unknown.push_back(key);  // "rank" is set from --node-rank, as in torchrun
    }
  }
  if (!unknown.empty())
    warn(c,
         "--rdzv-conf: unknown key(s) " + str::join(unknown, ", ") +
             " ignored (known: timeout, join_timeout, last_call_timeout, close_timeout, "
             "read_timeout, heartbeat_timeout, keep_alive_interval, "
             "keep_alive_max_attempt, join_progress_interval, is_host, store_type, use_libuv, "
             "token_file)");
  // The rendezvous store's secret: the file wins over the environment.
  if (!c.c10d.tokenFile.empty())
    c.rdzvSecret = store::auth::loadSecret(c.c10d.tokenFile);
  else if (auto fromEnv = store::auth::secretFromEnv())
    c.rdzvSecret = *fromEnv;
}

// ------------------------------------------------------------ the three paths
// The flags among `dests` that were given, as "--dashed-names".
std::vector<std::string> givenOf(const LaunchConfig& c,
                                 std::initializer_list<const char*> dests) {
  std::vector<std::string> out;
  for (const char* d : dests)
    if (given(c, d)) out.push_back("--" + str::replaceAll(d, "_", "-"));
  return out;
}

// torchrun's standalone path (--standalone, or its one-node default): c10d
// on localhost:0, a fresh uuid as run id; the given rendezvous values are
// ignored. MASTER_ADDR is --local-addr when given, as in torchrun. Unlike
// torchrun, the one-node default keeps an explicit --rdzv-id: it only names
// the job (TORCHELASTIC_RUN_ID, the log directory), and the user asked for it.
void takeStandalonePath(LaunchConfig& c, bool byDefault) {
  auto ignored = byDefault ? givenOf(c, {"master_addr"})
                           : givenOf(c, {"rdzv_backend", "rdzv_endpoint", "rdzv_id",
                                         "master_addr", "master_port"});
  if (!ignored.empty() && byDefault)
    warn(c,
         "--master-addr ignored: on one node without --master-port ddprun takes a free "
         "local port, as torchrun 2.x does; give --master-port P for a fixed address and "
         "port (static rendezvous)");
  else if (!ignored.empty())
    warn(c, str::join(ignored, " and ") +
                " ignored with --standalone (as in torchrun): it takes a free local port "
                "and a fresh run id");
  if (!(byDefault && given(c, "rdzv_id"))) c.rdzvId = str::uuid4();
  c.standaloneByDefault = byDefault;
  c.rdzvBackend = "c10d";
  c.rdzvEndpoint = "localhost:0";
  c.masterPort = 0;
  c.masterAddr = c.localAddr.empty() ? "localhost" : c.localAddr;
}

net::HostPort parseEndpoint(const std::string& text, uint16_t defaultPort) {
  try {
    return net::parseHostPort(text, defaultPort);
  } catch (const InvalidArgument& e) {
    DDPRUN_THROW(InvalidArgument, "--rdzv-endpoint: ", e.message());
  }
}

// Warns once about flags the c10d rendezvous does not read (as torchrun).
void warnC10dIgnores(LaunchConfig& c) {
  auto ignored = givenOf(c, {"master_addr", "master_port"});
  if (!ignored.empty())
    warn(c, str::join(ignored, " and ") + " ignored: only the static rendezvous uses " +
                (ignored.size() == 1 ? "it" : "them") + " (as in torchrun)");
  if (c.useDynamic && given(c, "node_rank"))
    warn(
        c,
        "--node-rank ignored with --rdzv-backend=c10d: the rendezvous assigns node ranks "
        "(the endpoint's host first, then the order of arrival)");
}

// is_host: --rdzv-conf is_host when given, else this machine is the
// endpoint's host (torchrun's inference, plus local interface addresses).
void decideIsHost(LaunchConfig& c) {
  c.isHostExplicit = c.c10d.isHost.has_value();
  c.isHost = c.isHostExplicit ? *c.c10d.isHost : net::isThisHost(c.endpointHost);
}

// The dynamic rendezvous's own rules (see decideC10dPath).
void checkDynamic(const LaunchConfig& c) {
  if (c.endpointPort == 0 && !c.isHost)
    DDPRUN_THROW(InvalidArgument, "--rdzv-endpoint ", c.rdzvEndpoint,
                 ": port 0 (a free port) works only on the agent that hosts the "
                 "rendezvous; give the port its host listens on, e.g. ",
                 net::formatHostPort(c.endpointHost, 29400));
  if (c.c10d.storeType != "tcp")
    DDPRUN_THROW(InvalidArgument, "--rdzv-conf store_type=", c.c10d.storeType,
                 ": ddprun's c10d rendezvous keeps its state in a TCP store at "
                 "--rdzv-endpoint; drop store_type or give store_type=tcp");
}

// --rdzv-backend=c10d: the dynamic rendezvous across nodes, or (one node
// hosting its own endpoint) the local rendezvous, which behaves the same
// there without a store to host: one round at once, a free worker-store
// port, the run id kept. The endpoint defaults to localhost:29400 as in
// torchrun, except across nodes, where every node must be told where to meet.
void takeC10dPath(LaunchConfig& c) {
  if (c.rdzvEndpoint.empty() && c.maxNodes > 1)
    DDPRUN_THROW(
        InvalidArgument,
        "--rdzv-endpoint: required with --rdzv-backend=c10d on several nodes: give "
        "HOST[:PORT] of the node that hosts the rendezvous, the same on every node "
        "(e.g. --rdzv-endpoint head:29400; the port defaults to 29400)");
  auto hp = parseEndpoint(c.rdzvEndpoint.empty() ? "localhost" : c.rdzvEndpoint, 29400);
  c.endpointHost = hp.host;
  c.endpointPort = hp.port;
  decideIsHost(c);
  c.useDynamic = c.maxNodes > 1 || !c.isHost;
  warnC10dIgnores(c);
  if (c.useDynamic) {
    checkDynamic(c);
    return;
  }
  c.masterPort = 0;
  c.masterAddr = c.localAddr.empty() ? "localhost" : c.localAddr;
}

bool hasPort(const std::string& endpoint) {
  if (!endpoint.empty() && endpoint.front() == '[')
    return endpoint.find("]:") != std::string::npos;
  return std::count(endpoint.begin(), endpoint.end(), ':') == 1;
}

// The static rendezvous: --rdzv-endpoint, when given, is the master address
// and port (torchrun does that).
void takeStaticPath(LaunchConfig& c) {
  if (!c.rdzvEndpoint.empty()) {
    auto hp = parseEndpoint(c.rdzvEndpoint, 0);
    if (!hasPort(c.rdzvEndpoint))
      DDPRUN_THROW(InvalidArgument, "--rdzv-endpoint '", c.rdzvEndpoint,
                   "': the static rendezvous needs a port: give HOST:PORT");
    auto ignored = givenOf(c, {"master_addr", "master_port"});
    if (!ignored.empty())
      warn(c, str::join(ignored, " and ") +
                  " ignored: --rdzv-endpoint gives node 0's address and port (as in "
                  "torchrun)");
    c.masterAddr = hp.host;
    c.masterPort = hp.port;
  }
  if (c.masterAddr.empty())
    DDPRUN_THROW(InvalidArgument,
                 "--master-addr: empty: give node 0's host name or address");
  if (c.nodeRank >= c.maxNodes)
    DDPRUN_THROW(InvalidArgument, "--node-rank ", c.nodeRank,
                 " is out of range for --nnodes ", c.maxNodes, " (0..", c.maxNodes - 1,
                 ")");
  if (c.minNodes != c.maxNodes)
    warn(c, "--nnodes " + std::to_string(c.minNodes) + ":" + std::to_string(c.maxNodes) +
                ": the static rendezvous waits for all " + std::to_string(c.maxNodes) +
                " nodes (torchrun's uses MAX too); for an elastic job give "
                "--rdzv-backend=c10d --rdzv-endpoint HOST[:PORT]");
  if (c.maxNodes > 1 && c.masterPort == 0)
    DDPRUN_THROW(InvalidArgument,
                 "--master-port 0 (a free port) works on one node only: the other nodes "
                 "must know node 0's port; give a port number");
  if (!c.localAddr.empty())
    warn(c,
         "--local-addr has no effect with the static rendezvous (as in torchrun): "
         "workers reach node 0 at --master-addr");
}

// An endpoint on another address than loopback answers anyone who reaches
// it, and says who runs what (docs/status.md): say so once.
void warnExposedStatus(LaunchConfig& c) {
  if (!c.statusPort || net::isLoopbackHost(c.statusAddr)) return;
  warn(c, "--status-addr " + c.statusAddr +
              ": the status endpoint answers anyone who can reach this address, with the "
              "run id, host names and worker pids; keep it on a trusted network (the "
              "default 127.0.0.1 is this machine only)");
}

// Flags accepted for compatibility that this version cannot honour.
void warnUnhonoured(LaunchConfig& c) {
  const std::string& h = c.eventLogHandler;
  if (h == "console")
    warn(c,
         "--event-log-handler=console is not supported: events go to events.jsonl in the "
         "log directory");
  else if (h != "null" && h != "dynamic_rendezvous")
    DDPRUN_THROW(InvalidArgument, "--event-log-handler: unknown handler '",
                 str::escape(h), "': expected null, console or dynamic_rendezvous");
  if (!c.logsSpecs.empty())
    warn(c, "--logs-specs=" + c.logsSpecs +
                " is not supported: ddprun cannot load Python entry points; logs use the "
                "default layout");
  if (!c.numaBinding.empty())
    warn(c, "--numa-binding=" + c.numaBinding +
                " is not supported yet: workers are not bound to NUMA nodes");
}

}  // namespace

void finalizeConfig(LaunchConfig& c) {
  checkProgram(c);
  checkBackend(c);
  checkNodes(c);
  checkLocalAddr(c);
  parseRdzvSettings(c);
  // torchrun 2.x's one-node default (PR #175699): the fixed port 29500 only
  // when asked for, so two jobs on one host never collide.
  const bool oneNodeDefault = !c.standalone && c.rdzvBackend == "static" &&
                              c.rdzvEndpoint.empty() && !given(c, "master_port") &&
                              c.maxNodes == 1;
  if (c.standalone || oneNodeDefault)
    takeStandalonePath(c, !c.standalone);
  else if (c.rdzvBackend == "c10d")
    takeC10dPath(c);
  else
    takeStaticPath(c);
  warnUnhonoured(c);
  checkRunId(c.rdzvId);
  warnExposedStatus(c);
}

namespace {
// The fields every multi-node backend takes alike, filled once for both.
rendezvous::CommonOptions commonOptions(const LaunchConfig& cfg) {
  rendezvous::CommonOptions o;
  o.runId = cfg.rdzvId;
  o.keepAliveInterval = cfg.c10d.keepAliveInterval;
  o.keepAliveMaxAttempt = cfg.c10d.keepAliveMaxAttempt;
  o.joinProgressInterval = cfg.c10d.joinProgressInterval;
  o.authSecret = cfg.rdzvSecret;
  return o;
}
}  // namespace

// The one place where flags become a rendezvous (see launch_config.h).
rendezvous::RendezvousSpec rendezvousSpec(const LaunchConfig& cfg) {
  using Kind = rendezvous::RendezvousSpec::Kind;
  rendezvous::RendezvousSpec spec;
  if (cfg.useDynamic) {
    spec.kind = Kind::kDynamic;
    rendezvous::DynamicOptions& o = spec.dynamic;
    static_cast<rendezvous::CommonOptions&>(o) = commonOptions(cfg);
    o.endpointHost = cfg.endpointHost;
    o.endpointPort = cfg.endpointPort;
    o.isHost = cfg.isHost;
    o.isHostExplicit = cfg.isHostExplicit;
    o.minNodes = cfg.minNodes;
    o.maxNodes = cfg.maxNodes;
    o.localAddr = cfg.localAddr;
    o.joinTimeout = cfg.c10d.joinTimeout;
    o.lastCallTimeout = cfg.c10d.lastCallTimeout;
    o.closeTimeout = cfg.c10d.closeTimeout;
    o.readTimeout = cfg.c10d.readTimeout;
  } else if (cfg.maxNodes == 1) {
    spec.kind = Kind::kLocal;
    spec.local.host = cfg.masterAddr;
    spec.local.port = cfg.masterPort;
  } else {
    spec.kind = Kind::kStatic;
    rendezvous::StaticOptions& o = spec.fixed;
    static_cast<rendezvous::CommonOptions&>(o) = commonOptions(cfg);
    o.masterAddr = cfg.masterAddr;
    o.masterPort = cfg.masterPort;
    o.nodeRank = cfg.nodeRank;
    o.nnodes = cfg.maxNodes;
    o.timeout = cfg.rdzvTimeout;
  }
  return spec;
}

}  // namespace ddprun::agent
