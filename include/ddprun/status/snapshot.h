// What the agent's status endpoint shows (GET /status as JSON, GET /metrics
// in Prometheus text format): a plain value, built by the agent on each state
// change and rendered by pure functions, so that the rendering is testable
// without sockets.
//
// Threading: a value; the functions are pure and thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/common/progress_file.h"

namespace ddprun::status {

enum class WorkerState { kStarting, kRunning, kSucceeded, kFailed, kStopped };
const char* toString(WorkerState state);

// A worker's latest progress report (its DDPRUN_PROGRESS_FILE) as the agent
// read it.
struct WorkerProgress {
  ProgressReport report;
  double secondsSinceProgress = 0;  // since the agent saw the report change
};

struct WorkerStatus {
  int localRank = 0;
  int globalRank = 0;
  int pid = -1;
  WorkerState state = WorkerState::kStarting;
  std::string started;          // wall clock, ISO-8601 UTC ("2024-05-01T12:00:00.123Z")
  std::optional<int> exitCode;  // once exited: the exit status, or -S after signal S
  std::string signal;           // "SIGTERM" when a signal ended it, else ""
  std::optional<WorkerProgress> progress;  // none before its first report
};

// One node of the current round, as the rendezvous reports it.
struct RoundMember {
  int groupRank = 0;
  int localWorldSize = 0;
  int baseRank = 0;  // global rank of its local rank 0
};

// Where the agent's pending join stands (rendezvous::JoinProgress as the
// status shows it); present only while the agent is joining and its
// rendezvous has said so.
struct JoinWait {
  int round = -1;
  int joined = 0;
  int minNodes = 0;
  int maxNodes = 0;
  int missingCount = 0;
  std::vector<std::string> missing;       // the first few, "node <addr> (pid P)"
  double lastCallSeconds = -1;            // until the last call completes it; < 0: none
  double waitingSeconds = 0;
  std::string waitingFor;                 // "" or what else it waits for
  std::string text;                       // the log's one line
};

// A Prometheus histogram with fixed upper bounds (le), counts per bucket
// (not cumulative: toPrometheus accumulates them) plus the +Inf one.
struct Histogram {
  std::vector<double> bounds;   // ascending
  std::vector<uint64_t> counts; // bounds.size() + 1 (the last: above every bound)
  double sum = 0;
  uint64_t count = 0;

  explicit Histogram(std::vector<double> upperBounds = {});
  void observe(double value);
};

// The buckets of ddprun_rendezvous_round_duration_seconds.
std::vector<double> roundDurationBuckets();

struct Snapshot {
  // The agent.
  std::string runId;
  std::string node;         // this machine's host name
  std::string agentState;   // joining | running | succeeded | stopping | done
  int groupRank = -1;       // -1 before the first round
  int groupWorldSize = 0;
  int attempt = 0;          // restarts so far (TORCHELASTIC_RESTART_COUNT)
  int maxRestarts = 0;
  int restartsLeft = 0;
  // The current (last joined) round; round = -1 before the first one.
  int round = -1;
  int worldSize = 0;
  std::string backend;      // the rendezvous in one line ("" on one node)
  std::string workerStore;  // "host:port" of the round's worker store
  std::vector<RoundMember> members;
  std::optional<JoinWait> join;  // while joining
  std::vector<WorkerStatus> workers;
  // Seconds to the job's last step, from the slowest local rank's rate
  // (ranks that report total_steps); none when unknown.
  std::optional<double> etaSeconds;
  std::optional<double> progressTimeout;  // --progress-timeout in seconds; none: off
  std::string updated;      // when this snapshot was taken, ISO-8601 UTC
  // Metrics (counters since the agent started).
  uint64_t restartsTotal = 0;      // worker group restarts, any cause
  std::map<std::string, uint64_t> workerExits;  // by code: "0", "1", "SIGKILL"
  Histogram roundDurations{roundDurationBuckets()};  // join to joined, seconds
  uint64_t heartbeatsMissed = 0;   // this node's beats that did not reach the store
};

// ISO-8601 UTC with milliseconds: "2024-05-01T12:00:00.123Z".
std::string isoUtc(std::chrono::system_clock::time_point t);

// GET /status: every field of the snapshot but the metrics (see docs/status.md).
nlohmann::json toJson(const Snapshot& s);

// GET /metrics: text exposition format 0.0.4, every metric named ddprun_*
// with # HELP and # TYPE lines, label values escaped.
std::string toPrometheus(const Snapshot& s);

// A label value escaped as the text format wants it (\\, \", \n).
std::string escapeLabelValue(const std::string& value);

}  // namespace ddprun::status
