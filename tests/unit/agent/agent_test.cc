// The agent's state machine, driven by a fake launcher (no processes: exits
// are scripted) and a fake rendezvous (rounds and round events are scripted).
// No sockets, no sleeps: a 0 s shutdown timeout makes the SIGKILL path fire
// at once.
#include "ddprun/agent/agent.h"

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

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

TEST(AgentStateMachine, AllSucceedFirstTime) {
  Harness h(config(3, 0));
  h.policy = [](int, int) { return Behaviour{0}; };
  EXPECT_EQ(h.run(), kExitSuccess);
  EXPECT_EQ(h.launches->starts.size(), 3u);
  EXPECT_TRUE(h.launches->signals.empty());
  EXPECT_EQ(h.rdzv->successes, std::vector<int>{0});
  EXPECT_TRUE(h.rdzv->shutdown);
  // One start line by default, in the one console style.
  EXPECT_EQ(count(h.err, "ddprun: started 3 workers (ranks 0-2 of 3); worker store at "
                         "127.0.0.1:29999; logs in "),
            1u)
      << h.err;
}

TEST(AgentStateMachine, FailureStopsTheOthersThenOneRestartSucceeds) {
  Harness h(config(2, 3));
  h.policy = [](int attempt, int lr) {
    if (attempt == 0 && lr == 1) return Behaviour{3};
    if (attempt == 0) return Behaviour{};  // runs until stopped
    return Behaviour{0};
  };
  EXPECT_EQ(h.run(), kExitSuccess);
  ASSERT_EQ(h.launches->starts.size(), 4u);
  EXPECT_EQ(h.launches->starts[2].attempt, 1);
  EXPECT_EQ(h.launches->starts[3].env.at("TORCHELASTIC_RESTART_COUNT"), "1");
  EXPECT_EQ(h.launches->starts[3].env.at("TORCHELASTIC_MAX_RESTARTS"), "3");
  // Rank 0 of attempt 0 was asked to stop with SIGTERM; nothing was killed.
  ASSERT_EQ(h.launches->signals.size(), 1u);
  EXPECT_EQ(h.launches->signals[0], std::make_pair(h.launches->starts[0].pid, SIGTERM));
  // The failure went to the rendezvous, with restarts left (not closing).
  ASSERT_EQ(h.rdzv->failures.size(), 1u);
  EXPECT_NE(h.rdzv->failures[0].first.find("rank 1 (local_rank 1"), std::string::npos);
  EXPECT_FALSE(h.rdzv->failures[0].second);
  EXPECT_EQ(h.rdzv->joins, 2);
  EXPECT_NE(h.err.find("restart 1 of 3"), std::string::npos) << h.err;
}

TEST(AgentStateMachine, RestartBudgetIsExactlyMaxRestartsAndCountedUp) {
  Harness h(config(2, 2));
  h.policy = [](int, int lr) { return lr == 0 ? Behaviour{1} : Behaviour{}; };
  EXPECT_EQ(h.run(), kExitWorkersFailed);
  EXPECT_EQ(h.launches->starts.size(), 6u);  // 1 attempt + 2 restarts, 2 workers each
  EXPECT_EQ(h.launches->starts.back().attempt, 2);
  EXPECT_NE(h.err.find("restart 1 of 2"), std::string::npos) << h.err;
  EXPECT_NE(h.err.find("restart 2 of 2"), std::string::npos) << h.err;
  EXPECT_EQ(h.err.find("restarts left"), std::string::npos) << h.err;
  // Only the last failure closes the job.
  ASSERT_EQ(h.rdzv->failures.size(), 3u);
  EXPECT_FALSE(h.rdzv->failures[0].second);
  EXPECT_FALSE(h.rdzv->failures[1].second);
  EXPECT_TRUE(h.rdzv->failures[2].second);
  // The report: rank 0 is the root cause, rank 1 a victim.
  EXPECT_NE(h.err.find("Root Cause (first observed failure):\n[0]:"), std::string::npos);
  EXPECT_NE(h.err.find("stopped by ddprun"), std::string::npos);
}

TEST(AgentStateMachine, WorkerIgnoringSigtermGetsSigkillAfterGrace) {
  Harness h(config(2, 0));
  h.policy = [](int, int lr) {
    Behaviour b;
    if (lr == 1) b.exitCode = 2;
    else b.ignoresSigterm = true;
    return b;
  };
  EXPECT_EQ(h.run(), kExitWorkersFailed);
  ASSERT_EQ(h.launches->signals.size(), 2u);
  EXPECT_EQ(h.launches->signals[0].second, SIGTERM);
  EXPECT_EQ(h.launches->signals[1].second, SIGKILL);
}

TEST(AgentStateMachine, TwoSimultaneousFailuresAreBothCulprits) {
  Harness h(config(3, 0));
  h.policy = [](int, int lr) { return lr < 2 ? Behaviour{lr + 1} : Behaviour{}; };
  EXPECT_EQ(h.run(), kExitWorkersFailed);
  // Only rank 2 was running when the agent stopped the group.
  ASSERT_EQ(h.launches->signals.size(), 1u);
  EXPECT_EQ(h.launches->signals[0].first, h.launches->starts[2].pid);
  // Ranks 0 and 1 failed by themselves: neither is a victim; rank 2 is.
  EXPECT_EQ(count(h.err, "stopped by ddprun"), 1u) << h.err;
  EXPECT_NE(h.err.find("rank      : 0 (local_rank: 0)"), std::string::npos);
  EXPECT_NE(h.err.find("rank      : 1 (local_rank: 1)"), std::string::npos);
  // The report also lands in the log directory.
  bool found = false;
  for (const auto& e : std::filesystem::recursive_directory_iterator(h.dir.file("logs")))
    found |= e.path().filename() == "failure_report.txt";
  EXPECT_TRUE(found);
}

TEST(AgentStateMachine, SignalDuringJoinEndsTheAgentAtOnce) {
  Harness h(config(2, 0));
  h.hook = [&h](FakeRendezvous&, int) { h.agent->signal(SIGINT); };  // the join never completes
  EXPECT_EQ(h.run(), 128 + SIGINT);
  EXPECT_TRUE(h.rdzv->cancelled);
  EXPECT_TRUE(h.launches->starts.empty());
}

// A static job cannot go on with a node missing: the others are told at once.
TEST(AgentStateMachine, SignalWhileRunningWithTheStaticRendezvousClosesTheJob) {
  LaunchConfig c = config(2, 3);
  c.minNodes = c.maxNodes = 2;
  Harness h(c);
  h.groups = 2;
  h.policy = [](int, int) { return Behaviour{}; };
  h.hook = [&h](FakeRendezvous& r, int round) {
    r.complete(round);
    h.agent->signal(SIGTERM);  // runs after the workers started
  };
  EXPECT_EQ(h.run(), 128 + SIGTERM);
  ASSERT_EQ(h.launches->signals.size(), 2u);
  for (const auto& s : h.launches->signals) EXPECT_EQ(s.second, SIGTERM);
  ASSERT_EQ(h.rdzv->failures.size(), 1u);
  EXPECT_TRUE(h.rdzv->failures[0].second);  // closes the job for every node
  EXPECT_EQ(h.rdzv->joins, 1);              // no restart after a signal
}

// With the elastic rendezvous a signalled node leaves: nothing is reported
// (a closing report would end the job for every node); shutdown() leaves.
TEST(AgentStateMachine, SignalWithTheElasticRendezvousLeavesWithoutClosing) {
  LaunchConfig c = config(2, 3);
  c.useDynamic = true;
  c.minNodes = 1;
  c.maxNodes = 4;
  Harness h(c);
  h.groups = 2;
  h.policy = [](int, int) { return Behaviour{}; };
  h.hook = [&h](FakeRendezvous& r, int round) {
    r.complete(round);
    h.agent->signal(SIGTERM);
  };
  EXPECT_EQ(h.run(), 128 + SIGTERM);
  ASSERT_EQ(h.launches->signals.size(), 2u);
  for (const auto& s : h.launches->signals) EXPECT_EQ(s.second, SIGTERM);
  EXPECT_TRUE(h.rdzv->failures.empty());  // neither a closing nor any failure report
  EXPECT_TRUE(h.rdzv->shutdown);
  EXPECT_EQ(h.rdzv->joins, 1);
}

// Same after the workers succeeded, while the node waits for the round's end.
TEST(AgentStateMachine, SignalAfterLocalSuccessWithTheElasticRendezvousLeaves) {
  LaunchConfig c = config(1, 0);
  c.useDynamic = true;
  c.maxNodes = 2;
  Harness h(c);
  h.groups = 2;
  h.autoFinish = false;
  h.policy = [](int, int) { return Behaviour{0}; };
  h.onSuccess = [&h] { h.agent->signal(SIGINT); };
  EXPECT_EQ(h.run(), 128 + SIGINT);
  EXPECT_EQ(h.rdzv->successes, std::vector<int>{0});
  EXPECT_TRUE(h.rdzv->failures.empty());
  EXPECT_TRUE(h.rdzv->shutdown);
}

TEST(AgentStateMachine, PeerFailureStopsAndRestartsTogether) {
  Harness h(config(2, 1));
  h.groupRank = 0;
  h.groups = 2;
  h.policy = [](int attempt, int) { return attempt == 0 ? Behaviour{} : Behaviour{0}; };
  h.hook = [](FakeRendezvous& r, int round) {
    r.complete(round);
    if (round == 0) r.emit({0, RoundEnd::kFailed, 1, "rank 3 exited with 1"});
  };
  EXPECT_EQ(h.run(), kExitSuccess);
  EXPECT_EQ(h.startsInAttempt(0), 2);
  EXPECT_EQ(h.startsInAttempt(1), 2);
  EXPECT_EQ(h.launches->starts.back().env.at("TORCHELASTIC_RESTART_COUNT"), "1");
  EXPECT_TRUE(h.rdzv->failures.empty());  // not ours to report
  EXPECT_NE(h.err.find("the job failed on node 1 (rank 3 exited with 1)"), std::string::npos)
      << h.err;
}

TEST(AgentStateMachine, PeerClosedEndsTheJobNamingThePeerNotALocalVictim) {
  Harness h(config(2, 3));
  h.groups = 2;
  h.policy = [](int, int) { return Behaviour{}; };
  h.hook = [](FakeRendezvous& r, int round) {
    r.complete(round);
    r.emit({round, RoundEnd::kClosed, 1, "rank 2 exited with 1"});
  };
  EXPECT_EQ(h.run(), kExitWorkersFailed);
  EXPECT_EQ(h.rdzv->joins, 1);
  EXPECT_NE(h.err.find("the job failed on node 1"), std::string::npos) << h.err;
  EXPECT_EQ(h.err.find("Root Cause"), std::string::npos) << h.err;
}

TEST(AgentStateMachine, MembershipChangeRestartsWithoutCounting) {
  Harness h(config(1, 0));  // no restart budget at all
  h.policy = [](int, int) { return Behaviour{}; };
  int joins = 0;
  h.hook = [&](FakeRendezvous& r, int round) {
    ++joins;
    r.complete(round);
    if (round == 0) r.emit({0, RoundEnd::kMembershipChanged, 2, "node 2 is waiting"});
    else h.agent->signal(SIGTERM);  // end the test from the second round
  };
  EXPECT_EQ(h.run(), 128 + SIGTERM);
  EXPECT_EQ(joins, 2);
  ASSERT_EQ(h.launches->starts.size(), 2u);
  EXPECT_EQ(h.launches->starts[1].env.at("TORCHELASTIC_RESTART_COUNT"), "0");
  // Who changed it is named, and the restart is said to be free; not a warning.
  EXPECT_NE(
      h.err.find("ddprun: the set of nodes changed (node 2 is waiting); restarting the "
                 "workers (not counted as a restart)"),
      std::string::npos)
      << h.err;
  EXPECT_EQ(h.err.find("warning: the set of nodes"), std::string::npos) << h.err;
  EXPECT_EQ(h.err.find("restart 1 of"), std::string::npos) << h.err;
}

// Workers that fail because a peer node died (its loss broke their
// collective): the rendezvous finds the peer gone and ends the round as a
// membership change; with no restart budget at all, the job goes on, the
// restart is not counted, and no failure report is written.
void expectFailureAbsorbed(int nproc) {
  LaunchConfig c = config(nproc, 0);
  c.useDynamic = true;  // a signal then leaves without a report
  c.maxNodes = 3;
  Harness h(c);
  h.absorbs = true;
  h.failureBecomes = RoundEvent{0, RoundEnd::kMembershipChanged, 1,
                                "node 10.0.0.3 (pid 7) is gone: its connection to the "
                                "rendezvous store closed"};
  int started = 0;  // the attempt stays 0: the restart is not counted
  h.policy = [&started](int, int) {
    if (started++ == 0) return Behaviour{1};  // the first worker of round 0
    return Behaviour{};                         // runs until stopped
  };
  h.hook = [&h](FakeRendezvous& r, int round) {
    r.complete(round);
    if (round == 1) h.agent->signal(SIGTERM);  // end the test from the second round
  };
  EXPECT_EQ(h.run(), 128 + SIGTERM);
  EXPECT_EQ(h.rdzv->joins, 2);
  ASSERT_EQ(h.rdzv->failures.size(), 1u);
  EXPECT_TRUE(h.rdzv->failures[0].second);  // asked to close: no budget; the loss won
  ASSERT_EQ(h.launches->starts.size(), 2u * nproc);
  EXPECT_EQ(h.launches->starts.back().env.at("TORCHELASTIC_RESTART_COUNT"), "0");
  EXPECT_NE(h.err.find("the set of nodes changed (node 10.0.0.3 (pid 7) is gone: its "
                       "connection to the rendezvous store closed); this node's workers "
                       "failed with it (rank 0"),
            std::string::npos)
      << h.err;
  EXPECT_NE(h.err.find("not counted as a restart"), std::string::npos) << h.err;
  EXPECT_EQ(h.err.find("restart 1 of"), std::string::npos) << h.err;
  EXPECT_EQ(h.err.find("Root Cause"), std::string::npos) << h.err;
}

TEST(AgentStateMachine, FailureAfterAPeersLossIsThatMembershipChange) {
  expectFailureAbsorbed(1);
}

TEST(AgentStateMachine, FailureAfterAPeersLossStopsTheOtherWorkersThenReforms) {
  expectFailureAbsorbed(2);
}

// Where the rendezvous could absorb a failure but finds no peer gone, the
// failure is what it was: with no budget, the job ends with the report.
TEST(AgentStateMachine, FailureWithEveryPeerAliveStillEndsTheJob) {
  Harness h(config(1, 0));
  h.absorbs = true;
  h.policy = [](int, int) { return Behaviour{1}; };
  EXPECT_EQ(h.run(), kExitWorkersFailed);
  EXPECT_EQ(h.rdzv->joins, 1);
  ASSERT_EQ(h.rdzv->failures.size(), 1u);
  EXPECT_TRUE(h.rdzv->failures[0].second);
  EXPECT_NE(h.err.find("Root Cause"), std::string::npos) << h.err;
}

// A membership change with the job-wide count: the count stays, no budget
// is needed, and the round's workers see the same TORCHELASTIC_RESTART_COUNT.
TEST(AgentStateMachine, MembershipChangeKeepsTheJobWideCount) {
  LaunchConfig c = config(1, 2);
  c.useDynamic = true;
  c.maxNodes = 3;
  Harness h(c);
  h.groups = 2;
  h.jobRestarts = [](int) { return 1; };  // one failed round before this node came
  h.policy = [](int, int) { return Behaviour{}; };
  h.hook = [&h](FakeRendezvous& r, int round) {
    r.complete(round);
    if (round == 0)
      r.emit({0, RoundEnd::kMembershipChanged, 1, "node 10.0.0.3 (pid 7) left"});
    else
      h.agent->signal(SIGTERM);
  };
  EXPECT_EQ(h.run(), 128 + SIGTERM);
  ASSERT_EQ(h.launches->starts.size(), 2u);
  for (const auto& st : h.launches->starts)
    EXPECT_EQ(st.env.at("TORCHELASTIC_RESTART_COUNT"), "1");
  EXPECT_NE(h.err.find("node 10.0.0.3 (pid 7) left"), std::string::npos) << h.err;
  // Said once, when this node first learned of it.
  EXPECT_EQ(count(h.err, "the job has used 1 of 2 restarts"), 1u) << h.err;
}

// A node arriving after restarts were spent elsewhere takes the job's count
// (workers, attempt directory, budget); its own restarts continue from it
// and the "restart K of N" line agrees with the count the rendezvous gives.
TEST(AgentStateMachine, RestartCountIsTheRendezvousJobWideCount) {
  Harness h(config(1, 3));
  h.groups = 2;
  h.jobRestarts = [](int round) { return 2 + round; };  // round 0 of this node: 2 used
  h.policy = [](int, int) { return Behaviour{1}; };     // every attempt fails
  EXPECT_EQ(h.run(), kExitWorkersFailed);
  ASSERT_EQ(h.launches->starts.size(), 2u);  // attempts 2 and 3; then the budget is spent
  EXPECT_EQ(h.launches->starts[0].env.at("TORCHELASTIC_RESTART_COUNT"), "2");
  EXPECT_EQ(h.launches->starts[1].env.at("TORCHELASTIC_RESTART_COUNT"), "3");
  EXPECT_NE(h.err.find("the job has used 2 of 3 restarts so far"), std::string::npos)
      << h.err;
  EXPECT_NE(h.err.find("restart 3 of 3"), std::string::npos) << h.err;
  EXPECT_EQ(h.err.find("restart 1 of"), std::string::npos) << h.err;
  // The first failure leaves one restart (not closing), the second closes.
  ASSERT_EQ(h.rdzv->failures.size(), 2u);
  EXPECT_FALSE(h.rdzv->failures[0].second);
  EXPECT_TRUE(h.rdzv->failures[1].second);
  EXPECT_TRUE(std::filesystem::exists(h.startedDir("attempt_2")));
  EXPECT_TRUE(std::filesystem::exists(h.startedDir("attempt_3")));
  EXPECT_FALSE(std::filesystem::exists(h.startedDir("attempt_0")));
}

// A node that arrives after the job is over has nothing to do: one line, exit 0.
TEST(AgentStateMachine, JobAlreadyOverExitsZeroWithOneLine) {
  for (const auto& [message, reason] :
       {std::pair<std::string, std::string>{"the job job7 is already over: finished",
                                            "finished"},
        {"the job job7 is already over (closed by node 1: rank 3 exited with 1)",
         "closed by node 1: rank 3 exited with 1"},
        {"closed after the last restart", "closed after the last restart"}}) {
    LaunchConfig c = config(2, 1);
    c.rdzvId = "job7";
    c.useDynamic = true;
    c.maxNodes = 4;
    Harness h(c);
    h.hook = [msg = message](FakeRendezvous& r, int) {
      r.fail(std::make_exception_ptr(rendezvous::ClosedError(msg, "dyn.cc", 1)));
    };
    EXPECT_EQ(h.run(), kExitSuccess) << message;
    EXPECT_TRUE(h.launches->starts.empty());
    EXPECT_EQ(count(h.err, "ddprun: the job job7 is already over (" + reason +
                               "); nothing to do\n"),
              1u)
        << h.err;
    EXPECT_EQ(h.err.find("error"), std::string::npos) << h.err;
    EXPECT_EQ(h.err.find("dyn.cc"), std::string::npos) << h.err;
    EXPECT_TRUE(h.rdzv->failures.empty());
  }
}

// Several nodes: the start line names the rendezvous (its describe()).
TEST(AgentStateMachine, StartLineNamesTheRendezvousAcrossNodes) {
  LaunchConfig c = config(2, 0);
  c.minNodes = 2;
  c.maxNodes = 4;
  c.useDynamic = true;
  Harness h(c);
  h.groupRank = 1;
  h.groups = 2;
  h.policy = [](int, int) { return Behaviour{0}; };
  EXPECT_EQ(h.run(), kExitSuccess);
  EXPECT_EQ(count(h.err,
                  "ddprun: started 2 workers (ranks 2-3 of 4) on node 1 of 2"
                  "; rendezvous fake; worker store at 127.0.0.1:29999; logs in "),
            1u)
      << h.err;
}

TEST(AgentConfig, DynamicRendezvousSpecFromTheFlags) {
  LaunchConfig c;
  c.script = "train.py";
  c.rdzvBackend = "c10d";
  c.rdzvEndpoint = "[fd00::1]:29411";
  c.rdzvId = "job7";
  c.minNodes = 2;
  c.maxNodes = 4;
  c.localAddr = "10.0.0.7";
  c.rdzvConf = {{"join_timeout", "90"},
                {"last_call_timeout", "2.5"},
                {"close_timeout", "7"},
                {"read_timeout", "11"},
                {"keep_alive_interval", "0.5"},
                {"keep_alive_max_attempt", "4"},
                {"is_host", "no"}};
  finalizeConfig(c);
  ASSERT_TRUE(c.useDynamic);
  const auto spec = rendezvousSpec(c);
  ASSERT_EQ(spec.kind, rendezvous::RendezvousSpec::Kind::kDynamic);
  const auto& o = spec.dynamic;
  EXPECT_EQ(o.endpointHost, "fd00::1");
  EXPECT_EQ(o.endpointPort, 29411);
  EXPECT_FALSE(o.isHost);
  EXPECT_TRUE(o.isHostExplicit);
  EXPECT_EQ(o.runId, "job7");
  EXPECT_EQ(o.minNodes, 2);
  EXPECT_EQ(o.maxNodes, 4);
  EXPECT_EQ(o.localAddr, "10.0.0.7");
  EXPECT_EQ(o.joinTimeout, std::chrono::seconds(90));
  EXPECT_EQ(o.lastCallTimeout, std::chrono::milliseconds(2500));
  EXPECT_EQ(o.closeTimeout, std::chrono::seconds(7));
  EXPECT_EQ(o.readTimeout, std::chrono::seconds(11));
  EXPECT_EQ(o.keepAliveInterval, std::chrono::milliseconds(500));
  EXPECT_EQ(o.keepAliveMaxAttempt, 4);
}

TEST(AgentStateMachine, WaitsForTheRoundToFinishAfterLocalSuccess) {
  Harness h(config(1, 0));
  h.groups = 2;
  h.autoFinish = false;
  h.policy = [](int, int) { return Behaviour{0}; };
  // The peer is still running when our worker succeeds; it then fails. With
  // no budget the job is over: exit 1, naming the peer.
  h.afterSuccess = RoundEvent{0, RoundEnd::kClosed, 1, "rank 1 exited with 1"};
  EXPECT_EQ(h.run(), kExitWorkersFailed);
  EXPECT_EQ(h.rdzv->successes, std::vector<int>{0});
  EXPECT_NE(h.err.find("the job failed on node 1"), std::string::npos) << h.err;
}

TEST(AgentStateMachine, StoreLostAfterLocalSuccessIsSuccess) {
  Harness h(config(1, 0));
  h.groups = 2;
  h.autoFinish = false;
  h.policy = [](int, int) { return Behaviour{0}; };
  h.afterSuccess = RoundEvent{0, RoundEnd::kStoreLost, 0, ""};
  EXPECT_EQ(h.run(), kExitSuccess);
}

// The endpoint's store gone while the workers run: the job is over (exit 1);
// the backend's reason, which names the store, is said once, not wrapped.
TEST(AgentStateMachine, StoreLostWhileRunningEndsTheJobNamingTheStore) {
  Harness h(config(1, 3));
  h.groups = 2;
  h.policy = [](int, int) { return Behaviour{}; };
  h.hook = [](FakeRendezvous& r, int round) {
    r.complete(round);
    r.emit({round, RoundEnd::kStoreLost, -1, "the rendezvous store at head:29400 is gone"});
  };
  EXPECT_EQ(h.run(), kExitWorkersFailed);
  EXPECT_EQ(h.rdzv->joins, 1);  // no restart: nowhere to meet
  EXPECT_NE(h.err.find("ddprun: warning: the rendezvous store at head:29400 is gone; "
                       "stopping this node's workers"),
            std::string::npos)
      << h.err;
  EXPECT_EQ(h.err.find("store is gone ("), std::string::npos) << h.err;
  EXPECT_NE(h.err.find("ddprun: the rendezvous store at head:29400 is gone; this node's "
                       "workers were stopped\n"),
            std::string::npos)
      << h.err;
}

TEST(AgentStateMachine, JoinFailureIsASetupError) {
  Harness h(config(2, 5));
  h.hook = [](FakeRendezvous& r, int) {
    r.fail(std::make_exception_ptr(
        TimeoutError("not every one of the 2 nodes joined: node 1 is missing", "x.cc", 1)));
  };
  EXPECT_EQ(h.run(), kExitSetup);
  EXPECT_TRUE(h.launches->starts.empty());
  EXPECT_NE(h.err.find("ddprun: error: not every one of the 2 nodes joined"),
            std::string::npos)
      << h.err;
  EXPECT_EQ(h.err.find("x.cc"), std::string::npos);  // no source locations
}

TEST(AgentStateMachine, SpawnFailureExitsThree) {
  Harness h(config(3, 2));
  h.policy = [](int, int) { return Behaviour{}; };
  h.hook = [&h](FakeRendezvous& r, int round) {
    h.launches->failStartAt = 2;
    r.complete(round);
  };
  EXPECT_EQ(h.run(), kExitSetup);
  EXPECT_EQ(h.launches->starts.size(), 2u);
  // The two started workers were killed; the job is closed for every node.
  EXPECT_EQ(h.launches->signals.size(), 2u);
  ASSERT_EQ(h.rdzv->failures.size(), 1u);
  EXPECT_TRUE(h.rdzv->failures[0].second);
  EXPECT_NE(h.err.find("ddprun: error: cannot start worker"), std::string::npos) << h.err;
}

TEST(AgentStateMachine, ACrashStormReachesItsBudget) {
  Harness h(config(2, 300));
  h.policy = [](int, int lr) { return lr == 0 ? Behaviour{1} : Behaviour{}; };
  EXPECT_EQ(h.run(), kExitWorkersFailed);
  EXPECT_EQ(h.launches->starts.size(), 602u);
  EXPECT_EQ(h.launches->starts.back().env.at("TORCHELASTIC_RESTART_COUNT"), "300");
  EXPECT_EQ(h.rdzv->joins, 301);
}

TEST(AgentStateMachine, NoUnhonouredFlagIsSilent) {
  LaunchConfig c = config(1, 0);
  c.warnings = {"--numa-binding=node is not supported yet; workers are not bound"};
  Harness h(c);
  h.policy = [](int, int) { return Behaviour{0}; };
  EXPECT_EQ(h.run(), kExitSuccess);
  EXPECT_EQ(count(h.err, "ddprun: warning: --numa-binding=node is not supported yet"), 1u);
}

}  // namespace
}  // namespace ddprun::agent

namespace ddprun::agent {
namespace {

// Under Slurm, SIGUSR1/SIGUSR2 reach every process of the step from Slurm:
// the agent lives through them, forwards nothing and stops nothing.
TEST(AgentSignals, ASurvivedSignalNeitherStopsNorIsForwarded) {
  LaunchConfig c = config(2, 0);
  c.survivedSignals = {SIGUSR1, SIGUSR2};
  Harness h(c);
  h.policy = [](int, int) { return Behaviour{}; };
  h.hook = [&h](FakeRendezvous& r, int round) {
    r.complete(round);
    h.agent->signal(SIGUSR1);
    h.agent->signal(SIGUSR2);
    h.agent->signal(SIGTERM);  // ends the test
  };
  EXPECT_EQ(h.run(), 128 + SIGTERM);
  ASSERT_EQ(h.launches->signals.size(), 2u);
  for (const auto& s : h.launches->signals) EXPECT_EQ(s.second, SIGTERM);
  EXPECT_NE(h.err.find("received SIGUSR1; the sender signalled every process"),
            std::string::npos)
      << h.err;
  EXPECT_NE(h.err.find("received SIGUSR2"), std::string::npos) << h.err;
  EXPECT_EQ(h.rdzv->joins, 1);
}

// The sender of SIGTERM enforces its grace period (Slurm's KillWait or
// GraceTime): no SIGKILL from the agent, even with a 0 s shutdown timeout.
// Nothing else is pending, so run() returns with the worker still running.
TEST(AgentSignals, NoSigkillAfterASignalWhoseSenderEnforcesTheGrace) {
  for (bool killAfterSignal : {true, false}) {
    LaunchConfig c = config(2, 0);
    c.killAfterSignal = killAfterSignal;
    Harness h(c);
    h.policy = [](int, int lr) {
      Behaviour b;
      b.ignoresSigterm = lr == 0;
      return b;
    };
    h.hook = [&h](FakeRendezvous& r, int round) {
      r.complete(round);
      h.agent->signal(SIGTERM);
    };
    int rc = h.run();
    bool killed = false;
    for (const auto& s : h.launches->signals) killed |= s.second == SIGKILL;
    EXPECT_EQ(killed, killAfterSignal);
    if (killAfterSignal) {
      EXPECT_EQ(rc, 128 + SIGTERM);
    }
  }
}

// A stop of the agent's own making (a failure) is still bounded.
TEST(AgentSignals, AFailureStopIsStillBoundedWithoutKillAfterSignal) {
  LaunchConfig c = config(2, 0);
  c.killAfterSignal = false;
  Harness h(c);
  h.policy = [](int, int lr) {
    Behaviour b;
    if (lr == 1) b.exitCode = 2;
    else b.ignoresSigterm = true;
    return b;
  };
  EXPECT_EQ(h.run(), kExitWorkersFailed);
  ASSERT_EQ(h.launches->signals.size(), 2u);
  EXPECT_EQ(h.launches->signals[1].second, SIGKILL);
}

}  // namespace
}  // namespace ddprun::agent
