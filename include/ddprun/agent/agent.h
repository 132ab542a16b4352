// The per-node agent: a state machine over three parts it does not implement
// itself: a Rendezvous (join a round, report, round events), a WorkerGroup
// (start, watch, stop the local workers) and a Reporter (output, events,
// failure report).
//
// States and transitions (every event arrives on the agent's one thread):
//   kJoining  --joined-->           kRunning   (workers started)
//   kJoining  --join failed-->      kDone(3)
//   kJoining  --job already over--> kDone(0)   (ClosedError: a late node, or
//                                   one re-joining after the job finished)
//                                 | kDone(1)   (re-joining: the job failed)
//   kRunning  --a worker failed-->  kStopping  (report failure; stop the rest)
//   kRunning  --a rank stalled-->   kStopping  (--progress-timeout: a rank that
//                                   reported progress went silent; as a failure)
//   kRunning  --all succeeded-->    kSucceeded (report success; wait for peers)
//   kRunning  --round failed/closed/membership elsewhere--> kStopping
//   kSucceeded --round finished-->  kDone(0)
//   kStopping --all stopped-->      kJoining (restart: failure with budget
//                                   left, or membership change) | kDone(1)
//   any       --signal S-->         kStopping(S) --all stopped--> kDone(128+S)
//   kJoining  --signal S-->         kDone(128+S) at once (the join is cancelled)
// The restart count is the rendezvous's job-wide one when it keeps one
// (RoundInfo.restartCount), else this node's. A membership change restarts
// without counting. On a signal the node leaves: with the elastic
// (dynamic) rendezvous nothing is reported and shutdown() leaves, so the
// other nodes re-form without it; with the static one the job is closed for
// every node (it cannot go on with a node missing).
// Not reusable: one Agent runs one job.
#pragma once

#include <functional>
#include <memory>

#include "ddprun/agent/launch_config.h"
#include "ddprun/agent/launcher.h"
#include "ddprun/agent/worker_spec.h"
#include "ddprun/rendezvous/rendezvous.h"

namespace ddprun::agent {

// Documented exit codes of `ddprun`.
constexpr int kExitSuccess = 0;
constexpr int kExitWorkersFailed = 1;  // restarts used up; the report says who
constexpr int kExitUsage = 2;          // bad flags or unsupported mode
constexpr int kExitSetup = 3;          // cannot listen, cannot create log dir, ...
// A forwarded signal S ends the agent with 128 + S. DDPRUN_EXIT_CODES=torchrun
// maps these onto torchrun's at the very end (cli/exit_codes.h).

// What the agent is built from; tests pass fakes.
struct AgentParts {
  std::unique_ptr<Launcher> launcher;
  // Builds the rendezvous (its results are posted to the agent's thread
  // through `post`). Null: rendezvous::makeRendezvous(rendezvousSpec(cfg)).
  std::function<std::unique_ptr<rendezvous::Rendezvous>(rendezvous::Rendezvous::Post post)>
      makeRendezvous;
  Env environment;     // the agent's environment, inherited by workers
  int consoleOut = 1;  // where worker output goes (tests pass pipes)
  int consoleErr = 2;
  bool handleSignals = true;  // false in unit tests: deliver them with Agent::signal
};

class Agent {
 public:
  // `cfg` must have passed finalizeConfig().
  Agent(LaunchConfig cfg, AgentParts parts);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;
  // Runs the job to the end; returns the exit code.
  int run();
  // Delivers a signal as if the process had received it (thread-safe).
  void signal(int sig);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::agent
