// Fakes for the agent's state machine tests: a launcher whose workers exit
// as scripted (no processes) and a rendezvous whose rounds and round events
// are scripted; Harness runs one Agent over them and keeps what it printed.
// No sockets, no sleeps: a 0 s shutdown timeout makes the SIGKILL path fire
// at once. Included by one test file each (internal linkage).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "ddprun/agent/agent.h"
#include "ddprun/common/error.h"
#include "ddprun/common/log.h"
#include "temp_dir.h"

namespace ddprun::agent {
namespace {

using rendezvous::Rendezvous;
using rendezvous::RoundEnd;
using rendezvous::RoundEvent;
using rendezvous::RoundInfo;

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
    int failStartAt = -1;                       // start() number that throws
  };
  std::shared_ptr<Log> log = std::make_shared<Log>();

  int start(const ProcessSpec& spec) override {
    if (static_cast<int>(log->starts.size()) == log->failStartAt)
      DDPRUN_THROW(IoError, "cannot start worker 'x': no such file");
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
  // Exits happen "in the kernel" at once; the agent hears of them when the
  // posted notification runs or when it polls.
  void pollExits() override {
    while (!pending_.empty()) {
      auto [pid, status] = pending_.front();
      pending_.pop_front();
      if (onExit_) onExit_(pid, status);
    }
  }
  void stopWatching() override { onExit_ = nullptr; }

 private:
  void exitLater(int pid, int status) {
    running_.erase(pid);
    pending_.emplace_back(pid, status);
    boost::asio::post(*io_, [this] { pollExits(); });
  }
  Policy policy_;
  boost::asio::io_context* io_ = nullptr;
  ExitHandler onExit_;
  std::map<int, Behaviour> running_;
  std::deque<std::pair<int, int>> pending_;
  int nextPid_ = 4'000'000;  // above pid_max: never a real process
};

// A rendezvous whose rounds complete at once (or as a hook decides) and
// whose round events the test scripts.
class FakeRendezvous : public Rendezvous {
 public:
  struct Log {
    int joins = 0;
    std::vector<int> successes;
    std::vector<std::pair<std::string, bool>> failures;  // (why, closeJob)
    bool cancelled = false;
    bool shutdown = false;
  };
  // Runs when join() is called, instead of completing the round at once.
  using JoinHook = std::function<void(FakeRendezvous&, int round)>;

  FakeRendezvous(Post post, std::shared_ptr<Log> log, JoinHook hook, int groupRank = 0,
                 int groups = 1)
      : post_(std::move(post)), log_(std::move(log)), hook_(std::move(hook)),
        groupRank_(groupRank), groups_(groups) {}

  void setEventHandler(EventHandler h) override { handler_ = std::move(h); }
  void join(int localWorldSize, JoinHandler done) override {
    nproc_ = localWorldSize;
    pending_ = std::move(done);
    int round = log_->joins++;
    if (hook_) hook_(*this, round);
    else complete(round);
  }
  void reportSuccess(int round) override {
    log_->successes.push_back(round);
    if (onSuccess) onSuccess();
    if (afterSuccess) emit(*afterSuccess);
    else if (autoFinish) emit({round, RoundEnd::kFinished, -1, ""});
  }
  void reportFailure(int round, const std::string& why, bool closeJob) override {
    log_->failures.emplace_back(why, closeJob);
    if (failureBecomes) emit(*failureBecomes);
    else emit({round, closeJob ? RoundEnd::kClosed : RoundEnd::kFailed, groupRank_, why});
  }
  bool absorbsFailuresOfLostPeers() const override { return absorbs; }
  bool closesJobOnSignal() const override { return !leavesOnSignal; }
  bool spansNodes() const override { return groups_ > 1 || leavesOnSignal; }
  void shutdown() override { log_->shutdown = true; }
  void cancel() override {
    log_->cancelled = true;
    if (pending_) fail(std::make_exception_ptr(CancelledError("cancelled")));
  }
  std::string describe() const override { return "fake"; }

  void complete(int round) {
    RoundInfo info;
    info.round = round;
    info.groupRank = groupRank_;
    info.groupWorldSize = groups_;
    info.baseRank = groupRank_ * nproc_;
    info.worldSize = groups_ * nproc_;
    info.workerStoreHost = "127.0.0.1";
    info.workerStorePort = 29999;
    info.restartCount = jobRestarts ? jobRestarts(round) : -1;
    auto done = std::move(pending_);
    pending_ = nullptr;
    post_([done, info] { done(nullptr, info); });
  }
  void fail(std::exception_ptr e) {
    auto done = std::move(pending_);
    pending_ = nullptr;
    post_([done, e] { done(e, {}); });
  }
  void emit(RoundEvent ev) {
    post_([this, ev] {
      if (handler_) handler_(ev);
    });
  }
  bool autoFinish = true;
  std::optional<RoundEvent> afterSuccess;  // sent instead of kFinished
  // The job-wide restart count of each round (RoundInfo.restartCount);
  // unset: -1, the backend keeps none.
  std::function<int(int round)> jobRestarts;
  std::function<void()> onSuccess;  // runs in reportSuccess
  // As the dynamic rendezvous: a failure may end the round as another event
  // (a peer was found gone), sent instead of the failure's own.
  bool absorbs = false;
  std::optional<RoundEvent> failureBecomes;
  bool leavesOnSignal = false;  // as the elastic rendezvous: a signal is no report

 private:
  Post post_;
  std::shared_ptr<Log> log_;
  JoinHook hook_;
  int groupRank_, groups_;
  int nproc_ = 1;
  JoinHandler pending_;
  EventHandler handler_;
};

LaunchConfig config(int nproc, int maxRestarts) {
  LaunchConfig c;
  c.nprocPerNode = nproc;
  c.maxRestarts = maxRestarts;
  c.noPython = true;
  c.script = "/bin/true";
  c.shutdownTimeout = std::chrono::seconds(0);
  c.signalsToHandle = {SIGTERM, SIGINT};
  return c;
}

// One agent run with fakes; console output lands in files read afterwards.
struct Harness {
  ddprun::testing::TempDir dir;
  LaunchConfig cfg;
  FakeLauncher::Policy policy;
  FakeRendezvous::JoinHook hook;
  int groupRank = 0, groups = 1;
  bool autoFinish = true;
  std::optional<RoundEvent> afterSuccess;
  std::function<int(int round)> jobRestarts;
  std::function<void()> onSuccess;
  bool absorbs = false;
  std::optional<RoundEvent> failureBecomes;
  bool leavesOnSignal = false;
  std::shared_ptr<FakeLauncher::Log> launches;
  std::shared_ptr<FakeRendezvous::Log> rdzv = std::make_shared<FakeRendezvous::Log>();
  Agent* agent = nullptr;
  FakeRendezvous* fake = nullptr;
  std::string out, err;

  explicit Harness(LaunchConfig c) : cfg(std::move(c)) { cfg.logDir = dir.file("logs"); }

  int run() {
    setLogStyle(LogStyle::kConsole);
    auto launcher = std::make_unique<FakeLauncher>(policy);
    launches = launcher->log;
    AgentParts parts;
    parts.launcher = std::move(launcher);
    parts.handleSignals = false;
    parts.makeRendezvous = [this](Rendezvous::Post post) {
      auto r = std::make_unique<FakeRendezvous>(std::move(post), rdzv, hook, groupRank, groups);
      r->autoFinish = autoFinish;
      r->afterSuccess = afterSuccess;
      r->jobRestarts = jobRestarts;
      r->onSuccess = onSuccess;
      r->absorbs = absorbs;
      r->failureBecomes = failureBecomes;
      r->leavesOnSignal = leavesOnSignal || cfg.useDynamic;
      fake = r.get();
      return r;
    };
    int outFd = ::open(dir.file("console.out").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    int errFd = ::open(dir.file("console.err").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    parts.consoleOut = outFd;
    parts.consoleErr = errFd;
    ::testing::internal::CaptureStderr();  // the agent's own messages
    int rc = 0;
    {
      Agent a(cfg, std::move(parts));
      agent = &a;
      rc = a.run();
      agent = nullptr;
    }
    err = ::testing::internal::GetCapturedStderr();
    ::close(outFd);
    ::close(errFd);
    err += slurp(dir.file("console.err"));
    out = slurp(dir.file("console.out"));
    return rc;
  }
  static std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // The attempt directory `name` in the run directory under the log dir.
  std::string startedDir(const std::string& name) const {
    for (const auto& e : std::filesystem::directory_iterator(dir.file("logs")))
      if (e.is_directory()) return (e.path() / name).string();
    return dir.file("logs/none/" + name);
  }
  int startsInAttempt(int attempt) const {
    int n = 0;
    for (const auto& s : launches->starts) n += s.attempt == attempt;
    return n;
  }
};

[[maybe_unused]] size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

}  // namespace
}  // namespace ddprun::agent
