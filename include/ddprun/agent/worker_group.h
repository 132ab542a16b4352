// The local workers of one attempt: start them from the round's info (argv,
// torchrun's environment, log dirs, output channels), keep each worker's
// state, and stop them (a signal to each process group, SIGKILL after the
// grace period).
//
// Threading: one thread, the agent's (the io_context's). Not copyable.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "ddprun/agent/interpreter.h"
#include "ddprun/agent/launch_config.h"
#include "ddprun/agent/launcher.h"
#include "ddprun/agent/reporter.h"
#include "ddprun/agent/worker_spec.h"
#include "ddprun/rendezvous/rendezvous.h"

namespace ddprun::agent {

struct WorkerRecord {
  int localRank = 0;
  int globalRank = 0;
  int pid = -1;
  bool running = false;
  bool stoppedByAgent = false;  // it was running when stop() signalled it
  int exitCode = 0;             // once !running: >0 exit status, <0 -signal
  std::chrono::steady_clock::time_point started;
  std::chrono::system_clock::time_point startedWall;  // for the status endpoint
  double seconds = 0;     // run time, once !running
  std::string errorFile;  // TORCHELASTIC_ERROR_FILE of the worker
  std::string progressFile;  // DDPRUN_PROGRESS_FILE of the worker
};

class WorkerGroup {
 public:
  // `agentEnv` is what every worker inherits; `python` the interpreter of
  // script workers (chooseInterpreter's rule: PYTHON_EXEC, else the Python
  // environment ddprun is installed in, else python3 on PATH). `cfg` must
  // outlive the group. A direct program is located with
  // ProgramSearch::fromProcess() and the PATH of `agentEnv`.
  WorkerGroup(boost::asio::io_context& io, const LaunchConfig& cfg, Launcher& launcher,
              WorkerOutput& output, Env agentEnv, Interpreter python);
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Starts `nproc` workers for the round, each in <attemptDir>/<local_rank>
  // (attemptDir is wiped first). Precondition: no worker of an earlier
  // attempt runs (call clear() after it stopped). On a failure (no such
  // program, spawn, output channel or directory) the workers already started
  // get SIGKILL (their exits still arrive through onExit) and IoError is
  // thrown; its message() names the program and how to fix it.
  void start(const rendezvous::RoundInfo& round, int nproc, int restartCount,
             const std::string& runId, const std::string& attemptDir);

  // Records an exit reported by the launcher and copies the worker's
  // remaining output (WorkerOutput::closeWorker). Returns the worker, or nullptr
  // when `pid` is not a running worker of this attempt.
  const WorkerRecord* onExit(int pid, int status);

  // First reaps what has exited already (Launcher::pollExits, so that a
  // worker that failed by itself is recorded as such, never as a victim),
  // then sends `sig` to every running worker's process group, marking them
  // stoppedByAgent; SIGKILL after the shutdown timeout to those still
  // running. `onStopped` is posted once none runs (at once if none does).
  // A later stop() (e.g. a second signal) re-sends and keeps the first
  // callback and the first deadline. `killAfterTimeout` false: no SIGKILL
  // from here (the one who sent `sig` enforces its own grace period).
  void stop(int sig, std::function<void()> onStopped, bool killAfterTimeout = true);

  size_t running() const;
  const std::vector<WorkerRecord>& workers() const;
  // The interpreter of the workers started last when they are Python
  // workers (a script, -m, --run-path); nullptr for a direct program or
  // before the first start().
  const Interpreter* pythonInterpreter() const;
  // Forgets the attempt's records and releases their memory (after it
  // stopped); a pending stop callback is dropped.
  void clear();

 private:
  void startOne(const AttemptInfo& attempt, int localRank, const std::string& attemptDir);
  void killStarted();
  void finishStopIfDone();
  void cancelKillTimer();
  WorkerRecord* find(int pid);

  boost::asio::io_context& io_;
  const LaunchConfig& cfg_;
  Launcher& launcher_;
  WorkerOutput& output_;
  Env agentEnv_;
  Interpreter python_;
  bool pythonWorkers_ = false;
  ProgramSearch search_;
  std::vector<WorkerRecord> workers_;
  boost::asio::steady_timer killTimer_;
  bool killTimerArmed_ = false;
  unsigned timerGeneration_ = 0;
  std::function<void()> onStopped_;
  bool polling_ = false;  // inside stop()'s pollExits (whose handlers may call stop())
};

}  // namespace ddprun::agent
