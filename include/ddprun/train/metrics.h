// What the trainer reports: JSON-lines metrics, the progress line, the
// parameter hash and the process's peak memory.
// Thread-safety: one training thread.
#pragma once

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "ddprun/train/layers.h"

namespace ddprun::train {

// Appends one JSON object per line, flushed, so a reader (or a killed run)
// sees every complete line. Disabled when the path is empty. `append` keeps
// what an earlier attempt wrote (a restarted group resumes its metrics).
class MetricsWriter {
 public:
  MetricsWriter(const std::string& path, bool append);  // throws IoError naming the path
  void write(const nlohmann::json& j);
  bool enabled() const { return out_.is_open(); }

 private:
  std::ofstream out_;
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

// SHA-256 (hex) of the parameters' bytes in registration order, then the
// buffers' (float32 little-endian): equal hashes mean bitwise-equal models.
std::string parametersSha256(const std::vector<Param*>& params,
                             const std::vector<Buffer*>& buffers);
double peakRssMb();
std::string formatSeconds(double s);  // "1m05s", "12s"

}  // namespace ddprun::train
