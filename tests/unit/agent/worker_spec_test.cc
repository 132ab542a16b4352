#include "ddprun/agent/worker_spec.h"

#include <gtest/gtest.h>

#include "ddprun/common/error.h"

namespace ddprun::agent {
namespace {

TEST(AssignRanks, HeterogeneousNodes) {
  auto l = assignRanks({4, 2, 3});
  EXPECT_EQ(l.baseRanks, (std::vector<int>{0, 4, 6}));
  EXPECT_EQ(l.worldSize, 9);
  EXPECT_THROW(assignRanks({2, 0}), InvalidArgument);
}

TEST(WorkerArgv, PythonModuleProgramAndMacro) {
  LaunchConfig c;
  c.script = "train.py";
  c.scriptArgs = {"--out", "ckpt_${local_rank}.pt", "${local_rank}${local_rank}"};
  EXPECT_EQ(workerArgv(c, 3, "python3", false),
            (std::vector<std::string>{"python3", "-u", "train.py", "--out", "ckpt_3.pt", "33"}));
  c.module = true;
  c.script = "pkg.train";
  c.scriptArgs = {};
  EXPECT_EQ(workerArgv(c, 0, "/opt/py", false),
            (std::vector<std::string>{"/opt/py", "-u", "-m", "pkg.train"}));
  c.module = false;
  c.noPython = true;
  c.script = "./train";
  EXPECT_EQ(workerArgv(c, 1, "python3", false), (std::vector<std::string>{"./train"}));
  c.noPython = false;  // an executable that is not a .py file runs directly
  EXPECT_EQ(workerArgv(c, 1, "python3", true), (std::vector<std::string>{"./train"}));
  c.script = "run.py";  // a .py file always goes through python
  EXPECT_EQ(workerArgv(c, 1, "python3", true),
            (std::vector<std::string>{"python3", "-u", "run.py"}));
}

TEST(WorkerEnv, TorchrunContract) {
  LaunchConfig c;
  c.maxRestarts = 3;
  c.role = "trainer";
  GroupInfo g;
  g.groupRank = 1;
  g.groupWorldSize = 2;
  g.baseRank = 4;
  g.worldSize = 8;
  g.masterAddr = "node0";
  g.masterPort = 4242;
  g.runId = "job1";
  Env parent = {{"PATH", "/bin"}, {"RANK", "stale"}};
  Env e = workerEnv(c, g, 2, 4, 1, "/logs/attempt_1/2/error.json", parent);
  EXPECT_EQ(e["PATH"], "/bin");
  EXPECT_EQ(e["RANK"], "6");
  EXPECT_EQ(e["LOCAL_RANK"], "2");
  EXPECT_EQ(e["WORLD_SIZE"], "8");
  EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(e["GROUP_RANK"], "1");
  EXPECT_EQ(e["GROUP_WORLD_SIZE"], "2");
  EXPECT_EQ(e["ROLE_RANK"], "6");
  EXPECT_EQ(e["ROLE_WORLD_SIZE"], "8");
  EXPECT_EQ(e["ROLE_NAME"], "trainer");
  EXPECT_EQ(e["MASTER_ADDR"], "node0");
  EXPECT_EQ(e["MASTER_PORT"], "4242");
  EXPECT_EQ(e["TORCHELASTIC_RESTART_COUNT"], "1");
  EXPECT_EQ(e["TORCHELASTIC_MAX_RESTARTS"], "3");
  EXPECT_EQ(e["TORCHELASTIC_RUN_ID"], "job1");
  EXPECT_EQ(e["TORCHELASTIC_USE_AGENT_STORE"], "True");
  EXPECT_EQ(e["TORCHELASTIC_ERROR_FILE"], "/logs/attempt_1/2/error.json");
  EXPECT_EQ(e["TORCHELASTIC_SIGNALS_TO_HANDLE"], "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
  EXPECT_EQ(e["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");
  EXPECT_EQ(e.count("CUDA_VISIBLE_DEVICES"), 0u);
}

TEST(WorkerEnv, KeepsUserNcclSettingAndVirtualLocalRank) {
  LaunchConfig c;
  c.virtualLocalRank = true;
  GroupInfo g;
  g.worldSize = 4;
  g.useAgentStore = false;
  Env parent = {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"}, {"CUDA_VISIBLE_DEVICES", "4,5,6,7"}};
  Env e = workerEnv(c, g, 2, 4, 0, "", parent);
  EXPECT_EQ(e["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "0");
  EXPECT_EQ(e["LOCAL_RANK"], "0");
  EXPECT_EQ(e["RANK"], "2");
  EXPECT_EQ(e["CUDA_VISIBLE_DEVICES"], "6");
  EXPECT_EQ(e["TORCHELASTIC_USE_AGENT_STORE"], "False");
  Env e2 = workerEnv(c, g, 1, 4, 0, "", {});
  EXPECT_EQ(e2["CUDA_VISIBLE_DEVICES"], "1");
}

}  // namespace
}  // namespace ddprun::agent
