#include "ddprun/train/data_choice.h"

#include "ddprun/common/strings.h"

namespace ddprun::train {

DataSplit loadTrainData(const TrainConfig& cfg, std::FILE* notices) {
  const int64_t maxTrain = cfg.trainSamples > 0 ? cfg.trainSamples : -1;
  const int64_t maxTest = cfg.testSamples > 0 ? cfg.testSamples : -1;
  auto synthetic = [&] {
    return makeSynthetic(maxTrain > 0 ? maxTrain : 60000, maxTest > 0 ? maxTest : 10000, cfg.seed);
  };
  if (cfg.data == "synthetic") return synthetic();
  if (cfg.data == kSyntheticCifar)
    return makeSyntheticCifar(maxTrain > 0 ? maxTrain : 50000, maxTest > 0 ? maxTest : 10000,
                              static_cast<int>(cfg.numClasses));
  const std::vector<std::string> missing = missingFashionMnistFiles(cfg.data);
  if (missing.empty()) return loadFashionMnist(cfg.data, maxTrain, maxTest);
  if (cfg.dataNamed)
    DDPRUN_THROW(DataError, "--data ", cfg.data, " holds no Fashion-MNIST: ",
                 str::join(missing, ", "), "; ", kDataHint);
  if (notices) {
    std::fprintf(notices, "train: Fashion-MNIST is not installed in %s (scripts/setup.sh installs "
                 "it): training on the synthetic set instead\n", cfg.data.c_str());
    std::fflush(notices);
  }
  DataSplit s = synthetic();
  s.source = "synthetic (no Fashion-MNIST at " + cfg.data + ")";
  return s;
}

}  // namespace ddprun::train
