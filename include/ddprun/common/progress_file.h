// The progress file: how a worker tells its agent how far training got, and
// the one definition of its format, shared by the writer (the trainer, and
// python/ddprun/progress.py which writes the same JSON) and the reader (the
// agent: `ddprun status`, /metrics, --progress-timeout; docs/status.md).
//
// The agent gives each worker the path in $DDPRUN_PROGRESS_FILE (a file in
// the worker's own directory of the attempt). The worker replaces the file
// whenever it likes with one small JSON object:
//   {"step": 41, "epoch": 2, "loss": 0.53, "samples_per_second": 812.5,
//    "total_steps": 1000, "time": 1714564800.25}
// step and time (unix seconds when its last step ended) are required; epoch,
// loss, samples_per_second and total_steps are optional (absent or null).
// Unknown fields are ignored. Writes are atomic (a temporary file in the same
// directory, then rename), so a reader sees a whole report or the previous one.
//
// Thread-safety: every function may be called from any thread.
// writeProgressFile's rate limit is process-wide (one mutex).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun {

// The variable naming the file, set by the agent for each worker.
inline constexpr const char* kProgressFileEnv = "DDPRUN_PROGRESS_FILE";
// The largest file the reader accepts (a report is about 150 bytes).
inline constexpr size_t kMaxProgressFileBytes = 4096;
// writeProgressFile writes at most once per this interval unless forced.
inline constexpr std::chrono::milliseconds kProgressWriteInterval{500};

struct ProgressReport {
  int64_t step = 0;                        // >= 0: steps done so far
  std::optional<int64_t> epoch;            // >= 0
  std::optional<double> loss;              // finite
  std::optional<double> samplesPerSecond;  // finite, >= 0
  std::optional<int64_t> totalSteps;       // > 0: steps of the whole run
  double time = 0;  // unix seconds (finite, >= 0) when the last step ended;
                    // writeProgressFile puts the current time for 0

  bool operator==(const ProgressReport&) const = default;
};

// The report as the file holds it (one line of JSON, no newline). Optional
// fields that are unset or not finite are left out (a diverged loss of NaN
// is not JSON); a time that is 0 or not finite becomes the current time.
std::string formatProgressReport(const ProgressReport& report);

// Parses a report, trusting nothing: a JSON object; step and time present;
// each field of its type (integers for step, epoch and total_steps) and in
// its range; no number that is not finite. nullopt with *why (when `why`
// is not null) saying what is wrong, e.g. "'step' is not an integer".
std::optional<ProgressReport> parseProgressReport(std::string_view text,
                                                  std::string* why = nullptr);

// Writes `report` to `path` atomically: <path>.tmp.<pid> in the same
// directory, then rename(2) over `path` (no fsync: a reader needs the latest
// whole report, not durability). Cheap enough to call every step: unless
// `force`, a call within kProgressWriteInterval of this process's last write
// to the same path writes nothing and returns true (call with force = true
// for a report that must land, e.g. at the end of an epoch or of training).
// Never throws: false when the path is empty or the file could not be
// written (errno says why; the temporary file is removed).
bool writeProgressFile(const std::string& path, const ProgressReport& report,
                       bool force = false);

// Reads and parses the file at `path`: a regular file (opened without
// following a symbolic link and without blocking, so a FIFO planted there
// cannot stall the reader) of at most kMaxProgressFileBytes, checked before
// reading. nullopt when there is no report: with *why empty when the file
// does not exist (nothing reported yet), else saying what is wrong ("larger
// than 4096 bytes", "not JSON", "'loss' is not a finite number", ...).
// Never throws.
std::optional<ProgressReport> readProgressFile(const std::string& path,
                                               std::string* why = nullptr);

}  // namespace ddprun
