// <utility> first: Boost 1.74's Asio under C++20 with g++ 12.
#include <utility>

#include "ddprun/agent/agent.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <thread>

#include "ddprun/agent/failure.h"
#include "ddprun/agent/reporter.h"
#include "ddprun/agent/worker_group.h"
#include "ddprun/common/cpus.h"
#include "ddprun/common/error.h"
#include "ddprun/common/log.h"
#include "ddprun/common/net.h"
#include "ddprun/common/progress_file.h"
#include "ddprun/common/strings.h"
#include "ddprun/rendezvous/spec.h"
#include "progress_watch.h"
#include "status_feed.h"

namespace ddprun::agent {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using rendezvous::RoundEnd;
using rendezvous::RoundEvent;
using rendezvous::RoundInfo;

namespace {
std::string messageOf(const std::exception& e) {
  if (const auto* d = dynamic_cast<const Error*>(&e)) return d->message();
  return e.what();
}

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// "3.2 s" below 10 s, else "31 s": how long a rank was silent.
std::string secondsText(double seconds) {
  char buf[48];
  std::snprintf(buf, sizeof buf, seconds < 10 ? "%.1f s" : "%.0f s", seconds);
  return buf;
}

std::optional<ProgressWatch::Clock::duration> watchTimeout(const LaunchConfig& cfg) {
  if (!cfg.progressTimeout) return std::nullopt;
  return *cfg.progressTimeout;
}
}  // namespace

class Agent::Impl {
  enum class State {
    kIdle,       // not started
    kJoining,    // waiting for the rendezvous round
    kRunning,    // workers of the round run
    kSucceeded,  // every local worker succeeded; waiting for the round to end
    kStopping,   // stopping the workers (failure here or elsewhere, or a signal)
    kDone,
  };
  // Why the workers are being stopped; decides what comes after.
  enum class StopCause { kNone, kOwnFailure, kPeer, kSignal };

 public:
  Impl(LaunchConfig cfg, AgentParts parts)
      : cfg_(std::move(cfg)),
        parts_(std::move(parts)),
        sigs_(io_),
        progressTimer_(io_),
        progress_(watchTimeout(cfg_)) {}

  int run() {
    if (!prepare()) return exitCode_;
    parts_.launcher->watchExits(io_, [this](int pid, int status) { onExit(pid, status); });
    if (parts_.handleSignals)
      for (int s : cfg_.signalsToHandle) sigs_.add(s);
    if (parts_.handleSignals)
      for (int s : cfg_.survivedSignals) sigs_.add(s);
    waitSignal();
    try {
      auto post = [this](std::function<void()> f) { asio::post(io_, std::move(f)); };
      rdzv_ = parts_.makeRendezvous ? parts_.makeRendezvous(post)
                                    : rendezvous::makeRendezvous(rendezvousSpec(cfg_), post);
    } catch (const std::exception& e) {
      DDPRUN_DEBUG("rendezvous setup: ", e.what());
      DDPRUN_ERROR(messageOf(e));
      finish(kExitSetup);
      return exitCode_;
    }
    rdzv_->setEventHandler([this](RoundEvent ev) { onRoundEvent(ev); });
    rdzv_->setJoinProgressHandler([this](const rendezvous::JoinProgress& p) {
      if (state_ != State::kJoining) return;  // a late word of a join that ended
      joinProgress_ = p;
      publishStatus();
    });
    join();
    io_.run();
    return exitCode_;
  }

  void signal(int sig) {
    asio::post(io_, [this, sig] { onSignal(sig); });
  }

 private:
  // ------------------------------------------------------------ setup
  // nproc, the run directory, the parts. False: exitCode_ says why.
  bool prepare() {
    if (!resolveNproc()) return false;
    for (const auto& w : cfg_.warnings) DDPRUN_WARN(w);
    Env& env = parts_.environment;
    if (nproc_ > 1 && !env.count("OMP_NUM_THREADS")) {
      env["OMP_NUM_THREADS"] = "1";
      DDPRUN_NOTICE("setting OMP_NUM_THREADS=1 for each of the ", nproc_,
                    " workers, as torchrun does (set it yourself to choose another value)");
    }
    ReporterOptions ro;
    try {
      ro.runDir = Reporter::makeRunDir(cfg_.logDir, cfg_.rdzvId);
    } catch (const std::exception& e) {
      DDPRUN_DEBUG("log directory: ", e.what());
      DDPRUN_ERROR(messageOf(e));
      exitCode_ = kExitSetup;
      return false;
    }
    ro.role = cfg_.role;
    ro.redirects = cfg_.redirects;
    ro.tee = cfg_.tee;
    ro.localRanksFilter = cfg_.localRanksFilter;
    ro.duplicateStdoutFilters = cfg_.duplicateStdoutFilters;
    ro.duplicateStderrFilters = cfg_.duplicateStderrFilters;
    ro.prefixTemplate = cfg_.logLinePrefixTemplate;
    if (ro.prefixTemplate.empty() && env.count("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"))
      ro.prefixTemplate = env.at("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
    ro.hostname = host_;
    ro.consoleOut = parts_.consoleOut;
    ro.consoleErr = parts_.consoleErr;
    reporter_ = std::make_unique<Reporter>(io_, ro);
    if (!startStatus()) return false;
    // The one interpreter rule (interpreter.h), on the workers' environment.
    group_ = std::make_unique<WorkerGroup>(io_, cfg_, *parts_.launcher, *reporter_, env,
                                           chooseInterpreter(env, selfExecutable(),
                                                             FileProbe::real()));
    return true;
  }

  // --status-port: the endpoint listens before anything starts.
  bool startStatus() {
    try {
      status_ = std::make_unique<StatusFeed>(cfg_, host_, nproc_);
    } catch (const Error& e) {
      DDPRUN_ERROR(e.message());
      exitCode_ = kExitSetup;
      return false;
    }
    if (status_->enabled() && cfg_.statusPort == 0)
      DDPRUN_NOTICE("status endpoint at ", status_->url(), "/status");
    else if (status_->enabled())
      DDPRUN_INFO("status endpoint at ", status_->url(), "/status");
    publishStatus();
    return true;
  }

  void publishStatus() {
    if (!status_ || !status_->enabled()) return;
    static constexpr const char* kNames[] = {"idle",    "joining",  "running",
                                             "succeeded", "stopping", "done"};
    StatusFeed::View view{kNames[static_cast<int>(state_)],
                          &round_,
                          restartCount_,
                          restartsLeft(),
                          group_ ? &group_->workers() : nullptr,
                          rdzv_ && rdzv_->spansNodes() ? rdzv_->describe() : "",
                          rdzv_ ? rdzv_->heartbeatsMissed() : 0};
    if (state_ == State::kJoining && joinProgress_) view.join = &*joinProgress_;
    view.progress = &progress_;
    view.now = ProgressWatch::Clock::now();
    status_->publish(view);
  }

  bool resolveNproc() {
    nproc_ = agent::resolveNproc(cfg_.nprocKind, cfg_.nprocPerNode);
    if (nproc_ > 0 || cfg_.nprocKind != NprocKind::kGpu) return true;
    DDPRUN_ERROR("--nproc-per-node=gpu but no CUDA device was found (no driver or no "
                 "GPU); give a number or 'cpu'");
    exitCode_ = kExitUsage;
    return false;
  }

  // ------------------------------------------------------------ joining
  void join() {
    state_ = State::kJoining;
    joinProgress_.reset();
    joinStarted_ = std::chrono::steady_clock::now();
    publishStatus();
    rdzv_->join(nproc_, [this](std::exception_ptr err, RoundInfo info) {
      onJoined(err, std::move(info));
    });
  }

  void onJoined(std::exception_ptr err, RoundInfo info) {
    if (state_ != State::kJoining) return;  // a signal ended the agent meanwhile
    if (err) {
      onJoinFailed(err);
      return;
    }
    round_ = std::move(info);
    adoptRestartCount();
    status_->roundJoined(secondsSince(joinStarted_));
    reporter_->event("rendezvous",
                     {{"round", round_.round}, {"group_rank", round_.groupRank},
                      {"group_world_size", round_.groupWorldSize},
                      {"world_size", round_.worldSize}, {"duration_s", secondsSince(joinStarted_)}},
                     restartCount_);
    startWorkers();
  }

  // A failed join: cancelled (we asked for it), the job already over, or a
  // setup error (peers missing, store unreachable: exit 3). The job over: a
  // node that never ran workers of it arrived late (nothing to do, exit 0,
  // as torchrun on RendezvousClosedError); one that did is joining again
  // after its round ended, and exits with the job's result (docs/agent.md,
  // "Exit codes by the job's outcome").
  void onJoinFailed(std::exception_ptr err) {
    try {
      std::rethrow_exception(err);
    } catch (const CancelledError&) {
      return;
    } catch (const rendezvous::ClosedError& e) {
      reporter_->event("rendezvous_closed", {{"reason", e.message()}}, restartCount_);
      if (!announcedStart_) {
        DDPRUN_NOTICE("the job ", cfg_.rdzvId, " is already over (",
                      closedReason(e.message()), "); nothing to do");
        finish(kExitSuccess);
      } else if (e.finished()) {
        DDPRUN_NOTICE("the job ", cfg_.rdzvId, " finished without this node (",
                      closedReason(e.message()), ")");
        finish(kExitSuccess);
      } else {
        DDPRUN_ERROR("the job ", cfg_.rdzvId, " ended while this node was joining again (",
                     closedReason(e.message()), ")");
        report();
        finish(kExitWorkersFailed);
      }
      return;
    } catch (const rendezvous::JobMismatchError& e) {
      // This node's job-wide flags differ from the job's: a usage error.
      DDPRUN_ERROR(e.message());
      reporter_->event("rendezvous_failed", {{"reason", e.message()}}, restartCount_);
      finish(kExitUsage);
      return;
    } catch (const std::exception& e) {
      DDPRUN_DEBUG("rendezvous: ", e.what());
      DDPRUN_ERROR(messageOf(e));
    }
    reporter_->event("rendezvous_failed", {}, restartCount_);
    finish(kExitSetup);
  }

  // The reason in a ClosedError's message, without a leading "the job <id>
  // is already over" that our own line says already.
  std::string closedReason(const std::string& message) const {
    const std::string lead = "the job " + cfg_.rdzvId + " is already over";
    if (message.rfind(lead, 0) != 0) return message;
    std::string rest = str::trim(message.substr(lead.size()));
    while (!rest.empty() &&
           (rest.front() == ':' || rest.front() == '(' || rest.front() == ' '))
      rest.erase(0, 1);
    if (!rest.empty() && rest.back() == ')') rest.pop_back();
    return rest.empty() ? "closed" : rest;
  }

  // The job-wide count of failed rounds, when the rendezvous keeps one (the
  // same on every node): TORCHELASTIC_RESTART_COUNT, the attempt directory
  // and the budget follow it. It differs from this node's own count only
  // when this node missed rounds (it arrived late, or waited to be
  // admitted); then say so, so that no message disagrees with it.
  void adoptRestartCount() {
    if (round_.restartCount < 0 || round_.restartCount == restartCount_) return;
    DDPRUN_NOTICE("the job has used ", round_.restartCount, " of ", cfg_.maxRestarts,
                  " restarts so far (counted for the whole job)");
    restartCount_ = round_.restartCount;
  }

  void startWorkers() {
    const std::string attemptDir =
        (fs::path(reporter_->runDir()) / ("attempt_" + std::to_string(restartCount_))).string();
    progress_.reset();
    try {
      group_->start(round_, nproc_, restartCount_, cfg_.rdzvId, attemptDir);
    } catch (const std::exception& e) {
      DDPRUN_DEBUG("starting workers: ", e.what());
      DDPRUN_ERROR(messageOf(e));
      rdzv_->reportFailure(round_.round, "node " + std::to_string(round_.groupRank) +
                                             " could not start its workers", /*closeJob=*/true);
      finish(kExitSetup);
      return;
    }
    state_ = State::kRunning;
    publishStatus();
    armProgressTimer();
    for (const auto& w : group_->workers())
      reporter_->event("start", {{"local_rank", w.localRank}, {"rank", w.globalRank}, {"pid", w.pid}},
                       restartCount_);
    const std::string line = startLine(attemptDir);
    if (!announcedStart_) DDPRUN_NOTICE(line);
    else DDPRUN_INFO(line);
    announcedStart_ = true;
  }

  std::string startLine(const std::string& attemptDir) const {
    std::string ranks = nproc_ == 1 ? "rank " + std::to_string(round_.baseRank)
                                    : "ranks " + std::to_string(round_.baseRank) + "-" +
                                          std::to_string(round_.baseRank + nproc_ - 1);
    std::string node = round_.groupWorldSize > 1
                           ? " on node " + std::to_string(round_.groupRank) + " of " +
                                 std::to_string(round_.groupWorldSize)
                           : "";
    // The backend, except for one node (nothing to say beyond the worker store).
    if (rdzv_->spansNodes()) node += "; rendezvous " + rdzv_->describe();
    return "started " + std::to_string(nproc_) + (nproc_ == 1 ? " worker (" : " workers (") +
           ranks + " of " + std::to_string(round_.worldSize) + ")" + node + "; worker store at " +
           net::formatHostPort(round_.workerStoreHost, round_.workerStorePort) + "; logs in " +
           (restartCount_ == 0 ? reporter_->runDir() : attemptDir) + pythonNote("; python ");
  }

  // `lead` + the Python workers' interpreter and its source; "" for others.
  std::string pythonNote(const std::string& lead) const {
    const Interpreter* py = group_ ? group_->pythonInterpreter() : nullptr;
    return py ? lead + py->describe() : "";
  }

  // ------------------------------------------------------------ running
  void onExit(int pid, int status) {
    const WorkerRecord* w = group_ ? group_->onExit(pid, status) : nullptr;
    if (w == nullptr) return;
    readProgress(*w, ProgressWatch::Clock::now());  // its last word, for the status
    progress_.exited(w->localRank);
    status_->workerExited(w->exitCode);
    publishStatus();
    reporter_->event("exit",
                     {{"local_rank", w->localRank}, {"rank", w->globalRank}, {"pid", w->pid},
                      {"exit_code", w->exitCode}, {"duration_s", w->seconds}},
                     restartCount_);
    if (w->exitCode != 0) recordFailure(*w);
    if (state_ != State::kRunning) return;  // stopping: the group says when all are gone
    if (w->exitCode != 0) {
      failureWhy_ = "rank " + std::to_string(w->globalRank) + " (local_rank " +
                    std::to_string(w->localRank) + ", pid " + std::to_string(w->pid) +
                    ") exited with " + describeExit(w->exitCode);
      const bool last = restartsLeft() <= 0;
      rdzv_->reportFailure(round_.round, failureWhy_, /*closeJob=*/last);
      beginStop(SIGTERM, StopCause::kOwnFailure);
    } else if (group_->running() == 0) {
      state_ = State::kSucceeded;
      reporter_->event("succeeded", {}, restartCount_);
      rdzv_->reportSuccess(round_.round);
      publishStatus();
      if (roundFinished_) finish(kExitSuccess);
    }
  }

  void recordFailure(const WorkerRecord& w) {
    WorkerFailure f;
    f.globalRank = w.globalRank;
    f.localRank = w.localRank;
    f.pid = w.pid;
    f.exitCode = w.exitCode;
    f.time = std::time(nullptr);
    f.victim = w.stoppedByAgent;
    readErrorFile(w.errorFile, f);
    if (stalled_ && stalled_->pid == w.pid) {
      // Stopped by us, but for what it did not do: the root cause.
      f.victim = false;
      const std::string said = !f.traceback.empty() ? f.traceback : f.message;
      f.traceback = stalled_->text + (said.empty() ? "" : "\n" + said);
    }
    f.stderrTail = reporter_->stderrTail(w.localRank);
    f.tailHasStdout = reporter_->tailHasStdout(w.localRank);
    failures_.push_back(std::move(f));
  }

  // ------------------------------------------------------------ progress
  // The workers' progress files are read on a timer while they run, when
  // someone looks (--status-port) or --progress-timeout watches for hangs.
  bool watchesProgress() const {
    return cfg_.progressTimeout || (status_ && status_->enabled());
  }

  // Once a second; with --progress-timeout, a quarter of it (0.1 s to 1 s),
  // so that a stall is noticed within about a quarter of the timeout.
  std::chrono::milliseconds progressInterval() const {
    using std::chrono::milliseconds;
    if (!cfg_.progressTimeout) return milliseconds(1000);
    return std::clamp(*cfg_.progressTimeout / 4, milliseconds(100), milliseconds(1000));
  }

  void armProgressTimer() {
    if (!watchesProgress()) return;
    progressTimer_.expires_after(progressInterval());
    // A completion queued before a re-arm still runs: the generation tells.
    progressTimer_.async_wait(
        [this, gen = ++progressGeneration_](boost::system::error_code ec) {
          if (ec || gen != progressGeneration_ || state_ != State::kRunning) return;
          onProgressTick();
        });
  }

  void onProgressTick() {
    const auto now = ProgressWatch::Clock::now();
    for (const auto& w : group_->workers())
      if (w.running) readProgress(w, now);
    if (auto stall = progress_.stalled(now)) {
      onStall(*stall);
      return;
    }
    publishStatus();
    armProgressTimer();
  }

  // One worker's file into the watch. A file that is there but wrong is
  // ignored, with one warning per worker and attempt.
  void readProgress(const WorkerRecord& w, ProgressWatch::Clock::time_point now) {
    if (!watchesProgress()) return;
    std::string why;
    if (auto report = readProgressFile(w.progressFile, &why)) {
      progress_.observe(w.localRank, *report, now);
    } else if (!why.empty() && badProgressFiles_.insert(w.localRank).second) {
      DDPRUN_WARN("ignoring the progress file of worker local_rank ", w.localRank,
                  " (pid ", w.pid, "): ", why, " (", w.progressFile, ")");
    }
  }

  // --progress-timeout: a rank that reported and then went silent fails the
  // group like a worker failure (restart if restarts are left, else the
  // report names it). It gets SIGCONT after the SIGTERM, so that one held
  // by SIGSTOP (a debugger, job control) ends too.
  void onStall(const ProgressWatch::Stall& st) {
    const WorkerRecord* w = nullptr;
    for (const auto& r : group_->workers())
      if (r.running && r.localRank == st.localRank) w = &r;
    if (w == nullptr) return;  // cannot be: only running ranks are watched
    const int pid = w->pid;
    const double silent = std::chrono::duration<double>(st.silent).count();
    const double timeout = std::chrono::duration<double>(*cfg_.progressTimeout).count();
    failureWhy_ = "rank " + std::to_string(w->globalRank) + " (local_rank " +
                  std::to_string(w->localRank) + ", pid " + std::to_string(pid) +
                  ") made no progress for " + secondsText(silent) + " (last step " +
                  std::to_string(st.lastStep) + ")";
    char limit[48];
    std::snprintf(limit, sizeof limit, "%g s", timeout);
    stalled_ = StalledRank{
        pid, failureWhy_ + "; ddprun stopped it (--progress-timeout " + limit + ")"};
    DDPRUN_ERROR(failureWhy_, " (--progress-timeout ", limit, "); stopping the workers");
    reporter_->event("stalled",
                     {{"local_rank", w->localRank},
                      {"rank", w->globalRank},
                      {"pid", pid},
                      {"last_step", st.lastStep},
                      {"silent_s", silent}},
                     restartCount_);
    rdzv_->reportFailure(round_.round, failureWhy_, /*closeJob=*/restartsLeft() <= 0);
    beginStop(SIGTERM, StopCause::kOwnFailure);
    parts_.launcher->signalGroup(pid, SIGCONT);
  }

  void onRoundEvent(const RoundEvent& ev) {
    if (state_ == State::kDone || ev.round != round_.round) return;  // stale
    if (state_ == State::kIdle || state_ == State::kJoining) return;
    roundEndSeen_ = true;
    if (ev.kind == RoundEnd::kFinished) {
      // Running still: the round's end says every node succeeded, so ours
      // will too; exit when they have (onExit), never wait for another event.
      if (state_ == State::kSucceeded) {
        finish(kExitSuccess);
      } else {
        roundFinished_ = true;
      }
      return;
    }
    // A failure naming this node is ours only if this node reported one
    // (another program may have written it): otherwise it is a peer's.
    const bool ours = ev.node == round_.groupRank &&
                      stopCause_ == StopCause::kOwnFailure &&
                      (ev.kind == RoundEnd::kFailed || ev.kind == RoundEnd::kClosed);
    if (ours) {  // we reported it and are already stopping
      // Reported as a failure, ended as closed: the rendezvous cannot
      // restart the job (its state was lost or tampered with). Over.
      if (ev.kind == RoundEnd::kClosed) ownEndClosed_ = true;
      if (awaitingRoundEnd_) afterStopped();
      return;
    }
    if (ev.kind == RoundEnd::kStoreLost && state_ == State::kSucceeded) {
      // Our workers are done; the store's host left after the round ended.
      finish(kExitSuccess);
      return;
    }
    if (state_ == State::kStopping) {
      if (stopCause_ != StopCause::kSignal) peer_ = ev;  // the round ended elsewhere too
      if (awaitingRoundEnd_) afterStopped();
      return;
    }
    peer_ = ev;
    // Nodes arriving or leaving is the elastic job's normal life, not a fault.
    if (ev.kind == RoundEnd::kMembershipChanged)
      DDPRUN_NOTICE(describePeer(ev),
                    "; stopping this node's workers to re-form the group");
    else
      DDPRUN_WARN(describePeer(ev), "; stopping this node's workers");
    beginStop(SIGTERM, StopCause::kPeer);
  }

  std::string describePeer(const RoundEvent& ev) const {
    switch (ev.kind) {
      case RoundEnd::kFailed:
      case RoundEnd::kClosed:
        if (ev.node < 0)  // no node's workers: the rendezvous closed it
          return "the job was closed" + (ev.reason.empty() ? "" : " (" + ev.reason + ")");
        return "the job failed on node " + std::to_string(ev.node) +
               (ev.reason.empty() ? "" : " (" + ev.reason + ")");
      case RoundEnd::kMembershipChanged:
        return "the set of nodes changed" + (ev.reason.empty() ? "" : " (" + ev.reason + ")");
      case RoundEnd::kStoreLost:  // the backends' reasons name the store and its address
        return ev.reason.empty() ? "the rendezvous store is gone" : ev.reason;
      case RoundEnd::kFinished: break;
    }
    return "the round ended";
  }

  // ------------------------------------------------------------ stopping
  void beginStop(int sig, StopCause cause) {
    // Set before stop(): stop() first collects exits that already happened,
    // and those must see that we are stopping (no second failure report).
    state_ = State::kStopping;
    if (stopCause_ != StopCause::kSignal) stopCause_ = cause;
    group_->stop(sig, [this] { afterStopped(); }, killsAfter(cause));
    publishStatus();
  }

  // Whether the workers get SIGKILL once the shutdown timeout passes.
  bool killsAfter(StopCause cause) const {
    return cause != StopCause::kSignal || cfg_.killAfterSignal;
  }

  int restartsLeft() const { return cfg_.maxRestarts - restartCount_; }

  void afterStopped() {
    if (state_ != State::kStopping) return;
    awaitingRoundEnd_ = false;
    if (stopCause_ == StopCause::kSignal) {
      finish(128 + signal_);
      return;
    }
    // Our failure may have followed a peer node's death (its workers' loss
    // broke ours): the rendezvous then ends the round as a membership
    // change, and what the failure costs is known only from that event.
    if (stopCause_ == StopCause::kOwnFailure && !roundEndSeen_ &&
        rdzv_->absorbsFailuresOfLostPeers()) {
      awaitingRoundEnd_ = true;
      return;
    }
    const bool membership = peer_ && peer_->kind == RoundEnd::kMembershipChanged &&
                            (stopCause_ == StopCause::kPeer ||
                             stopCause_ == StopCause::kOwnFailure);
    // The job is over when another node closed it (or its store is gone),
    // or when our own failure used up the budget.
    const bool closed = (peer_ && (peer_->kind == RoundEnd::kClosed ||
                                   peer_->kind == RoundEnd::kStoreLost)) ||
                        (stopCause_ == StopCause::kOwnFailure &&
                         (restartsLeft() <= 0 || ownEndClosed_));
    if (membership || (!closed && restartsLeft() > 0)) {
      restart(membership);
      return;
    }
    report();
    finish(kExitWorkersFailed);
  }

  // Next round: a failure costs one restart; a membership change costs none.
  void restart(bool membership) {
    std::string why = membership && peer_                  ? describePeer(*peer_)
                      : stopCause_ == StopCause::kOwnFailure ? failureWhy_
                      : peer_                                ? describePeer(*peer_)
                                                             : "";
    if (membership && stopCause_ == StopCause::kOwnFailure)
      why += "; this node's workers failed with it (" + failureWhy_ + ")";
    status_->restarted();
    if (!membership) {
      ++restartCount_;
      DDPRUN_WARN("worker group failed (", why, "); restart ", restartCount_, " of ",
                  cfg_.maxRestarts);
    } else {
      DDPRUN_NOTICE(why, "; restarting the workers (not counted as a restart)");
    }
    reporter_->event("restart",
                     {{"restart_count", restartCount_}, {"restarts_left", restartsLeft()},
                      {"counted", !membership}, {"reason", why}},
                     restartCount_);
    clearAttempt();
    join();
  }

  // Releases everything the finished attempt held (a crash storm must not
  // grow memory).
  void clearAttempt() {
    group_->clear();
    reporter_->endAttempt();
    failures_.clear();
    failures_.shrink_to_fit();
    peer_.reset();
    roundFinished_ = false;
    roundEndSeen_ = false;
    awaitingRoundEnd_ = false;
    failureWhy_.clear();
    stopCause_ = StopCause::kNone;
    stalled_.reset();
    badProgressFiles_.clear();
    progress_.reset();
  }

  // The final report. A local failure that was not caused by us is the root
  // cause; when every local worker was only stopped because another node
  // failed, that node is named instead of a local victim.
  void report() {
    const bool ownCulprit = std::any_of(failures_.begin(), failures_.end(),
                                        [](const WorkerFailure& f) { return !f.victim; });
    std::string text;
    if (!ownCulprit && peer_) {
      // A lost store has no node to point at.
      const bool byNode = peer_->kind != RoundEnd::kStoreLost;
      text = "ddprun: " + describePeer(*peer_) + "; this node's workers were stopped" +
             (byNode ? " (see that node's report for the root cause)\n" : "\n");
    } else if (!failures_.empty()) {
      text = formatFailureSummary(cfg_.script, host_, failures_, pythonNote("interpreter: "));
    }
    if (!text.empty()) reporter_->failureReport(text);
    auto own = parts_.environment.find("TORCHELASTIC_ERROR_FILE");
    if (ownCulprit && own != parts_.environment.end() && !own->second.empty())
      copyRootErrorFile(failures_, own->second);
    nlohmann::json fields = {{"reason", ownCulprit ? failureWhy_
                                        : peer_    ? describePeer(*peer_)
                                                   : std::string()}};
    if (const std::string py = pythonNote(""); !py.empty()) fields["interpreter"] = py;
    reporter_->event("failed", std::move(fields), restartCount_);
  }

  // ------------------------------------------------------------ signals
  void waitSignal() {
    if (!parts_.handleSignals) return;
    sigs_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      onSignal(sig);
      if (state_ != State::kDone) waitSignal();
    });
  }

  void onSignal(int sig) {
    if (state_ == State::kDone) return;
    if (std::find(cfg_.survivedSignals.begin(), cfg_.survivedSignals.end(), sig) !=
        cfg_.survivedSignals.end()) {
      DDPRUN_NOTICE("received ", signalName(sig),
                    "; the sender signalled every process of the job, the workers too; "
                    "going on");
      if (reporter_)
        reporter_->event("signal", {{"signal", signalName(sig)}, {"survived", true}},
                         restartCount_);
      return;
    }
    signal_ = sig;
    if (reporter_) reporter_->event("signal", {{"signal", signalName(sig)}}, restartCount_);
    switch (state_) {
      case State::kIdle:
      case State::kJoining:
        DDPRUN_WARN("received ", signalName(sig), " while joining the rendezvous; exiting");
        if (rdzv_) rdzv_->cancel();
        finish(128 + sig);
        return;
      case State::kRunning:
      case State::kSucceeded:
        DDPRUN_WARN("received ", signalName(sig), "; forwarding it to the workers");
        reportSignalToPeers(sig);
        if (state_ == State::kSucceeded) {
          finish(128 + sig);
          return;
        }
        beginStop(sig, StopCause::kSignal);
        return;
      case State::kStopping:
        DDPRUN_WARN("received ", signalName(sig), "; forwarding it to the workers");
        stopCause_ = StopCause::kSignal;
        group_->stop(sig, [this] { afterStopped(); }, killsAfter(StopCause::kSignal));
        return;
      case State::kDone: return;
    }
  }

  // A signalled node leaves the job; whether the others go on without it is
  // the rendezvous's to decide. The elastic rendezvous re-forms the group
  // without this node (its shutdown() leaves rather than closes), so nothing
  // is reported: a closing report would end the job for everybody. A static
  // job cannot go on with a node missing, so the others are told at once
  // (the job is closed) instead of waiting for a node that will not return.
  void reportSignalToPeers(int sig) {
    if (!rdzv_->closesJobOnSignal()) return;
    rdzv_->reportFailure(
        round_.round,
        "node " + std::to_string(round_.groupRank) + " received " + signalName(sig),
        /*closeJob=*/true);
  }

  // ------------------------------------------------------------ the end
  void finish(int code) {
    if (state_ == State::kDone) return;
    state_ = State::kDone;
    exitCode_ = code;
    if (code == kExitSuccess && cfg_.printCompletion) DDPRUN_NOTICE("job completed successfully");
    if (rdzv_) rdzv_->shutdown();
    if (group_ && group_->running() > 0) {
      // Only on paths that never started a stop (setup errors): nothing may
      // outlive the agent.
      parts_.launcher->pollExits();
      for (const auto& w : group_->workers())
        if (w.running) parts_.launcher->signalGroup(w.pid, SIGKILL);
    }
    if (reporter_) {
      reporter_->flushAll();
      reporter_->event("end", {{"exit_code", code}}, restartCount_);
    }
    parts_.launcher->stopWatching();
    ++progressGeneration_;
    publishStatus();
    boost::system::error_code ec;
    sigs_.cancel(ec);
    io_.stop();
  }

  LaunchConfig cfg_;
  asio::io_context io_;
  // After io_: the launcher's exit watch is an I/O object of io_ and must be
  // destroyed before it.
  AgentParts parts_;
  asio::signal_set sigs_;
  std::unique_ptr<Reporter> reporter_;
  std::unique_ptr<WorkerGroup> group_;
  std::unique_ptr<rendezvous::Rendezvous> rdzv_;
  std::unique_ptr<StatusFeed> status_;  // the --status-port endpoint's feed
  // The workers' progress files (--status-port, --progress-timeout).
  asio::steady_timer progressTimer_;
  unsigned progressGeneration_ = 0;
  ProgressWatch progress_;
  std::set<int> badProgressFiles_;  // local ranks warned about this attempt
  struct StalledRank {
    int pid = 0;
    std::string text;  // for the failure report
  };
  std::optional<StalledRank> stalled_;  // the rank --progress-timeout stopped
  std::string host_ = net::hostName();
  int nproc_ = 1;
  State state_ = State::kIdle;
  StopCause stopCause_ = StopCause::kNone;
  RoundInfo round_;
  std::optional<rendezvous::JoinProgress> joinProgress_;  // the pending join's latest word
  std::optional<RoundEvent> peer_;  // how the round ended elsewhere
  bool roundFinished_ = false;      // the round's end said finished while ours ran
  bool roundEndSeen_ = false;       // an event of the running round arrived
  bool awaitingRoundEnd_ = false;   // stopped after our failure; the event decides
  std::string failureWhy_;         // our own first failure of the attempt
  std::vector<WorkerFailure> failures_;
  std::chrono::steady_clock::time_point joinStarted_;
  int restartCount_ = 0;
  int signal_ = 0;
  int exitCode_ = 0;
  bool announcedStart_ = false;  // workers of this job ran here (onJoinFailed)
  bool ownEndClosed_ = false;    // this node's failure ended its round as kClosed
};

Agent::Agent(LaunchConfig cfg, AgentParts parts)
    : impl_(std::make_unique<Impl>(std::move(cfg), std::move(parts))) {}
Agent::~Agent() = default;
int Agent::run() { return impl_->run(); }
void Agent::signal(int sig) { impl_->signal(sig); }

}  // namespace ddprun::agent
