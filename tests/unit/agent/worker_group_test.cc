// WorkerGroup with a fake launcher and a fake output: no processes, no
// sleeps (a 0-second shutdown timeout fires as soon as the io_context runs).
#include <utility>

#include "ddprun/agent/worker_group.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <deque>
#include <filesystem>
#include <fstream>
#include <set>

#include "ddprun/common/error.h"

namespace ddprun::agent {
namespace {

namespace fs = std::filesystem;
using Argv = std::vector<std::string>;

int exited(int code) { return W_EXITCODE(code, 0); }
int killedBy(int sig) { return W_EXITCODE(0, sig); }

// Processes that exist only as pids. A signal queues the exit it would cause
// (unless the pid ignores it); exits reach the handler like SIGCHLD would:
// posted to the io_context, or at once through pollExits().
class FakeLauncher : public Launcher {
 public:
  int start(const ProcessSpec& spec) override {
    if (static_cast<int>(specs.size()) == failAt)
      DDPRUN_THROW(IoError, "cannot start worker: '", spec.argv[0],
                   "' not found on PATH");
    specs.push_back(spec);
    fdsOpenAtStart.push_back(fcntl(spec.stdoutFd, F_GETFD) != -1);
    return nextPid++;
  }
  void signalGroup(int pid, int sig) override {
    signals.emplace_back(pid, sig);
    if (sig != SIGKILL && ignoring.count(pid)) return;
    exit(pid, killedBy(sig));
  }
  void watchExits(boost::asio::io_context& io, ExitHandler onExit) override {
    io_ = &io;
    onExit_ = std::move(onExit);
  }
  void pollExits() override {
    ++polls;
    while (!pending_.empty()) deliverOne();
  }
  void stopWatching() override {}

  // The process exits; its SIGCHLD is handled later, on the io_context.
  void exit(int pid, int status) {
    pending_.emplace_back(pid, status);
    boost::asio::post(*io_, [this] { pollExits(); });
  }
  // Reaps one pending exit, as a SIGCHLD handler that saw only the first.
  void deliverOne() {
    auto [pid, status] = pending_.front();
    pending_.pop_front();
    onExit_(pid, status);
  }

  std::vector<ProcessSpec> specs;
  std::vector<bool> fdsOpenAtStart;
  std::vector<std::pair<int, int>> signals;  // (pid, signal)
  std::set<int> ignoring;                    // pids that ignore every signal but SIGKILL
  int failAt = -1;                           // start() number that throws
  int nextPid = 100;
  int polls = 0;

 private:
  boost::asio::io_context* io_ = nullptr;
  ExitHandler onExit_;
  std::deque<std::pair<int, int>> pending_;
};

// Channels are pipes: the group must close its copies of the write ends.
class FakeOutput : public WorkerOutput {
 public:
  ~FakeOutput() override {
    for (int fd : readEnds_) ::close(fd);
  }
  WorkerFds openWorker(int localRank, int globalRank,
                       const std::string& workerDir) override {
    if (!handed.empty()) previousClosed.push_back(fcntl(handed.back(), F_GETFD) == -1);
    opened.push_back({localRank, globalRank, workerDir});
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) ADD_FAILURE() << "pipe2";
    readEnds_.push_back(p[0]);
    handed.push_back(p[1]);
    return {p[1], p[1]};  // one shared channel: the same fd twice
  }
  void closeWorker(int localRank) override { closed.push_back(localRank); }

  struct Opened {
    int localRank, globalRank;
    std::string dir;
  };
  std::vector<Opened> opened;
  std::vector<int> closed;
  std::vector<int> handed;
  std::vector<bool> previousClosed;

 private:
  std::vector<int> readEnds_;
};

class WorkerGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ddprun_group_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    attemptDir_ = (root_ / "attempt_0").string();
    cfg_.script = "train.py";
    cfg_.scriptArgs = {"--shard=${local_rank}"};
    cfg_.shutdownTimeout = std::chrono::seconds(0);
    round_.groupRank = 1;
    round_.groupWorldSize = 2;
    round_.baseRank = 4;
    round_.worldSize = 8;
    round_.localWorldSizes = {4, 4};
    round_.workerStoreHost = "10.0.0.1";
    round_.workerStorePort = 29400;
    launcher_.watchExits(io_, [this](int pid, int status) { onExit(pid, status); });
  }
  void TearDown() override { fs::remove_all(root_); }

  // The agent's part: a worker failing by itself stops the others.
  void onExit(int pid, int status) {
    const WorkerRecord* w = group_.onExit(pid, status);
    if (w != nullptr && w->exitCode != 0 && !w->stoppedByAgent)
      group_.stop(SIGTERM, [this] { ++stopped_; });
  }
  void start(int nproc) { group_.start(round_, nproc, 3, "job7", attemptDir_); }
  const WorkerRecord& worker(int lr) {
    return group_.workers().at(static_cast<size_t>(lr));
  }
  // Runs every handler and timer that is due (a 0 s timeout included).
  void settle() {
    io_.restart();
    io_.run();
  }

  fs::path root_;
  std::string attemptDir_;
  boost::asio::io_context io_;
  LaunchConfig cfg_;
  rendezvous::RoundInfo round_;
  FakeLauncher launcher_;
  FakeOutput output_;
  WorkerGroup group_{io_,      cfg_, launcher_, output_, Env{{"PATH", "/usr/bin:/bin"}},
                     Interpreter{"python3", InterpreterSource::kPath, "/usr/bin/python3", ""}};
  int stopped_ = 0;
};

TEST_F(WorkerGroupTest, EachRankGetsItsArgvEnvDirAndChannel) {
  fs::create_directories(fs::path(attemptDir_) / "0");
  std::ofstream(fs::path(attemptDir_) / "0" / "stale.log") << "old";
  start(2);
  ASSERT_EQ(launcher_.specs.size(), 2u);
  EXPECT_FALSE(fs::exists(fs::path(attemptDir_) / "0" / "stale.log"));  // wiped first
  for (int lr = 0; lr < 2; ++lr) {
    const ProcessSpec& s = launcher_.specs[lr];
    std::string dir = (fs::path(attemptDir_) / std::to_string(lr)).string();
    EXPECT_EQ(s.argv,
              (Argv{"python3", "-u", "train.py", "--shard=" + std::to_string(lr)}));
    EXPECT_EQ(s.exe, "");  // python3 is looked up on the worker's PATH
    EXPECT_NE(s.notFoundHint.find("PYTHON_EXEC"), std::string::npos);
    Env e = s.env;
    EXPECT_EQ(e["PATH"], "/usr/bin:/bin");
    EXPECT_EQ(e["RANK"], std::to_string(4 + lr));
    EXPECT_EQ(e["LOCAL_RANK"], std::to_string(lr));
    EXPECT_EQ(e["WORLD_SIZE"], "8");
    EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(e["GROUP_RANK"], "1");
    EXPECT_EQ(e["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ(e["MASTER_ADDR"], "10.0.0.1");
    EXPECT_EQ(e["MASTER_PORT"], "29400");
    EXPECT_EQ(e["TORCHELASTIC_RUN_ID"], "job7");
    EXPECT_EQ(e["TORCHELASTIC_RESTART_COUNT"], "3");
    EXPECT_EQ(e["TORCHELASTIC_ERROR_FILE"], dir + "/error.json");
    EXPECT_TRUE(fs::is_directory(dir));
    EXPECT_EQ(output_.opened[lr].localRank, lr);
    EXPECT_EQ(output_.opened[lr].globalRank, 4 + lr);
    EXPECT_EQ(output_.opened[lr].dir, dir);
    EXPECT_EQ(s.stdoutFd, output_.handed[lr]);
    EXPECT_EQ(s.stderrFd, output_.handed[lr]);
    EXPECT_TRUE(launcher_.fdsOpenAtStart[lr]);
    const WorkerRecord& w = worker(lr);
    EXPECT_EQ(w.localRank, lr);
    EXPECT_EQ(w.globalRank, 4 + lr);
    EXPECT_EQ(w.pid, 100 + lr);
    EXPECT_TRUE(w.running);
    EXPECT_FALSE(w.stoppedByAgent);
    EXPECT_EQ(w.errorFile, dir + "/error.json");
  }
  // The group's copies of the channel ends are closed after each start.
  EXPECT_EQ(output_.previousClosed, (std::vector<bool>{true}));
  EXPECT_EQ(fcntl(output_.handed[1], F_GETFD), -1);
  EXPECT_EQ(group_.running(), 2u);
  ASSERT_NE(group_.pythonInterpreter(), nullptr);  // script workers: named in reports
  EXPECT_EQ(group_.pythonInterpreter()->describe(), "/usr/bin/python3 (python3 on PATH)");
}

TEST_F(WorkerGroupTest, DirectProgramKeepsItsNameAsArgv0) {
  cfg_.script = "/bin/true";
  cfg_.noPython = true;
  cfg_.scriptArgs = {"${local_rank}"};
  start(1);
  EXPECT_EQ(launcher_.specs[0].argv, (Argv{"/bin/true", "0"}));
  EXPECT_EQ(launcher_.specs[0].exe, "/bin/true");
  EXPECT_EQ(launcher_.specs[0].notFoundHint.find("PYTHON_EXEC"), std::string::npos);
  EXPECT_EQ(group_.pythonInterpreter(), nullptr);  // no interpreter to name
}

TEST_F(WorkerGroupTest, ExitsAreRecordedOnceWithCodeOrSignal) {
  start(2);
  const WorkerRecord* w = group_.onExit(100, exited(0));
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->localRank, 0);
  EXPECT_FALSE(w->running);
  EXPECT_EQ(w->exitCode, 0);
  EXPECT_GE(w->seconds, 0.0);
  EXPECT_EQ(group_.onExit(100, exited(0)), nullptr);  // not running any more
  EXPECT_EQ(group_.onExit(999, exited(0)), nullptr);  // not ours
  w = group_.onExit(101, killedBy(SIGSEGV));
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->exitCode, -SIGSEGV);
  EXPECT_EQ(output_.closed, (std::vector<int>{0, 1}));  // output copied at each exit
  EXPECT_EQ(group_.running(), 0u);
}

TEST_F(WorkerGroupTest, SpawnFailureKillsWhatStartedAndThrowsIoError) {
  launcher_.failAt = 2;
  try {
    start(3);
    ADD_FAILURE() << "start() did not throw";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("not found"), std::string::npos) << e.message();
  }
  EXPECT_EQ(launcher_.signals,
            (std::vector<std::pair<int, int>>{{100, SIGKILL}, {101, SIGKILL}}));
  ASSERT_EQ(group_.workers().size(), 2u);
  EXPECT_TRUE(worker(0).stoppedByAgent);
  EXPECT_TRUE(worker(1).stoppedByAgent);
  EXPECT_EQ(output_.closed,
            (std::vector<int>{2}));  // the channel of the one never started
  EXPECT_EQ(fcntl(output_.handed[2], F_GETFD), -1);
  settle();  // the killed workers' exits arrive like any other
  EXPECT_EQ(group_.running(), 0u);
  EXPECT_EQ(worker(0).exitCode, -SIGKILL);
}

TEST_F(WorkerGroupTest, MissingProgramThrowsBeforeAnythingStarts) {
  cfg_.programNotFound = "program 'nosuch' not found: ...; give a path to it";
  try {
    start(2);
    ADD_FAILURE() << "start() did not throw";
  } catch (const IoError& e) {
    EXPECT_EQ(e.message(), cfg_.programNotFound);
  }
  EXPECT_TRUE(launcher_.specs.empty());
  EXPECT_TRUE(launcher_.signals.empty());
}

TEST_F(WorkerGroupTest, StopSignalsEveryRunningWorkerAndPostsOnce) {
  start(3);
  group_.onExit(102, exited(0));  // finished already: not signalled
  int calls = 0;
  group_.stop(SIGTERM, [&] { ++calls; });
  EXPECT_EQ(launcher_.polls, 1);  // exits reaped before choosing whom to signal
  EXPECT_EQ(launcher_.signals,
            (std::vector<std::pair<int, int>>{{100, SIGTERM}, {101, SIGTERM}}));
  EXPECT_TRUE(worker(0).stoppedByAgent);
  EXPECT_TRUE(worker(1).stoppedByAgent);
  EXPECT_FALSE(worker(2).stoppedByAgent);
  EXPECT_EQ(calls, 0);  // posted, not run inside stop()
  settle();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(worker(0).exitCode, -SIGTERM);
  EXPECT_EQ(group_.running(), 0u);
}

TEST_F(WorkerGroupTest, StopWithNothingRunningPostsAtOnce) {
  int calls = 0;
  group_.stop(SIGTERM, [&] { ++calls; });
  settle();
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(launcher_.signals.empty());
}

TEST_F(WorkerGroupTest, SigkillAfterTheGraceForAWorkerIgnoringSigterm) {
  start(2);
  launcher_.ignoring.insert(101);
  int calls = 0;
  group_.stop(SIGTERM, [&] { ++calls; });
  settle();  // the 0 s timeout fires: SIGKILL to the one still running
  EXPECT_EQ(launcher_.signals, (std::vector<std::pair<int, int>>{
                                   {100, SIGTERM}, {101, SIGTERM}, {101, SIGKILL}}));
  EXPECT_EQ(worker(0).exitCode, -SIGTERM);
  EXPECT_EQ(worker(1).exitCode, -SIGKILL);
  EXPECT_EQ(calls, 1);
}

TEST_F(WorkerGroupTest, ALaterStopResendsAndKeepsTheFirstCallback) {
  start(1);
  launcher_.ignoring.insert(100);
  cfg_.shutdownTimeout = std::chrono::seconds(3600);  // never fires in this test
  int first = 0, second = 0;
  group_.stop(SIGTERM, [&] { ++first; });
  group_.stop(SIGINT, [&] { ++second; });
  EXPECT_EQ(launcher_.signals,
            (std::vector<std::pair<int, int>>{{100, SIGTERM}, {100, SIGINT}}));
  launcher_.exit(100, exited(1));
  settle();
  EXPECT_EQ(first, 1);
  EXPECT_EQ(second, 0);
}

TEST_F(WorkerGroupTest, TwoSimultaneousFailuresAreBothCulprits) {
  start(3);
  launcher_.ignoring = {100, 101, 102};  // exits below are their own doing
  launcher_.exit(100, exited(1));
  launcher_.exit(101, exited(2));  // failed too, its SIGCHLD not handled yet
  launcher_.deliverOne();          // the agent sees rank 0 fail and stops the rest
  EXPECT_EQ(worker(0).exitCode, 1);
  EXPECT_EQ(worker(1).exitCode, 2);
  EXPECT_FALSE(worker(0).stoppedByAgent);
  EXPECT_FALSE(worker(1).stoppedByAgent);  // not a victim
  EXPECT_TRUE(worker(2).stoppedByAgent);
  // One signal, to the one still running (the nested stop() did not send twice).
  EXPECT_EQ(launcher_.signals, (std::vector<std::pair<int, int>>{{102, SIGTERM}}));
  settle();  // 0 s grace: SIGKILL
  EXPECT_EQ(worker(2).exitCode, -SIGKILL);
  EXPECT_EQ(stopped_, 1);
}

TEST_F(WorkerGroupTest, StartWhileWorkersRunIsRejected) {
  start(1);
  EXPECT_THROW(start(1), InvalidArgument);
}

TEST_F(WorkerGroupTest, ClearReleasesRecordsAndTheOldKillTimerSparesTheNextAttempt) {
  start(2);
  launcher_.ignoring = {100, 101};
  int calls = 0;
  group_.stop(SIGTERM, [&] { ++calls; });  // 0 s timer armed
  group_.onExit(100, exited(0));
  group_.onExit(101, exited(0));  // all gone before the timer's handler ran
  group_.clear();
  EXPECT_TRUE(group_.workers().empty());
  EXPECT_EQ(group_.workers().capacity(), 0u);
  start(2);
  settle();
  for (const auto& [pid, sig] : launcher_.signals) EXPECT_NE(sig, SIGKILL) << pid;
  EXPECT_EQ(group_.running(), 2u);
  EXPECT_EQ(calls, 1);  // posted before clear(): still runs once
}

}  // namespace
}  // namespace ddprun::agent
