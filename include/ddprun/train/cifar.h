// CIFAR-10 and CIFAR-100 for the bundled trainer, read from the directories
// torchvision leaves on disk (torchvision.datasets.CIFAR10/100(root,
// download=True)) and from the binary versions of the same sets:
//
//   cifar-10-batches-py/   data_batch_1..5, test_batch: pickled dicts
//                          {'data': uint8 array N x 3072, 'labels': [int], ...}
//   cifar-100-python/      train, test: {'data': ..., 'fine_labels': [int], ...}
//   cifar-10-batches-bin/  data_batch_1.bin..5, test_batch.bin: records of
//                          1 label byte + 3072 pixel bytes
//   cifar-100-binary/      train.bin, test.bin: coarse label byte, fine label
//                          byte, 3072 pixel bytes
//
// Pixels are kept as the files hold them: each image 3 planes (R, G, B) of
// 32x32 bytes, i.e. NCHW, which is what gatherBatch expects; the training
// split is the train files concatenated in order (data_batch_1 first), as
// torchvision orders it. CIFAR-100 trains on the fine labels (100 classes).
// The pickles are read by pickle_reader.h (no code runs, memory bounded).
//
// Every problem is a DataError naming the file and saying what is wrong
// (missing batch files, truncation, a record size that does not divide the
// file, a bad pickle with the opcode and offset, an array of the wrong shape
// or dtype, labels out of range, image and label counts that disagree, a file
// larger than a CIFAR batch can plausibly be: checked before it is read).
//
// Thread-safety: the functions are pure apart from reading files.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddprun/train/data.h"

namespace ddprun::train {

// What --data holds: kAuto recognises the layout (Fashion-MNIST, then CIFAR,
// then an image folder: data_choice.h). Declared here, where the CIFAR
// layouts it names are.
enum class DataFormat {
  kAuto, kFashionMnist, kCifar10Py, kCifar100Py, kCifar10Bin, kCifar100Bin, kImageFolder
};

// The --data-format spellings, for help texts and messages.
inline constexpr const char* kDataFormatNames =
    "auto | fashion-mnist | cifar10 | cifar100 | cifar10-bin | cifar100-bin | image-folder";

// "auto", "fashion-mnist", "cifar10", "cifar100", "cifar10-bin",
// "cifar100-bin", "image-folder"; nullopt for anything else.
std::optional<DataFormat> parseDataFormat(const std::string& name);
// The spelling parseDataFormat reads.
const char* dataFormatName(DataFormat format);

// One image's bytes: 3 channels of 32x32.
inline constexpr int kCifarSide = 32;
inline constexpr int64_t kCifarImageBytes = 3 * 32 * 32;
// The most images one batch file may hold (CIFAR-100's train file has
// 50000): a bigger claim, or a bigger file, is refused before it is read.
inline constexpr int64_t kMaxCifarImagesPerFile = 60000;
// The largest pickle file read: the pixels twice over (Python 3's protocol 2
// stores bytes as UTF-8 text, up to 2 bytes each) plus room for labels and
// file names.
inline constexpr int64_t kMaxCifarPickleBytes =
    2 * kMaxCifarImagesPerFile * kCifarImageBytes + (int64_t{64} << 20);

// The advice appended to every CIFAR DataError.
inline constexpr const char* kCifarHint =
    "get an intact copy with torchvision.datasets.CIFAR10(root, download=True) (CIFAR100 "
    "likewise; the binary versions from https://www.cs.toronto.edu/~kriz/cifar.html), or "
    "pass --data synthetic-cifar to train on the generated set";

// A CIFAR batch directory: which layout, and where (the directory holding
// the batch files, not torchvision's root).
struct CifarLocation {
  DataFormat format = DataFormat::kCifar10Py;
  std::string dir;
};

// What a CIFAR layout is made of.
struct CifarLayout {
  DataFormat format;
  const char* dirName;                  // the batches directory's name under root
  std::vector<const char*> trainFiles;  // in the order the training split concatenates
  const char* testFile;
  int numClasses;                       // 10 or 100
  const char* setName;                  // "CIFAR-10", "CIFAR-100"
  bool binary;
};
// The layout of a CIFAR format. Precondition: `format` is one of the four
// CIFAR formats (else InvalidArgument).
const CifarLayout& cifarLayout(DataFormat format);

// Recognises a CIFAR directory: `path` may be the batches directory itself
// (its name is the layout's, or it holds the layout's batch files) or
// torchvision's root above it. `wanted` is kAuto (any of the four layouts)
// or one CIFAR format; kFashionMnist finds nothing. Where root holds both
// the python and the binary version of one set, the python one is taken.
// nullopt when nothing matches. Throws DataError when `path` holds CIFAR-10
// and CIFAR-100 both and `wanted` is kAuto (the message names both).
std::optional<CifarLocation> findCifar(const std::string& path, DataFormat wanted);

// For messages: where findCifar looked, e.g. "<path>/cifar-10-batches-py/,
// ... or their batch files in <path> itself".
std::string cifarPlacesLookedFor(const std::string& path, DataFormat wanted);

// Reads the set at `loc`. maxTrain/maxTest cap the samples of each split
// (-1 = all); train files after the cap is reached are checked to exist but
// not read. Dataset: channels 3, 32x32, numClasses 10 or 100, the set's
// mean/std; source "CIFAR-10 (<dir>)" or "CIFAR-100 (<dir>)". Throws
// DataError (every batch file that is missing listed in one message).
DataSplit loadCifar(const CifarLocation& loc, int64_t maxTrain = -1, int64_t maxTest = -1);

// In-memory entry points (the file readers use them; so do the tests and the
// fuzz target). Each parses one whole batch file's bytes, checks it
// completely, and appends at most `maxCount` images (-1 = all) to
// out.pixels/out.labels, adding to out.size; returns how many it appended.
// numClasses is 10 (CIFAR-10's 'labels' / 1 label byte) or 100
// (CIFAR-100's 'fine_labels' / coarse + fine label bytes). `file` names the
// file in messages. Throws DataError.
int64_t appendCifarPickle(std::string_view bytes, int numClasses, int64_t maxCount,
                          const std::string& file, Dataset& out);
int64_t appendCifarBinary(std::string_view bytes, int numClasses, int64_t maxCount,
                          const std::string& file, Dataset& out);

}  // namespace ddprun::train
