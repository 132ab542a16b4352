// Training data for the bundled trainer: Fashion-MNIST read from the IDX files
// Debian's `dataset-fashion-mnist` package installs, a generated synthetic set
// of the same shape (asked for with --data synthetic: never a silent stand-in
// for missing files, data_choice.h), and a generated CIFAR-shaped set
// (3x32x32 colour images) for ResNet. Nothing is downloaded.
//
// A Dataset keeps the raw pixel bytes (0..255, as in the IDX file): 47 MB for
// the 60000 training images rather than 188 MB as floats. gatherBatch
// normalises while it copies a batch out, exactly as PyTorch's
//   ToTensor() + Normalize((0.2860,), (0.3530,))
// does it in float32, bit for bit, so a model trained here sees the same inputs
// as one trained by a torchvision script:
//   x = (float(p) / 255.0f - 0.2860f) / 0.3530f
//
// The IDX reader trusts nothing in a file: magic numbers, dimensions, counts,
// label values and truncation are all checked, and a header's sample count is
// checked against a cap and against what the compressed file can plausibly
// hold (64 times its size plus 1 MiB) before any memory is set aside for it. Pixels are
// read straight into the Dataset, with no second full-size buffer. Every problem is
// reported as a DataError that names the file and says how to get good data.
//
// Thread-safety: the functions are pure (apart from reading files) and may be
// called from several threads at once; a Dataset is a plain value.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/common/error.h"
#include "ddprun/train/transforms.h"

namespace ddprun::train {

inline constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";

// The file names inside a Fashion-MNIST directory (gzip-compressed IDX).
inline constexpr const char* kTrainImagesFile = "train-images-idx3-ubyte.gz";
inline constexpr const char* kTrainLabelsFile = "train-labels-idx1-ubyte.gz";
inline constexpr const char* kTestImagesFile = "t10k-images-idx3-ubyte.gz";
inline constexpr const char* kTestLabelsFile = "t10k-labels-idx1-ubyte.gz";

// IDX magic numbers (big-endian in the file): unsigned bytes, 3 or 1 dims.
inline constexpr uint32_t kIdxImagesMagic = 0x00000803;
inline constexpr uint32_t kIdxLabelsMagic = 0x00000801;

// The most samples one IDX file may claim. Fashion-MNIST has 60000; the cap
// only stops a corrupt header from asking for gigabytes.
inline constexpr int64_t kMaxIdxSamples = int64_t{1} << 22;

// Fashion-MNIST's normalisation constants (torchvision's usual values).
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

// The per-channel normalisation constants of the usual recipes (torchvision's
// values), the one table of them: CIFAR-10's (also the generated CIFAR-shaped
// set's), CIFAR-100's and ImageNet's (image folders). --normalize's presets
// (transforms.h) name these.
inline constexpr float kCifarMean[3] = {0.4914f, 0.4822f, 0.4465f};
inline constexpr float kCifarStd[3] = {0.2470f, 0.2435f, 0.2616f};
inline constexpr float kCifar100Mean[3] = {0.5071f, 0.4865f, 0.4409f};
inline constexpr float kCifar100Std[3] = {0.2673f, 0.2564f, 0.2762f};
inline constexpr float kImageNetMean[3] = {0.485f, 0.456f, 0.406f};
inline constexpr float kImageNetStd[3] = {0.229f, 0.224f, 0.225f};

// --data synthetic-cifar: its name, and the fixed seed it is generated from
// (the set is the same in every run, whatever --seed says, like a real data
// set; --seed still drives initialisation and shuffling).
inline constexpr const char* kSyntheticCifar = "synthetic-cifar";
inline constexpr uint64_t kSyntheticCifarSeed = 0xC1FA;

// The appended advice in every DataError message.
inline constexpr const char* kDataHint =
    "install Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist, or "
    "scripts/setup.sh from a clone), or pass --data synthetic to train on the generated "
    "set";

// Missing, unreadable or corrupt data. The message is shown to users as is:
// it names the file, says what is wrong and ends with kDataHint.
class DataError : public InvalidArgument {
  using InvalidArgument::InvalidArgument;
};

// A set of labelled images, stored sample-major (NCHW) as raw pixel bytes
// or generated on demand; gatherBatch turns them into normalised float32.
struct Dataset {
  int64_t size = 0;
  int channels = 1, height = 28, width = 28;
  int numClasses = 10;
  std::vector<uint8_t> pixels;  // size * sampleElems(), raw 0..255 (not normalised);
                                // empty when `render` is set
  std::vector<int32_t> labels;  // size, each in [0, numClasses)
  // Normalisation of channel c: x = (p / 255 - mean[c]) / std[c] in float32
  // (ToTensor + Normalize). One entry per channel.
  std::vector<float> mean = {kFashionMnistMean}, std = {kFashionMnistStd};
  // A generated set too large to keep: writes sample i's sampleElems() raw
  // bytes into `out`, the same bytes every time. Thread-safe (a pure function).
  std::function<void(int64_t i, uint8_t* out)> render;
  // Files decoded on demand (an image folder): sample i's image at its own
  // size, CHW uint8 with `channels` channels; channels x height x width is
  // then the size a batch holds (the images are fitted to it, see
  // gatherBatch). Thread-safe; throws DataError naming the file. When set,
  // `pixels` is empty and `render` unset.
  std::function<ImageU8(int64_t i)> load;

  // Pixels per sample (and floats per sample in a gathered batch):
  // channels * height * width.
  int64_t sampleElems() const;
};

struct DataSplit {
  Dataset train, test;
  std::string source;  // "Fashion-MNIST (<dir>)", "synthetic" or "synthetic-cifar"
  // Image files replaced because they did not decode (an image folder read
  // with skipBad, image_folder.h), counted by both splits' loaders as
  // batches are gathered; null for every other set.
  std::shared_ptr<std::atomic<int64_t>> skipped;
};

// The normalised value of pixel `p`, computed with the float32 operations
// PyTorch uses (division by 255, subtraction of the mean, division by std).
float normalisePixel(uint8_t p);

// True when all four Fashion-MNIST files exist (as regular files) in `dir`.
bool fashionMnistPresent(const std::string& dir);
// The Fashion-MNIST files `dir` lacks, each as "<dir>/<file> (<why>)" (no
// such file, not a regular file, ...); empty when all four are there.
std::vector<std::string> missingFashionMnistFiles(const std::string& dir);

// Reads one pair of IDX files (gzip-compressed or plain) into a Dataset.
// At most `maxCount` samples are read (-1 = all); the counts in the two
// headers must agree. Throws DataError.
Dataset loadIdxPair(const std::string& imagesPath, const std::string& labelsPath,
                    int64_t maxCount = -1);

// Reads the four Fashion-MNIST files in `dir`. maxTrain/maxTest cap the
// number of samples read from each split (-1 = all; a cap above the file's
// count reads the whole file). When a cap stops reading early, the bytes
// after it are not inspected. Throws DataError.
DataSplit loadFashionMnist(const std::string& dir, int64_t maxTrain = -1,
                           int64_t maxTest = -1);

// A learnable 10-class set of 1x28x28 images: each class is a fixed random
// block pattern (shared by train and test), each sample that pattern with a
// random contrast and per-pixel noise, stored as raw bytes like Fashion-MNIST
// (gatherBatch normalises them with the same constants). Labels
// are balanced (counts differ by at most one) and shuffled. One training
// sample in 20 shows another class's pattern than its label (mislabelled, as
// in real data sets: without them the classes are separable by so wide a
// margin that SGD at lr 0.05 with momentum 0.9 drives the logits up until
// training diverges); the test split is clean. The same sizes and seed
// always give the same bytes (recipe: docs/train.md). Sizes must be >= 0.
DataSplit makeSynthetic(int64_t trainSize, int64_t testSize, uint64_t seed);

// A learnable CIFAR-shaped set: 3x32x32 colour images of `numClasses`
// classes (2..10). Class k is a fixed random pattern of 4x4-pixel cells per
// channel (the first numClasses of 10 patterns the seed fixes); a sample is its
// class's pattern at a random contrast plus per-pixel noise. Pixels are never
// stored: gatherBatch renders each sample from (seed, split, index), so any
// size costs only its labels (4 bytes a sample). Labels come in blocks of
// numClasses consecutive samples, each block a random permutation of the
// classes: every prefix of the set is balanced within one block, and the
// first n samples of a larger set are the set of size n. Normalised with
// CIFAR-10's constants. Exact recipe (tests/interop/synthetic_cifar.py
// reproduces it): docs/train.md.
DataSplit makeSyntheticCifar(int64_t trainSize, int64_t testSize, int numClasses = 10,
                             uint64_t seed = kSyntheticCifarSeed);

// Copies samples idx[0..n) of `d` into x (n * d.sampleElems() floats, each
// pixel normalised with its channel's mean and std, for Fashion-MNIST
// x = normalisePixel(p)) and y (n labels). Preconditions: every idx[i] is in [0, d.size)
// (checked: throws InvalidArgument), x and y hold n entries and do not alias `d`.
void gatherBatch(const Dataset& d, const int64_t* idx, size_t n, float* x, int32_t* y);

class WorkPool;  // src/train/work_pool.h
// How a training batch's samples are augmented while gathered
// (transforms.h): sample j of epoch e draws its crop and flip from
// SampleRng(seed, e, j), so a batch's values never depend on the thread
// count, the batch size or the order the samples are processed in, and a
// resumed run draws what the uninterrupted one drew.
struct SampleTransform {
  Augment augment = Augment::kNone;
  uint64_t seed = 0;
  int64_t epoch = 0;
};
// The padding of --augment crop-flip (CIFAR's RandomCrop(32, padding=4)).
inline constexpr int kCropFlipPad = 4;
// The centre crop of an image of `h` x `w` with the aspect of outH x outW,
// `fraction` of the size that aspect allows (0 < fraction <= 1).
CropBox centreCropBox(int h, int w, int outH, int outW, double fraction = 0.875);
// gatherBatch with each sample transformed by `t` (crop-flip: padCropFlip;
// random-resized-crop: randomResizedCropParams, resizedCrop back to the
// image's own size, then the flip coin; as torchvision's Compose orders them)
// before it is normalised, the samples split over `pool`'s threads (null:
// this thread alone). Same preconditions as above.
// A set of decoded files (Dataset::load) is fitted to height x width first:
// random-resized-crop crops the decoded image itself (ImageNet's training
// transform); otherwise its central crop of the batch's aspect, 87.5% of the
// shorter side (torchvision's Resize(256) + CenterCrop(224) ratio), is
// resized to it (centreCropBox), and crop-flip then applies to that.
void gatherBatch(const Dataset& d, const int64_t* idx, size_t n, float* x, int32_t* y,
                 const SampleTransform& t, WorkPool* pool);

}  // namespace ddprun::train
