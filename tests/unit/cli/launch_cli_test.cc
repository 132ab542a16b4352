#include "ddprun/cli/launch_cli.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "ddprun/agent/agent.h"
#include "ddprun/cli/exit_codes.h"
#include "ddprun/common/error.h"
#include "ddprun/common/strings.h"
#include "cli/parse_launch.h"

#ifndef DDPRUN_DOCS_DIR
#error "DDPRUN_DOCS_DIR must name the docs directory (tests/CMakeLists.txt)"
#endif

namespace ddprun::cli {
namespace {

using agent::kExitSetup;
using agent::kExitSuccess;
using agent::kExitUsage;
using agent::kExitWorkersFailed;
using agent::LaunchConfig;
using agent::NprocKind;
using agent::Std;

using test::parse;
using test::Parsed;

bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

TEST(LaunchCli, DefaultsMatchTorchrun) {
  auto p = parse({"train.py"});
  ASSERT_EQ(p.rc, -1) << p.err;
  const auto& c = p.cfg;
  EXPECT_EQ(c.minNodes, 1);
  EXPECT_EQ(c.maxNodes, 1);
  EXPECT_EQ(c.nprocKind, NprocKind::kCount);
  EXPECT_EQ(c.nprocPerNode, 1);
  EXPECT_EQ(c.maxRestarts, 0);
  EXPECT_DOUBLE_EQ(c.monitorInterval, 0.1);
  EXPECT_EQ(c.role, "default");
  EXPECT_EQ(c.shutdownTimeout.count(), 30);
  EXPECT_EQ(c.signalsToHandle, (std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT}));
  EXPECT_EQ(c.rdzvTimeout, std::chrono::seconds(900));
  EXPECT_EQ(c.script, "train.py");
  EXPECT_TRUE(c.scriptArgs.empty());
  EXPECT_TRUE(c.explicitFlags.empty());
  EXPECT_TRUE(c.warnings.empty());
}

// torchrun 2.x on one node without --master-port: the standalone path.
TEST(LaunchCli, OneNodeDefaultTakesAFreePortAndAFreshRunId) {
  auto a = parse({"train.py"});
  auto b = parse({"--nproc-per-node=4", "train.py"});
  ASSERT_EQ(a.rc, -1) << a.err;
  ASSERT_EQ(b.rc, -1) << b.err;
  EXPECT_TRUE(a.cfg.standaloneByDefault);
  EXPECT_FALSE(a.cfg.standalone);
  EXPECT_EQ(a.cfg.masterPort, 0);
  EXPECT_EQ(a.cfg.masterAddr, "localhost");
  EXPECT_EQ(a.cfg.rdzvBackend, "c10d");
  EXPECT_EQ(a.cfg.rdzvId.size(), 36u) << a.cfg.rdzvId;
  EXPECT_NE(a.cfg.rdzvId, b.cfg.rdzvId);
  // An explicit id is kept (torchrun would replace it): it only names the job.
  auto named = parse({"--rdzv-id=job7", "train.py"});
  ASSERT_EQ(named.rc, -1) << named.err;
  EXPECT_TRUE(named.cfg.standaloneByDefault);
  EXPECT_EQ(named.cfg.rdzvId, "job7");
}

TEST(LaunchCli, MasterPortFlagOrPetKeepsTheFixedPortStaticRendezvous) {
  for (const auto& p :
       {parse({"--master-port", "29500", "train.py"}),
        parse({"train.py"}, {{"PET_MASTER_PORT", "29500"}}),
        parse({"--master_port=29500", "--rdzv-backend=static", "train.py"})}) {
    ASSERT_EQ(p.rc, -1) << p.err;
    EXPECT_FALSE(p.cfg.standaloneByDefault);
    EXPECT_EQ(p.cfg.rdzvBackend, "static");
    EXPECT_EQ(p.cfg.masterPort, 29500);
    EXPECT_EQ(p.cfg.masterAddr, "127.0.0.1");
    EXPECT_EQ(p.cfg.rdzvId, "none");
    EXPECT_TRUE(p.cfg.explicitFlags.count("master_port"));
  }
}

TEST(LaunchCli, BothSpellingsAndScriptArgsPassThrough) {
  auto a = parse({"--nproc_per_node=4", "--max_restarts", "3", "train.py", "--lr", "0.1",
                  "--nproc_per_node=9", "--", "-x"});
  ASSERT_EQ(a.rc, -1) << a.err;
  EXPECT_EQ(a.cfg.nprocPerNode, 4);
  EXPECT_EQ(a.cfg.maxRestarts, 3);
  EXPECT_EQ(a.cfg.scriptArgs,
            (std::vector<std::string>{"--lr", "0.1", "--nproc_per_node=9", "--", "-x"}));
  auto b =
      parse({"--nproc-per-node", "4", "--max-restarts=3", "--node-rank", "1", "--nnodes",
             "2", "--master-addr", "10.0.0.1", "--master-port", "1234", "train.py"});
  ASSERT_EQ(b.rc, -1) << b.err;
  EXPECT_EQ(b.cfg.nprocPerNode, 4);
  EXPECT_EQ(b.cfg.nodeRank, 1);
  EXPECT_EQ(b.cfg.minNodes, 2);
  EXPECT_EQ(b.cfg.masterAddr, "10.0.0.1");
  EXPECT_EQ(b.cfg.masterPort, 1234);
  EXPECT_EQ(b.cfg.rdzvBackend, "static");
}

// The multi-node command of the README, typed the same on every node.
TEST(LaunchCli, ElasticCommandLineOfTheReadme) {
  auto p = parse({"--nnodes=2:4", "--nproc_per_node=8", "--rdzv_backend=c10d",
                  "--rdzv_endpoint=head.example:29400", "--rdzv_id=job7",
                  "--rdzv_conf=keep_alive_interval=1,keep_alive_max_attempt=2,is_host=0",
                  "--local_addr=10.0.0.9", "train.py"});
  ASSERT_EQ(p.rc, -1) << p.err;
  EXPECT_TRUE(p.cfg.useDynamic);
  EXPECT_EQ(p.cfg.minNodes, 2);
  EXPECT_EQ(p.cfg.maxNodes, 4);
  EXPECT_EQ(p.cfg.nprocPerNode, 8);
  EXPECT_EQ(p.cfg.endpointHost, "head.example");
  EXPECT_EQ(p.cfg.endpointPort, 29400);
  EXPECT_EQ(p.cfg.rdzvId, "job7");
  EXPECT_EQ(p.cfg.localAddr, "10.0.0.9");
  EXPECT_EQ(p.cfg.c10d.keepAliveInterval, std::chrono::seconds(1));
  EXPECT_EQ(p.cfg.c10d.keepAliveMaxAttempt, 2);
  EXPECT_FALSE(p.cfg.isHost);
  EXPECT_TRUE(p.cfg.isHostExplicit);
  EXPECT_TRUE(p.cfg.warnings.empty());
}

TEST(LaunchCli, EveryFlagParses) {
  auto p = parse({"--nnodes=1",
                  "--nproc-per-node=gpu",
                  "--rdzv-backend=c10d",
                  "--rdzv-endpoint=localhost:29400",
                  "--rdzv-id=job7",
                  "--rdzv-conf=join_timeout=900,read_timeout=120",
                  "--monitor-interval=5",
                  "--start-method=fork",
                  "--event-log-handler=null",
                  "--role=trainer",
                  "-m",
                  "--run-path",
                  "--log-dir=/tmp/l",
                  "-r",
                  "0:1,12:3",
                  "-t",
                  "3",
                  "--local-ranks-filter=0,2",
                  "--duplicate-stdout-filters=a,,b,c",
                  "--duplicate-stderr-filters=err",
                  "--local-addr=n1",
                  "--logs-specs=s",
                  "--numa-binding=node",
                  "--signals-to-handle=SIGTERM,USR1",
                  "--shutdown-timeout=120",
                  "--virtual-local-rank",
                  "--log-line-prefix-template=${hostname}:${rank}: ",
                  "pkg.mod"});
  ASSERT_EQ(p.rc, -1) << p.err;
  const auto& c = p.cfg;
  EXPECT_EQ(c.maxNodes, 1);
  EXPECT_EQ(c.nprocKind, NprocKind::kGpu);
  EXPECT_EQ(c.rdzvBackend, "c10d");
  EXPECT_EQ(c.rdzvEndpoint, "localhost:29400");
  EXPECT_EQ(c.rdzvId, "job7");  // c10d on one node keeps the run id
  EXPECT_EQ(c.rdzvConf.at("read_timeout"), "120");
  EXPECT_EQ(c.c10d.joinTimeout, std::chrono::seconds(900));
  EXPECT_EQ(c.c10d.readTimeout, std::chrono::seconds(120));
  EXPECT_EQ(c.masterAddr, "n1");  // --local-addr is MASTER_ADDR on one node
  EXPECT_EQ(c.masterPort, 0);
  EXPECT_EQ(c.startMethod, "fork");
  EXPECT_EQ(c.role, "trainer");
  EXPECT_TRUE(c.module);
  EXPECT_TRUE(c.runPath);
  EXPECT_EQ(c.logDir, "/tmp/l");
  EXPECT_EQ(c.redirects.forRank(12), Std::kAll);  // multi-digit ranks accepted
  EXPECT_EQ(c.redirects.forRank(0), Std::kOut);
  EXPECT_EQ(c.redirects.forRank(1), Std::kNone);
  EXPECT_EQ(c.tee.forRank(5), Std::kAll);
  EXPECT_EQ(c.localRanksFilter, (std::set<int>{0, 2}));
  EXPECT_EQ(c.duplicateStdoutFilters, (std::vector<std::string>{"a,b", "c"}));
  EXPECT_EQ(c.duplicateStderrFilters, (std::vector<std::string>{"err"}));
  EXPECT_EQ(c.logsSpecs, "s");
  EXPECT_EQ(c.numaBinding, "node");
  EXPECT_EQ(c.signalsToHandle, (std::vector<int>{SIGTERM, SIGUSR1}));
  EXPECT_EQ(c.signalsToHandleText, "SIGTERM,USR1");
  EXPECT_EQ(c.shutdownTimeout.count(), 120);
  EXPECT_TRUE(c.virtualLocalRank);
  EXPECT_EQ(c.logLinePrefixTemplate, "${hostname}:${rank}: ");
  EXPECT_EQ(c.script, "pkg.mod");
  EXPECT_EQ(c.warnings.size(), 2u);  // --logs-specs and --numa-binding
}

// `--rdzv_id= a.py b.sh` runs a.py with the run id "" (the empty value does
// not take the next word).
TEST(LaunchCli, EmptyValuesStayEmpty) {
  auto p = parse({"--rdzv_id=", "a.py", "b.sh"});
  ASSERT_EQ(p.rc, -1) << p.err;
  EXPECT_EQ(p.cfg.script, "a.py");
  EXPECT_EQ(p.cfg.scriptArgs, (std::vector<std::string>{"b.sh"}));
  EXPECT_EQ(p.cfg.rdzvId, "");
  auto q =
      parse({"--role=", "--log-dir=", "--local-ranks-filter=", "--rdzv-conf=", "a.py"});
  ASSERT_EQ(q.rc, -1) << q.err;
  EXPECT_EQ(q.cfg.role, "");
  EXPECT_EQ(q.cfg.logDir, "");
  EXPECT_TRUE(q.cfg.localRanksFilter.empty());
  EXPECT_TRUE(q.cfg.rdzvConf.empty());
  auto r = parse({"a.py"}, {{"PET_ROLE", ""}});
  ASSERT_EQ(r.rc, -1) << r.err;
  EXPECT_EQ(r.cfg.role, "");
  // An empty value where a number or a set is expected is an error.
  for (const char* flag :
       {"--nnodes=", "--master-port=", "--redirects=", "--max-restarts=",
        "--signals-to-handle=", "--shutdown-timeout="}) {
    auto bad = parse({flag, "a.py"});
    EXPECT_EQ(bad.rc, 2) << flag;
    EXPECT_TRUE(
        contains(bad.err, std::string(flag).substr(0, std::string(flag).size() - 1)))
        << flag << ": " << bad.err;
  }
}

TEST(LaunchCli, DoubleDashEndsTheFlags) {
  auto p = parse({"--nproc-per-node=2", "--", "train.py", "--lr", "1"});
  ASSERT_EQ(p.rc, -1) << p.err;
  EXPECT_EQ(p.cfg.nprocPerNode, 2);
  EXPECT_EQ(p.cfg.script, "train.py");
  EXPECT_EQ(p.cfg.scriptArgs, (std::vector<std::string>{"--lr", "1"}));
  auto dashScript = parse({"--", "--odd-name.py"});
  ASSERT_EQ(dashScript.rc, -1) << dashScript.err;
  EXPECT_EQ(dashScript.cfg.script, "--odd-name.py");
  auto none = parse({"--nproc-per-node=2", "--"});
  EXPECT_EQ(none.rc, 2);
  EXPECT_TRUE(contains(none.err, "missing training script")) << none.err;
}

TEST(LaunchCli, RepeatedFlagsLastOneWins) {
  auto p = parse({"--nproc-per-node=2", "--nproc_per_node", "4", "--standalone",
                  "--standalone", "-r", "1", "--redirects=2", "--max-restarts=9",
                  "--max-restarts=1", "t.py"});
  ASSERT_EQ(p.rc, -1) << p.err;
  EXPECT_EQ(p.cfg.nprocPerNode, 4);
  EXPECT_TRUE(p.cfg.standalone);
  EXPECT_EQ(p.cfg.redirects.forRank(0), Std::kErr);
  EXPECT_EQ(p.cfg.maxRestarts, 1);
  // Only the last value is validated, as argparse stores only the last.
  auto q = parse({"--nnodes=0", "--nnodes=1", "t.py"});
  EXPECT_EQ(q.rc, -1) << q.err;
}

// argparse accepts a unique prefix of a long flag (allow_abbrev).
TEST(LaunchCli, UniquePrefixOfALongFlag) {
  auto p = parse({"--nproc", "3", "--max-r=2", "--standa", "t.py"});
  ASSERT_EQ(p.rc, -1) << p.err;
  EXPECT_EQ(p.cfg.nprocPerNode, 3);
  EXPECT_EQ(p.cfg.maxRestarts, 2);
  EXPECT_TRUE(p.cfg.standalone);
  auto ambiguous = parse({"--no", "t.py"});
  EXPECT_EQ(ambiguous.rc, 2);
  EXPECT_TRUE(contains(ambiguous.err, "ambiguous flag '--no'")) << ambiguous.err;
  EXPECT_TRUE(contains(ambiguous.err, "--no-python")) << ambiguous.err;
  EXPECT_TRUE(contains(ambiguous.err, "--node-rank")) << ambiguous.err;
}

TEST(LaunchCli, ShortFlagForms) {
  for (const auto& args : std::vector<std::vector<const char*>>{
           {"-r3", "t.py"}, {"-r=3", "t.py"}, {"-r", "3", "t.py"}, {"-mr3", "t.py"}}) {
    auto p = parse(args);
    ASSERT_EQ(p.rc, -1) << args[0] << ": " << p.err;
    EXPECT_EQ(p.cfg.redirects.forRank(0), Std::kAll) << args[0];
    EXPECT_EQ(p.cfg.script, "t.py");
  }
  EXPECT_TRUE(parse({"-mr3", "t.py"}).cfg.module);
}

TEST(LaunchCli, ValueFlagsAndSwitchesAreNotConfused) {
  auto missing = parse({"--rdzv-id", "--standalone", "t.py"});
  EXPECT_EQ(missing.rc, 2);
  EXPECT_TRUE(contains(missing.err, "--rdzv-id: expected a value")) << missing.err;
  auto abbreviated = parse({"--rdzv-i", "--standalone", "t.py"});
  EXPECT_TRUE(contains(abbreviated.err, "--rdzv-id: expected a value")) << abbreviated.err;
  auto explicitArg = parse({"--standalone=1", "t.py"});
  EXPECT_EQ(explicitArg.rc, 2);
  EXPECT_TRUE(contains(explicitArg.err, "--standalone takes no value"))
      << explicitArg.err;
  // A negative number is a value, as in argparse: here a bad one.
  auto negative = parse({"--node-rank", "-1", "t.py"});
  EXPECT_EQ(negative.rc, 2);
  EXPECT_TRUE(contains(negative.err, "--node-rank: invalid value '-1'")) << negative.err;
}

TEST(LaunchCli, PetEnvironmentFallbackAndCommandLineWins) {
  auto p = parse({"--max-restarts=5", "train.py"}, {{"PET_NPROC_PER_NODE", "3"},
                                                    {"PET_MAX_RESTARTS", "2"},
                                                    {"PET_STANDALONE", "1"},
                                                    {"PET_RDZV_CONF", "timeout=60"},
                                                    {"PET_LOGS_SPECS", "ignored"},
                                                    {"PET_NUMA_BINDING", "ignored"}});
  ASSERT_EQ(p.rc, -1) << p.err;
  EXPECT_EQ(p.cfg.nprocPerNode, 3);
  EXPECT_EQ(p.cfg.maxRestarts, 5);
  EXPECT_TRUE(p.cfg.standalone);
  EXPECT_EQ(p.cfg.rdzvTimeout, std::chrono::seconds(60));
  EXPECT_EQ(p.cfg.logsSpecs, "");  // torchrun reads no PET_ for these two
  EXPECT_EQ(p.cfg.numaBinding, "");
  EXPECT_TRUE(p.cfg.warnings.empty());
  auto off = parse({"train.py"}, {{"PET_STANDALONE", "0"}, {"PET_NO_PYTHON", "1"}});
  ASSERT_EQ(off.rc, -1) << off.err;
  EXPECT_FALSE(off.cfg.standalone);
  EXPECT_TRUE(off.cfg.noPython);
}

TEST(LaunchCli, BadPetValuesNameTheVariable) {
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>> cases = {
      {{{"PET_STANDALONE", "yes"}}, "PET_STANDALONE='yes'"},
      {{{"PET_NNODES", "0"}}, "PET_NNODES='0' (from the environment): --nnodes"},
      {{{"PET_MASTER_PORT", "70000"}}, "PET_MASTER_PORT='70000'"},
      {{{"PET_START_METHOD", "thread"}}, "PET_START_METHOD='thread'"},
      {{{"PET_RDZV_CONF", "timeout=abc"}}, "timeout='abc'"},
  };
  for (const auto& [env, needle] : cases) {
    auto p = parse({"t.py"}, env);
    EXPECT_EQ(p.rc, 2) << needle;
    EXPECT_TRUE(contains(p.err, needle)) << "stderr: " << p.err;
  }
}

// A run id names the log directory ("<id>_<random>") and the store's keys: a
// 100 KB PET_RDZV_ID used to end in "File name too long" (exit 3).
TEST(LaunchCli, RunIdsAreBoundedAndCheckedAsFlags) {
  auto huge = parse({"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=h:1", "t.py"},
                    {{"PET_RDZV_ID", std::string(100'000, 'r')}});
  EXPECT_EQ(huge.rc, kExitUsage);
  EXPECT_TRUE(contains(huge.err, "PET_RDZV_ID='rrrr")) << huge.err;
  EXPECT_TRUE(contains(huge.err, "a run id of 100000 bytes; run ids have at most 128"))
      << huge.err;
  EXPECT_LT(huge.err.size(), 800u);
  auto flag = parse({"--rdzv-id", std::string(129, 'r').c_str(), "t.py"});
  EXPECT_EQ(flag.rc, kExitUsage);
  EXPECT_TRUE(str::startsWith(flag.err, "ddprun: error: --rdzv-id: a run id of 129")) << flag.err;
  EXPECT_EQ(parse({"--rdzv-id", std::string(128, 'r').c_str(), "t.py"}).rc, -1);
  for (const char* bad : {"a/b", "../x", "a\nb", "tab\there"}) {
    auto p = parse({"--rdzv-id", bad, "t.py"});
    EXPECT_EQ(p.rc, kExitUsage) << bad;
    EXPECT_TRUE(contains(p.err, "--rdzv-id: '")) << p.err;
  }
  // Slurm's, uuids, job names, odd but harmless characters stay accepted.
  for (const char* ok : {"4242.0", "3f1c-aa_B.7", "we\"ird\\id", "job:7@x"})
    EXPECT_EQ(parse({"--rdzv-id", ok, "t.py"}).rc, -1) << ok;
}

// docs/status.md: the endpoint shows pids, host names and the run id.
TEST(LaunchCli, AStatusEndpointBeyondLoopbackWarnsOnce) {
  auto exposed = parse({"--status-port=0", "--status-addr=0.0.0.0", "t.py"});
  ASSERT_EQ(exposed.rc, -1) << exposed.err;
  ASSERT_EQ(exposed.cfg.warnings.size(), 1u);
  EXPECT_TRUE(contains(exposed.cfg.warnings[0], "--status-addr 0.0.0.0: the status endpoint "
                                                 "answers anyone who can reach this address"))
      << exposed.cfg.warnings[0];
  EXPECT_EQ(parse({"--status-port=0", "--status-addr=10.1.2.3", "t.py"}).cfg.warnings.size(), 1u);
  for (const char* quiet : {"127.0.0.1", "::1", "127.0.0.2"})
    EXPECT_TRUE(parse({"--status-port=0", "--status-addr", quiet, "t.py"}).cfg.warnings.empty())
        << quiet;
  EXPECT_TRUE(parse({"--status-port=0", "t.py"}).cfg.warnings.empty());
  EXPECT_TRUE(parse({"--status-addr=0.0.0.0", "t.py"}).cfg.warnings.empty());  // no endpoint
}

TEST(LaunchCli, ShutdownTimeoutFallsBackToTorchEnv) {
  auto p = parse({"train.py"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "600"}});
  ASSERT_EQ(p.rc, -1) << p.err;
  EXPECT_EQ(p.cfg.shutdownTimeout.count(), 600);
  auto flagWins = parse({"--shutdown-timeout=5", "train.py"},
                        {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "600"}});
  EXPECT_EQ(flagWins.cfg.shutdownTimeout.count(), 5);
  auto bad = parse({"train.py"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "soon"}});
  EXPECT_EQ(bad.rc, 2);
  EXPECT_TRUE(contains(bad.err, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT")) << bad.err;
}

// Each malformed invocation exits 2 with one line naming what was wrong.
TEST(LaunchCli, BadInputExitsTwoNamingTheProblem) {
  const std::vector<std::pair<std::vector<const char*>, std::string>> cases = {
      {{"--bogus", "train.py"}, "--bogus"},
      {{"-x", "train.py"}, "'-x'"},
      {{}, "missing training script"},
      {{"--nnodes=0", "t.py"}, "--nnodes"},
      {{"--nnodes=3:2", "t.py"}, "MIN:MAX"},
      {{"--nnodes=1:2:3", "t.py"}, "--nnodes"},
      {{"--nnodes=abc", "t.py"}, "--nnodes"},
      {{"--nnodes=1:4", "--node-rank=4", "t.py"}, "out of range for --nnodes 4"},
      {{"--nproc-per-node=0", "t.py"}, "--nproc-per-node"},
      {{"--nproc-per-node=xpu", "t.py"}, "'cpu', 'gpu' or 'auto'"},
      {{"--nproc-per-node=-2", "t.py"}, "--nproc-per-node"},
      {{"--max-restarts=-1", "t.py"}, "--max-restarts"},
      {{"--max-restarts=many", "t.py"}, "--max-restarts"},
      {{"--monitor-interval=0", "t.py"}, "--monitor-interval"},
      {{"--monitor-interval=x", "t.py"}, "--monitor-interval"},
      {{"--monitor-interval=inf", "t.py"}, "--monitor-interval"},
      {{"--master-port=70000", "t.py"}, "--master-port"},
      {{"--master-port=http", "t.py"}, "--master-port"},
      {{"--node-rank=-1", "t.py"}, "--node-rank"},
      {{"--nnodes=2", "--node-rank=2", "t.py"}, "--node-rank 2 is out of range"},
      {{"--rdzv-backend=etcd", "t.py"}, "etcd"},
      {{"--rdzv-backend=zookeeper", "t.py"}, "--rdzv-backend"},
      {{"--rdzv-backend=c10d", "--nnodes=2", "t.py"}, "--rdzv-endpoint: required"},
      {{"--rdzv-backend=c10d", "--nnodes=1:2", "--rdzv-endpoint=h:0", "t.py"}, "port 0"},
      {{"--rdzv-backend=c10d", "--nnodes=2", "--rdzv-endpoint=h", "--local-addr=h:1",
        "t.py"},
       "--local-addr"},
      {{"--standalone", "--nnodes=2", "t.py"}, "--standalone"},
      {{"--rdzv-conf=timeout", "t.py"}, "KEY=VALUE"},
      {{"--rdzv-conf==5", "t.py"}, "KEY=VALUE"},
      {{"--rdzv-conf=timeout=abc", "t.py"}, "--rdzv-conf timeout='abc'"},
      {{"--rdzv-conf=timeout=-5", "t.py"}, "--rdzv-conf timeout='-5'"},
      {{"--rdzv-conf=join_timeout=0", "t.py"}, "join_timeout"},
      {{"--rdzv-conf=is_host=maybe", "t.py"}, "is_host"},
      {{"--rdzv-endpoint=host:99999", "--master-port=1", "t.py"}, "--rdzv-endpoint"},
      {{"--rdzv-endpoint=host", "--master-port=1", "t.py"}, "--rdzv-endpoint"},
      {{"--redirects=4", "t.py"}, "--redirects"},
      {{"--tee=0:9", "t.py"}, "--tee"},
      {{"-r", "x:1", "t.py"}, "--redirects"},
      {{"--local-ranks-filter=a,b", "t.py"}, "--local-ranks-filter"},
      {{"--signals-to-handle=SIGKILL", "t.py"}, "SIGKILL"},
      {{"--signals-to-handle=SIGNOPE", "t.py"}, "SIGNOPE"},
      {{"--shutdown-timeout=-5", "t.py"}, "--shutdown-timeout"},
      {{"--start-method=thread", "t.py"}, "--start-method: invalid choice 'thread'"},
      {{"--numa-binding=rack", "t.py"}, "--numa-binding: invalid choice 'rack'"},
      {{"--event-log-handler=syslog", "t.py"}, "--event-log-handler"},
      {{"-m", "--no-python", "t"}, "--no-python"},
      {{"--nnodes"}, "--nnodes: expected a value"},
      {{"--print-completion", "fish"}, "--print-completion: invalid choice 'fish'"},
  };
  for (const auto& [args, needle] : cases) {
    auto p = parse(args);
    EXPECT_EQ(p.rc, 2) << needle;
    EXPECT_TRUE(contains(p.err, needle)) << "stderr: " << p.err;
    EXPECT_TRUE(str::startsWith(p.err, "ddprun: error: ")) << p.err;
    EXPECT_EQ(std::count(p.err.begin(), p.err.end(), '\n'), 1) << p.err;
    EXPECT_FALSE(contains(p.err, ".cc:")) << "source location leaked: " << p.err;
  }
}

TEST(LaunchCli, UnhonouredFlagsWarnOnceEach) {
  auto p = parse({"--numa-binding=node", "--logs-specs=x", "--event-log-handler=console",
                  "--local-addr=h", "--master-port=1", "--start-method=fork",
                  "--monitor-interval=5", "--run-path", "t.py"});
  ASSERT_EQ(p.rc, -1) << p.err;
  ASSERT_EQ(p.cfg.warnings.size(), 4u);
  for (const char* flag :
       {"--numa-binding", "--logs-specs", "--event-log-handler", "--local-addr"})
    EXPECT_EQ(std::count_if(p.cfg.warnings.begin(), p.cfg.warnings.end(),
                            [&](const std::string& w) { return contains(w, flag); }),
              1)
        << flag;
  EXPECT_TRUE(p.err.empty()) << "warnings are the agent's to print: " << p.err;
}

TEST(LaunchCli, HelpExitsZero) {
  auto p = parse({"--help"});
  EXPECT_EQ(p.rc, 0);
  for (const auto& f : launchFlags())
    for (const auto& n : f.names) EXPECT_TRUE(contains(p.out, n)) << n;
  EXPECT_TRUE(contains(parse({"-h", "--bogus"}).out, "usage: ddprun"));
}

TEST(LaunchCli, VersionExitsZero) {
  auto p = parse({"--version"});
  EXPECT_EQ(p.rc, 0);
  EXPECT_TRUE(str::startsWith(p.out, "ddprun ")) << p.out;
}

// torchrun 2.x: --print-completion {bash,zsh,tcsh} prints a script and exits
// 0, without a training script.
TEST(LaunchCli, PrintCompletionForEachShell) {
  for (const char* shell : {"bash", "zsh", "tcsh"}) {
    auto p = parse({"--print-completion", shell});
    EXPECT_EQ(p.rc, 0) << shell << ": " << p.err;
    EXPECT_TRUE(p.cfg.printCompletion);
    EXPECT_EQ(p.out, completionScript(shell));
    for (const auto& f : launchFlags())
      for (const auto& n : f.names)
        EXPECT_TRUE(contains(p.out, n.substr(n.rfind('-') == 0 ? 1 : 2)))
            << shell << " " << n;
  }
  auto underscore = parse({"--print_completion", "zsh"});  // both spellings, as every flag
  EXPECT_EQ(underscore.rc, 0) << underscore.err;
  EXPECT_EQ(underscore.out, completionScript("zsh"));
  EXPECT_TRUE(
      contains(completionScript("bash"), "complete -o filenames -F _ddprun ddprun"));
  EXPECT_TRUE(contains(completionScript("bash"), "compgen -W 'spawn fork forkserver'"));
  EXPECT_TRUE(str::startsWith(completionScript("zsh"), "#compdef ddprun\n"));
  EXPECT_TRUE(contains(completionScript("tcsh"), "complete ddprun "));
}

// "Both spellings" holds for every flag of more than one word: --a-b and --a_b.
TEST(LaunchCli, EveryMultiWordFlagHasBothSpellings) {
  for (const auto& f : launchFlags()) {
    std::set<std::string> names(f.names.begin(), f.names.end());
    for (const auto& n : f.names) {
      if (!str::startsWith(n, "--")) continue;
      const std::string dashed = "--" + str::replaceAll(n.substr(2), "_", "-");
      const std::string underscored = "--" + str::replaceAll(n.substr(2), "-", "_");
      EXPECT_TRUE(names.count(dashed)) << n << " lacks " << dashed;
      EXPECT_TRUE(names.count(underscored)) << n << " lacks " << underscored;
      const std::string word = underscored + "=x";  // known (x itself may be refused)
      auto p = parse({word.c_str()});
      EXPECT_EQ(p.err.find("unknown flag"), std::string::npos) << underscored << ": " << p.err;
    }
  }
}

// ------------------------------------------------------------ exit codes
TEST(ExitCodes, DdprunsOwnByDefaultTorchrunsOnRequest) {
  EXPECT_EQ(parseExitCodeStyle(std::nullopt), ExitCodeStyle::kDdprun);
  EXPECT_EQ(parseExitCodeStyle(""), ExitCodeStyle::kDdprun);
  EXPECT_EQ(parseExitCodeStyle("ddprun"), ExitCodeStyle::kDdprun);
  EXPECT_EQ(parseExitCodeStyle("torchrun"), ExitCodeStyle::kTorchrun);
  for (const char* bad : {"Torchrun", "1", "torch"}) {
    try {
      parseExitCodeStyle(std::string(bad));
      ADD_FAILURE() << bad << " accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_TRUE(contains(e.message(), "DDPRUN_EXIT_CODES='")) << e.message();
      EXPECT_TRUE(contains(e.message(), "expected ddprun")) << e.message();
      EXPECT_TRUE(contains(e.message(), "or torchrun")) << e.message();
    }
  }
}

TEST(ExitCodes, TorchrunsAreZeroTwoOrOne) {
  const int sigint = 128 + SIGINT, sigterm = 128 + SIGTERM;
  for (int code : {kExitSuccess, kExitWorkersFailed, kExitUsage, kExitSetup, sigint, sigterm})
    EXPECT_EQ(exitCodeIn(ExitCodeStyle::kDdprun, code), code);
  EXPECT_EQ(exitCodeIn(ExitCodeStyle::kTorchrun, kExitSuccess), 0);
  EXPECT_EQ(exitCodeIn(ExitCodeStyle::kTorchrun, kExitUsage), 2);  // argparse's
  // ChildFailedError, RendezvousTimeoutError, SignalException: uncaught, 1.
  for (int code : {kExitWorkersFailed, kExitSetup, sigint, sigterm})
    EXPECT_EQ(exitCodeIn(ExitCodeStyle::kTorchrun, code), 1) << code;
}

// ------------------------------------------------------------ docs/cli.md
// The rows of the flag table in docs/cli.md: the first cell's `-flag`
// spellings, and the PET_ variable of the third cell ("" for none).
struct DocRow {
  std::vector<std::string> names;
  std::string envVar;
  std::string line;
};

std::vector<DocRow> docFlagTable() {
  std::ifstream in(DDPRUN_DOCS_DIR "/cli.md");
  EXPECT_TRUE(in.good()) << "cannot read " DDPRUN_DOCS_DIR "/cli.md";
  std::vector<DocRow> rows;
  bool inTable = false;
  const std::regex flagRe("`(-{1,2}[a-z][a-z0-9_-]*)`");
  const std::regex petRe("PET_[A-Z_]+");
  for (std::string line; std::getline(in, line);) {
    if (str::startsWith(line, "| flag ")) inTable = true;
    if (!inTable) continue;
    if (!str::startsWith(line, "|")) break;
    auto cells = str::split(line, '|');  // "", flag, default, env, ...
    if (cells.size() < 5 || str::startsWith(str::trim(cells[1]), "---") ||
        str::trim(cells[1]) == "flag")
      continue;
    DocRow row;
    row.line = line;
    for (std::sregex_iterator it(cells[1].begin(), cells[1].end(), flagRe), end;
         it != end; ++it)
      row.names.push_back((*it)[1]);
    std::smatch m;
    if (std::regex_search(cells[3], m, petRe)) row.envVar = m.str();
    rows.push_back(row);
  }
  return rows;
}

TEST(LaunchCli, DocsFlagTableMatchesTheParser) {
  auto rows = docFlagTable();
  ASSERT_FALSE(rows.empty()) << "no '| flag |' table in docs/cli.md";
  std::map<std::string, const DocRow*> documented;
  for (const auto& row : rows)
    for (const auto& n : row.names) documented[n] = &row;
  for (const auto& f : launchFlags()) {
    for (const auto& n : f.names) {
      if (!documented.count(n)) {
        ADD_FAILURE() << n << " is missing from the docs/cli.md flag table";
        continue;
      }
      EXPECT_EQ(documented[n]->envVar, f.envVar)
          << "environment variable of " << n << " in: " << documented[n]->line;
      EXPECT_EQ(documented[n]->names, f.names) << "spellings of " << n << " in one row";
    }
  }
  std::set<std::string> parsed;
  for (const auto& f : launchFlags()) parsed.insert(f.names.begin(), f.names.end());
  for (const auto& [n, row] : documented)
    EXPECT_TRUE(parsed.count(n)) << n << " is in docs/cli.md but not a flag of ddprun";
}

// Issue 40: every number of ddprun, --rdzv-conf values included, refuses
// NaN, infinities, values beyond 64 bits or its range and trailing junk with
// exit 2 and one line naming the flag (or key) and the value.
TEST(LaunchCli, EveryNumberRefusesNanInfinitiesOverflowAndJunk) {
  const std::vector<const char*> bad = {
      "nan", "inf", "-inf", "1e400", "18446744073709551616", "-5", "5x", "0x10"};
  const std::vector<std::string> flags = {
      "--nnodes",           "--nproc-per-node", "--max-restarts",
      "--monitor-interval", "--node-rank",      "--master-port",
      "--shutdown-timeout", "--status-port",    "--local-ranks-filter",
      "--redirects",        "--progress-timeout"};
  for (const auto& flag : flags)
    for (const char* v : bad) {
      const std::string arg = flag + "=" + v;
      auto p = parse({arg.c_str(), "t.py"});
      EXPECT_EQ(p.rc, kExitUsage) << arg << ": " << p.err;
      EXPECT_TRUE(contains(p.err, flag)) << arg << ": " << p.err;
      EXPECT_EQ(std::count(p.err.begin(), p.err.end(), '\n'), 1) << p.err;
    }
  const std::vector<std::string> keys = {"timeout",
                                         "join_timeout",
                                         "last_call_timeout",
                                         "close_timeout",
                                         "read_timeout",
                                         "heartbeat_timeout",
                                         "keep_alive_interval",
                                         "keep_alive_max_attempt"};
  for (const auto& key : keys)
    for (const char* v : bad) {
      const std::string arg = "--rdzv-conf=" + key + "=" + v;
      auto p = parse({"--rdzv-backend=c10d", arg.c_str(), "t.py"});
      EXPECT_EQ(p.rc, kExitUsage) << arg << ": " << p.err;
      EXPECT_TRUE(contains(p.err, "--rdzv-conf " + key + "='" + v + "'")) << p.err;
    }
  // From the environment too.
  auto p = parse({"t.py"}, {{"PET_RDZV_CONF", "read_timeout=nan"}});
  EXPECT_EQ(p.rc, kExitUsage);
  EXPECT_TRUE(contains(p.err, "--rdzv-conf read_timeout='nan': not a finite number"))
      << p.err;
  p = parse({"t.py"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "99999999999999999999"}});
  EXPECT_EQ(p.rc, kExitUsage);
  EXPECT_TRUE(contains(p.err, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT")) << p.err;
}

// Issue 40: keep_alive_interval has a floor of 0.05 s (50 ms), and says so;
// 1e-320 passed once and no round could hold.
TEST(LaunchCli, KeepAliveIntervalHasAFloorOf50Ms) {
  for (const char* v : {"1e-320", "0.001", "0.049"}) {
    const std::string arg = std::string("--rdzv-conf=keep_alive_interval=") + v;
    auto p = parse({"--rdzv-backend=c10d", arg.c_str(), "t.py"});
    EXPECT_EQ(p.rc, kExitUsage) << v;
    EXPECT_TRUE(contains(p.err, ">= 0.05")) << p.err;
    EXPECT_TRUE(contains(p.err, "below 50 ms")) << p.err;
  }
  for (auto [v, ms] : std::vector<std::pair<const char*, int64_t>>{
           {"0.05", 50}, {"0.2", 200}, {"1", 1000}}) {
    const std::string arg = std::string("--rdzv-conf=keep_alive_interval=") + v;
    auto p = parse({"--rdzv-backend=c10d", arg.c_str(), "t.py"});
    ASSERT_EQ(p.rc, -1) << p.err;
    EXPECT_EQ(p.cfg.c10d.keepAliveInterval.count(), ms) << v;
  }
}

// Issue 40: a host name or a path with a control character (a pasted
// newline, an escape sequence) exits 2 at parse time, from the command line
// or a PET_ variable, shown escaped: the raw bytes never reach the terminal.
TEST(LaunchCli, ControlCharactersInHostsAndPathsExitTwoShownEscaped) {
  const std::vector<std::pair<std::vector<const char*>, std::string>> cases = {
      {{"--master-addr=evil\nhost", "--nnodes=2", "--master-port=1", "t.py"},
       "--master-addr: 'evil\\x0ahost' holds a control character"},
      {{"--rdzv-endpoint=h\x1b[31m:5", "--nnodes=2", "t.py"},
       "--rdzv-endpoint: 'h\\x1b[31m:5' holds a control character"},
      {{"--rdzv-backend=c10d", "--rdzv-endpoint=a\rb:29400", "--nnodes=2", "t.py"},
       "--rdzv-endpoint: 'a\\x0db:29400'"},
      {{"--local-addr=a\x07", "t.py"},
       "--local-addr: 'a\\x07' holds a control character"},
      {{"--log-dir=/tmp/x\ny", "t.py"},
       "--log-dir: '/tmp/x\\x0ay' holds a control character"},
      {{"--rdzv-conf=token_file=/tmp/a\x1b]0;t\x07", "t.py"},
       "--rdzv-conf token_file: '/tmp/a\\x1b]0;t\\x07'"},
  };
  for (const auto& [args, needle] : cases) {
    auto p = parse(args);
    EXPECT_EQ(p.rc, kExitUsage) << needle << ": " << p.err;
    EXPECT_TRUE(contains(p.err, needle)) << p.err;
    for (char ch : p.err.substr(0, p.err.size() - 1))
      EXPECT_FALSE(static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f)
          << str::escape(p.err);
  }
  for (const auto& [var, flag] : std::vector<std::pair<std::string, std::string>>{
           {"PET_MASTER_ADDR", "--master-addr"},
           {"PET_RDZV_ENDPOINT", "--rdzv-endpoint"},
           {"PET_LOG_DIR", "--log-dir"}}) {
    auto p = parse({"--nnodes=2", "--master-port=1", "t.py"}, {{var, "x\x1b[2Jy"}});
    EXPECT_EQ(p.rc, kExitUsage) << var << ": " << p.err;
    EXPECT_TRUE(contains(p.err, var + "='x\\x1b[2Jy' (from the environment): " + flag))
        << p.err;
    EXPECT_FALSE(contains(p.err, "\x1b")) << str::escape(p.err);
  }
}

}  // namespace
}  // namespace ddprun::cli
