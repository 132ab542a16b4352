// What the trainer reports: JSON-lines metrics, the progress line, the
// parameter hash and the process's peak memory.
// Thread-safety: one training thread.
#pragma once

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "ddprun/train/layers.h"

namespace ddprun::train {

// Appends one JSON object per line with one write(2) each, so a reader (or a
// killed run) sees every complete line. Disabled when the path is empty.
// `append` keeps what an earlier attempt wrote (a restarted group resumes its
// metrics). The target is a regular file or a stream (files.h): a FIFO needs
// a reader when the writer opens it (no waiting). Owns its descriptor.
class MetricsWriter {
 public:
  // Throws InvalidArgument naming the path when it cannot be opened (bad
  // input: exit 2).
  MetricsWriter(const std::string& path, bool append);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  // Throws IoError naming the path when the line cannot be written (disk
  // full, no reader left): a run-time failure (exit 1).
  void write(const nlohmann::json& j);
  bool enabled() const { return fd_ >= 0; }

 private:
  std::string path_;
  int fd_ = -1;
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
