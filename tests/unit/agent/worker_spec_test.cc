#include "ddprun/agent/worker_spec.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

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

namespace fs = std::filesystem;

// A temporary tree: cwd/, bundled/ (beside ddprun), path1/ and path2/ (PATH).
class ResolveProgram : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ddprun_resolve_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    for (const char* d : {"cwd", "bundled", "path1", "path2"}) fs::create_directory(root_ / d);
    where_.cwd = (root_ / "cwd").string();
    where_.besideDdprun = (root_ / "bundled").string();
    where_.path = "::" + (root_ / "path1").string() + "::" + (root_ / "path2").string() + ":";
  }
  void TearDown() override { fs::remove_all(root_); }

  // Creates dir/name, executable or not; returns its path.
  std::string put(const std::string& dir, const std::string& name, bool executable) {
    fs::path p = root_ / dir / name;
    std::ofstream(p) << "#!/bin/sh\n";
    chmod(p.c_str(), executable ? 0755 : 0644);
    return p.string();
  }
  ResolvedProgram resolve(const std::string& name, bool noPython = false, bool module = false) {
    return resolveProgram(name, module, noPython, where_);
  }

  fs::path root_;
  ProgramSearch where_;
};

TEST_F(ResolveProgram, FileInCurrentDirectoryKeepsTodaysRule) {
  put("bundled", "train", true);  // never consulted while ./train exists
  put("cwd", "train", false);
  auto r = resolve("train");
  EXPECT_EQ(r.program, "train");  // a python script, as given
  EXPECT_FALSE(r.direct);
  EXPECT_EQ(r.notFound, "");
  put("cwd", "train", true);  // executable, not .py: run directly, never from PATH
  r = resolve("train");
  EXPECT_EQ(r.program, "./train");
  EXPECT_TRUE(r.direct);
  r = resolve("train", /*noPython=*/true);
  EXPECT_EQ(r.program, "./train");
  EXPECT_TRUE(r.direct);
  put("cwd", "run.py", true);  // .py always goes through python
  r = resolve("run.py");
  EXPECT_EQ(r.program, "run.py");
  EXPECT_FALSE(r.direct);
}

TEST_F(ResolveProgram, BareNameRunsTheBundledProgramThenPath) {
  std::string bundled = put("bundled", "train", true);
  std::string onPath = put("path2", "train", true);
  put("path1", "train", false);  // not executable: skipped
  auto r = resolve("train");
  EXPECT_EQ(r.program, bundled);
  EXPECT_TRUE(r.direct);  // as if --no-python
  EXPECT_EQ(r.notFound, "");
  fs::remove(bundled);
  r = resolve("train");
  EXPECT_EQ(r.program, onPath);
  EXPECT_TRUE(r.direct);
  put("bundled", "train", false);  // a non-executable bundled file is skipped too
  EXPECT_EQ(resolve("train").program, onPath);
  fs::create_directory(root_ / "cwd" / "tool");  // a directory here is not the program
  std::string tool = put("path1", "tool", true);
  EXPECT_EQ(resolve("tool").program, tool);
}

TEST_F(ResolveProgram, NoPythonBareNameIsSearchedToo) {
  std::string bundled = put("bundled", "helper.py", true);
  auto r = resolve("helper.py", /*noPython=*/true);
  EXPECT_EQ(r.program, bundled);
  EXPECT_TRUE(r.direct);
  // Without --no-python a missing .py script is python's to report.
  r = resolve("helper.py");
  EXPECT_EQ(r.program, "helper.py");
  EXPECT_FALSE(r.direct);
  EXPECT_EQ(r.notFound, "");
}

TEST_F(ResolveProgram, PathsAndModulesAreNotSearched) {
  put("bundled", "train", true);
  put("path1", "pkg.train", true);
  auto r = resolve("sub/train");  // relative to the current directory, as given
  EXPECT_EQ(r.program, "sub/train");
  EXPECT_FALSE(r.direct);
  EXPECT_EQ(r.notFound, "");
  EXPECT_TRUE(resolve("/nonexistent/train", /*noPython=*/true).direct);
  r = resolve("pkg.train", false, /*module=*/true);
  EXPECT_EQ(r.program, "pkg.train");
  EXPECT_FALSE(r.direct);
}

TEST_F(ResolveProgram, NotFoundNamesEveryPlaceSearched) {
  put("path1", "train", false);
  for (bool noPython : {false, true}) {
    auto r = resolve("train", noPython);
    EXPECT_NE(r.notFound.find("'train' not found"), std::string::npos) << r.notFound;
    EXPECT_NE(r.notFound.find(where_.cwd), std::string::npos) << r.notFound;
    EXPECT_NE(r.notFound.find((root_ / "bundled" / "train").string()), std::string::npos)
        << r.notFound;
    EXPECT_NE(r.notFound.find(where_.path), std::string::npos) << r.notFound;
  }
  // The error surfaces where workers start (after the usage checks), as an IoError.
  LaunchConfig c;
  c.script = "train";
  resolveWorkerProgram(c, where_);
  EXPECT_FALSE(c.programNotFound.empty());
  try {
    workerArgv(c, 0, "python3", false);
    ADD_FAILURE() << "workerArgv ran a program that was not found";
  } catch (const IoError& e) {
    EXPECT_EQ(e.message(), c.programNotFound);
  }
}

TEST_F(ResolveProgram, WorkerProgramUpdatesTheConfig) {
  std::string bundled = put("bundled", "train", true);
  LaunchConfig c;
  c.script = "train";
  c.scriptArgs = {"--epochs", "1"};
  resolveWorkerProgram(c, where_);
  EXPECT_EQ(c.script, bundled);
  EXPECT_TRUE(c.noPython);
  EXPECT_EQ(c.programNotFound, "");
  EXPECT_EQ(workerArgv(c, 0, "python3", false),
            (std::vector<std::string>{bundled, "--epochs", "1"}));
  LaunchConfig py;
  py.script = "train.py";
  resolveWorkerProgram(py, where_);
  EXPECT_EQ(workerArgv(py, 0, "python3", false),
            (std::vector<std::string>{"python3", "-u", "train.py"}));
}

TEST(ProgramSearch, FromProcessFindsTheBinaryDirectory) {
  auto s = ProgramSearch::fromProcess();
  ASSERT_FALSE(s.besideDdprun.empty());
  EXPECT_TRUE(fs::is_directory(s.besideDdprun));
  const char* path = std::getenv("PATH");
  EXPECT_EQ(s.path, path ? path : "");
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
