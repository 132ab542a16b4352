// Which data `train` trains on: --data (and --data-format) against what this
// machine holds. Thread-safety: stateless.
#pragma once

#include "ddprun/train/cifar.h"
#include "ddprun/train/data.h"
#include "ddprun/train/train_config.h"

namespace ddprun::train {

// The set --data names: "synthetic", "synthetic-cifar", or a directory of
// Fashion-MNIST files or of CIFAR-10/100 (cifar.h: the batches directory
// torchvision leaves, python or binary version, or torchvision's root above
// it), capped by --train-samples/--test-samples. `format` kAuto recognises the
// layout: Fashion-MNIST's four files first, then CIFAR; another value reads
// only that layout. The directory, named with --data or the default one
// (kDefaultDataDir, when --data is not given), must hold the data: else
// DataError (exit 2) naming the directory, every missing file, the layouts
// looked for, and how to get the data or to ask for a synthetic set. A
// missing default set is never silently replaced by the synthetic one.
// (Whether the model takes the data's images and classes is checked after
// loading: modelDataProblem in train_config.h.)
// DataSplit::source is what the final JSON's "data" reports.
// Throws DataError for missing, unreadable or corrupt files.
DataSplit loadTrainData(const TrainConfig& cfg, DataFormat format);
// The same with DataFormat::kAuto.
DataSplit loadTrainData(const TrainConfig& cfg);

}  // namespace ddprun::train
