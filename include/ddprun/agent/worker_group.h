// The local workers of one attempt: start them from the round's info (argv,
// torchrun's environment, log dirs, output channels), keep each worker's
// state, and stop them (a signal to each process group, SIGKILL after the
// grace period).
//
// Threading: one thread, the agent's (the io_context's).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

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
  double seconds = 0;           // run time, once !running
  std::string errorFile;        // TORCHELASTIC_ERROR_FILE of the worker
};

class WorkerGroup {
 public:
  // `agentEnv` is what every worker inherits; `python` the interpreter of
  // script workers (PYTHON_EXEC, else python3 on PATH).
  WorkerGroup(boost::asio::io_context& io, const LaunchConfig& cfg, Launcher& launcher,
              WorkerOutput& output, Env agentEnv, std::string python);

  // Starts `nproc` workers for the round, each in <attemptDir>/<local_rank>
  // (attemptDir is wiped first). On a spawn failure the workers already
  // started are killed and IoError is thrown (the message names the program).
  void start(const rendezvous::RoundInfo& round, int nproc, int restartCount,
             const std::string& runId, const std::string& attemptDir);

  // Records an exit reported by the launcher and copies the worker's
  // remaining output (WorkerOutput::closeWorker). Returns the worker, or nullptr
  // when `pid` is not a running worker of this attempt.
  const WorkerRecord* onExit(int pid, int status);

  // Sends `sig` to every running worker's process group, marking them
  // stoppedByAgent; SIGKILL after the shutdown timeout to those still
  // running. `onStopped` is posted once none runs (at once if none does).
  // A later stop() (e.g. a second signal) re-sends and keeps the first
  // callback.
  void stop(int sig, std::function<void()> onStopped);

  size_t running() const;
  const std::vector<WorkerRecord>& workers() const;
  // Forgets the attempt's records and channels (after it stopped).
  void clear();

 private:
  boost::asio::io_context& io_;
  const LaunchConfig& cfg_;
  Launcher& launcher_;
  WorkerOutput& output_;
  Env agentEnv_;
  std::string python_;
  std::vector<WorkerRecord> workers_;
  boost::asio::steady_timer killTimer_;
  std::function<void()> onStopped_;
};

}  // namespace ddprun::agent
