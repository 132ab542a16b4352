// The mapping from a Slurm step's environment to ddprun's flags.
#include "ddprun/cluster/slurm.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "ddprun/common/error.h"

namespace ddprun::cluster {
namespace {

using Env = std::map<std::string, std::string>;
using Given = std::map<std::string, std::string>;

// What srun sets for task 0 of `srun -N3 --ntasks-per-node=1` on gpu[01-03]
// (job 4242, step 0) on its second node.
Env step() {
  return {{"SLURM_JOB_ID", "4242"},          {"SLURM_STEP_ID", "0"},
          {"SLURM_STEP_NODELIST", "gpu[01-03]"}, {"SLURM_JOB_NODELIST", "gpu[01-03,7]"},
          {"SLURM_STEP_NUM_NODES", "3"},     {"SLURM_NNODES", "4"},
          {"SLURM_STEP_NUM_TASKS", "3"},     {"SLURM_NODEID", "1"},
          {"SLURMD_NODENAME", "gpu02"},      {"SLURM_LOCALID", "0"},
          {"SLURM_PROCID", "1"},             {"SLURM_CPUS_ON_NODE", "16"}};
}

struct Result {
  ClusterDefaults d;
  std::map<std::string, std::string> values;
  std::map<std::string, std::string> sources;
};

Result run(const Env& env, const Given& given = {}, std::set<std::string> unresolvable = {}) {
  Result r;
  r.d = slurmDefaults(
      [&](const std::string& k) -> std::optional<std::string> {
        auto it = env.find(k);
        if (it == env.end()) return std::nullopt;
        return it->second;
      },
      [&](const std::string& dest) -> std::optional<std::string> {
        auto it = given.find(dest);
        if (it == given.end()) return std::nullopt;
        return it->second;
      },
      [&](const std::string& host) { return unresolvable.count(host) == 0; });
  for (const auto& f : r.d.flags) {
    r.values[f.dest] = f.value;
    r.sources[f.dest] = f.source;
  }
  return r;
}

std::string errorOf(const Env& env, const Given& given = {},
                    std::set<std::string> unresolvable = {}) {
  try {
    run(env, given, std::move(unresolvable));
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "";
}

TEST(SlurmDefaults, AStepGivesEveryRendezvousFlag) {
  Result r = run(step());
  EXPECT_EQ(r.d.manager, "Slurm");
  EXPECT_EQ(r.values, (std::map<std::string, std::string>{{"nnodes", "3"},
                                                          {"node_rank", "1"},
                                                          {"master_addr", "gpu01"},
                                                          {"master_port", "19242"},
                                                          {"rdzv_id", "4242.0"}}));
  EXPECT_EQ(r.sources["node_rank"], "SLURMD_NODENAME in SLURM_STEP_NODELIST");
  EXPECT_EQ(r.sources["master_port"], "15000 + (SLURM_JOB_ID + 997 * SLURM_STEP_ID) % 10000");
  EXPECT_EQ(slurmPort(4242, 0), 19242);  // step 0: Lightning's convention
  EXPECT_EQ(slurmPort(123456789, 0), 21789);
  std::string line = r.d.summary();
  EXPECT_NE(line.find("from Slurm (job 4242 step 0 on gpu02)"), std::string::npos) << line;
  EXPECT_NE(line.find("--master-addr gpu01 (first of SLURM_STEP_NODELIST)"), std::string::npos)
      << line;
  EXPECT_NE(line.find("take precedence"), std::string::npos) << line;
}

// Two steps of one job on the same nodes (srun ... & srun ... &) must not
// rendezvous on the same port.
TEST(SlurmDefaults, EveryStepOfAJobGetsItsOwnPortInASafeRange) {
  std::set<int> ports;
  for (uint64_t s = 0; s < 10000; ++s) {
    int p = slurmPort(4242, s);
    EXPECT_GE(p, 15000);
    EXPECT_LE(p, 24999);
    ports.insert(p);
  }
  EXPECT_EQ(ports.size(), 10000u);
  EXPECT_EQ(slurmPort(4242, 1), 15000 + (4242 + 997) % 10000);
  EXPECT_LE(slurmPort(UINT64_MAX, 0xFFFFFFEF), 24999);  // no overflow
  Env e = step();
  e["SLURM_STEP_ID"] = "1";
  Result second = run(e);
  EXPECT_EQ(second.values["master_port"], std::to_string(slurmPort(4242, 1)));
  EXPECT_NE(second.values["master_port"], run(step()).values["master_port"]);
  Result c10d = run(e, {{"rdzv_backend", "c10d"}});
  EXPECT_EQ(c10d.values["rdzv_endpoint"], "gpu01:" + std::to_string(slurmPort(4242, 1)));
}

TEST(SlurmDefaults, TheFirstNodeOfTheStepIsNodeRankZero) {
  Env e = step();
  e["SLURMD_NODENAME"] = "gpu01";
  e["SLURM_NODEID"] = "0";
  EXPECT_EQ(run(e).values["node_rank"], "0");
  e["SLURMD_NODENAME"] = "gpu03";
  EXPECT_EQ(run(e).values["node_rank"], "2");
  // Without SLURMD_NODENAME, Slurm's node id.
  e.erase("SLURMD_NODENAME");
  e["SLURM_NODEID"] = "2";
  Result r = run(e);
  EXPECT_EQ(r.values["node_rank"], "2");
  EXPECT_EQ(r.sources["node_rank"], "SLURM_NODEID");
}

TEST(SlurmDefaults, TheStepListWinsOverTheJobList) {
  Env e = step();
  e.erase("SLURM_STEP_NODELIST");
  e.erase("SLURM_STEP_NUM_NODES");
  e["SLURM_NNODES"] = "4";
  Result r = run(e);  // the job list gpu[01-03,7]: 4 nodes
  EXPECT_EQ(r.values["nnodes"], "4");
  EXPECT_EQ(r.sources["nnodes"], "SLURM_JOB_NODELIST");
}

TEST(SlurmDefaults, GpusOnTheNodeElseTheTasksCpus) {
  Env e = step();
  e["SLURM_GPUS_ON_NODE"] = "4";
  EXPECT_EQ(run(e).values["nproc_per_node"], "4");
  e["SLURM_GPUS_ON_NODE"] = "0";
  e["SLURM_CPUS_PER_TASK"] = "6";
  Result r = run(e);
  EXPECT_EQ(r.values["nproc_per_node"], "6");
  EXPECT_EQ(r.sources["nproc_per_node"], "SLURM_CPUS_PER_TASK");
  e.erase("SLURM_CPUS_PER_TASK");
  e.erase("SLURM_CPUS_ON_NODE");
  EXPECT_EQ(run(e).values.count("nproc_per_node"), 0u);
}

// torchrun's default is one worker per node; a CPU-only node's CPU count
// (128 on a big node) is not a worker count.
TEST(SlurmDefaults, ACpuOnlyNodeKeepsOneWorkerUnlessCpusPerTaskAreAskedFor) {
  Env e = step();
  e["SLURM_CPUS_ON_NODE"] = "128";
  EXPECT_EQ(run(e).values.count("nproc_per_node"), 0u);  // the default: 1
  e["SLURM_GPUS_ON_NODE"] = "0";
  EXPECT_EQ(run(e).values.count("nproc_per_node"), 0u);
  e["SLURM_CPUS_PER_TASK"] = "4";  // srun -c 4: the user's choice
  EXPECT_EQ(run(e).values["nproc_per_node"], "4");
}

TEST(SlurmDefaults, GivenFlagsAreNeverSupplied) {
  Result r = run(step(), {{"nnodes", "2:3"}, {"master_port", "1234"}, {"nproc_per_node", "1"},
                          {"rdzv_id", "mine"}});
  EXPECT_EQ(r.values.count("nnodes"), 0u);
  EXPECT_EQ(r.values.count("master_port"), 0u);
  EXPECT_EQ(r.values.count("nproc_per_node"), 0u);
  EXPECT_EQ(r.values.count("rdzv_id"), 0u);
  EXPECT_EQ(r.values["master_addr"], "gpu01");
  EXPECT_EQ(r.values["node_rank"], "1");
  // A given --master-addr is not resolved (the user's name may be fine there).
  Result own = run(step(), {{"master_addr", "10.0.0.1"}}, {"gpu01"});
  EXPECT_EQ(own.values.count("master_addr"), 0u);
}

TEST(SlurmDefaults, StandaloneTakesNoRendezvousFlag) {
  Env e = step();
  e["SLURM_GPUS_ON_NODE"] = "2";
  Result r = run(e, {{"standalone", "1"}});
  EXPECT_EQ(r.values, (std::map<std::string, std::string>{{"nproc_per_node", "2"}}));
}

TEST(SlurmDefaults, C10dGetsAnEndpointInsteadOfAMaster) {
  Result r = run(step(), {{"rdzv_backend", "c10d"}});
  EXPECT_EQ(r.values["rdzv_endpoint"], "gpu01:19242");
  EXPECT_EQ(r.values.count("master_addr"), 0u);
  EXPECT_EQ(r.values.count("node_rank"), 0u);
  EXPECT_EQ(r.values["nnodes"], "3");
  EXPECT_EQ(r.values["rdzv_id"], "4242.0");
  EXPECT_EQ(run(step(), {{"rdzv_backend", "c10d"}, {"rdzv_endpoint", "h:1"}})
                .values.count("rdzv_endpoint"),
            0u);
}

TEST(SlurmDefaults, OneNodeLeavesThePortToTheOneNodeDefault) {
  Env e = step();
  e["SLURM_STEP_NODELIST"] = "gpu05";
  e["SLURM_STEP_NUM_NODES"] = "1";
  e["SLURM_STEP_NUM_TASKS"] = "1";
  e["SLURMD_NODENAME"] = "gpu05";
  Result r = run(e);
  EXPECT_EQ(r.values.count("master_addr"), 0u);
  EXPECT_EQ(r.values.count("master_port"), 0u);
  EXPECT_EQ(r.values["nnodes"], "1");
}

TEST(SlurmDefaults, NothingOutsideAStep) {
  Env e = step();
  e.erase("SLURM_STEP_ID");
  EXPECT_TRUE(run(e).d.empty());  // salloc's shell, the batch script
  e = step();
  e["SLURM_STEP_ID"] = "4294967294";  // the batch step
  EXPECT_TRUE(run(e).d.empty());
  EXPECT_TRUE(run({}).d.empty());
  e = step();
  e["DDPRUN_SLURM"] = "0";
  EXPECT_TRUE(run(e).d.empty());
  // The old spellings are read too.
  e = step();
  e.erase("SLURM_JOB_ID");
  e.erase("SLURM_STEP_ID");
  e["SLURM_JOBID"] = "7";
  e["SLURM_STEPID"] = "3";
  EXPECT_EQ(run(e).values["rdzv_id"], "7.3");
}

TEST(SlurmDefaults, MisconfiguredStepsNameTheVariable) {
  Env e = step();
  e["SLURM_STEP_NUM_TASKS"] = "6";
  std::string m = errorOf(e);
  EXPECT_NE(m.find("SLURM_STEP_NUM_TASKS=6"), std::string::npos) << m;
  EXPECT_NE(m.find("--ntasks-per-node=1"), std::string::npos) << m;

  e = step();
  e.erase("SLURM_STEP_NUM_TASKS");
  e["SLURM_LOCALID"] = "1";
  m = errorOf(e);
  EXPECT_NE(m.find("SLURM_LOCALID=1"), std::string::npos) << m;

  e = step();
  e["SLURM_STEP_NODELIST"] = "gpu[01-03";
  m = errorOf(e);
  EXPECT_NE(m.find("SLURM_STEP_NODELIST='gpu[01-03'"), std::string::npos) << m;
  EXPECT_NE(m.find("'[' without ']'"), std::string::npos) << m;

  e = step();
  e["SLURM_STEP_NUM_NODES"] = "2";
  m = errorOf(e);
  EXPECT_NE(m.find("SLURM_STEP_NUM_NODES=2"), std::string::npos) << m;
  EXPECT_NE(m.find("names 3 node(s)"), std::string::npos) << m;

  e = step();
  e["SLURMD_NODENAME"] = "cpu9";
  m = errorOf(e);
  EXPECT_NE(m.find("SLURMD_NODENAME='cpu9' is not in SLURM_STEP_NODELIST"), std::string::npos)
      << m;

  m = errorOf(step(), {}, {"gpu01"});
  EXPECT_NE(m.find("'gpu01' (from SLURM_STEP_NODELIST) does not resolve"), std::string::npos)
      << m;

  e = step();
  e["SLURM_JOB_ID"] = "x";
  m = errorOf(e);
  EXPECT_NE(m.find("SLURM_JOB_ID='x' is not an integer"), std::string::npos) << m;

  e = step();
  e.erase("SLURM_STEP_NODELIST");
  e.erase("SLURM_JOB_NODELIST");
  m = errorOf(e);
  EXPECT_NE(m.find("SLURM_STEP_NODELIST is not set"), std::string::npos) << m;
}

}  // namespace
}  // namespace ddprun::cluster
