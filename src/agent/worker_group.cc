// <utility> first: Boost 1.74's Asio under C++20 with g++ 12.
#include <utility>

#include "ddprun/agent/worker_group.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <filesystem>
#include <system_error>

#include "ddprun/common/error.h"
#include "ddprun/common/log.h"

namespace ddprun::agent {

namespace fs = std::filesystem;

namespace {
const char* const kInterpreterHint =
    "set PYTHON_EXEC to the Python interpreter (e.g. PYTHON_EXEC=/usr/bin/python3), "
    "or activate the virtual environment that has it";
const char* const kProgramHint = "give the path of an existing executable";

void closeFds(const WorkerFds& fds) {
  if (fds.stdoutFd >= 0) ::close(fds.stdoutFd);
  if (fds.stderrFd >= 0 && fds.stderrFd != fds.stdoutFd) ::close(fds.stderrFd);
}
}  // namespace

WorkerGroup::WorkerGroup(boost::asio::io_context& io, const LaunchConfig& cfg,
                         Launcher& launcher, WorkerOutput& output, Env agentEnv,
                         Interpreter python)
    : io_(io),
      cfg_(cfg),
      launcher_(launcher),
      output_(output),
      agentEnv_(std::move(agentEnv)),
      python_(std::move(python)),
      search_(ProgramSearch::fromProcess()),
      killTimer_(io) {
  auto path = agentEnv_.find("PATH");
  if (path != agentEnv_.end()) search_.path = path->second;
}

void WorkerGroup::start(const rendezvous::RoundInfo& round, int nproc, int restartCount,
                        const std::string& runId, const std::string& attemptDir) {
  DDPRUN_CHECK(running() == 0, "workers of the previous attempt still run");
  clear();
  // Records stay put from here on: onExit returns pointers to them.
  workers_.reserve(static_cast<size_t>(nproc));
  AttemptInfo attempt{round, runId, restartCount, nproc};
  try {
    std::error_code ec;
    fs::remove_all(attemptDir, ec);  // torchrun wipes a reused attempt directory too
    for (int lr = 0; lr < nproc; ++lr) startOne(attempt, lr, attemptDir);
  } catch (const IoError&) {
    killStarted();
    throw;
  } catch (const Error& e) {
    killStarted();
    DDPRUN_THROW(IoError, e.message());
  } catch (const std::exception& e) {
    killStarted();
    DDPRUN_THROW(IoError, "cannot start the workers: ", e.what());
  }
}

void WorkerGroup::startOne(const AttemptInfo& attempt, int localRank,
                           const std::string& attemptDir) {
  WorkerCommand cmd = workerCommand(cfg_, localRank, python_.command, search_);
  pythonWorkers_ = cmd.interpreter;
  fs::path dir = fs::path(attemptDir) / std::to_string(localRank);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    DDPRUN_THROW(IoError, "cannot create the worker directory ", dir.string(), ": ",
                 ec.message(), "; pass a writable --log-dir");
  WorkerRecord rec;
  rec.localRank = localRank;
  rec.globalRank = attempt.round.baseRank + localRank;
  rec.errorFile = (dir / "error.json").string();
  rec.progressFile = (dir / "progress.json").string();
  ProcessSpec spec;
  spec.argv = std::move(cmd.argv);
  spec.exe = std::move(cmd.exe);
  spec.env = workerEnv(cfg_, attempt, localRank, rec.errorFile, agentEnv_, rec.progressFile);
  spec.notFoundHint = cmd.interpreter ? kInterpreterHint : kProgramHint;
  WorkerFds fds = output_.openWorker(localRank, rec.globalRank, dir.string());
  spec.stdoutFd = fds.stdoutFd;
  spec.stderrFd = fds.stderrFd;
  try {
    rec.pid = launcher_.start(spec);
  } catch (...) {
    closeFds(fds);
    output_.closeWorker(localRank);
    throw;
  }
  closeFds(fds);  // the worker has its own copies
  rec.running = true;
  rec.started = std::chrono::steady_clock::now();
  rec.startedWall = std::chrono::system_clock::now();
  workers_.push_back(std::move(rec));
  DDPRUN_DEBUG("started worker local_rank ", localRank, " (rank ",
               workers_.back().globalRank, ", pid ", workers_.back().pid, ")");
}

// After a failed start: the workers already running go at once; their exits
// still come through onExit, like any other.
void WorkerGroup::killStarted() {
  for (auto& w : workers_)
    if (w.running) {
      w.stoppedByAgent = true;
      launcher_.signalGroup(w.pid, SIGKILL);
    }
}

WorkerRecord* WorkerGroup::find(int pid) {
  for (auto& w : workers_)
    if (w.running && w.pid == pid) return &w;
  return nullptr;
}

const WorkerRecord* WorkerGroup::onExit(int pid, int status) {
  WorkerRecord* w = find(pid);
  if (w == nullptr) return nullptr;
  w->running = false;
  w->exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  w->seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - w->started)
          .count();
  output_.closeWorker(w->localRank);
  finishStopIfDone();
  return w;
}

void WorkerGroup::stop(int sig, std::function<void()> onStopped, bool killAfterTimeout) {
  if (!onStopped_) onStopped_ = std::move(onStopped);
  // Exits that happened already are recorded first, as the workers' own.
  // An exit handler may call stop() again: that nested call only keeps its
  // callback; this one does the signalling.
  if (polling_) return;
  polling_ = true;
  try {
    launcher_.pollExits();
  } catch (...) {
    polling_ = false;
    throw;
  }
  polling_ = false;
  for (auto& w : workers_)
    if (w.running) {
      DDPRUN_INFO("sending ", signalName(sig), " to worker local_rank ", w.localRank,
                  " (process group ", w.pid, ")");
      w.stoppedByAgent = true;
      launcher_.signalGroup(w.pid, sig);
    }
  if (running() > 0 && !killTimerArmed_ && killAfterTimeout) {
    killTimerArmed_ = true;
    killTimer_.expires_after(cfg_.shutdownTimeout);
    // A completion already queued when the timer is cancelled still runs
    // with success: the generation tells it that its stop is over.
    killTimer_.async_wait([this, gen = timerGeneration_](boost::system::error_code ec) {
      if (ec || gen != timerGeneration_) return;
      killTimerArmed_ = false;
      for (auto& w : workers_)
        if (w.running) {
          DDPRUN_WARN("worker local_rank ", w.localRank, " (pid ", w.pid,
                      ") did not exit within ", cfg_.shutdownTimeout.count(),
                      " s; sending SIGKILL");
          launcher_.signalGroup(w.pid, SIGKILL);
        }
    });
  }
  finishStopIfDone();
}

void WorkerGroup::finishStopIfDone() {
  if (!onStopped_ || running() > 0) return;
  cancelKillTimer();
  boost::asio::post(io_, std::exchange(onStopped_, nullptr));
}

size_t WorkerGroup::running() const {
  size_t n = 0;
  for (const auto& w : workers_) n += w.running ? 1 : 0;
  return n;
}

const std::vector<WorkerRecord>& WorkerGroup::workers() const { return workers_; }

const Interpreter* WorkerGroup::pythonInterpreter() const {
  return pythonWorkers_ ? &python_ : nullptr;
}

void WorkerGroup::clear() {
  std::vector<WorkerRecord>().swap(workers_);
  cancelKillTimer();
  onStopped_ = nullptr;
}

void WorkerGroup::cancelKillTimer() {
  if (!killTimerArmed_) return;
  killTimer_.cancel();
  killTimerArmed_ = false;
  ++timerGeneration_;
}

}  // namespace ddprun::agent
