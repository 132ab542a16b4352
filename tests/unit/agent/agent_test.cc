// The agent's worker state machine and restart accounting, driven by a fake
// launcher: no processes are started; exits are scripted.
#include "ddprun/agent/agent.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <boost/asio.hpp>
#include <filesystem>
#include <map>
#include <optional>

namespace ddprun::agent {
namespace {

// What a fake worker does: exit at once with a status, or run until a signal
// it honours arrives.
struct Behaviour {
  std::optional<int> exitCode;  // set: exits right after start
  bool ignoresSigterm = false;
};

class FakeLauncher : public Launcher {
 public:
  using Policy = std::function<Behaviour(int attempt, int localRank)>;
  explicit FakeLauncher(Policy p) : policy_(std::move(p)) {}

  struct Started {
    int pid, attempt, localRank;
    Env env;
  };
  struct Log {
    std::vector<Started> starts;
    std::vector<std::pair<int, int>> signals;  // (pid, sig)
  };
  std::shared_ptr<Log> log = std::make_shared<Log>();

  int start(const ProcessSpec& spec) override {
    int attempt = std::stoi(spec.env.at("TORCHELASTIC_RESTART_COUNT"));
    int lr = std::stoi(spec.env.at("LOCAL_RANK"));
    int pid = nextPid_++;
    log->starts.push_back({pid, attempt, lr, spec.env});
    Behaviour b = policy_(attempt, lr);
    running_[pid] = b;
    if (b.exitCode) exitLater(pid, *b.exitCode << 8);  // waitpid status of exit(code)
    return pid;
  }
  void signalGroup(int pid, int sig) override {
    log->signals.emplace_back(pid, sig);
    auto it = running_.find(pid);
    if (it == running_.end()) return;
    if (sig == SIGTERM && it->second.ignoresSigterm) return;
    exitLater(pid, sig);  // waitpid status of death by signal
  }
  void watchExits(boost::asio::io_context& io, ExitHandler h) override {
    io_ = &io;
    onExit_ = std::move(h);
  }
  void stopWatching() override { onExit_ = nullptr; }

 private:
  void exitLater(int pid, int status) {
    running_.erase(pid);
    boost::asio::post(*io_, [this, pid, status] {
      if (onExit_) onExit_(pid, status);
    });
  }
  Policy policy_;
  boost::asio::io_context* io_ = nullptr;
  ExitHandler onExit_;
  std::map<int, Behaviour> running_;
  int nextPid_ = 4'000'000;  // above pid_max: never a real process
};

LaunchConfig config(int nproc, int maxRestarts) {
  LaunchConfig c;
  c.standalone = true;
  c.nprocPerNode = nproc;
  c.maxRestarts = maxRestarts;
  c.noPython = true;
  c.script = "/bin/true";
  c.shutdownTimeout = std::chrono::seconds(1);
  c.logDir = (std::filesystem::temp_directory_path() / "ddprun_agent_test").string();
  return c;
}

int run(LaunchConfig c, FakeLauncher::Policy p, std::shared_ptr<FakeLauncher::Log>& log) {
  auto launcher = std::make_unique<FakeLauncher>(std::move(p));
  log = launcher->log;
  testing::internal::CaptureStderr();
  int rc = Agent(std::move(c), std::move(launcher)).run();
  testing::internal::GetCapturedStderr();
  return rc;
}

TEST(AgentStateMachine, AllSucceedFirstTime) {
  std::shared_ptr<FakeLauncher::Log> log;
  int rc = run(config(3, 0), [](int, int) { return Behaviour{0}; }, log);
  EXPECT_EQ(rc, kExitSuccess);
  EXPECT_EQ(log->starts.size(), 3u);
  EXPECT_TRUE(log->signals.empty());
}

TEST(AgentStateMachine, FailureStopsTheOthersThenOneRestartSucceeds) {
  std::shared_ptr<FakeLauncher::Log> log;
  int rc = run(config(2, 3),
               [](int attempt, int lr) {
                 if (attempt == 0 && lr == 1) return Behaviour{3};
                 if (attempt == 0) return Behaviour{};  // runs until stopped
                 return Behaviour{0};
               },
               log);
  EXPECT_EQ(rc, kExitSuccess);
  ASSERT_EQ(log->starts.size(), 4u);
  EXPECT_EQ(log->starts[2].attempt, 1);
  EXPECT_EQ(log->starts[3].env.at("TORCHELASTIC_RESTART_COUNT"), "1");
  EXPECT_EQ(log->starts[3].env.at("TORCHELASTIC_MAX_RESTARTS"), "3");
  // Rank 0 of attempt 0 was asked to stop with SIGTERM, and nothing was killed.
  ASSERT_EQ(log->signals.size(), 1u);
  EXPECT_EQ(log->signals[0], std::make_pair(log->starts[0].pid, SIGTERM));
}

TEST(AgentStateMachine, RestartBudgetIsExactlyMaxRestarts) {
  std::shared_ptr<FakeLauncher::Log> log;
  int rc = run(config(2, 2), [](int, int lr) { return lr == 0 ? Behaviour{1} : Behaviour{}; },
               log);
  EXPECT_EQ(rc, kExitWorkersFailed);
  EXPECT_EQ(log->starts.size(), 6u);  // 1 attempt + 2 restarts, 2 workers each
  EXPECT_EQ(log->starts.back().attempt, 2);
}

TEST(AgentStateMachine, WorkerIgnoringSigtermGetsSigkillAfterGrace) {
  std::shared_ptr<FakeLauncher::Log> log;
  auto t0 = std::chrono::steady_clock::now();
  int rc = run(config(2, 0),
               [](int, int lr) {
                 Behaviour b;
                 if (lr == 1) b.exitCode = 2;
                 else b.ignoresSigterm = true;
                 return b;
               },
               log);
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(rc, kExitWorkersFailed);
  ASSERT_EQ(log->signals.size(), 2u);
  EXPECT_EQ(log->signals[0].second, SIGTERM);
  EXPECT_EQ(log->signals[1].second, SIGKILL);
  EXPECT_GE(took, std::chrono::milliseconds(950));  // the 1 s grace
}

}  // namespace
}  // namespace ddprun::agent
