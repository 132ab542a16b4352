// Which data `train` trains on: --data against what this machine holds.
// Thread-safety: stateless.
#pragma once

#include <cstdio>

#include "ddprun/train/data.h"
#include "ddprun/train/train_config.h"

namespace ddprun::train {

// The set --data names: "synthetic", "synthetic-cifar", or a directory of
// Fashion-MNIST files, capped by --train-samples/--test-samples.
// - A directory the user named (cfg.dataNamed) must hold the four files:
//   else DataError (exit 2) naming every missing one and how to get them.
// - The default directory, not named and incomplete, is replaced by the
//   synthetic set: `notices` (when not null: rank 0) gets one line saying so,
//   and DataSplit::source reads "synthetic (no Fashion-MNIST at <dir>)".
// DataSplit::source is what the final JSON's "data" reports.
// Throws DataError for missing, unreadable or corrupt files.
DataSplit loadTrainData(const TrainConfig& cfg, std::FILE* notices);

}  // namespace ddprun::train
