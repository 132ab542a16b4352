// A checkpoint directory shared by several runs: each run's files carry its
// identity, so pruning and resuming only ever touch the run's own files and an
// earlier run's checkpoints are kept.
//
// Names: "ckpt-<run tag>-<global step, zero-padded to 9 digits>.safetensors"
// (more digits past 999999999). The run tag is the run id itself when it is
// 1 to 64 characters of [A-Za-z0-9_.-], else "x" and 16 hex digits of a hash
// of it; the file's metadata "run" holds the full run id. Files of the older
// form "ckpt-<step>.safetensors" (written before run identities) belong to no
// run: they are listed with the tag "" and never pruned by a run.
//
// Thread-safety: the functions keep no state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::train {

struct CheckpointFile {
  std::string path;  // "<dir>/<name>" (just the name from parseCheckpointName)
  std::string tag;   // the run tag in the name; "" for the older form
  int64_t step = 0;  // global step
};

// The file-name tag of a run id (see above). Precondition: runId non-empty.
std::string runTag(const std::string& runId);
// "ckpt-<tag>-<step>.safetensors"; tag from runTag, step >= 0.
std::string checkpointFileName(const std::string& tag, int64_t globalStep);
// The tag and step of a checkpoint file name (no directory), or nullopt when
// the name is not one we would write (e.g. a leftover ".tmp.<pid>").
std::optional<CheckpointFile> parseCheckpointName(const std::string& fileName);
// The regular-file checkpoints in `dir`, highest step first (ties: by name).
// A missing directory has none; an unreadable one throws CheckpointError.
std::vector<CheckpointFile> listCheckpoints(const std::string& dir);
// Those of one run (tag), highest step first.
std::vector<CheckpointFile> listCheckpoints(const std::string& dir,
                                            const std::string& tag);
// The tag of the most recently modified checkpoint in `dir` (another run's,
// for --resume), or nullopt when there is none.
std::optional<std::string> lastWrittenRun(const std::string& dir);
// Removes all but the `keep` (>= 0) highest-step checkpoints of the run
// `tag` (non-empty); other runs' files and other files are left alone.
// Throws IoError when a removal fails.
void pruneCheckpoints(const std::string& dir, const std::string& tag, int keep);

}  // namespace ddprun::train
