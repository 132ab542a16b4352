// The trainer's checkpoint metadata (the safetensors "__metadata__" strings):
// what is written, and the range checks a file must pass before any of it is
// used to resume. Pure logic: no files, no process group.
//
// Keys: format ("ddprun-train-1"), run (the run id, checkpoint_dir.h), model,
// optimizer, epoch (the epoch to continue), step (the next step within it),
// global_step (steps done in the run), optimizer_steps, world, batch_size,
// seed, rng (the generator state); epoch_loss_sum, epoch_loss_count,
// epoch_seconds, run_seconds, run_samples (RunTotals; optional).
//
// Thread-safety: the functions keep no state.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace ddprun::train {

// What this run is, to check a checkpoint against.
struct RunShape {
  std::string model, optimizer;
  int64_t epochs = 1;
  int64_t stepsPerEpoch =
      0;  // of this run's configuration (world, batch, samples, --max-steps)
  int world = 1, batchSize = 1;
  uint64_t seed = 0;
};

// What the run had done before the checkpoint, so that a resumed run's
// epoch records and summary cover the whole epoch and run: the epoch's loss
// (the sum of per-sample losses over `epochLossCount` samples, every rank's)
// and seconds so far, the run's training seconds and samples so far. Files
// without them (older ones) read as zeros with `known` false.
struct RunTotals {
  double epochLossSum = 0, epochLossCount = 0, epochSeconds = 0, runSeconds = 0;
  int64_t runSamples = 0;
  bool known = true;
};

// Where a checkpoint stands.
struct CheckpointPosition {
  int64_t epoch = 0, step = 0, globalStep = 0, optimizerSteps = 0;
  std::string rng;         // Rng::state()
  std::string run;         // the run id ("" in files written before run ids)
  bool sameLayout = true;  // taken with this run's world size, batch size and seed
  RunTotals totals{};
};

std::map<std::string, std::string> checkpointMetadata(const RunShape& shape,
                                                      const CheckpointPosition& pos);

// Parses `meta` of the file `path` into *out, checking every field before it
// is trusted: the format marker; model and optimizer equal to the run's;
// integers written in full (no sign games, no trailing text); world and
// batch_size >= 1; epoch in [0, epochs]; step in [0, stepsPerEpoch] (0 at
// epoch == epochs; with another world size, batch size or seed the step is
// set to 0: the epoch restarts); global_step in [step, 10^12];
// optimizer_steps == global_step (one optimizer step per training step);
// an rng state the generator accepts; the totals, when present, finite and
// >= 0 (decimal numbers); `run`, when `runTagOfFile` is
// non-empty, a run id whose tag is that one. Returns "" or the error, which
// names the file and the field: "<path>: metadata field 'step' is \"-20\",
// outside [0, 47] (...)".
std::string readCheckpointMetadata(const std::string& path,
                                   const std::map<std::string, std::string>& meta,
                                   const RunShape& shape, const std::string& runTagOfFile,
                                   CheckpointPosition* out);

}  // namespace ddprun::train
