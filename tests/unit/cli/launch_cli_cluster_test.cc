// Flag precedence with a cluster manager's environment: command line, then
// PET_*, then what the Slurm step says, then torchrun's defaults. Kubeflow's
// PyTorchJob variables (PET_* plus pod-level MASTER_ADDR/RANK/WORLD_SIZE)
// reach the same config.
#include <gtest/gtest.h>
#include <signal.h>

#include <map>

#include "ddprun/agent/agent.h"
#include "ddprun/cli/launch_cli.h"
#include "parse_launch.h"

namespace ddprun::cli {
namespace {

using Env = std::map<std::string, std::string>;

using test::parse;
using test::Parsed;

// srun -N3 --ntasks-per-node=1 on localhost,n[2-3] (the first node must
// resolve; localhost does without DNS), task on the second node.
Env slurmStep() {
  return {{"SLURM_JOB_ID", "31"},          {"SLURM_STEP_ID", "2"},
          {"SLURM_STEP_NODELIST", "localhost,n[2-3]"},
          {"SLURM_STEP_NUM_NODES", "3"},   {"SLURM_STEP_NUM_TASKS", "3"},
          {"SLURM_NODEID", "1"},           {"SLURMD_NODENAME", "n2"},
          {"SLURM_LOCALID", "0"},          {"SLURM_CPUS_ON_NODE", "2"}};
}

TEST(LaunchCliCluster, ZeroFlagsInsideASlurmStep) {
  Parsed p = parse({"train"}, slurmStep());
  ASSERT_EQ(p.rc, -1) << p.err;
  EXPECT_EQ(p.cfg.minNodes, 3);
  EXPECT_EQ(p.cfg.maxNodes, 3);
  EXPECT_EQ(p.cfg.nodeRank, 1);
  EXPECT_EQ(p.cfg.masterAddr, "localhost");
  EXPECT_EQ(p.cfg.masterPort, 15000 + (31 + 997 * 2));  // the step is part of the port
  EXPECT_EQ(p.cfg.rdzvId, "31.2");
  EXPECT_EQ(p.cfg.nprocPerNode, 1);  // SLURM_CPUS_ON_NODE=2 is no worker count
  EXPECT_EQ(p.cfg.rdzvBackend, "static");
  EXPECT_FALSE(p.cfg.standaloneByDefault);
  ASSERT_EQ(p.cfg.notices.size(), 1u);
  EXPECT_NE(p.cfg.notices[0].find("from Slurm (job 31 step 2 on n2)"), std::string::npos)
      << p.cfg.notices[0];
}

TEST(LaunchCliCluster, FlagsThenPetThenSlurm) {
  Env e = slurmStep();
  e["PET_MASTER_PORT"] = "4000";
  e["PET_NPROC_PER_NODE"] = "3";
  Parsed p = parse({"--nproc-per-node=1", "--rdzv-id", "mine", "train"}, e);
  ASSERT_EQ(p.rc, -1) << p.err;
  EXPECT_EQ(p.cfg.nprocPerNode, 1);    // the command line beats PET_ and Slurm
  EXPECT_EQ(p.cfg.masterPort, 4000);   // PET_ beats Slurm
  EXPECT_EQ(p.cfg.rdzvId, "mine");
  EXPECT_EQ(p.cfg.nodeRank, 1);        // the rest still from Slurm
  EXPECT_EQ(p.cfg.minNodes, 3);
  ASSERT_EQ(p.cfg.notices.size(), 1u);
  EXPECT_EQ(p.cfg.notices[0].find("--master-port"), std::string::npos) << p.cfg.notices[0];
  EXPECT_EQ(p.cfg.notices[0].find("--nproc-per-node"), std::string::npos) << p.cfg.notices[0];
}

TEST(LaunchCliCluster, DdprunSlurmZeroIgnoresTheStep) {
  Env e = slurmStep();
  e["DDPRUN_SLURM"] = "0";
  Parsed p = parse({"train"}, e);
  ASSERT_EQ(p.rc, -1) << p.err;
  EXPECT_EQ(p.cfg.minNodes, 1);
  EXPECT_TRUE(p.cfg.notices.empty());
}

TEST(LaunchCliCluster, AMisconfiguredStepIsAUsageErrorNamingTheVariable) {
  Env e = slurmStep();
  e["SLURM_STEP_NUM_TASKS"] = "6";
  Parsed p = parse({"train"}, e);
  EXPECT_EQ(p.rc, agent::kExitUsage);
  EXPECT_NE(p.err.find("ddprun: error: SLURM_STEP_NUM_TASKS=6"), std::string::npos) << p.err;
  e = slurmStep();
  e["SLURM_STEP_NODELIST"] = "n[2-3,";
  p = parse({"train"}, e);
  EXPECT_EQ(p.rc, agent::kExitUsage);
  EXPECT_NE(p.err.find("SLURM_STEP_NODELIST='n[2-3,' does not parse"), std::string::npos)
      << p.err;
  // A bad value Slurm supplied is named with its origin when the flag parses it.
  e = slurmStep();
  e["SLURM_CPUS_PER_TASK"] = "lots";
  p = parse({"train"}, e);
  EXPECT_EQ(p.rc, agent::kExitUsage);
  EXPECT_NE(p.err.find("SLURM_CPUS_PER_TASK='lots'"), std::string::npos) << p.err;
}

// The list: 65,536 names of 120,000 bytes (7.8 GB) is refused from
// the pattern, naming the variable, before anything is expanded.
TEST(LaunchCliCluster, AHostileNodeListIsAUsageErrorNamingTheVariable) {
  Env e = slurmStep();
  e["SLURM_STEP_NODELIST"] = std::string(120'000, 'a') + "[0-65535]";
  Parsed p = parse({"train"}, e);
  EXPECT_EQ(p.rc, agent::kExitUsage);
  EXPECT_NE(p.err.find("ddprun: error: SLURM_STEP_NODELIST='aaaa"), std::string::npos) << p.err;
  EXPECT_NE(p.err.find("a host name of 120005 bytes"), std::string::npos) << p.err;
  EXPECT_LT(p.err.size(), 1000u);
}

TEST(LaunchCliCluster, SlurmSignalsAndGracePeriod) {
  Parsed p = parse({"train"}, slurmStep());
  ASSERT_EQ(p.rc, -1) << p.err;
  EXPECT_EQ(p.cfg.survivedSignals, (std::vector<int>{SIGUSR1, SIGUSR2}));
  EXPECT_FALSE(p.cfg.killAfterSignal);
  EXPECT_NE(p.cfg.notices[0].find("SIGUSR1, SIGUSR2 from Slurm reach the workers directly"),
            std::string::npos)
      << p.cfg.notices[0];
  EXPECT_NE(p.cfg.notices[0].find("no SIGKILL from ddprun"), std::string::npos);
  // The user's choices win.
  p = parse({"--shutdown-timeout", "5", "--signals-to-handle", "SIGTERM,SIGUSR1", "train"},
            slurmStep());
  ASSERT_EQ(p.rc, -1) << p.err;
  EXPECT_TRUE(p.cfg.survivedSignals.empty());
  EXPECT_TRUE(p.cfg.killAfterSignal);
  Env e = slurmStep();
  e["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "60";
  p = parse({"train"}, e);
  EXPECT_TRUE(p.cfg.killAfterSignal);
  // Outside Slurm nothing changes.
  p = parse({"train"}, {});
  EXPECT_TRUE(p.cfg.survivedSignals.empty());
  EXPECT_TRUE(p.cfg.killAfterSignal);
}

TEST(LaunchCliCluster, KubeflowPlainPolicy) {
  // Worker pod 1 of a PyTorchJob with 1 master + 1 worker, nprocPerNode 2:
  // the operator sets PET_* for torchrun and pod-level variables that are
  // not ddprun's to read (the workers get their own RANK/WORLD_SIZE).
  Env e = {{"PET_NNODES", "2"},          {"PET_NPROC_PER_NODE", "2"},
           {"PET_NODE_RANK", "1"},       {"PET_MASTER_ADDR", "job-master-0"},
           {"PET_MASTER_PORT", "23456"}, {"MASTER_ADDR", "job-master-0"},
           {"MASTER_PORT", "23456"},     {"WORLD_SIZE", "4"},
           {"RANK", "1"},                {"PYTHONUNBUFFERED", "1"}};
  Parsed p = parse({"train"}, e);
  ASSERT_EQ(p.rc, -1) << p.err;
  EXPECT_EQ(p.cfg.minNodes, 2);
  EXPECT_EQ(p.cfg.nodeRank, 1);
  EXPECT_EQ(p.cfg.nprocPerNode, 2);
  EXPECT_EQ(p.cfg.masterAddr, "job-master-0");
  EXPECT_EQ(p.cfg.masterPort, 23456);
  EXPECT_TRUE(p.cfg.notices.empty());
}

TEST(LaunchCliCluster, KubeflowElasticPolicy) {
  Env e = {{"PET_NNODES", "1:3"},
           {"PET_NPROC_PER_NODE", "auto"},
           {"PET_RDZV_BACKEND", "c10d"},
           {"PET_RDZV_ENDPOINT", "job-master-0:29400"},
           {"PET_RDZV_ID", "job"},
           {"PET_MAX_RESTARTS", "3"},
           {"PET_MONITOR_INTERVAL", "5"},
           {"MASTER_ADDR", "job-master-0"},
           {"MASTER_PORT", "23456"},
           {"WORLD_SIZE", "3"},
           {"RANK", "0"}};
  Parsed p = parse({"train"}, e);
  ASSERT_EQ(p.rc, -1) << p.err;
  EXPECT_EQ(p.cfg.minNodes, 1);
  EXPECT_EQ(p.cfg.maxNodes, 3);
  EXPECT_EQ(p.cfg.rdzvBackend, "c10d");
  EXPECT_EQ(p.cfg.rdzvEndpoint, "job-master-0:29400");
  EXPECT_EQ(p.cfg.rdzvId, "job");
  EXPECT_EQ(p.cfg.maxRestarts, 3);
  EXPECT_EQ(p.cfg.nprocKind, agent::NprocKind::kAuto);
}

}  // namespace
}  // namespace ddprun::cli
