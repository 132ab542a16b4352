#include "ddprun/train/data.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <new>

#include "work_pool.h"

namespace ddprun::train {

namespace {

constexpr int kImageSide = 28;
constexpr int64_t kImageBytes = int64_t{kImageSide} * kImageSide;
constexpr int kNumClasses = 10;
// How much larger than its file a sample section may be. Deflate could
// expand up to about 1032:1, but image and label files compress far less
// (Fashion-MNIST 1.8:1, MNIST 4.8:1), so a header claiming more than 64 times
// the file's size (plus 1 MiB for tiny files) is refused before anything is
// allocated: a small file must not cost gigabytes per rank. A genuine set
// that compresses better can be given uncompressed (plain IDX files are read
// too, and for them the bound is the file itself).
constexpr int64_t kMaxInflateRatio = 64;
constexpr int64_t kInflateSlack = int64_t{1} << 20;
// Pixels are read in pieces this large into memory reserved once for the
// whole (bounded) section: no regrowth copy, no second full-size buffer.
constexpr int64_t kReadChunk = int64_t{1} << 20;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  DDPRUN_THROW(DataError, path, ": ", what, "; ", kDataHint);
}

// Empty when `path` is a regular file (its size in *size), else why not.
std::string regularFileProblem(const std::string& path, int64_t* size = nullptr) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return errno == ENOENT ? "no such file"
                           : std::string("cannot stat: ") + std::strerror(errno);
  if (!S_ISREG(st.st_mode)) return "not a regular file";
  if (size != nullptr) *size = st.st_size;
  return {};
}

// A gzip (or plain: zlib reads those transparently) file opened for reading.
class GzReader {
 public:
  explicit GzReader(std::string path) : path_(std::move(path)) {
    if (auto problem = regularFileProblem(path_, &fileBytes_); !problem.empty())
      fail(path_, problem);
    file_ = gzopen(path_.c_str(), "rb");
    if (file_ == nullptr)
      fail(path_, std::string("cannot open: ") + std::strerror(errno));
  }
  ~GzReader() { gzclose(file_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  const std::string& path() const { return path_; }
  int64_t fileBytes() const { return fileBytes_; }

  // Reads up to n bytes; returns how many arrived (fewer only at end of data).
  int64_t read(void* dst, int64_t n) {
    auto* out = static_cast<char*>(dst);
    int64_t done = 0;
    while (done < n) {
      auto want = static_cast<unsigned>(std::min<int64_t>(n - done, int64_t{1} << 30));
      int got = gzread(file_, out + done, want);
      if (got < 0)
        fail(path_, "corrupt or truncated gzip data (zlib: " + zlibError() + ")");
      if (got == 0) break;
      done += got;
    }
    return done;
  }

  // Reads exactly n bytes of `what`, or throws naming the truncation.
  void readExact(void* dst, int64_t n, const std::string& what) {
    int64_t got = read(dst, n);
    if (got != n) {
      fail(path_, "truncated: " + what + " needs " + std::to_string(n) +
                      " bytes, the file ends after " + std::to_string(got));
    }
  }

  uint32_t readBigEndianU32(const std::string& what) {
    std::array<unsigned char, 4> b{};
    readExact(b.data(), 4, what);
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
  }

  bool atEnd() {
    char c = 0;
    return read(&c, 1) == 0;
  }

 private:
  std::string zlibError() {
    int code = Z_OK;
    const char* msg = gzerror(file_, &code);
    return msg != nullptr ? msg : "unknown error";
  }

  std::string path_;
  int64_t fileBytes_ = 0;
  gzFile file_ = nullptr;
};

// Refuses a header count before anything is allocated for it.
void checkCount(const GzReader& in, int64_t count, int64_t itemBytes,
                int64_t headerBytes) {
  if (count > kMaxIdxSamples) {
    fail(in.path(), "header claims " + std::to_string(count) +
                        " samples, more than the limit of " +
                        std::to_string(kMaxIdxSamples) + " (corrupt header?)");
  }
  const int64_t need = headerBytes + count * itemBytes;
  const int64_t canHold = in.fileBytes() * kMaxInflateRatio + kInflateSlack;
  if (need > canHold) {
    fail(in.path(), "header claims " + std::to_string(count) + " samples (" +
                        std::to_string(need) + " bytes uncompressed), more than a " +
                        std::to_string(in.fileBytes()) +
                        "-byte file can hold at a plausible compression ratio (" +
                        std::to_string(canHold) +
                        " bytes at most; corrupt header? a "
                        "genuine file that compresses better can be given uncompressed)");
  }
}

// Reads n items of itemBytes each (n * itemBytes was bounded by checkCount).
std::vector<uint8_t> readItems(GzReader& in, int64_t n, int64_t itemBytes,
                               int64_t declared) {
  const int64_t total = n * itemBytes;
  std::vector<uint8_t> out;
  try {
    out.reserve(static_cast<size_t>(total));
  } catch (const std::bad_alloc&) {
    fail(in.path(), "out of memory for " + std::to_string(n) + " samples (" +
                        std::to_string(total) + " bytes)");
  }
  while (static_cast<int64_t>(out.size()) < total) {
    int64_t have = static_cast<int64_t>(out.size());
    int64_t step = std::min(kReadChunk, total - have);
    out.resize(have + step);
    int64_t got = in.read(out.data() + have, step);
    if (got != step) {
      fail(in.path(), "truncated: the header declares " + std::to_string(declared) +
                          " samples, the data ends after " +
                          std::to_string((have + got) / itemBytes));
    }
  }
  if (n == declared && !in.atEnd()) {
    fail(in.path(), "unexpected data after the " + std::to_string(declared) +
                        " samples the header declares");
  }
  return out;
}

void checkMagic(GzReader& in, uint32_t want, const char* kind) {
  uint32_t magic = in.readBigEndianU32("the magic number");
  if (magic != want) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "bad magic number 0x%08x (IDX %s have 0x%08x)", magic,
                  kind, want);
    fail(in.path(), buf);
  }
}

// Reads and checks an images header; returns its sample count.
int64_t readImagesHeader(GzReader& in) {
  checkMagic(in, kIdxImagesMagic, "images");
  int64_t count = in.readBigEndianU32("the image count");
  uint32_t rows = in.readBigEndianU32("the row count");
  uint32_t cols = in.readBigEndianU32("the column count");
  if (rows != kImageSide || cols != kImageSide) {
    fail(in.path(), "images are " + std::to_string(rows) + "x" + std::to_string(cols) +
                        ", expected 28x28");
  }
  checkCount(in, count, kImageBytes, 16);
  return count;
}

// Reads and checks a labels header; returns its sample count.
int64_t readLabelsHeader(GzReader& in) {
  checkMagic(in, kIdxLabelsMagic, "labels");
  int64_t count = in.readBigEndianU32("the label count");
  checkCount(in, count, 1, 8);
  return count;
}

// The same float32 operations, in the same order, as ToTensor (p / 255)
// followed by Normalize ((x - mean) / std). Not folded into one multiply:
// that would round differently.
float normalised(uint8_t p, float mean, float std) {
  const float x = static_cast<float>(p) / 255.0f;
  return (x - mean) / std;
}

// Lookup tables of the 256 normalised values, one per channel.
std::vector<std::array<float, 256>> pixelTables(const Dataset& d) {
  DDPRUN_CHECK(d.mean.size() == static_cast<size_t>(d.channels) &&
                   d.std.size() == static_cast<size_t>(d.channels),
               "a dataset of ", d.channels, " channels needs as many means and stds");
  std::vector<std::array<float, 256>> t(static_cast<size_t>(d.channels));
  for (int c = 0; c < d.channels; ++c)
    for (int p = 0; p < 256; ++p)
      t[c][p] = normalised(static_cast<uint8_t>(p), d.mean[c], d.std[c]);
  return t;
}

// splitmix64: small, fast and good enough for synthetic images and shuffles.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound) by multiply-high (platform independent).
  uint64_t below(uint64_t bound) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * bound) >> 64);
  }

 private:
  uint64_t state_;
};

// Synthetic classes: a 7x7 grid of 4x4-pixel cells, about half of them lit
// with a random intensity, the rest dark. Fixed by the seed alone.
constexpr int kCellsPerSide = 7;
constexpr int kCellSide = kImageSide / kCellsPerSide;
using Prototype = std::array<uint8_t, kImageBytes>;

std::array<Prototype, kNumClasses> makePrototypes(Rng& rng) {
  std::array<Prototype, kNumClasses> protos{};
  for (auto& proto : protos) {
    for (int cy = 0; cy < kCellsPerSide; ++cy) {
      for (int cx = 0; cx < kCellsPerSide; ++cx) {
        uint64_t r = rng.next();
        auto v = static_cast<uint8_t>((r & 1) ? 96 + (r >> 8) % 160 : 0);
        for (int y = 0; y < kCellSide; ++y)
          for (int x = 0; x < kCellSide; ++x)
            proto[(cy * kCellSide + y) * kImageSide + cx * kCellSide + x] = v;
      }
    }
  }
  return protos;
}

// One sample: contrast in [1/2, 1] times the prototype plus noise in
// [-80, 80], clamped to a byte. Integer arithmetic only, so the bytes are the
// same on every platform; the noise bytes come first so the pixel loop
// vectorises.
void renderSample(const Prototype& proto, Rng& rng, uint8_t* out) {
  const auto contrast = static_cast<int>(128 + rng.below(129));
  std::array<uint8_t, kImageBytes> noise;
  static_assert(kImageBytes % 8 == 0);
  for (int64_t i = 0; i < kImageBytes; i += 8) {
    uint64_t r = rng.next();
    for (int k = 0; k < 8; ++k) noise[i + k] = static_cast<uint8_t>(r >> (8 * k));
  }
  for (int64_t i = 0; i < kImageBytes; ++i) {
    int v = (proto[i] * contrast >> 8) + (noise[i] * 161 >> 8) - 80;
    out[i] = static_cast<uint8_t>(std::clamp(v, 0, 255));
  }
}

// Mislabelled training samples: one in kMislabelledOneIn shows another
// class's pattern than its label says. Without them the set is separable by
// a wide margin (nearest class mean alone classifies every sample), so the
// training loss reaches 0 within ~40 steps; cross-entropy then has no finite
// minimum and only grows the logits, until at the default lr 0.05 with
// momentum 0.9 one step on a rare sample kills LeNet's ReLUs (loss back to
// ln 10, accuracy 0.1). With them, as in real data sets, the loss has a floor
// (0.31, the entropy of the label given the pattern) and the logits stay
// bounded. The test split is clean.
constexpr uint64_t kMislabelledOneIn = 20;
constexpr uint64_t kOtherClasses = kNumClasses - 1;

// The class whose pattern a training sample labelled `label` shows: one draw
// v = below(20 * 9) from the split's mislabel stream; v < 9 gives class
// (label + 1 + v) % 10 (each other class alike), else `label` itself.
int32_t shownClass(int32_t label, Rng& mislabel) {
  const uint64_t v = mislabel.below(kMislabelledOneIn * kOtherClasses);
  return v < kOtherClasses ? static_cast<int32_t>((label + 1 + v) % kNumClasses) : label;
}

// `mislabel`: the training split's stream (one draw per sample); null for
// the test split.
Dataset makeSyntheticSet(const std::array<Prototype, kNumClasses>& protos, int64_t size,
                         Rng& rng, Rng* mislabel) {
  Dataset d;
  d.size = size;
  d.labels.resize(size);
  for (int64_t i = 0; i < size; ++i) d.labels[i] = static_cast<int32_t>(i % kNumClasses);
  for (int64_t i = size - 1; i > 0; --i)
    std::swap(d.labels[i], d.labels[rng.below(static_cast<uint64_t>(i) + 1)]);
  d.pixels.resize(size * kImageBytes);
  for (int64_t i = 0; i < size; ++i) {
    const int32_t shown = mislabel ? shownClass(d.labels[i], *mislabel) : d.labels[i];
    renderSample(protos[shown], rng, d.pixels.data() + i * kImageBytes);
  }
  return d;
}

}  // namespace

int64_t Dataset::sampleElems() const { return int64_t{channels} * height * width; }

float normalisePixel(uint8_t p) {
  return normalised(p, kFashionMnistMean, kFashionMnistStd);
}

bool fashionMnistPresent(const std::string& dir) { return missingFashionMnistFiles(dir).empty(); }

std::vector<std::string> missingFashionMnistFiles(const std::string& dir) {
  std::vector<std::string> missing;
  for (const char* f :
       {kTrainImagesFile, kTrainLabelsFile, kTestImagesFile, kTestLabelsFile}) {
    const std::string path = dir + "/" + f;
    if (const std::string why = regularFileProblem(path); !why.empty())
      missing.push_back(path + " (" + why + ")");
  }
  return missing;
}

Dataset loadIdxPair(const std::string& imagesPath, const std::string& labelsPath,
                    int64_t maxCount) {
  DDPRUN_CHECK(maxCount >= -1, "maxCount is ", maxCount, " (use -1 for all)");
  GzReader images(imagesPath);
  GzReader labels(labelsPath);
  int64_t count = readImagesHeader(images);
  int64_t labelCount = readLabelsHeader(labels);
  if (count != labelCount) {
    fail(labelsPath, "holds " + std::to_string(labelCount) + " labels but " + imagesPath +
                         " holds " + std::to_string(count) + " images");
  }
  int64_t n = maxCount < 0 ? count : std::min(count, maxCount);

  Dataset d;
  d.size = n;
  std::vector<uint8_t> lab = readItems(labels, n, 1, count);
  d.labels.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    if (lab[i] >= kNumClasses) {
      fail(labelsPath, "label " + std::to_string(i) + " is " + std::to_string(lab[i]) +
                           ", outside [0, 10)");
    }
    d.labels[i] = lab[i];
  }
  d.pixels = readItems(images, n, kImageBytes, count);  // moved, not copied
  return d;
}

DataSplit loadFashionMnist(const std::string& dir, int64_t maxTrain, int64_t maxTest) {
  DataSplit s;
  s.train =
      loadIdxPair(dir + "/" + kTrainImagesFile, dir + "/" + kTrainLabelsFile, maxTrain);
  s.test = loadIdxPair(dir + "/" + kTestImagesFile, dir + "/" + kTestLabelsFile, maxTest);
  s.source = "Fashion-MNIST (" + dir + ")";
  return s;
}

namespace {

// The CIFAR-shaped set (see makeSyntheticCifar in data.h). Everything is
// splitmix64 with integer arithmetic, so the bytes are the same on every
// platform and tests/interop/synthetic_cifar.py reproduces them.
constexpr int kCifarSide = 32, kCifarChannels = 3, kCifarClasses = 10;
constexpr int kCifarCell = 4, kCifarCells = kCifarSide / kCifarCell;
constexpr int64_t kCifarPlane = int64_t{kCifarSide} * kCifarSide;
constexpr int64_t kCifarBytes = kCifarChannels * kCifarPlane;
// Draws per sample: the contrast, then 8 noise bytes per draw.
constexpr uint64_t kCifarDraws = 1 + kCifarBytes / 8;
constexpr uint64_t kSplitmixGamma = 0x9E3779B97F4A7C15ull;
using CifarPrototype = std::array<uint8_t, kCifarBytes>;

// Class k: for each channel, then each cell in row-major order, one draw r:
// the cell is lit at 64 + (r >> 8) % 192 when r is odd, else dark (0).
std::shared_ptr<const std::vector<CifarPrototype>> cifarPrototypes(uint64_t seed) {
  Rng rng(seed);
  auto protos = std::make_shared<std::vector<CifarPrototype>>(kCifarClasses);
  for (auto& proto : *protos)
    for (int c = 0; c < kCifarChannels; ++c)
      for (int cy = 0; cy < kCifarCells; ++cy)
        for (int cx = 0; cx < kCifarCells; ++cx) {
          const uint64_t r = rng.next();
          const auto v = static_cast<uint8_t>((r & 1) ? 64 + (r >> 8) % 192 : 0);
          for (int y = 0; y < kCifarCell; ++y)
            for (int x = 0; x < kCifarCell; ++x)
              proto[c * kCifarPlane + (cy * kCifarCell + y) * kCifarSide +
                    cx * kCifarCell + x] = v;
        }
  return protos;
}

// Sample i of a split draws from the split's pixel stream starting at draw
// i * kCifarDraws (splitmix64 jumps there by adding to its state): contrast
// 128 + below(129), then noise bytes (little-endian within each draw);
// pixel = clamp((proto * contrast >> 8) + (noise * 161 >> 8) - 80, 0, 255).
void renderCifar(const CifarPrototype& proto, uint64_t streamState, int64_t i,
                 uint8_t* out) {
  Rng rng(streamState + static_cast<uint64_t>(i) * kCifarDraws * kSplitmixGamma);
  const auto contrast = static_cast<int>(128 + rng.below(129));
  for (int64_t q = 0; q < kCifarBytes; q += 8) {
    const uint64_t r = rng.next();
    for (int k = 0; k < 8; ++k) {
      const int noise = static_cast<uint8_t>(r >> (8 * k));
      const int v = (proto[q + k] * contrast >> 8) + (noise * 161 >> 8) - 80;
      out[q + k] = static_cast<uint8_t>(std::clamp(v, 0, 255));
    }
  }
}

// Labels in blocks of `classes`: each block a Fisher-Yates shuffle of
// 0..classes-1 (from the last position down, j = below(pos + 1)), drawn in
// order from the split's label stream.
std::vector<int32_t> cifarLabels(int64_t size, int classes, Rng& rng) {
  std::vector<int32_t> labels(static_cast<size_t>(size));
  std::vector<int32_t> block(static_cast<size_t>(classes));
  for (int64_t at = 0; at < size; at += classes) {
    for (int k = 0; k < classes; ++k) block[k] = k;
    for (int k = classes - 1; k > 0; --k)
      std::swap(block[k], block[rng.below(static_cast<uint64_t>(k) + 1)]);
    for (int k = 0; k < classes && at + k < size; ++k) labels[at + k] = block[k];
  }
  return labels;
}

Dataset makeCifarSet(std::shared_ptr<const std::vector<CifarPrototype>> protos,
                     int64_t size, int classes, uint64_t splitSeed) {
  Dataset d;
  d.size = size;
  d.channels = kCifarChannels;
  d.height = d.width = kCifarSide;
  d.numClasses = classes;
  d.mean.assign(kCifarMean, kCifarMean + kCifarChannels);
  d.std.assign(kCifarStd, kCifarStd + kCifarChannels);
  Rng labelRng(splitSeed);
  d.labels = cifarLabels(size, classes, labelRng);
  const uint64_t stream = ~splitSeed;  // the pixel stream's state before draw 0
  auto labels = std::make_shared<const std::vector<int32_t>>(d.labels);
  d.render = [protos, labels, stream](int64_t i, uint8_t* out) {
    renderCifar((*protos)[(*labels)[i]], stream, i, out);
  };
  return d;
}

}  // namespace

DataSplit makeSyntheticCifar(int64_t trainSize, int64_t testSize, int numClasses,
                             uint64_t seed) {
  DDPRUN_CHECK(trainSize >= 0 && testSize >= 0, "sizes ", trainSize, ", ", testSize);
  DDPRUN_CHECK(trainSize <= kMaxIdxSamples && testSize <= kMaxIdxSamples, "at most ",
               kMaxIdxSamples, " samples per split");
  DDPRUN_CHECK(numClasses >= 2 && numClasses <= kCifarClasses,
               "the synthetic CIFAR set has 2 to ", kCifarClasses, " classes (got ",
               numClasses, ")");
  auto protos = cifarPrototypes(seed);
  DataSplit s;
  s.train = makeCifarSet(protos, trainSize, numClasses, seed ^ 0x747261696E000000ull);
  s.test = makeCifarSet(protos, testSize, numClasses, seed ^ 0x7465737400000000ull);
  s.source = kSyntheticCifar;
  return s;
}

DataSplit makeSynthetic(int64_t trainSize, int64_t testSize, uint64_t seed) {
  DDPRUN_CHECK(trainSize >= 0 && testSize >= 0, "sizes ", trainSize, ", ", testSize);
  DDPRUN_CHECK(trainSize <= kMaxIdxSamples && testSize <= kMaxIdxSamples, "at most ",
               kMaxIdxSamples, " samples per split");
  Rng protoRng(seed);
  auto protos = makePrototypes(protoRng);
  // Independent streams for the two splits, both derived from the seed.
  Rng trainRng(seed ^ 0x747261696E000000ull);     // "train"
  Rng testRng(seed ^ 0x7465737400000000ull);      // "test"
  Rng mislabelRng(seed ^ 0x6D69736C6162656Cull);  // "mislabel"
  DataSplit s;
  s.train = makeSyntheticSet(protos, trainSize, trainRng, &mislabelRng);
  s.test = makeSyntheticSet(protos, testSize, testRng, nullptr);
  s.source = "synthetic";
  return s;
}

void gatherBatch(const Dataset& d, const int64_t* idx, size_t n, float* x, int32_t* y) {
  gatherBatch(d, idx, n, x, y, SampleTransform{}, nullptr);
}

namespace {

// Two sample-sized buffers a thread transforms its samples in.
struct SampleScratch {
  explicit SampleScratch(size_t elems) : a(elems), b(elems) {}
  std::vector<uint8_t> a, b;
};

// Sample j's pixels as the batch takes them (d's channels x height x width),
// transformed by `t`: in `s`'s buffers, or the stored bytes themselves.
const uint8_t* samplePixels(const Dataset& d, int64_t j, const SampleTransform& t,
                            SampleScratch& s) {
  ImageU8 file;
  ImageView src{nullptr, d.channels, d.height, d.width};
  if (d.load) {
    file = d.load(j);
    src = file.view();
  } else if (d.render) {
    d.render(j, s.a.data());
    src.px = s.a.data();
  } else {
    src.px = d.pixels.data() + j * d.sampleElems();
  }
  SampleRng rng(t.seed, t.epoch, j);
  uint8_t* dst = src.px == s.a.data() ? s.b.data() : s.a.data();
  if (t.augment == Augment::kRandomResizedCrop) {
    // RandomResizedCrop to the batch's size (from the decoded file itself) + flip.
    augment(t.augment, src, rng, {.outH = d.height, .outW = d.width}, dst);
    return dst;
  }
  if (d.load) {  // a file of its own size: its centre crop, resized
    resizedCrop(src, centreCropBox(src.h, src.w, d.height, d.width), d.height, d.width, dst);
    src = {dst, d.channels, d.height, d.width};
    dst = dst == s.a.data() ? s.b.data() : s.a.data();
  }
  if (t.augment == Augment::kNone) return src.px;
  augment(t.augment, src, rng, {.pad = kCropFlipPad}, dst);
  return dst;
}

}  // namespace

CropBox centreCropBox(int h, int w, int outH, int outW, double fraction) {
  DDPRUN_CHECK(h >= 1 && w >= 1 && outH >= 1 && outW >= 1 && fraction > 0 && fraction <= 1,
               "centreCropBox: bad sizes");
  // The largest box of outH:outW's aspect inside h x w, scaled by fraction.
  double bh = h, bw = static_cast<double>(h) * outW / outH;
  if (bw > w) {
    bw = w;
    bh = static_cast<double>(w) * outH / outW;
  }
  const int ch = std::clamp(static_cast<int>(std::nearbyint(bh * fraction)), 1, h);
  const int cw = std::clamp(static_cast<int>(std::nearbyint(bw * fraction)), 1, w);
  // torchvision's CenterCrop: top = round((h - ch) / 2), half to even.
  return {.top = static_cast<int>(std::nearbyint((h - ch) / 2.0)),
          .left = static_cast<int>(std::nearbyint((w - cw) / 2.0)),
          .height = ch,
          .width = cw};
}

void gatherBatch(const Dataset& d, const int64_t* idx, size_t n, float* x, int32_t* y,
                 const SampleTransform& t, WorkPool* pool) {
  if (n == 0) return;
  const int64_t elems = d.sampleElems(), plane = int64_t{d.height} * d.width;
  for (size_t i = 0; i < n; ++i)
    DDPRUN_CHECK(idx[i] >= 0 && idx[i] < d.size, "sample index ", idx[i], " outside [0, ",
                 d.size, ")");
  const auto tables = pixelTables(d);
  // Samples [begin, end): each written to its own slot, whichever thread.
  auto gather = [&](size_t begin, size_t end) {
    SampleScratch scratch(static_cast<size_t>(elems));
    for (size_t i = begin; i < end; ++i) {
      const int64_t j = idx[i];
      const uint8_t* px = samplePixels(d, j, t, scratch);
      float* out = x + i * elems;
      for (int c = 0; c < d.channels; ++c) {
        const auto& tab = tables[c];
        for (int64_t q = c * plane; q < (c + 1) * plane; ++q) out[q] = tab[px[q]];
      }
      y[i] = d.labels[j];
    }
  };
  if (pool) pool->run(n, gather);
  else gather(0, n);
}

}  // namespace ddprun::train
