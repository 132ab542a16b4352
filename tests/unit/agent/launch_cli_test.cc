#include "ddprun/cli/launch_cli.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <map>

namespace ddprun::cli {
namespace {

using agent::LaunchConfig;
using agent::NprocKind;
using agent::Std;

struct Parsed {
  int rc;
  LaunchConfig cfg;
  std::string err;
};

Parsed parse(std::vector<const char*> args, std::map<std::string, std::string> env = {}) {
  args.insert(args.begin(), "ddprun");
  Parsed p;
  EnvLookup lookup = [env](const std::string& k) -> std::optional<std::string> {
    auto it = env.find(k);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  testing::internal::CaptureStderr();
  p.rc = parseLaunchCli(static_cast<int>(args.size()), args.data(), lookup, p.cfg);
  p.err = testing::internal::GetCapturedStderr();
  return p;
}

TEST(LaunchCli, DefaultsMatchTorchrun) {
  auto p = parse({"train.py"});
  ASSERT_EQ(p.rc, -1) << p.err;
  const auto& c = p.cfg;
  EXPECT_EQ(c.minNodes, 1);
  EXPECT_EQ(c.maxNodes, 1);
  EXPECT_EQ(c.nprocKind, NprocKind::kCount);
  EXPECT_EQ(c.nprocPerNode, 1);
  EXPECT_EQ(c.rdzvBackend, "static");
  EXPECT_EQ(c.rdzvId, "none");
  EXPECT_EQ(c.maxRestarts, 0);
  EXPECT_DOUBLE_EQ(c.monitorInterval, 0.1);
  EXPECT_EQ(c.role, "default");
  EXPECT_EQ(c.masterAddr, "127.0.0.1");
  EXPECT_EQ(c.masterPort, 29500);
  EXPECT_EQ(c.shutdownTimeout.count(), 30);
  EXPECT_EQ(c.signalsToHandle, (std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT}));
  EXPECT_EQ(c.script, "train.py");
  EXPECT_TRUE(c.scriptArgs.empty());
}

TEST(LaunchCli, BothSpellingsAndScriptArgsPassThrough) {
  auto a = parse({"--nproc_per_node=4", "--max_restarts", "3", "train.py", "--lr", "0.1",
                  "--nproc_per_node=9"});
  ASSERT_EQ(a.rc, -1) << a.err;
  EXPECT_EQ(a.cfg.nprocPerNode, 4);
  EXPECT_EQ(a.cfg.maxRestarts, 3);
  EXPECT_EQ(a.cfg.scriptArgs,
            (std::vector<std::string>{"--lr", "0.1", "--nproc_per_node=9"}));
  auto b = parse({"--nproc-per-node", "4", "--max-restarts=3", "--node-rank", "1",
                  "--nnodes", "2", "--master-addr", "10.0.0.1", "--master-port", "1234",
                  "train.py"});
  ASSERT_EQ(b.rc, -1) << b.err;
  EXPECT_EQ(b.cfg.nprocPerNode, 4);
  EXPECT_EQ(b.cfg.nodeRank, 1);
  EXPECT_EQ(b.cfg.minNodes, 2);
  EXPECT_EQ(b.cfg.masterAddr, "10.0.0.1");
  EXPECT_EQ(b.cfg.masterPort, 1234);
}

TEST(LaunchCli, EveryFlagParses) {
  auto p = parse({"--nnodes=1:4", "--nproc-per-node=gpu", "--rdzv-backend=c10d",
                  "--rdzv-endpoint=host:29400", "--rdzv-id=job7",
                  "--rdzv-conf=join_timeout=900,read_timeout=120", "--standalone",
                  "--monitor-interval=5", "--start-method=fork", "--event-log-handler=x",
                  "--role=trainer", "-m", "--run-path", "--log-dir=/tmp/l", "-r", "0:1,12:3",
                  "-t", "3", "--local-ranks-filter=0,2", "--duplicate-stdout-filters=a,,b,c",
                  "--duplicate-stderr-filters=err", "--local-addr=n1", "--logs-specs=s",
                  "--numa-binding=node", "--signals-to-handle=SIGTERM,USR1",
                  "--shutdown-timeout=120", "--virtual-local-rank", "pkg.mod"});
  ASSERT_EQ(p.rc, -1) << p.err;
  const auto& c = p.cfg;
  EXPECT_EQ(c.maxNodes, 4);
  EXPECT_EQ(c.nprocKind, NprocKind::kGpu);
  EXPECT_EQ(c.rdzvEndpoint, "host:29400");
  EXPECT_EQ(c.rdzvId, "job7");
  EXPECT_EQ(c.rdzvConf.at("read_timeout"), "120");
  EXPECT_TRUE(c.standalone);
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
  EXPECT_EQ(c.signalsToHandle, (std::vector<int>{SIGTERM, SIGUSR1}));
  EXPECT_EQ(c.shutdownTimeout.count(), 120);
  EXPECT_TRUE(c.virtualLocalRank);
  EXPECT_EQ(c.script, "pkg.mod");
}

TEST(LaunchCli, PetEnvironmentFallbackAndCommandLineWins) {
  setenv("PET_NPROC_PER_NODE", "3", 1);
  setenv("PET_MAX_RESTARTS", "2", 1);
  setenv("PET_STANDALONE", "1", 1);
  auto p = parse({"--max-restarts=5", "train.py"});
  unsetenv("PET_NPROC_PER_NODE");
  unsetenv("PET_MAX_RESTARTS");
  unsetenv("PET_STANDALONE");
  ASSERT_EQ(p.rc, -1) << p.err;
  EXPECT_EQ(p.cfg.nprocPerNode, 3);
  EXPECT_EQ(p.cfg.maxRestarts, 5);
  EXPECT_TRUE(p.cfg.standalone);
}

TEST(LaunchCli, ShutdownTimeoutFallsBackToTorchEnv) {
  auto p = parse({"train.py"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "600"}});
  ASSERT_EQ(p.rc, -1) << p.err;
  EXPECT_EQ(p.cfg.shutdownTimeout.count(), 600);
}

// Each malformed invocation exits 2 with a message naming what was wrong.
TEST(LaunchCli, BadInputExitsTwoNamingTheProblem) {
  const std::vector<std::pair<std::vector<const char*>, std::string>> cases = {
      {{"--bogus", "train.py"}, "--bogus"},
      {{}, "missing training script"},
      {{"--nnodes=0", "t.py"}, "--nnodes"},
      {{"--nnodes=3:2", "t.py"}, "MIN:MAX"},
      {{"--nnodes=1:2:3", "t.py"}, "--nnodes"},
      {{"--nnodes=abc", "t.py"}, "--nnodes"},
      {{"--nproc-per-node=0", "t.py"}, "--nproc-per-node"},
      {{"--nproc-per-node=xpu", "t.py"}, "'cpu', 'gpu' or 'auto'"},
      {{"--nproc-per-node=-2", "t.py"}, "--nproc-per-node"},
      {{"--max-restarts=-1", "t.py"}, "--max-restarts"},
      {{"--max-restarts=many", "t.py"}, "--max-restarts"},
      {{"--monitor-interval=0", "t.py"}, "--monitor-interval"},
      {{"--monitor-interval=x", "t.py"}, "--monitor-interval"},
      {{"--master-port=70000", "t.py"}, "--master-port"},
      {{"--master-port=http", "t.py"}, "--master-port"},
      {{"--node-rank=-1", "t.py"}, "--node-rank"},
      {{"--rdzv-backend=etcd", "t.py"}, "etcd"},
      {{"--rdzv-conf=timeout", "t.py"}, "KEY=VALUE"},
      {{"--rdzv-conf==5", "t.py"}, "KEY=VALUE"},
      {{"--redirects=4", "t.py"}, "--redirects"},
      {{"--tee=0:9", "t.py"}, "--tee"},
      {{"-r", "x:1", "t.py"}, "--redirects"},
      {{"--local-ranks-filter=a,b", "t.py"}, "--local-ranks-filter"},
      {{"--signals-to-handle=SIGKILL", "t.py"}, "SIGKILL"},
      {{"--signals-to-handle=SIGNOPE", "t.py"}, "SIGNOPE"},
      {{"--shutdown-timeout=-5", "t.py"}, "--shutdown-timeout"},
      {{"--start-method=thread", "t.py"}, "--start-method"},
      {{"-m", "--no-python", "t"}, "--no-python"},
      {{"--nnodes"}, "nnodes"},
  };
  for (const auto& [args, needle] : cases) {
    auto p = parse(args);
    EXPECT_EQ(p.rc, 2) << needle;
    EXPECT_NE(p.err.find(needle), std::string::npos) << "stderr: " << p.err;
    EXPECT_NE(p.err.find("ddprun: error:"), std::string::npos) << p.err;
  }
}

TEST(LaunchCli, HelpExitsZero) {
  testing::internal::CaptureStdout();
  auto p = parse({"--help"});
  std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(p.rc, 0);
  for (const char* f : {"--nproc-per-node", "--nproc_per_node", "--rdzv-endpoint",
                        "--max-restarts", "--shutdown-timeout", "--signals-to-handle"})
    EXPECT_NE(out.find(f), std::string::npos) << f;
}

}  // namespace
}  // namespace ddprun::cli
