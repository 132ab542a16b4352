// torchvision's ImageFolder layout for the bundled trainer: a directory of
// class folders, each holding that class's image files,
//
//   root/dog/xxx.png, root/dog/sub/xxy.jpeg, root/cat/123.jpg, ...
//
// read exactly as torchvision.datasets.ImageFolder(root) lists it:
//   classes   the names of root's entries that are directories (a symlink
//             to a directory counts; hidden names count too), sorted by byte
//             value (= Python's str sort for UTF-8 names); class index =
//             position in that list.
//   samples   for each class in that order, every file under its folder
//             whose name ends (ASCII case-insensitively) in one of
//             kImageExtensions, found as make_dataset finds them:
//             sorted(os.walk(class_dir, followlinks=True)) (directories in
//             byte order of their full path, symlinked directories followed)
//             and each directory's file names sorted; a "file" is any entry
//             that is not a directory (so a broken symlink named x.jpg is a
//             sample, and fails to decode like a corrupt file). Sample i is
//             (path, class) with path = os.path.join(root, class, ..., name)
//             spelt from `root` as given.
// Deviations, each where torchvision would misbehave: a directory that is
// its own ancestor through a symlink (a cycle) is not entered again
// (os.walk would recurse until the path is too long); a directory that
// cannot be read is an error (os.walk skips it silently). Images are
// decoded on demand (Dataset::load, image_decode.h: JPEG and PNG, as PIL's
// .convert("RGB")); a file of another format fails to decode.
//
// Errors (DataError, one line naming the path and what to do): the root is
// missing or not a directory, it has no class folders, a class folder has
// no image file (torchvision: "Found no valid file for the classes ..."),
// more than ImageFolderOptions::maxFiles image files or maxClasses classes,
// a val folder whose classes differ from the train folder's.
//
// Thread-safety: the functions are pure apart from reading the file system;
// a returned Dataset's `load` may be called from any number of threads.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ddprun/train/data.h"
#include "ddprun/train/image_decode.h"

namespace ddprun::train {

// torchvision's IMG_EXTENSIONS (compared case-insensitively).
inline constexpr std::array<const char*, 9> kImageExtensions = {
    ".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"};

// ImageNet's normalisation constants: kImageNetMean/kImageNetStd (data.h).

// The side of the images a batch holds when ImageFolderOptions::imageSize is 0.
inline constexpr int kDefaultImageFolderSize = 224;
// The default caps (ImageNet-1k has 1.28 million files in 1000 classes;
// ImageNet-21k 14 million in 21841).
inline constexpr int64_t kMaxImageFolderFiles = int64_t{1} << 25;
inline constexpr int64_t kMaxImageFolderClasses = 100000;
// The seed of the --val-fraction split (fixed: the split is a property of
// the folder, the same in every run whatever --seed says).
inline constexpr uint64_t kImageFolderSplitSeed = 0x1F01D5EEDull;

// The advice appended to every image folder DataError.
inline constexpr const char* kImageFolderHint =
    "give --data a directory laid out as torchvision's ImageFolder expects "
    "(root/<class>/<image files>, JPEG or PNG)";

// True when `name` ends in one of kImageExtensions (ASCII case-insensitive,
// as torchvision's has_file_allowed_extension on path.lower()).
bool hasImageExtension(std::string_view name);

// What ImageFolder(root) lists: classes and samples in its order.
struct ImageFolderListing {
  std::string root;
  std::vector<std::string> classes;  // sorted; index = label
  std::vector<std::string> paths;    // sample i's file
  std::vector<int32_t> labels;       // sample i's class
};

// Lists `root` as described above. Throws DataError (root missing or not a
// directory, no class folder, an empty class, a directory that cannot be
// read, more than maxFiles image files or maxClasses classes: counted while
// walking, before more is kept).
ImageFolderListing listImageFolder(const std::string& root,
                                   int64_t maxFiles = kMaxImageFolderFiles,
                                   int64_t maxClasses = kMaxImageFolderClasses);

// Cheap recognition for --data: `path` is a directory and one of its
// subdirectories (symlinks followed, in sorted order, at most 64 of them
// looked into, each scanned up to 4096 entries) holds a file with an image
// extension directly. Never throws; false for anything unreadable. A CIFAR
// or Fashion-MNIST directory is never taken for an image folder (their
// files have no image extension).
bool looksLikeImageFolder(const std::string& path);

struct ImageFolderOptions {
  std::string trainRoot;      // required
  // The test split: a second folder (valRoot, e.g. ImageNet's val/ in
  // class folders), or valFraction of trainRoot's samples held out, or
  // neither (the test split is then empty: size 0). Not both.
  std::string valRoot;
  // In [0, 1). The split is stratified and fixed: within each class of n
  // samples, round(n * valFraction) of them (half away from zero, at most
  // n - 1: every class keeps a training sample) go to the test split,
  // namely those with the smallest key
  //   key(p) = splitmix64_finaliser(fnv1a64(p) ^ kImageFolderSplitSeed),
  // p = the path relative to trainRoot ("dog/sub/x.jpg"), ties by folder
  // order. A file's side of the split does not depend on the thread count,
  // --seed or the files of other classes. Both splits keep folder order.
  double valFraction = 0;
  // Height = width of the images a batch holds (gatherBatch fits each
  // decoded image to it); 0: kDefaultImageFolderSize.
  int64_t imageSize = 0;
  int channels = 3;           // 3 only (RGB, ImageNet's normalisation)
  // Caps on each split's samples (-1 or 0: all). A cap keeps a class-balanced
  // subset: the first samples of every class in turn (class 0's first, class
  // 1's first, ..., then each class's second, ...) until the cap is reached,
  // kept in folder order.
  int64_t maxTrain = -1, maxTest = -1;
  // A file that fails to decode is replaced by the next sample of its class
  // (in folder order, wrapping around within the split) that decodes, and
  // counted once in DataSplit::skipped; the choice depends only on the
  // files, never on threads. When every file of a class fails, loading that
  // class throws DataError. false: the DataError propagates (train exits 2
  // naming the file).
  bool skipBad = false;
  int64_t maxFiles = kMaxImageFolderFiles;
  int64_t maxClasses = kMaxImageFolderClasses;
  DecodeLimits limits;
};

// Loads the listing(s) of `opt` (no image is decoded here). Both Datasets:
// load = decode sample i (decodeImage(path, 3), with skipBad as above),
// pixels empty, channels 3, height = width = the image size, numClasses =
// the train folder's classes, ImageNet's mean/std. DataSplit::source is
// "ImageFolder (<trainRoot>, N classes)"; DataSplit::skipped counts the
// files skipped so far in either split (set when skipBad, else null).
// Throws DataError (listImageFolder's errors; valRoot's classes not equal
// to trainRoot's, naming both and the first difference) and
// InvalidArgument (bad options: valRoot and valFraction both, valFraction
// outside [0, 1), channels not 3, imageSize outside [1, 65535]).
//
// How `train` calls it (src/train/data_choice.cc, TrainConfig cfg):
//   if (looksLikeImageFolder(cfg.data)) {
//     ImageFolderOptions o;
//     o.trainRoot = cfg.data;              // --data
//     o.valRoot = cfg.valData;             // --val-data (new flag; "" if absent)
//     o.valFraction = cfg.valFraction;     // --val-fraction (new flag; 0 if absent)
//     o.imageSize = cfg.imageSize;         // --image-size (0: 224)
//     o.maxTrain = cfg.trainSamples > 0 ? cfg.trainSamples : -1;
//     o.maxTest = cfg.testSamples > 0 ? cfg.testSamples : -1;
//     o.skipBad = cfg.skipBadImages;       // --skip-bad-images (new flag)
//     return loadImageFolder(o);
//   }
// and, after training, reports skippedImages(split) (e.g. in the final JSON).
DataSplit loadImageFolder(const ImageFolderOptions& opt);

// The files skipped so far (0 when the split has no counter).
int64_t skippedImages(const DataSplit& split);

}  // namespace ddprun::train
