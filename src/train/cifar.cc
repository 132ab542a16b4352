#include "ddprun/train/cifar.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>

#include "ddprun/common/strings.h"
#include "ddprun/train/pickle_reader.h"

namespace ddprun::train {

namespace {

namespace fs = std::filesystem;

// Binary records are read this many at a time.
constexpr int64_t kRecordsPerRead = 1024;

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  DDPRUN_THROW(DataError, file, ": ", what, "; ", kCifarHint);
}

const std::vector<CifarLayout>& layouts() {
  static const std::vector<CifarLayout> all = {
      {DataFormat::kCifar10Py, "cifar-10-batches-py",
       {"data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5"},
       "test_batch", 10, "CIFAR-10", false},
      {DataFormat::kCifar100Py, "cifar-100-python", {"train"}, "test", 100, "CIFAR-100", false},
      {DataFormat::kCifar10Bin, "cifar-10-batches-bin",
       {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
        "data_batch_5.bin"},
       "test_batch.bin", 10, "CIFAR-10", true},
      {DataFormat::kCifar100Bin, "cifar-100-binary", {"train.bin"}, "test.bin", 100, "CIFAR-100",
       true},
  };
  return all;
}

// Empty when `path` is a regular file (its size in *size), else why not.
std::string regularFileProblem(const std::string& path, int64_t* size = nullptr) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return errno == ENOENT ? "no such file" : std::string("cannot stat: ") + std::strerror(errno);
  if (!S_ISREG(st.st_mode)) return "not a regular file";
  if (size != nullptr) *size = st.st_size;
  return {};
}

bool isFile(const std::string& path) { return regularFileProblem(path).empty(); }
bool isDir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

// The last component of `path`, ignoring trailing slashes.
std::string baseName(const std::string& path) {
  fs::path p(path);
  if (!p.has_filename()) p = p.parent_path();
  return p.filename().string();
}

// `dir` is `layout`'s batches directory: named like it, or holding its files
// (CIFAR-100's python files are called just train and test, so both, or
// one of them and torchvision's meta file, are wanted there).
bool isBatchDir(const std::string& dir, const CifarLayout& layout) {
  if (!isDir(dir)) return false;
  if (baseName(dir) == layout.dirName) return true;
  const std::string d = dir + "/";
  if (layout.format == DataFormat::kCifar100Py) {
    const bool train = isFile(d + "train"), test = isFile(d + "test");
    return (train && test) || ((train || test) && isFile(d + "meta"));
  }
  if (isFile(d + layout.testFile)) return true;
  for (const char* f : layout.trainFiles)
    if (isFile(d + f)) return true;
  return false;
}

std::vector<const CifarLayout*> wantedLayouts(DataFormat wanted) {
  std::vector<const CifarLayout*> out;
  for (const CifarLayout& l : layouts())
    if (wanted == DataFormat::kAuto || wanted == l.format) out.push_back(&l);
  return out;
}

// Reads a whole (size-checked) file into memory.
std::string readWhole(const std::string& path, int64_t size) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) fail(path, std::string("cannot open: ") + std::strerror(errno));
  std::string bytes;
  try {
    bytes.resize(static_cast<size_t>(size));
  } catch (const std::bad_alloc&) {
    fail(path, "out of memory for its " + std::to_string(size) + " bytes");
  }
  const size_t got = std::fread(bytes.data(), 1, bytes.size(), f.get());
  if (got != bytes.size())
    fail(path, "read " + std::to_string(got) + " of its " + std::to_string(size) +
                   " bytes (" + (std::ferror(f.get()) ? std::strerror(errno) : "it shrank") + ")");
  return bytes;
}


// The keys of a dict, for a message about the one that is missing.
std::string keysOf(const PickleDoc& doc, const PickleValue& dict) {
  std::string out;
  size_t shown = 0;
  for (size_t i = 0; i + 1 < dict.items.size(); i += 2) {
    const PickleValue& k = doc.at(dict.items[i]);
    if (k.kind != PickleKind::kStr && k.kind != PickleKind::kBytes) continue;
    if (shown == 8) {
      out += ", ...";
      break;
    }
    out += (shown++ ? ", '" : "'") + str::escape(k.text, 40) + "'";
  }
  return out.empty() ? "none" : out;
}

void reserveMore(Dataset& out, int64_t n, const std::string& file) {
  try {
    out.pixels.reserve(out.pixels.size() + static_cast<size_t>(n * kCifarImageBytes));
    out.labels.reserve(out.labels.size() + static_cast<size_t>(n));
  } catch (const std::bad_alloc&) {
    fail(file, "out of memory for " + std::to_string(n) + " images");
  }
}

// The pixel array of a CIFAR pickle: uint8, N x 3072 (or N x 3 x 32 x 32),
// C order, 1 <= N <= the cap. Returns N.
int64_t checkPixelArray(const PickleArray& a, const std::string& file) {
  if (!a.built) fail(file, "its 'data' array has no contents (no BUILD state)");
  if (a.dtype != "u1" && a.dtype != "|u1" && a.dtype != "uint8")
    fail(file, "its 'data' array has dtype '" + str::escape(a.dtype, 40) + "', expected uint8 ('u1')");
  std::string shape;
  for (int64_t d : a.shape) shape += (shape.empty() ? "" : "x") + std::to_string(d);
  const bool flat = a.shape.size() == 2 && a.shape[1] == kCifarImageBytes;
  const bool planes = a.shape.size() == 4 && a.shape[1] == 3 && a.shape[2] == kCifarSide &&
                      a.shape[3] == kCifarSide;
  if (!flat && !planes)
    fail(file, "its 'data' array is " + (shape.empty() ? std::string("a scalar") : shape) +
                   ", expected N x 3072 (3 planes of 32x32 bytes per image)");
  if (a.fortranOrder && a.shape[0] > 1)
    fail(file, "its 'data' array is in Fortran order, expected C order (one image per row)");
  const int64_t n = a.shape[0];
  if (n < 1) fail(file, "its 'data' array holds no images");
  if (n > kMaxCifarImagesPerFile)
    fail(file, "its 'data' array holds " + std::to_string(n) + " images, more than the " +
                   std::to_string(kMaxCifarImagesPerFile) + " a CIFAR batch file can hold");
  return n;
}

// Checks every label of `list` (n of them, each in [0, numClasses)).
void checkLabels(const PickleDoc& doc, const PickleValue& list, const char* key, int64_t n,
                 int numClasses, const std::string& file) {
  if (list.kind != PickleKind::kList && list.kind != PickleKind::kTuple)
    fail(file, std::string("its '") + key + "' entry is a " + pickleKindName(list.kind) +
                   ", expected a list of ints");
  if (static_cast<int64_t>(list.items.size()) != n)
    fail(file, "holds " + std::to_string(n) + " images but " +
                   std::to_string(list.items.size()) + " '" + key + "'");
  for (size_t i = 0; i < list.items.size(); ++i) {
    const PickleValue& v = doc.at(list.items[i]);
    if (v.kind != PickleKind::kInt)
      fail(file, std::string("'") + key + "' entry " + std::to_string(i) + " is a " +
                     pickleKindName(v.kind) + ", expected an int");
    if (v.integer < 0 || v.integer >= numClasses)
      fail(file, std::string("'") + key + "' entry " + std::to_string(i) + " is " +
                     std::to_string(v.integer) + ", outside [0, " + std::to_string(numClasses) +
                     ")");
  }
}

void checkNumClasses(int numClasses) {
  DDPRUN_CHECK(numClasses == 10 || numClasses == 100, "CIFAR has 10 or 100 classes, not ",
               numClasses);
}

// Record layout of the binary files.
int64_t labelBytes(int numClasses) { return numClasses == 10 ? 1 : 2; }
int64_t recordBytes(int numClasses) { return labelBytes(numClasses) + kCifarImageBytes; }

// The number of records in a binary file of `size` bytes, checked.
int64_t binaryRecordCount(int64_t size, int numClasses, const std::string& file) {
  const int64_t rec = recordBytes(numClasses);
  const std::string what = numClasses == 10 ? "1 label byte + 3072 pixel bytes"
                                            : "coarse and fine label bytes + 3072 pixel bytes";
  if (size == 0) fail(file, "is empty (a CIFAR binary batch holds records of " + what + ")");
  if (size > kMaxCifarImagesPerFile * rec)
    fail(file, "is " + std::to_string(size) + " bytes, more than a CIFAR binary batch can be (" +
                   std::to_string(kMaxCifarImagesPerFile) + " records of " +
                   std::to_string(rec) + " bytes at most); not a CIFAR file?");
  if (size % rec != 0)
    fail(file, "is " + std::to_string(size) + " bytes, not a whole number of " +
                   std::to_string(rec) + "-byte records (" + what + "): truncated, or not " +
                   (numClasses == 10 ? "CIFAR-10's" : "CIFAR-100's") + " binary version");
  return size / rec;
}

// Decodes n records (the first of them record number `first` of the file).
void decodeRecords(const uint8_t* rec, int64_t n, int64_t first, int numClasses,
                   const std::string& file, Dataset& out) {
  const int64_t size = recordBytes(numClasses), lb = labelBytes(numClasses);
  for (int64_t i = 0; i < n; ++i, rec += size) {
    if (numClasses == 100 && rec[0] >= 20)
      fail(file, "record " + std::to_string(first + i) + " has coarse label " +
                     std::to_string(rec[0]) + ", outside [0, 20) (misaligned records?)");
    const int label = rec[lb - 1];
    if (label >= numClasses)
      fail(file, "record " + std::to_string(first + i) + " has label " + std::to_string(label) +
                     ", outside [0, " + std::to_string(numClasses) + ") (misaligned records?)");
    out.labels.push_back(label);
    out.pixels.insert(out.pixels.end(), rec + lb, rec + size);
  }
  out.size += n;
}

int64_t capped(int64_t n, int64_t maxCount) { return maxCount < 0 ? n : std::min(n, maxCount); }

// Reads a binary batch file record by record (no second full-size buffer).
int64_t appendBinaryFile(const std::string& path, int numClasses, int64_t maxCount,
                         Dataset& out) {
  int64_t size = 0;
  if (auto problem = regularFileProblem(path, &size); !problem.empty()) fail(path, problem);
  const int64_t count = binaryRecordCount(size, numClasses, path);
  const int64_t take = capped(count, maxCount);
  reserveMore(out, take, path);
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) fail(path, std::string("cannot open: ") + std::strerror(errno));
  const int64_t rec = recordBytes(numClasses);
  std::vector<uint8_t> buf(static_cast<size_t>(std::min(take, kRecordsPerRead) * rec));
  for (int64_t done = 0; done < take;) {
    const int64_t n = std::min(kRecordsPerRead, take - done);
    const size_t got = std::fread(buf.data(), 1, static_cast<size_t>(n * rec), f.get());
    if (got != static_cast<size_t>(n * rec))
      fail(path, "truncated while reading: record " + std::to_string(done + got / rec) +
                     " of " + std::to_string(count) + " is incomplete");
    decodeRecords(buf.data(), n, done, numClasses, path, out);
    done += n;
  }
  return take;
}

int64_t appendPickleFile(const std::string& path, int numClasses, int64_t maxCount,
                         Dataset& out) {
  int64_t size = 0;
  if (auto problem = regularFileProblem(path, &size); !problem.empty()) fail(path, problem);
  if (size > kMaxCifarPickleBytes)
    fail(path, "is " + std::to_string(size) + " bytes, more than a CIFAR batch pickle can be (" +
                   std::to_string(kMaxCifarPickleBytes) + " at most); not a CIFAR file?");
  const std::string bytes = readWhole(path, size);
  return appendCifarPickle(bytes, numClasses, maxCount, path, out);
}

Dataset emptySet(const CifarLayout& l) {
  Dataset d;
  d.channels = 3;
  d.height = d.width = kCifarSide;
  d.numClasses = l.numClasses;
  const float* mean = l.numClasses == 10 ? kCifarMean : kCifar100Mean;
  const float* std = l.numClasses == 10 ? kCifarStd : kCifar100Std;
  d.mean.assign(mean, mean + 3);
  d.std.assign(std, std + 3);
  return d;
}

// Reads `files` in order into one split, stopping when maxCount is reached.
Dataset readSplit(const CifarLayout& l, const std::string& dir,
                  const std::vector<const char*>& files, int64_t maxCount) {
  Dataset d = emptySet(l);
  for (const char* f : files) {
    const int64_t left = maxCount < 0 ? -1 : maxCount - d.size;
    if (left == 0) break;
    const std::string path = dir + "/" + f;
    if (l.binary) appendBinaryFile(path, l.numClasses, left, d);
    else appendPickleFile(path, l.numClasses, left, d);
  }
  return d;
}

}  // namespace

std::optional<DataFormat> parseDataFormat(const std::string& name) {
  for (DataFormat f : {DataFormat::kAuto, DataFormat::kFashionMnist, DataFormat::kCifar10Py,
                       DataFormat::kCifar100Py, DataFormat::kCifar10Bin, DataFormat::kCifar100Bin,
                       DataFormat::kImageFolder})
    if (name == dataFormatName(f)) return f;
  return std::nullopt;
}

const char* dataFormatName(DataFormat format) {
  switch (format) {
    case DataFormat::kAuto: return "auto";
    case DataFormat::kFashionMnist: return "fashion-mnist";
    case DataFormat::kCifar10Py: return "cifar10";
    case DataFormat::kCifar100Py: return "cifar100";
    case DataFormat::kCifar10Bin: return "cifar10-bin";
    case DataFormat::kCifar100Bin: return "cifar100-bin";
    case DataFormat::kImageFolder: return "image-folder";
  }
  return "?";
}

const CifarLayout& cifarLayout(DataFormat format) {
  for (const CifarLayout& l : layouts())
    if (l.format == format) return l;
  DDPRUN_THROW(InvalidArgument, "no CIFAR layout for data format ", dataFormatName(format));
}

std::optional<CifarLocation> findCifar(const std::string& path, DataFormat wanted) {
  const std::vector<const CifarLayout*> candidates = wantedLayouts(wanted);
  std::vector<CifarLocation> found;
  for (const CifarLayout* l : candidates)
    if (isBatchDir(path, *l)) found.push_back({l->format, path});
  if (found.empty()) {
    for (const CifarLayout* l : candidates) {
      const std::string sub = path + "/" + l->dirName;
      if (isDir(sub)) found.push_back({l->format, sub});
    }
  }
  if (found.empty()) return std::nullopt;
  // The python version before the binary one of the same set (layouts()'s
  // order); two different sets are ambiguous.
  const CifarLocation& first = found.front();
  for (const CifarLocation& other : found) {
    if (cifarLayout(other.format).numClasses != cifarLayout(first.format).numClasses) {
      DDPRUN_THROW(DataError, "--data ", path, " holds both ", cifarLayout(first.format).setName,
                   " (", first.dir, ") and ", cifarLayout(other.format).setName, " (", other.dir,
                   "): name the one to train on with --data <its directory>");
    }
  }
  return first;
}

std::string cifarPlacesLookedFor(const std::string& path, DataFormat wanted) {
  std::string subs, files;
  for (const CifarLayout* l : wantedLayouts(wanted)) {
    subs += (subs.empty() ? "" : ", ") + path + "/" + l->dirName + "/";
    files += (files.empty() ? "" : ", ") + std::string(l->trainFiles.front()) + "..." +
             l->testFile;
  }
  return subs + ", or their batch files (" + files + ") in " + path + " itself";
}

DataSplit loadCifar(const CifarLocation& loc, int64_t maxTrain, int64_t maxTest) {
  const CifarLayout& l = cifarLayout(loc.format);
  std::vector<std::string> missing;
  std::vector<const char*> all = l.trainFiles;
  all.push_back(l.testFile);
  for (const char* f : all) {
    const std::string path = loc.dir + "/" + f;
    if (auto problem = regularFileProblem(path); !problem.empty())
      missing.push_back(path + " (" + problem + ")");
  }
  if (!missing.empty()) {
    std::string list;
    for (const std::string& m : missing) list += (list.empty() ? "" : ", ") + m;
    DDPRUN_THROW(DataError, loc.dir, ": ", l.setName, " (", dataFormatName(loc.format),
                 ") batch files missing: ", list, "; ", kCifarHint);
  }
  DataSplit s;
  s.train = readSplit(l, loc.dir, l.trainFiles, maxTrain);
  s.test = readSplit(l, loc.dir, {l.testFile}, maxTest);
  s.source = std::string(l.setName) + " (" + loc.dir + ")";
  return s;
}

int64_t appendCifarPickle(std::string_view bytes, int numClasses, int64_t maxCount,
                          const std::string& file, Dataset& out) {
  checkNumClasses(numClasses);
  const PickleResult r = parsePickle(bytes);
  if (!r.ok) fail(file, "not a readable CIFAR pickle: " + r.error);
  const PickleDoc& doc = r.doc;
  const PickleValue& root = doc.at(doc.root);
  if (root.kind != PickleKind::kDict)
    fail(file, std::string("holds a ") + pickleKindName(root.kind) +
                   ", expected the dict of a CIFAR batch");
  const char* labelKey = numClasses == 10 ? "labels" : "fine_labels";
  const PickleValue* data = doc.dictGet(root, "data");
  const PickleValue* labels = doc.dictGet(root, labelKey);
  if (data == nullptr || labels == nullptr)
    fail(file, std::string("has no '") + (data == nullptr ? "data" : labelKey) +
                   "' entry (its keys: " + keysOf(doc, root) + ")" +
                   (numClasses == 10 && doc.dictGet(root, "fine_labels") != nullptr
                        ? "; this is a CIFAR-100 file"
                        : numClasses == 100 && doc.dictGet(root, "labels") != nullptr
                              ? "; this is a CIFAR-10 file"
                              : ""));
  if (data->kind != PickleKind::kNdarray)
    fail(file, std::string("its 'data' entry is a ") + pickleKindName(data->kind) +
                   ", expected a numpy uint8 array");
  const PickleArray& a = doc.arrays[static_cast<size_t>(data->integer)];
  const int64_t n = checkPixelArray(a, file);
  checkLabels(doc, *labels, labelKey, n, numClasses, file);
  const int64_t take = capped(n, maxCount);
  reserveMore(out, take, file);
  const auto* px = reinterpret_cast<const uint8_t*>(a.data.data());
  out.pixels.insert(out.pixels.end(), px, px + take * kCifarImageBytes);
  for (int64_t i = 0; i < take; ++i)
    out.labels.push_back(static_cast<int32_t>(doc.at(labels->items[static_cast<size_t>(i)]).integer));
  out.size += take;
  return take;
}

int64_t appendCifarBinary(std::string_view bytes, int numClasses, int64_t maxCount,
                          const std::string& file, Dataset& out) {
  checkNumClasses(numClasses);
  const int64_t count = binaryRecordCount(static_cast<int64_t>(bytes.size()), numClasses, file);
  const int64_t take = capped(count, maxCount);
  reserveMore(out, take, file);
  decodeRecords(reinterpret_cast<const uint8_t*>(bytes.data()), take, 0, numClasses, file, out);
  return take;
}

}  // namespace ddprun::train
