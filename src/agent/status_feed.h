// What the agent tells its status endpoint (--status-port, docs/status.md):
// the counters behind /metrics, and a Snapshot built from the agent's state
// and published on each state change. Without --status-port it does nothing.
//
// Threading: the agent's thread only; the server reads the published
// snapshots on a thread of its own (status::Publisher).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ddprun/agent/launch_config.h"
#include "ddprun/agent/worker_group.h"
#include "ddprun/rendezvous/rendezvous.h"
#include "ddprun/status/server.h"
#include "progress_watch.h"

namespace ddprun::agent {

class StatusFeed {
 public:
  // Starts the endpoint when cfg.statusPort is set. Throws Error (cannot
  // listen; the message names --status-addr/--status-port and why). `nproc`
  // (the resolved --nproc-per-node) sizes the descriptors the endpoint
  // leaves the agent (docs/status.md).
  StatusFeed(const LaunchConfig& cfg, std::string node, int nproc);
  StatusFeed(const StatusFeed&) = delete;
  StatusFeed& operator=(const StatusFeed&) = delete;

  bool enabled() const { return server_ != nullptr; }
  std::string url() const;  // "http://127.0.0.1:PORT"; "" when disabled

  void roundJoined(double seconds);  // a join completed after `seconds`
  void workerExited(int exitCode);   // WorkerRecord::exitCode
  void restarted();

  // The agent's state as the snapshot shows it.
  struct View {
    const char* state = "";
    const rendezvous::RoundInfo* round = nullptr;  // the last joined one
    int attempt = 0;
    int restartsLeft = 0;
    const std::vector<WorkerRecord>* workers = nullptr;
    std::string backend;
    uint64_t heartbeatsMissed = 0;
    // The workers' progress reports (null: none), read at `now`.
    const ProgressWatch* progress = nullptr;
    ProgressWatch::Clock::time_point now{};
    // Where a pending join stands (null: not joining, or nothing said yet).
    const rendezvous::JoinProgress* join = nullptr;
  };
  void publish(const View& view);

 private:
  const LaunchConfig& cfg_;
  std::shared_ptr<status::Publisher> publisher_ = std::make_shared<status::Publisher>();
  std::unique_ptr<status::StatusServer> server_;
  status::Snapshot counters_;  // node, run id and the metrics; the rest per publish
  bool joined_ = false;
};

}  // namespace ddprun::agent
