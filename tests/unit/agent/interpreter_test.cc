// The interpreter rule of Python workers (chooseInterpreter) over a fake file
// system: PYTHON_EXEC, else the environment ddprun is installed in, else
// python3 on PATH.
#include "ddprun/agent/interpreter.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace ddprun::agent {
namespace {

// A file system of a few named files, directories and executables.
struct FakeFs {
  std::set<std::string> files, dirs, executables;
  FileProbe probe() const {
    FileProbe p;
    p.isFile = [this](const std::string& s) {
      return files.count(s) || executables.count(s);
    };
    p.isDirectory = [this](const std::string& s) { return dirs.count(s) > 0; };
    p.isExecutable = [this](const std::string& s) { return executables.count(s) > 0; };
    return p;
  }
};

class InterpreterRule : public ::testing::Test {
 protected:
  FakeFs fs_;
  Env env_{{"PATH", "/home/u/.pyenv/shims:/usr/bin:/bin"}};
  void SetUp() override {
    fs_.executables = {"/home/u/.pyenv/shims/python3", "/usr/bin/python3"};
  }
  Interpreter choose(const std::string& self) const {
    return chooseInterpreter(env_, self, fs_.probe());
  }
};

TEST_F(InterpreterRule, AVenvsOwnPython) {
  fs_.files.insert("/opt/venv/pyvenv.cfg");
  fs_.executables.insert("/opt/venv/bin/python3");
  fs_.executables.insert("/opt/venv/bin/python");
  Interpreter in = choose("/opt/venv/bin/ddprun");
  EXPECT_EQ(in.source, InterpreterSource::kEnvironment);
  EXPECT_EQ(in.command, "/opt/venv/bin/python3");  // the venv path, never resolved
  EXPECT_EQ(in.file, "/opt/venv/bin/python3");
  EXPECT_EQ(in.describe(),
            "/opt/venv/bin/python3 (the environment ddprun is installed in)");
}

TEST_F(InterpreterRule, ACondaEnvironmentWithOnlyPython) {
  fs_.dirs.insert("/opt/conda/envs/t/conda-meta");
  fs_.executables.insert("/opt/conda/envs/t/bin/python");
  Interpreter in = choose("/opt/conda/envs/t/bin/ddprun");
  EXPECT_EQ(in.source, InterpreterSource::kEnvironment);
  EXPECT_EQ(in.command, "/opt/conda/envs/t/bin/python");
}

TEST_F(InterpreterRule, APlainBinDirectoryIsNoEnvironment) {
  fs_.executables.insert("/usr/local/bin/python3");
  Interpreter in = choose("/usr/local/bin/ddprun");
  EXPECT_EQ(in.source, InterpreterSource::kPath);
  EXPECT_EQ(in.command, "python3");  // looked up by the launcher on the workers' PATH
  EXPECT_EQ(in.file, "/home/u/.pyenv/shims/python3");
  EXPECT_EQ(in.describe(), "/home/u/.pyenv/shims/python3 (python3 on PATH)");
}

TEST_F(InterpreterRule, AnEnvironmentWithoutAnExecutablePythonFallsBackToPath) {
  fs_.files.insert("/opt/venv/pyvenv.cfg");
  fs_.files.insert("/opt/venv/bin/python3");  // present but not executable
  EXPECT_EQ(choose("/opt/venv/bin/ddprun").source, InterpreterSource::kPath);
}

TEST_F(InterpreterRule, OnlyTheBinDirectoryOfTheEnvironmentCounts) {
  fs_.files.insert("/opt/venv/pyvenv.cfg");
  fs_.executables.insert("/opt/venv/bin/python3");
  // ddprun elsewhere inside the environment (a build tree, lib/): not "installed in it".
  EXPECT_EQ(choose("/opt/venv/lib/ddprun").source, InterpreterSource::kPath);
  EXPECT_EQ(choose("/opt/venv/bin/sub/ddprun").source, InterpreterSource::kPath);
  EXPECT_EQ(choose("").source, InterpreterSource::kPath);  // /proc/self/exe unreadable
}

TEST_F(InterpreterRule, PythonExecWins) {
  fs_.files.insert("/opt/venv/pyvenv.cfg");
  fs_.executables.insert("/opt/venv/bin/python3");
  env_["PYTHON_EXEC"] = "/usr/bin/python3.11";
  Interpreter in = choose("/opt/venv/bin/ddprun");
  EXPECT_EQ(in.source, InterpreterSource::kPythonExec);
  EXPECT_EQ(in.command, "/usr/bin/python3.11");
  EXPECT_EQ(in.describe(), "/usr/bin/python3.11 (PYTHON_EXEC)");
}

TEST_F(InterpreterRule, ABarePythonExecIsLookedUpOnPath) {
  env_["PYTHON_EXEC"] = "python3";
  Interpreter in = choose("/usr/local/bin/ddprun");
  EXPECT_EQ(in.command, "python3");
  EXPECT_EQ(in.describe(),
            "/home/u/.pyenv/shims/python3 (PYTHON_EXEC=python3, found on PATH)");
  env_["PYTHON_EXEC"] = "python9";
  EXPECT_EQ(
      choose("/usr/local/bin/ddprun").describe(),
      "python9 (PYTHON_EXEC; not found on PATH: /home/u/.pyenv/shims:/usr/bin:/bin)");
}

TEST_F(InterpreterRule, AnEmptyPythonExecIsIgnored) {
  fs_.files.insert("/opt/venv/pyvenv.cfg");
  fs_.executables.insert("/opt/venv/bin/python3");
  env_["PYTHON_EXEC"] = "";
  EXPECT_EQ(choose("/opt/venv/bin/ddprun").source, InterpreterSource::kEnvironment);
  EXPECT_EQ(choose("/usr/bin/ddprun").source, InterpreterSource::kPath);
}

TEST_F(InterpreterRule, NoPythonOnPathIsSaidSo) {
  env_["PATH"] = "/nowhere";
  EXPECT_EQ(choose("/usr/bin/ddprun").describe(),
            "python3 (not found on PATH: /nowhere)");
  env_.erase("PATH");  // the launcher's default
  EXPECT_EQ(choose("/usr/bin/ddprun").describe(), "/usr/bin/python3 (python3 on PATH)");
}

TEST(InterpreterSelf, TheRunningBinaryIsKnown) {
  const std::string self = selfExecutable();
  ASSERT_FALSE(self.empty());
  EXPECT_EQ(self.front(), '/');
  EXPECT_TRUE(FileProbe::real().isExecutable(self));
}

}  // namespace
}  // namespace ddprun::agent
