// The bundled trainer's loop: data-parallel training of a bundled model with
// the runtime's Reducer and DistributedSampler, evaluation with the exact
// (unpadded) split, checkpoints and resume, metrics.
//
// One step: gather this rank's batch (data) -> forward, loss, backward with
// each layer's gradients handed to the reducer as they become ready
// (forward_backward) -> reducer.finalize() (comm_wait: on a device it only
// orders the optimizer after the all-reduces) -> optimizer step, gradients
// marked to be overwritten by the next backward (optimizer).
//
// Checkpoints (rank 0, atomically, safetensors): every --checkpoint-every
// global steps and at each epoch end: parameters and buffers under their
// PyTorch names, optimizer state as "optim.<param>.<slot>", and metadata
// (model, epoch, next step, global step, optimizer steps, world, batch size,
// seed, RNG state, run id). Checkpoint files carry the run's identity
// (checkpoint_dir.h): pruning and resuming touch only this run's files. A
// group restarted by its launcher (TORCHELASTIC_RESTART_COUNT > 0) resumes
// from this run's newest valid checkpoint, every field range-checked first
// (checkpoint_meta.h), writes a {"type": "resume"} metrics record, and
// reaches the same final parameters as an uninterrupted run.
//
// Thread-safety: a Trainer runs on one thread; several Trainers (one per
// rank) may run in one process over distinct ProcessGroups (tests).
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "ddprun/runtime/process_group.h"
#include "ddprun/train/data.h"
#include "ddprun/train/train_config.h"

namespace ddprun::train {

struct TrainerIo {
  std::FILE* progress = stderr;  // rank 0's progress lines and notices
  // This run's identity, the same on every rank and across the launcher's
  // restarts of the group (TORCHELASTIC_RUN_ID); "" makes a fresh one (rank 0
  // draws it, every rank uses it) that lives as long as this call.
  std::string runId;
  // Restarted by the launcher (TORCHELASTIC_RESTART_COUNT > 0): resume from
  // this run's newest valid checkpoint (TrainConfig::resume does so on a
  // first start too, and may continue another run's files).
  bool restarted = false;
  // Where this rank reports its progress to its launcher (common/
  // progress_file.h; $DDPRUN_PROGRESS_FILE under ddprun): "" reports nothing.
  std::string progressFile{};
};

// Runs the whole job on this rank and returns the final summary (the same
// object on every rank; rank 0 prints it). Throws InvalidArgument (bad input:
// an unusable checkpoint, more ranks than samples), CheckpointError, or the
// runtime's errors (a dead or stalled peer).
nlohmann::json runTraining(const TrainConfig& cfg, const DataSplit& data,
                           runtime::ProcessGroup& pg, const TrainerIo& io = {});

// The `train` program (src/train/train_main.cc): parses flags, loads data,
// joins the process group (ddprun, torchrun, or alone), trains, prints the
// final JSON line on rank 0.
// Returns the exit code: 0 done, 1 training failed (a peer died, a write
// failed at run time), 2 bad input (flags, data files, checkpoints, output
// paths that may not be replaced, more ranks than samples).
int trainMain(int argc, const char* const* argv);

}  // namespace ddprun::train
