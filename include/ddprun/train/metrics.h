// What the trainer reports: JSON-lines metrics, the progress line, the
// parameter hash and the process's peak memory.
// Thread-safety: one training thread (MetricsWriter keeps its own writer
// thread).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "ddprun/train/layers.h"
#include "ddprun/train/record_queue.h"

namespace ddprun::train {

// Appends one JSON object per line, so a reader (or a killed run) sees every
// complete line. Disabled when the path is empty. `append` keeps what an
// earlier attempt wrote (a restarted group resumes its metrics). The target
// is a regular file or a stream (files.h).
//
// The training thread never waits for the target: write() queues the record
// (a RecordQueue) and a writer thread writes it. When the reader of a FIFO
// or stream stops reading, the queue fills and further records are dropped
// and counted (finish() returns the count), while training goes on.
// open(2) cannot block either: the target is opened with O_NONBLOCK, so a
// FIFO without a reader is refused at once (ENXIO: exit 2) instead of
// waiting for one; the descriptor stays non-blocking and the writer thread
// waits in poll(2), where finish() and the destructor can wake it.
// Thread-safety: write() and finish() from one thread (the training thread).
class MetricsWriter {
 public:
  struct Options {
    // About 200 bytes a record: room for 1024 records is minutes of slack
    // at --log-interval 1 for a reader that pauses.
    RecordQueue::Limits queue{.maxRecords = 1024, .maxBytes = 4u << 20};
    // How long finish() waits, at most, for a target that is full (a reader
    // that stopped reading) before it drops what is still queued.
    std::chrono::milliseconds drainTimeout{2000};
  };
  struct Totals {
    uint64_t records = 0;  // records given to write()
    uint64_t dropped = 0;  // of those, records that never reached the target
  };

  // Throws InvalidArgument naming the path when it cannot be opened (bad
  // input: exit 2).
  MetricsWriter(const std::string& path, bool append) : MetricsWriter(path, append, Options{}) {}
  MetricsWriter(const std::string& path, bool append, Options options);
  // Ends the writer as finish() does, without throwing.
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  // Queues one record; never waits. Throws IoError naming the path when an
  // earlier record could not be written (disk full, no reader left): a
  // run-time failure (exit 1).
  void write(const nlohmann::json& j);
  // Writes what is queued (waiting at most drainTimeout for a stalled
  // target), stops the writer thread and closes the target: later write()s
  // do nothing. Throws IoError as write() does. Later calls return the same
  // totals.
  Totals finish();
  bool enabled() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }

 private:
  void writerLoop();
  bool writeLine(const std::string& line);  // false: failed or gave up
  void wake();
  void rethrowFailure();

  std::string path_;
  Options options_;
  int fd_ = -1, wakeFd_ = -1;
  RecordQueue queue_;
  std::chrono::steady_clock::time_point drainDeadline_;  // set before stopping_
  std::atomic<bool> stopping_{false}, failed_{false};
  std::string failure_;        // set by the writer thread before failed_
  uint64_t gaveUp_ = 0;        // records the writer thread abandoned mid-write
  std::optional<Totals> totals_;
  std::thread writer_;
};

// Rank 0's progress line: rewritten in place on a terminal, one line per
// interval otherwise (a log file).
class Progress {
 public:
  explicit Progress(std::FILE* out, bool enabled);
  void update(const std::string& line);
  void finish();  // ends the in-place line

 private:
  std::FILE* out_;
  bool enabled_, tty_, dirty_ = false;
};

// SHA-256 (hex) of these byte ranges, in order (model_state.h's modelSha256:
// parameters then buffers, equal hashes mean bitwise-equal models).
std::string sha256Hex(const std::vector<std::pair<const void*, size_t>>& spans);
double peakRssMb();
std::string formatSeconds(double s);  // "1m05s", "12s"

}  // namespace ddprun::train
