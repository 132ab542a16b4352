// The per-node agent: rendezvous, start the local workers, watch them, stop
// and restart the group on failure, forward signals, write logs and the
// failure report.
//
// Event-driven: worker exits arrive from the Launcher (SIGCHLD for the real
// one) and output as pipe reads, all
// on one Asio io_context thread (the thread that calls run()). Not reusable:
// one Agent runs one job.
#pragma once

#include <memory>

#include "ddprun/agent/launch_config.h"
#include "ddprun/agent/launcher.h"

namespace ddprun::agent {

// Documented exit codes of `ddprun`.
constexpr int kExitSuccess = 0;
constexpr int kExitWorkersFailed = 1;  // restarts used up; the report says who
constexpr int kExitUsage = 2;          // bad flags or unsupported mode
constexpr int kExitSetup = 3;          // cannot listen, cannot create log dir, ...
// A forwarded signal S ends the agent with 128 + S.

class Agent {
 public:
  Agent(LaunchConfig cfg, std::unique_ptr<Launcher> launcher);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;
  // Runs the job to the end; returns the exit code.
  int run();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::agent
