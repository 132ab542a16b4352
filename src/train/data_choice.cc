#include "ddprun/train/data_choice.h"

#include <filesystem>

#include "ddprun/common/strings.h"
#include "ddprun/train/image_folder.h"

namespace ddprun::train {
namespace {

// What `dir` lacks: the directory itself, or the files named one by one.
std::string whatIsMissing(const std::string& dir, const std::vector<std::string>& missing) {
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) return dir + " does not exist";
  return str::join(missing, ", ");
}

DataSplit loadFashionMnistOrRefuse(const TrainConfig& cfg, DataFormat format, int64_t maxTrain,
                                   int64_t maxTest) {
  const std::vector<std::string> missing = missingFashionMnistFiles(cfg.data);
  if (missing.empty()) return loadFashionMnist(cfg.data, maxTrain, maxTest);
  if (cfg.dataNamed && format == DataFormat::kFashionMnist)
    DDPRUN_THROW(DataError, "--data ", cfg.data, " holds no Fashion-MNIST: ",
                 str::join(missing, ", "), "; ", kDataHint);
  if (cfg.dataNamed) {
    if (auto loc = findCifar(cfg.data, DataFormat::kAuto))
      return loadCifar(*loc, maxTrain, maxTest);
    DDPRUN_THROW(DataError, "--data ", cfg.data, " holds no Fashion-MNIST: ",
                 str::join(missing, ", "), "; nor CIFAR-10/100: looked for ",
                 cifarPlacesLookedFor(cfg.data, DataFormat::kAuto), "; ", kDataHint,
                 ", or name a CIFAR directory as torchvision downloads it");
  }
  // The default set is missing: refused, never replaced by the synthetic set
  // behind the user's back (whose accuracy would then be read as Fashion-MNIST's).
  DDPRUN_THROW(DataError, "no --data given, and the default data set, Fashion-MNIST, is not "
               "installed where train looks for it: ", whatIsMissing(cfg.data, missing), "; ",
               kDataHint, ", or --data DIR naming a directory with its four IDX .gz files");
}

// --data as torchvision's ImageFolder (image_folder.h).
DataSplit loadImageFolderOf(const TrainConfig& cfg, int64_t maxTrain, int64_t maxTest) {
  ImageFolderOptions o;
  o.trainRoot = cfg.data;
  o.valRoot = cfg.valData;
  o.valFraction = cfg.valFraction;
  o.imageSize = cfg.imageSize;
  o.maxTrain = maxTrain;
  o.maxTest = maxTest;
  o.skipBad = cfg.skipBadImages;
  return loadImageFolder(o);
}

}  // namespace

DataSplit loadTrainData(const TrainConfig& cfg) { return loadTrainData(cfg, DataFormat::kAuto); }

DataSplit loadTrainData(const TrainConfig& cfg, DataFormat format) {
  const int64_t maxTrain = cfg.trainSamples > 0 ? cfg.trainSamples : -1;
  const int64_t maxTest = cfg.testSamples > 0 ? cfg.testSamples : -1;
  const bool generated = cfg.data == "synthetic" || cfg.data == kSyntheticCifar;
  if (generated && format != DataFormat::kAuto)
    DDPRUN_THROW(DataError, "--data-format ", dataFormatName(format), " names files on disk, "
                 "but --data ", cfg.data, " is generated: drop --data-format, or name a "
                 "directory with --data");
  // An image folder is named (--data-format image-folder) or recognised:
  // a named directory that holds neither Fashion-MNIST nor CIFAR but class
  // folders of images.
  const bool imageFolder =
      format == DataFormat::kImageFolder ||
      (format == DataFormat::kAuto && cfg.dataNamed && !generated &&
       !fashionMnistPresent(cfg.data) && !findCifar(cfg.data, DataFormat::kAuto) &&
       looksLikeImageFolder(cfg.data));
  if (imageFolder) return loadImageFolderOf(cfg, maxTrain, maxTest);
  if (!cfg.valData.empty() || cfg.valFraction > 0)
    DDPRUN_THROW(DataError, "--val-data and --val-fraction are for an image folder (--data DIR "
                 "of class folders); --data ", cfg.data, " is not one and has its own test "
                 "split");
  if (cfg.skipBadImages)
    DDPRUN_THROW(DataError, "--skip-bad-images is for an image folder (--data DIR of class "
                 "folders); --data ", cfg.data, " is not one");
  if (cfg.data == "synthetic")
    return makeSynthetic(maxTrain > 0 ? maxTrain : 60000, maxTest > 0 ? maxTest : 10000,
                         cfg.seed);
  if (cfg.data == kSyntheticCifar)
    return makeSyntheticCifar(maxTrain > 0 ? maxTrain : 50000, maxTest > 0 ? maxTest : 10000,
                              static_cast<int>(cfg.numClasses));
  if (format == DataFormat::kAuto || format == DataFormat::kFashionMnist)
    return loadFashionMnistOrRefuse(cfg, format, maxTrain, maxTest);
  if (auto loc = findCifar(cfg.data, format))
    return loadCifar(*loc, maxTrain, maxTest);
  const CifarLayout& l = cifarLayout(format);
  DDPRUN_THROW(DataError, "--data ", cfg.data, " holds no ", l.setName, " (--data-format ",
               dataFormatName(format), "): looked for ", cifarPlacesLookedFor(cfg.data, format),
               "; ", kCifarHint);
}

}  // namespace ddprun::train
