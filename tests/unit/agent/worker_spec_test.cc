#include "ddprun/agent/worker_spec.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ddprun/common/error.h"

namespace ddprun::agent {
namespace {

namespace fs = std::filesystem;

using Argv = std::vector<std::string>;

// A temporary tree: cwd/, bundled/ (beside ddprun), path1/ and path2/ (PATH).
class ResolveProgram : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ddprun_resolve_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    for (const char* d : {"cwd", "bundled", "path1", "path2"})
      fs::create_directory(root_ / d);
    where_.cwd = (root_ / "cwd").string();
    where_.besideDdprun = (root_ / "bundled").string();
    where_.path =
        "::" + (root_ / "path1").string() + "::" + (root_ / "path2").string() + ":";
  }
  void TearDown() override { fs::remove_all(root_); }

  // Creates dir/name, a shell script or a native (ELF) program, executable
  // or not; returns its path.
  std::string put(const std::string& dir, const std::string& name, bool executable,
                  bool elf = false) {
    fs::path p = root_ / dir / name;
    static const char kElfHeader[] = {0x7f, 'E', 'L', 'F', 2, 1, 1};
    std::string content = elf ? std::string(kElfHeader, sizeof kElfHeader)
                              : std::string("#!/bin/sh\necho hi\n");
    std::ofstream(p, std::ios::binary) << content;
    chmod(p.c_str(), executable ? 0755 : 0644);
    return p.string();
  }
  ResolvedProgram resolve(const std::string& name, bool noPython = false,
                          bool module = false, bool runPath = false) {
    return resolveProgram(name, module, noPython, runPath, where_);
  }
  LaunchConfig config(const std::string& script, Argv args = {}) {
    LaunchConfig c;
    c.script = script;
    c.scriptArgs = std::move(args);
    return c;
  }

  fs::path root_;
  ProgramSearch where_;
};

TEST_F(ResolveProgram, FileInCurrentDirectoryRunsUnderPythonUnlessNative) {
  put("bundled", "train", true, /*elf=*/true);  // never consulted while ./train exists
  put("cwd", "train", true);  // an executable shell script: Python, as torchrun does
  auto r = resolve("train");
  EXPECT_EQ(r.program, "train");
  EXPECT_EQ(r.path, "");
  EXPECT_FALSE(r.direct);
  EXPECT_EQ(r.notFound, "");
  r = resolve("train", /*noPython=*/true);  // --no-python: directly, never from PATH
  EXPECT_EQ(r.program, "train");
  EXPECT_EQ(r.path, "./train");
  EXPECT_TRUE(r.direct);
  put("cwd", "train", true, /*elf=*/true);  // a native executable runs directly
  r = resolve("train");
  EXPECT_EQ(r.program, "train");
  EXPECT_EQ(r.path, "./train");
  EXPECT_TRUE(r.direct);
  put("cwd", "run.py", true);
  r = resolve("run.py");
  EXPECT_EQ(r.program, "run.py");
  EXPECT_FALSE(r.direct);
}

TEST_F(ResolveProgram, BareNameRunsTheBundledProgramThenPath) {
  std::string bundled = put("bundled", "train", true, /*elf=*/true);
  std::string onPath = put("path2", "train", true);
  put("path1", "train", false);  // not executable: skipped
  auto r = resolve("train");
  EXPECT_EQ(r.program, "train");  // argv[0] stays as given
  EXPECT_EQ(r.path, bundled);
  EXPECT_TRUE(r.direct);  // as if --no-python
  EXPECT_EQ(r.notFound, "");
  fs::remove(bundled);
  r = resolve("train");
  EXPECT_EQ(r.program, "train");
  EXPECT_EQ(r.path, onPath);
  EXPECT_TRUE(r.direct);
  put("bundled", "train", false);  // a non-executable bundled file is skipped too
  EXPECT_EQ(resolve("train").path, onPath);
  fs::create_directory(root_ / "cwd" / "tool");  // a directory here is not the program
  std::string tool = put("path1", "tool", true);
  EXPECT_EQ(resolve("tool").path, tool);
}

TEST_F(ResolveProgram, NoPythonBareNameIsSearchedToo) {
  std::string bundled = put("bundled", "helper.py", true);
  auto r = resolve("helper.py", /*noPython=*/true);
  EXPECT_EQ(r.path, bundled);
  EXPECT_EQ(r.program, "helper.py");
  EXPECT_TRUE(r.direct);
  // Without --no-python a missing .py script is Python's to report.
  r = resolve("helper.py");
  EXPECT_EQ(r.program, "helper.py");
  EXPECT_FALSE(r.direct);
  EXPECT_EQ(r.notFound, "");
}

TEST_F(ResolveProgram, PathsModulesAndRunPathAreNotSearched) {
  put("bundled", "train", true, /*elf=*/true);
  put("path1", "pkg.train", true);
  auto r = resolve("sub/train");  // relative to the current directory, as given
  EXPECT_EQ(r.program, "sub/train");
  EXPECT_FALSE(r.direct);
  EXPECT_EQ(r.notFound, "");
  r = resolve("/nonexistent/train", /*noPython=*/true);
  EXPECT_TRUE(r.direct);
  EXPECT_EQ(r.path, "/nonexistent/train");  // the launcher says it does not exist
  fs::create_directory(root_ / "cwd" / "sub");
  put("cwd/sub", "native", true, /*elf=*/true);
  r = resolve("sub/native");
  EXPECT_TRUE(r.direct);
  EXPECT_EQ(r.path, "sub/native");
  r = resolve("pkg.train", false, /*module=*/true);
  EXPECT_EQ(r.program, "pkg.train");
  EXPECT_FALSE(r.direct);
  // --run-path wins over --no-python and is never searched, as in torchrun.
  r = resolve("train", /*noPython=*/true, false, /*runPath=*/true);
  EXPECT_FALSE(r.direct);
  EXPECT_EQ(r.notFound, "");
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
    EXPECT_NE(r.notFound.find("give a path"), std::string::npos) << r.notFound;
    EXPECT_EQ(r.notFound.find("PYTHON_EXEC"), std::string::npos) << r.notFound;
  }
  // The error surfaces where workers start (after the usage checks), as an IoError.
  LaunchConfig c = config("train");
  resolveWorkerProgram(c, where_);
  EXPECT_FALSE(c.programNotFound.empty());
  try {
    workerCommand(c, 0, "python3", where_);
    ADD_FAILURE() << "workerCommand ran a program that was not found";
  } catch (const IoError& e) {
    EXPECT_EQ(e.message(), c.programNotFound);
  }
}

TEST_F(ResolveProgram, WorkerProgramUpdatesTheConfigButNotTheName) {
  std::string bundled = put("bundled", "train", true, /*elf=*/true);
  LaunchConfig c = config("train", {"--epochs", "1"});
  resolveWorkerProgram(c, where_);
  EXPECT_EQ(c.script, "train");
  EXPECT_TRUE(c.noPython);
  EXPECT_EQ(c.programNotFound, "");
  WorkerCommand cmd = workerCommand(c, 0, "python3", where_);
  EXPECT_EQ(cmd.exe, bundled);
  EXPECT_EQ(cmd.argv, (Argv{"train", "--epochs", "1"}));
  EXPECT_FALSE(cmd.interpreter);
  LaunchConfig py = config("train.py");
  resolveWorkerProgram(py, where_);
  EXPECT_FALSE(py.noPython);
  cmd = workerCommand(py, 0, "python3", where_);
  EXPECT_EQ(cmd.exe, "");  // the launcher finds python3 on the worker's PATH
  EXPECT_EQ(cmd.argv, (Argv{"python3", "-u", "train.py"}));
  EXPECT_TRUE(cmd.interpreter);
}

TEST_F(ResolveProgram, CommandLinesAndTheLocalRankMacro) {
  LaunchConfig c = config(
      "train.py", {"--out", "ckpt_${local_rank}.pt", "${local_rank}${local_rank}"});
  EXPECT_EQ(workerCommand(c, 3, "python3", where_).argv,
            (Argv{"python3", "-u", "train.py", "--out", "ckpt_3.pt", "33"}));
  c = config("pkg.train");
  c.module = true;
  EXPECT_EQ(workerCommand(c, 0, "/opt/py", where_).argv,
            (Argv{"/opt/py", "-u", "-m", "pkg.train"}));
  // A text script without .py, executable with a shebang: Python runs it.
  put("cwd", "job.sh", true);
  c = config("job.sh", {"a"});
  resolveWorkerProgram(c, where_);
  EXPECT_EQ(workerCommand(c, 0, "python3", where_).argv,
            (Argv{"python3", "-u", "job.sh", "a"}));
  // --no-python: argv[0] exactly as given.
  c = config("job.sh", {"${local_rank}"});
  c.noPython = true;
  WorkerCommand cmd = workerCommand(c, 2, "python3", where_);
  EXPECT_EQ(cmd.argv, (Argv{"job.sh", "2"}));
  EXPECT_EQ(cmd.exe, "./job.sh");
}

TEST_F(ResolveProgram, RunPathRunsTheScriptThroughRunpy) {
  LaunchConfig c = config("job.sh", {"--x", "${local_rank}"});
  c.runPath = true;
  c.noPython = true;  // --run-path wins, as in torchrun
  resolveWorkerProgram(c, where_);
  WorkerCommand cmd = workerCommand(c, 1, "python3", where_);
  ASSERT_EQ(cmd.argv.size(), 7u);
  EXPECT_EQ(cmd.argv[0], "python3");
  EXPECT_EQ(cmd.argv[1], "-u");
  EXPECT_EQ(cmd.argv[2], "-c");
  EXPECT_NE(cmd.argv[3].find("runpy.run_path(sys.argv[0], run_name='__main__')"),
            std::string::npos);
  EXPECT_NE(cmd.argv[3].find("sys.argv=sys.argv[1:]"), std::string::npos);
  EXPECT_EQ((Argv(cmd.argv.begin() + 4, cmd.argv.end())), (Argv{"job.sh", "--x", "1"}));
  EXPECT_TRUE(cmd.interpreter);
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
  AttemptInfo a;
  a.round.groupRank = 1;
  a.round.groupWorldSize = 2;
  a.round.baseRank = 4;
  a.round.worldSize = 8;
  a.round.workerStoreHost = "node0";
  a.round.workerStorePort = 4242;
  a.runId = "job1";
  a.restartCount = 1;
  a.localWorldSize = 4;
  Env parent = {{"PATH", "/bin"}, {"RANK", "stale"}};
  Env e = workerEnv(c, a, 2, "/logs/attempt_1/2/error.json", parent);
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

TEST(WorkerEnv, TheRendezvousSecretIsNotPassedOn) {
  LaunchConfig c;
  AttemptInfo a;
  Env e = workerEnv(c, a, 0, "", {{"DDPRUN_RDZV_TOKEN", "secret"}, {"HOME", "/root"}});
  EXPECT_EQ(e.count("DDPRUN_RDZV_TOKEN"), 0u);
  EXPECT_EQ(e["HOME"], "/root");
}

TEST(WorkerEnv, KeepsUserNcclSettingAndVirtualLocalRank) {
  LaunchConfig c;
  c.virtualLocalRank = true;
  AttemptInfo a;
  a.round.worldSize = 4;
  a.localWorldSize = 4;
  Env parent = {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"},
                {"CUDA_VISIBLE_DEVICES", "4,5,6,7"}};
  Env e = workerEnv(c, a, 2, "", parent);
  EXPECT_EQ(e["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "0");
  EXPECT_EQ(e["LOCAL_RANK"], "0");
  EXPECT_EQ(e["RANK"], "2");
  EXPECT_EQ(e["CUDA_VISIBLE_DEVICES"], "6");
  Env e2 = workerEnv(c, a, 1, "", {});
  EXPECT_EQ(e2["CUDA_VISIBLE_DEVICES"], "1");
  Env e3 = workerEnv(c, a, 3, "", {{"CUDA_VISIBLE_DEVICES", "0,1"}});  // fewer devices
  EXPECT_EQ(e3["CUDA_VISIBLE_DEVICES"], "3");
}

}  // namespace
}  // namespace ddprun::agent
