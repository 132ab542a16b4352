// Which data `train` trains on: --data against what this machine holds.
// Thread-safety: stateless.
#pragma once

#include "ddprun/train/data.h"
#include "ddprun/train/train_config.h"

namespace ddprun::train {

// The set --data names: "synthetic", "synthetic-cifar", or a directory of
// Fashion-MNIST files, capped by --train-samples/--test-samples. The
// directory, named with --data or the default one (kDefaultDataDir, when
// --data is not given), must hold the four files: else DataError (exit 2)
// naming the directory, every missing file, and how to get them or to ask
// for the synthetic set. A missing default set is never silently replaced by
// the synthetic one. DataSplit::source is what the final JSON's "data" reports.
// Throws DataError for missing, unreadable or corrupt files.
DataSplit loadTrainData(const TrainConfig& cfg);

}  // namespace ddprun::train
