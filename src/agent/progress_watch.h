// What the agent knows of its workers' training progress (their progress
// files, common/progress_file.h) and the hang watchdog's decision
// (--progress-timeout): a pure value with no clock and no files, every
// method taking `now`, so that the rules are unit-tested under a fake clock.
//
// Staleness is measured on the agent's own steady clock, from when the agent
// saw a rank's report change (its step or its time), never from the worker's
// wall-clock `time`: a worker whose clock differs, jumps or lies cannot make
// a rank look stalled or alive. A rank that never reported is never stalled
// (its program may not report at all); a rank that exited is no longer
// watched (its last report is kept for the status); reset() starts a new
// attempt with nothing known.
//
// Not thread-safe: the agent's thread only.
#pragma once

#include <chrono>
#include <map>
#include <optional>

#include "ddprun/common/progress_file.h"

namespace ddprun::agent {

class ProgressWatch {
 public:
  using Clock = std::chrono::steady_clock;

  struct Rank {
    ProgressReport report;      // the latest one read
    Clock::time_point changed;  // when the agent saw (step, time) change
    ProgressReport first;       // the first of the attempt: the rate's base
    bool watched = true;        // false once the worker exited
  };

  struct Stall {
    int localRank = 0;
    int64_t lastStep = 0;
    Clock::duration silent{};  // since the agent saw its report change
  };

  // `timeout` unset: stalled() never says so (no --progress-timeout).
  explicit ProgressWatch(std::optional<Clock::duration> timeout = std::nullopt)
      : timeout_(timeout) {}

  // A new attempt: every rank forgotten.
  void reset() { ranks_.clear(); }

  // A report read from `localRank`'s file at `now`. True when it is news:
  // the first of the attempt, or a step or time that differs from the last
  // one (a step that went back, e.g. a worker restarting from a checkpoint
  // by itself, is news too and becomes the rate's new base).
  bool observe(int localRank, const ProgressReport& report, Clock::time_point now);

  // The worker exited: no longer watched for stalls.
  void exited(int localRank);

  // The rank's state; nullptr before its first report of the attempt.
  const Rank* rank(int localRank) const;

  // Seconds since `localRank`'s report last changed, as the agent saw it;
  // nullopt before its first report.
  std::optional<double> secondsSinceProgress(int localRank, Clock::time_point now) const;

  // The watched rank silent the longest, when that is at least the timeout
  // (ties: the lowest local rank); nullopt without a timeout or a stall.
  std::optional<Stall> stalled(Clock::time_point now) const;

  // Steps per second of one rank over the attempt, from its own reports
  // ((step - first step) / (time - first time): one clock, the worker's);
  // nullopt until two reports with more steps and a later time.
  static std::optional<double> stepsPerSecond(const Rank& rank);

  // Seconds until the job's last step: of the watched ranks that report
  // total_steps and have a rate, the longest (total_steps - step) / rate,
  // i.e. the slowest rank decides; nullopt when no rank has both.
  std::optional<double> etaSeconds() const;

 private:
  std::optional<Clock::duration> timeout_;
  std::map<int, Rank> ranks_;
};

}  // namespace ddprun::agent
