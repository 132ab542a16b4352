#include "temp_dir.h"
#include "ddprun/train/data.h"
#include "ddprun/train/data_choice.h"
#include "ddprun/train/transforms.h"
#include "work_pool.h"

#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

namespace ddprun::train {
namespace {

using ddprun::testing::TempDir;

using Bytes = std::vector<uint8_t>;

uint32_t crc32(const Bytes& data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (uint8_t b : data) {
    crc ^= b;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

void putLe(Bytes& out, uint32_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// A gzip member holding `data` in stored (uncompressed) deflate blocks: a
// valid .gz that zlib reads, built without depending on zlib in the test.
Bytes gzipStored(const Bytes& data) {
  Bytes out = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff};
  size_t pos = 0;
  do {
    size_t len = std::min<size_t>(data.size() - pos, 65535);
    bool last = pos + len == data.size();
    out.push_back(last ? 1 : 0);
    putLe(out, static_cast<uint32_t>(len), 2);
    putLe(out, static_cast<uint32_t>(~len & 0xFFFF), 2);
    out.insert(out.end(), data.begin() + pos, data.begin() + pos + len);
    pos += len;
  } while (pos < data.size());
  putLe(out, crc32(data), 4);
  putLe(out, static_cast<uint32_t>(data.size()), 4);
  return out;
}

void putBe(Bytes& out, uint32_t v) {
  for (int i = 3; i >= 0; --i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

Bytes idxImages(uint32_t count, const Bytes& pixels, uint32_t magic = kIdxImagesMagic,
                uint32_t rows = 28, uint32_t cols = 28) {
  Bytes out;
  putBe(out, magic);
  putBe(out, count);
  putBe(out, rows);
  putBe(out, cols);
  out.insert(out.end(), pixels.begin(), pixels.end());
  return out;
}

Bytes idxLabels(uint32_t count, const Bytes& labels, uint32_t magic = kIdxLabelsMagic) {
  Bytes out;
  putBe(out, magic);
  putBe(out, count);
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

void writeFile(const std::string& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()),
          static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

// Sample i has every pixel equal to (i * 37 + pixel) % 256; label i % 10.
Bytes samplePixels(int n) {
  Bytes px(static_cast<size_t>(n) * 784);
  for (int i = 0; i < n; ++i)
    for (int p = 0; p < 784; ++p)
      px[i * 784 + p] = static_cast<uint8_t>((i * 37 + p) % 256);
  return px;
}
Bytes sampleLabels(int n) {
  Bytes l(n);
  for (int i = 0; i < n; ++i) l[i] = static_cast<uint8_t>(i % 10);
  return l;
}

// Writes the four Fashion-MNIST files (train: n samples, test: m) into dir.
void writeFashionDir(const TempDir& dir, int n, int m) {
  writeFile(dir.file(kTrainImagesFile), gzipStored(idxImages(n, samplePixels(n))));
  writeFile(dir.file(kTrainLabelsFile), gzipStored(idxLabels(n, sampleLabels(n))));
  writeFile(dir.file(kTestImagesFile), gzipStored(idxImages(m, samplePixels(m))));
  writeFile(dir.file(kTestLabelsFile), gzipStored(idxLabels(m, sampleLabels(m))));
}

// Runs f, expecting a DataError whose message contains every one of `parts`.
template <typename F>
void expectDataError(F f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no DataError thrown";
  } catch (const DataError& e) {
    std::string msg = e.message();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << msg << "\nlacks: " << p;
    EXPECT_NE(msg.find("scripts/setup.sh"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--data synthetic"), std::string::npos) << msg;
  }
}

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

// Every sample of `d`, in order, as gatherBatch hands them to the trainer.
std::vector<float> gatherAll(const Dataset& d) {
  std::vector<int64_t> idx(d.size);
  std::iota(idx.begin(), idx.end(), int64_t{0});
  std::vector<float> x(d.size * d.sampleElems());
  std::vector<int32_t> y(d.size);
  gatherBatch(d, idx.data(), idx.size(), x.data(), y.data());
  EXPECT_EQ(y, d.labels);
  return x;
}

TEST(DataTest, NormalisationMatchesPyTorchBitForBit) {
  // Values printed by PyTorch 1.13: t.to(float32).div(255).sub(0.2860).div(0.3530).
  const std::vector<std::pair<int, uint32_t>> expected = {
      {0, 0xbf4f6929},   {1, 0xbf4c911b},   {2, 0xbf49b90c},   {77, 0x3d393308},
      {128, 0x3f1c9e13}, {200, 0x3fb4b111}, {254, 0x4000bd4c}, {255, 0x4001734f}};
  for (auto [p, want] : expected)
    EXPECT_EQ(bits(normalisePixel(static_cast<uint8_t>(p))), want) << "pixel " << p;
}

TEST(DataTest, LoadsValidGzipIdx) {
  TempDir dir;
  writeFile(dir.file("img.gz"), gzipStored(idxImages(5, samplePixels(5))));
  writeFile(dir.file("lab.gz"), gzipStored(idxLabels(5, sampleLabels(5))));
  Dataset d = loadIdxPair(dir.file("img.gz"), dir.file("lab.gz"));
  ASSERT_EQ(d.size, 5);
  EXPECT_EQ(d.sampleElems(), 784);
  ASSERT_EQ(d.pixels.size(), 5u * 784);
  ASSERT_EQ(d.labels.size(), 5u);
  Bytes px = samplePixels(5);
  EXPECT_EQ(d.pixels, px);  // the raw bytes of the file
  std::vector<float> x = gatherAll(d);
  ASSERT_EQ(x.size(), px.size());
  for (size_t i = 0; i < px.size(); ++i)
    ASSERT_EQ(bits(x[i]), bits(normalisePixel(px[i]))) << i;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(d.labels[i], i % 10);
}

TEST(DataTest, MaxCountReadsAPrefix) {
  TempDir dir;
  writeFile(dir.file("img.gz"), gzipStored(idxImages(7, samplePixels(7))));
  writeFile(dir.file("lab.gz"), gzipStored(idxLabels(7, sampleLabels(7))));
  Dataset d = loadIdxPair(dir.file("img.gz"), dir.file("lab.gz"), 3);
  EXPECT_EQ(d.size, 3);
  EXPECT_EQ(d.pixels.size(), 3u * 784);
  Bytes px = samplePixels(7);
  EXPECT_EQ(d.pixels, Bytes(px.begin(), px.begin() + 3 * 784));
  EXPECT_EQ(d.labels, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(loadIdxPair(dir.file("img.gz"), dir.file("lab.gz"), 100).size, 7);
  EXPECT_EQ(loadIdxPair(dir.file("img.gz"), dir.file("lab.gz"), 0).size, 0);
  EXPECT_THROW(loadIdxPair(dir.file("img.gz"), dir.file("lab.gz"), -2), InvalidArgument);
}

TEST(DataTest, ReadsPlainUncompressedIdxToo) {
  TempDir dir;
  writeFile(dir.file("img"), idxImages(2, samplePixels(2)));
  writeFile(dir.file("lab"), idxLabels(2, sampleLabels(2)));
  EXPECT_EQ(loadIdxPair(dir.file("img"), dir.file("lab")).size, 2);
}

TEST(DataTest, FashionMnistDirectory) {
  TempDir dir;
  EXPECT_FALSE(fashionMnistPresent(dir.path()));
  writeFashionDir(dir, 6, 4);
  EXPECT_TRUE(fashionMnistPresent(dir.path()));
  DataSplit s = loadFashionMnist(dir.path(), -1, 2);
  EXPECT_EQ(s.train.size, 6);
  EXPECT_EQ(s.test.size, 2);
  EXPECT_EQ(s.source, "Fashion-MNIST (" + dir.path() + ")");
  std::filesystem::remove(dir.file(kTestLabelsFile));
  EXPECT_FALSE(fashionMnistPresent(dir.path()));
  expectDataError([&] { loadFashionMnist(dir.path()); },
                  {dir.file(kTestLabelsFile), "no such file"});
}

TrainConfig dataConfig(const std::string& data, bool named) {
  TrainConfig c;
  c.data = data;
  c.dataNamed = named;
  c.trainSamples = 8;
  c.testSamples = 4;
  return c;
}

// The default directory (--data not given) without Fashion-MNIST is refused
// (exit 2: a DataError is an InvalidArgument), never replaced by the
// synthetic set: the message says that no --data was given, where train
// looked, and the ways out (install the set, or ask for the synthetic one).
static_assert(std::is_base_of_v<InvalidArgument, DataError>);
TEST(DataChoiceTest, DefaultDirectoryMissingIsRefusedNotReplaced) {
  TempDir dir;
  std::vector<std::string> parts = {"no --data given", "Fashion-MNIST", "--data DIR",
                                    "apt-get install dataset-fashion-mnist"};
  for (const char* f : {kTrainImagesFile, kTrainLabelsFile, kTestImagesFile, kTestLabelsFile})
    parts.push_back(dir.file(f) + " (no such file)");
  expectDataError([&] { loadTrainData(dataConfig(dir.path(), false)); }, parts);
  // Incomplete: only what is missing is named.
  writeFashionDir(dir, 6, 4);
  std::filesystem::remove(dir.file(kTestLabelsFile));
  expectDataError([&] { loadTrainData(dataConfig(dir.path(), false)); },
                  {"no --data given", dir.file(kTestLabelsFile) + " (no such file)"});
  try {
    loadTrainData(dataConfig(dir.path(), false));
  } catch (const DataError& e) {
    EXPECT_EQ(e.message().find(kTrainImagesFile), std::string::npos) << e.message();
  }
  // No such directory at all: said once, not four times.
  const std::string gone = dir.file("absent");
  expectDataError([&] { loadTrainData(dataConfig(gone, false)); },
                  {"no --data given", gone + " does not exist"});
  try {
    loadTrainData(dataConfig(gone, false));
  } catch (const DataError& e) {
    EXPECT_EQ(e.message().find(kTrainImagesFile), std::string::npos) << e.message();
  }
}

// A directory the user named is refused the same way: every missing file
// named, with how to get them.
TEST(DataChoiceTest, NamedDirectoryWithoutTheFilesIsRefused) {
  TempDir dir;
  std::vector<std::string> all;
  for (const char* f : {kTrainImagesFile, kTrainLabelsFile, kTestImagesFile, kTestLabelsFile})
    all.push_back(dir.file(f) + " (no such file)");
  all.push_back("--data " + dir.path());
  expectDataError([&] { loadTrainData(dataConfig(dir.path(), true)); }, all);
  writeFashionDir(dir, 6, 4);
  std::filesystem::remove(dir.file(kTrainLabelsFile));
  expectDataError([&] { loadTrainData(dataConfig(dir.path(), true)); },
                  {"--data " + dir.path(), dir.file(kTrainLabelsFile)});
  try {
    loadTrainData(dataConfig(dir.path(), true));
  } catch (const DataError& e) {
    EXPECT_EQ(e.message().find(kTrainImagesFile), std::string::npos) << e.message();
    EXPECT_EQ(e.message().find("no --data given"), std::string::npos) << e.message();
  }
}

TEST(DataChoiceTest, SourcesOfRealAndSyntheticData) {
  TempDir dir;
  writeFashionDir(dir, 6, 4);
  for (bool named : {false, true}) {
    const DataSplit s = loadTrainData(dataConfig(dir.path(), named));
    EXPECT_EQ(s.source, "Fashion-MNIST (" + dir.path() + ")");
    EXPECT_EQ(s.train.size, 6);
  }
  const DataSplit syn = loadTrainData(dataConfig("synthetic", true));
  EXPECT_EQ(syn.source, "synthetic");
  EXPECT_EQ(syn.train.size, 8);
  EXPECT_EQ(syn.test.size, 4);
  EXPECT_EQ(loadTrainData(dataConfig(kSyntheticCifar, true)).source, kSyntheticCifar);
}

TEST(DataTest, MissingDirectoryNamesTheFile) {
  EXPECT_FALSE(fashionMnistPresent("/nonexistent/ddprun-data"));
  expectDataError(
      [] { loadFashionMnist("/nonexistent/ddprun-data"); },
      {"/nonexistent/ddprun-data/train-images-idx3-ubyte.gz", "no such file"});
}

TEST(DataTest, WrongMagicRefused) {
  TempDir dir;
  writeFile(dir.file("img.gz"), gzipStored(idxImages(2, samplePixels(2), 0x00000801)));
  writeFile(dir.file("lab.gz"), gzipStored(idxLabels(2, sampleLabels(2))));
  expectDataError([&] { loadIdxPair(dir.file("img.gz"), dir.file("lab.gz")); },
                  {dir.file("img.gz"), "bad magic number 0x00000801"});
  writeFile(dir.file("img.gz"), gzipStored(idxImages(2, samplePixels(2))));
  writeFile(dir.file("lab.gz"), gzipStored(idxLabels(2, sampleLabels(2), 0x00000803)));
  expectDataError([&] { loadIdxPair(dir.file("img.gz"), dir.file("lab.gz")); },
                  {dir.file("lab.gz"), "bad magic number 0x00000803"});
}

TEST(DataTest, WrongDimensionsRefused) {
  TempDir dir;
  writeFile(dir.file("img.gz"),
            gzipStored(idxImages(1, Bytes(32 * 32), kIdxImagesMagic, 32, 32)));
  writeFile(dir.file("lab.gz"), gzipStored(idxLabels(1, {0})));
  expectDataError([&] { loadIdxPair(dir.file("img.gz"), dir.file("lab.gz")); },
                  {dir.file("img.gz"), "32x32", "expected 28x28"});
}

TEST(DataTest, CountMismatchRefused) {
  TempDir dir;
  writeFile(dir.file("img.gz"), gzipStored(idxImages(3, samplePixels(3))));
  writeFile(dir.file("lab.gz"), gzipStored(idxLabels(4, sampleLabels(4))));
  expectDataError([&] { loadIdxPair(dir.file("img.gz"), dir.file("lab.gz")); },
                  {dir.file("lab.gz"), "4 labels", "3 images"});
}

TEST(DataTest, LabelOutOfRangeRefused) {
  TempDir dir;
  writeFile(dir.file("img.gz"), gzipStored(idxImages(3, samplePixels(3))));
  writeFile(dir.file("lab.gz"), gzipStored(idxLabels(3, {1, 10, 2})));
  expectDataError([&] { loadIdxPair(dir.file("img.gz"), dir.file("lab.gz")); },
                  {dir.file("lab.gz"), "label 1 is 10"});
}

TEST(DataTest, TruncatedDataRefused) {
  TempDir dir;
  Bytes px = samplePixels(3);
  px.erase(px.end() - 100, px.end());  // a complete gzip stream, short of pixels
  writeFile(dir.file("img.gz"), gzipStored(idxImages(3, px)));
  writeFile(dir.file("lab.gz"), gzipStored(idxLabels(3, sampleLabels(3))));
  expectDataError([&] { loadIdxPair(dir.file("img.gz"), dir.file("lab.gz")); },
                  {dir.file("img.gz"), "truncated", "declares 3 samples"});
}

TEST(DataTest, TruncatedGzipStreamRefused) {
  TempDir dir;
  Bytes gz = gzipStored(idxImages(3, samplePixels(3)));
  gz.resize(gz.size() / 2);  // the compressed file itself cut short
  writeFile(dir.file("img.gz"), gz);
  writeFile(dir.file("lab.gz"), gzipStored(idxLabels(3, sampleLabels(3))));
  expectDataError([&] { loadIdxPair(dir.file("img.gz"), dir.file("lab.gz")); },
                  {dir.file("img.gz"), "truncated"});
}

TEST(DataTest, TruncatedHeaderRefused) {
  TempDir dir;
  Bytes hdr;
  putBe(hdr, kIdxImagesMagic);
  putBe(hdr, 3);
  writeFile(dir.file("img.gz"), gzipStored(hdr));
  writeFile(dir.file("lab.gz"), gzipStored(idxLabels(3, sampleLabels(3))));
  expectDataError([&] { loadIdxPair(dir.file("img.gz"), dir.file("lab.gz")); },
                  {dir.file("img.gz"), "truncated", "row count"});
}

TEST(DataTest, CorruptGzipRefused) {
  TempDir dir;
  Bytes gz = gzipStored(idxImages(3, samplePixels(3)));
  gz[10] = 0x07;  // first deflate block header: reserved block type 3
  writeFile(dir.file("img.gz"), gz);
  writeFile(dir.file("lab.gz"), gzipStored(idxLabels(3, sampleLabels(3))));
  expectDataError([&] { loadIdxPair(dir.file("img.gz"), dir.file("lab.gz")); },
                  {dir.file("img.gz"), "zlib"});
}

TEST(DataTest, TrailingDataRefused) {
  TempDir dir;
  writeFile(dir.file("img.gz"), gzipStored(idxImages(2, samplePixels(3))));
  writeFile(dir.file("lab.gz"), gzipStored(idxLabels(2, sampleLabels(2))));
  expectDataError([&] { loadIdxPair(dir.file("img.gz"), dir.file("lab.gz")); },
                  {dir.file("img.gz"), "unexpected data after the 2 samples"});
}

TEST(DataTest, HugeCountRefusedBeforeAllocating) {
  TempDir dir;
  // 2^31 images would be 1.6 GB of pixels: over the cap.
  writeFile(dir.file("img.gz"), gzipStored(idxImages(0x80000000u, samplePixels(1))));
  writeFile(dir.file("lab.gz"), gzipStored(idxLabels(0x80000000u, sampleLabels(1))));
  expectDataError([&] { loadIdxPair(dir.file("img.gz"), dir.file("lab.gz")); },
                  {dir.file("img.gz"), "2147483648 samples", "limit"});
  // Under the cap but far more than a file of this size can hold.
  writeFile(dir.file("img.gz"), gzipStored(idxImages(1000000, samplePixels(1))));
  expectDataError([&] { loadIdxPair(dir.file("img.gz"), dir.file("lab.gz")); },
                  {dir.file("img.gz"), "1000000 samples", "can hold"});
  writeFile(dir.file("img.gz"), gzipStored(idxImages(1, samplePixels(1))));
  expectDataError([&] { loadIdxPair(dir.file("img.gz"), dir.file("lab.gz")); },
                  {dir.file("lab.gz"), "2147483648 samples", "limit"});
}

// A header that deflate could in principle satisfy (at most ~1032:1) but no
// image file plausibly does (more than 64 times the file plus 1 MiB) is
// refused, naming the file and the sizes, before memory is set aside for it:
// a 1 MB gzip declaring 1.3 M images must not cost gigabytes per rank.
TEST(DataTest, ImplausibleInflatedSizeRefusedBeforeAllocating) {
  TempDir dir;
  writeFile(dir.file("img.gz"),
            gzipStored(idxImages(10000, samplePixels(100))));  // ~78 KB
  writeFile(dir.file("lab.gz"), gzipStored(idxLabels(10000, sampleLabels(10000))));
  expectDataError([&] { loadIdxPair(dir.file("img.gz"), dir.file("lab.gz")); },
                  {dir.file("img.gz"), "10000 samples", "7840016 bytes", "plausible"});
  // Within the bound, a genuinely short file is reported as truncated.
  writeFile(dir.file("img.gz"), gzipStored(idxImages(2000, samplePixels(100))));
  writeFile(dir.file("lab.gz"), gzipStored(idxLabels(2000, sampleLabels(2000))));
  expectDataError([&] { loadIdxPair(dir.file("img.gz"), dir.file("lab.gz")); },
                  {dir.file("img.gz"), "truncated"});
}

TEST(DataTest, RealFashionMnistIfInstalled) {
  if (!fashionMnistPresent(kDefaultDataDir))
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  DataSplit s = loadFashionMnist(kDefaultDataDir);
  EXPECT_EQ(s.source, std::string("Fashion-MNIST (") + kDefaultDataDir + ")");
  ASSERT_EQ(s.train.size, 60000);
  ASSERT_EQ(s.test.size, 10000);
  EXPECT_EQ(s.train.pixels.size(), 60000u * 784);
  EXPECT_EQ(s.train.labels[0], 9);  // an ankle boot
  EXPECT_EQ(s.test.labels[0], 9);
  std::array<int, 10> counts{};
  for (int32_t l : s.train.labels) {
    ASSERT_TRUE(l >= 0 && l < 10);
    ++counts[l];
  }
  for (int c : counts) EXPECT_EQ(c, 6000);
  double sum = 0;
  for (uint8_t p : s.train.pixels) sum += normalisePixel(p);
  // The normalisation constants are this set's mean/std, so the mean is ~0.
  EXPECT_NEAR(sum / s.train.pixels.size(), 0.0, 0.01);
  EXPECT_EQ(loadFashionMnist(kDefaultDataDir, 100, 10).train.size, 100);
}

TEST(DataTest, SyntheticIsDeterministicAndBalanced) {
  DataSplit a = makeSynthetic(1003, 201, 7);
  DataSplit b = makeSynthetic(1003, 201, 7);
  DataSplit c = makeSynthetic(1003, 201, 8);
  EXPECT_EQ(a.source, "synthetic");
  ASSERT_EQ(a.train.size, 1003);
  ASSERT_EQ(a.test.size, 201);
  ASSERT_EQ(a.train.pixels.size(), 1003u * 784);
  ASSERT_EQ(a.test.pixels.size(), 201u * 784);
  EXPECT_EQ(a.train.labels, b.train.labels);
  EXPECT_EQ(a.test.labels, b.test.labels);
  EXPECT_EQ(a.train.pixels, b.train.pixels);
  EXPECT_EQ(a.test.pixels, b.test.pixels);
  EXPECT_NE(a.train.pixels, c.train.pixels);
  EXPECT_NE(0, std::memcmp(a.train.pixels.data(), a.test.pixels.data(), 784));
  std::array<int, 10> counts{};
  for (int32_t l : a.train.labels) ++counts[l];
  for (int k = 0; k < 10; ++k) EXPECT_EQ(counts[k], k < 3 ? 101 : 100) << k;
  EXPECT_NE(a.train.labels, c.train.labels);  // shuffled, by the seed
  const float lo = normalisePixel(0), hi = normalisePixel(255);
  for (float v : gatherAll(a.train)) ASSERT_TRUE(v >= lo && v <= hi);
  EXPECT_EQ(makeSynthetic(0, 0, 1).train.size, 0);
  EXPECT_THROW(makeSynthetic(-1, 0, 1), InvalidArgument);
}

TEST(DataTest, SyntheticIsLearnable) {
  // Nearest class mean, fitted on train, should classify the test set.
  DataSplit s = makeSynthetic(2000, 500, 3);
  const int64_t e = s.train.sampleElems();
  const std::vector<float> train = gatherAll(s.train), test = gatherAll(s.test);
  std::vector<double> mean(10 * e, 0.0);
  std::array<int, 10> n{};
  for (int64_t i = 0; i < s.train.size; ++i) {
    ++n[s.train.labels[i]];
    for (int64_t j = 0; j < e; ++j)
      mean[s.train.labels[i] * e + j] += train[i * e + j];
  }
  for (int k = 0; k < 10; ++k)
    for (int64_t j = 0; j < e; ++j) mean[k * e + j] /= n[k];
  int correct = 0;
  for (int64_t i = 0; i < s.test.size; ++i) {
    int best = -1;
    double bestDist = 0;
    for (int k = 0; k < 10; ++k) {
      double dist = 0;
      for (int64_t j = 0; j < e; ++j) {
        double d = test[i * e + j] - mean[k * e + j];
        dist += d * d;
      }
      if (best < 0 || dist < bestDist) best = k, bestDist = dist;
    }
    correct += best == s.test.labels[i];
  }
  EXPECT_GT(correct, 0.9 * s.test.size);
}

// Each sample's class by its nearest class mean (means fitted on `fit`).
std::vector<int> nearestMeanClasses(const Dataset& fit, const Dataset& d) {
  const int64_t e = fit.sampleElems();
  const std::vector<float> xf = gatherAll(fit), xd = gatherAll(d);
  std::vector<double> mean(10 * e, 0.0);
  std::array<int, 10> n{};
  for (int64_t i = 0; i < fit.size; ++i) {
    ++n[fit.labels[i]];
    for (int64_t j = 0; j < e; ++j) mean[fit.labels[i] * e + j] += xf[i * e + j];
  }
  for (int k = 0; k < 10; ++k)
    for (int64_t j = 0; j < e; ++j) mean[k * e + j] /= n[k];
  std::vector<int> out(d.size);
  for (int64_t i = 0; i < d.size; ++i) {
    double bestDist = 0;
    for (int k = 0; k < 10; ++k) {
      double dist = 0;
      for (int64_t j = 0; j < e; ++j) dist += std::pow(xd[i * e + j] - mean[k * e + j], 2);
      if (k == 0 || dist < bestDist) out[i] = k, bestDist = dist;
    }
  }
  return out;
}

// One training sample in 20 shows another class's pattern than its label;
// the test split is clean. Against class means fitted on the (clean) test
// split: every test sample is its label's class, and about 5 % of the
// training samples (binomial: 200 +- 14 of 4000) are another.
TEST(DataTest, SyntheticTrainingSplitHasOneInTwentyMislabelled) {
  const DataSplit s = makeSynthetic(4000, 2000, 3);
  const std::vector<int> test = nearestMeanClasses(s.test, s.test);
  const std::vector<int> train = nearestMeanClasses(s.test, s.train);
  int testWrong = 0, trainWrong = 0;
  for (int64_t i = 0; i < s.test.size; ++i) testWrong += test[i] != s.test.labels[i];
  for (int64_t i = 0; i < s.train.size; ++i) trainWrong += train[i] != s.train.labels[i];
  EXPECT_EQ(testWrong, 0);
  EXPECT_GE(trainWrong, 150);
  EXPECT_LE(trainWrong, 250);
  // The labels stay balanced: it is the pictures that disagree with them.
  std::array<int, 10> counts{};
  for (int32_t l : s.train.labels) ++counts[l];
  for (int c : counts) EXPECT_EQ(c, 400);
}

// FNV-1a over values (as tests/bench/bench_tools_test.py's fnv()).
uint64_t fnv(const std::vector<int64_t>& values) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t v : values) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
  return h;
}

uint64_t trainSplitFnv(const DataSplit& s) {
  std::vector<int64_t> v(s.train.pixels.begin(), s.train.pixels.end());
  v.insert(v.end(), s.train.labels.begin(), s.train.labels.end());
  return fnv(v);
}

// The recipe docs/train.md states, pinned: scripts/bench/benchutil.py's
// numpy port (synthetic_mnist_raw) is checked against these same values by
// tests/bench/bench_tools_test.py, so a change of either shows.
TEST(DataTest, SyntheticIsTheDocumentedRecipe) {
  const DataSplit a = makeSynthetic(37, 0, 0);
  EXPECT_EQ(a.train.labels[0], 0);
  EXPECT_EQ(trainSplitFnv(a), 5549098087609738546u);
  EXPECT_EQ(trainSplitFnv(makeSynthetic(1003, 0, 7)), 3364982578054311191u);
}

// The bytes of one sample of a generated set.
std::vector<uint8_t> rendered(const Dataset& d, int64_t i) {
  std::vector<uint8_t> out(static_cast<size_t>(d.sampleElems()));
  d.render(i, out.data());
  return out;
}

int64_t byteSum(const std::vector<uint8_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}

// Golden values from tests/interop/synthetic_cifar.py, the independent numpy
// implementation the parity test trains on: a change of the recipe shows here.
TEST(DataTest, SyntheticCifarIsTheDocumentedRecipe) {
  const DataSplit s = makeSyntheticCifar(12, 5);
  EXPECT_EQ(s.source, "synthetic-cifar");
  EXPECT_EQ(s.train.labels, (std::vector<int32_t>{1, 5, 6, 0, 9, 8, 4, 3, 7, 2, 2, 7}));
  EXPECT_EQ(s.test.labels, (std::vector<int32_t>{9, 7, 5, 4, 6}));
  const std::vector<uint8_t> first = rendered(s.train, 0);
  EXPECT_EQ(std::vector<uint8_t>(first.begin(), first.begin() + 8),
            (std::vector<uint8_t>{53, 77, 48, 0, 106, 82, 60, 106}));
  EXPECT_EQ(byteSum(first), 175223);
  EXPECT_EQ(byteSum(rendered(s.train, 7)), 209373);
  const std::vector<uint8_t> last = rendered(s.train, 11);
  EXPECT_EQ(std::vector<uint8_t>(last.end() - 4, last.end()),
            (std::vector<uint8_t>{77, 75, 183, 155}));
  EXPECT_EQ(byteSum(rendered(s.test, 4)), 203469);
  EXPECT_EQ(makeSyntheticCifar(7, 0, 3).train.labels,
            (std::vector<int32_t>{2, 1, 0, 0, 2, 1, 2}));
}

TEST(DataTest, SyntheticCifarIsGeneratedOnDemandAndPrefixStable) {
  const DataSplit big = makeSyntheticCifar(50000, 10000);
  const DataSplit small = makeSyntheticCifar(25, 4);
  EXPECT_EQ(big.train.size, 50000);
  EXPECT_EQ(big.test.size, 10000);
  EXPECT_TRUE(big.train.pixels.empty());  // 150 MB it does not keep
  EXPECT_EQ(big.train.sampleElems(), 3 * 32 * 32);
  EXPECT_EQ(big.train.numClasses, 10);
  // The first n samples of a larger set are the set of size n.
  EXPECT_EQ(std::vector<int32_t>(big.train.labels.begin(), big.train.labels.begin() + 25),
            small.train.labels);
  EXPECT_EQ(rendered(big.train, 24), rendered(small.train, 24));
  EXPECT_EQ(rendered(big.test, 3), rendered(small.test, 3));
  EXPECT_EQ(rendered(big.train, 49999),
            rendered(big.train, 49999));  // the same every time
  EXPECT_NE(rendered(big.train, 0), rendered(big.test, 0));
  EXPECT_NE(rendered(big.train, 0), rendered(makeSyntheticCifar(1, 0, 10, 1).train, 0));
  // Balanced: each block of 10 holds every class once.
  std::array<int, 10> counts{};
  for (int32_t l : big.train.labels) ++counts[l];
  for (int c : counts) EXPECT_EQ(c, 5000);
  for (int k : {2, 3, 7}) {
    const DataSplit s = makeSyntheticCifar(101, 0, k);
    EXPECT_EQ(s.train.numClasses, k);
    for (int32_t l : s.train.labels) ASSERT_TRUE(l >= 0 && l < k) << l;
  }
  EXPECT_THROW(makeSyntheticCifar(10, 10, 11), InvalidArgument);
  EXPECT_THROW(makeSyntheticCifar(10, 10, 1), InvalidArgument);
  EXPECT_THROW(makeSyntheticCifar(-1, 10), InvalidArgument);
}

TEST(DataTest, SyntheticCifarIsNormalisedPerChannel) {
  const DataSplit s = makeSyntheticCifar(3, 0);
  const Dataset& d = s.train;
  const int64_t e = d.sampleElems(), plane = 32 * 32;
  std::vector<int64_t> idx = {2, 0};
  std::vector<float> x(idx.size() * e);
  std::vector<int32_t> y(idx.size());
  gatherBatch(d, idx.data(), idx.size(), x.data(), y.data());
  for (size_t i = 0; i < idx.size(); ++i) {
    EXPECT_EQ(y[i], d.labels[idx[i]]);
    const std::vector<uint8_t> px = rendered(d, idx[i]);
    for (int64_t k = 0; k < e; ++k) {
      const int c = static_cast<int>(k / plane);
      const float want =
          (static_cast<float>(px[k]) / 255.0f - kCifarMean[c]) / kCifarStd[c];
      ASSERT_EQ(bits(x[i * e + k]), bits(want)) << i << "," << k;
    }
  }
}

TEST(DataTest, SyntheticCifarIsLearnable) {
  // Nearest class mean, fitted on train, should classify the test set.
  const DataSplit s = makeSyntheticCifar(1000, 300);
  const int64_t e = s.train.sampleElems();
  const std::vector<float> train = gatherAll(s.train), test = gatherAll(s.test);
  std::vector<double> mean(10 * e, 0.0);
  for (int64_t i = 0; i < s.train.size; ++i)
    for (int64_t j = 0; j < e; ++j)
      mean[s.train.labels[i] * e + j] += train[i * e + j] / 100.0;
  int correct = 0;
  for (int64_t i = 0; i < s.test.size; ++i) {
    int best = -1;
    double bestDist = 0;
    for (int k = 0; k < 10; ++k) {
      double dist = 0;
      for (int64_t j = 0; j < e; ++j)
        dist += std::pow(test[i * e + j] - mean[k * e + j], 2);
      if (best < 0 || dist < bestDist) best = k, bestDist = dist;
    }
    correct += best == s.test.labels[i];
  }
  EXPECT_GT(correct, 0.9 * s.test.size);
}

TEST(DataTest, GatherBatchNormalisesTheNamedSamples) {
  DataSplit s = makeSynthetic(20, 0, 5);
  const Dataset& d = s.train;
  const int64_t e = d.sampleElems();
  std::vector<int64_t> idx = {19, 0, 7, 7};
  std::vector<float> x(idx.size() * e, -99.0f);
  std::vector<int32_t> y(idx.size(), -1);
  gatherBatch(d, idx.data(), idx.size(), x.data(), y.data());
  for (size_t i = 0; i < idx.size(); ++i) {
    EXPECT_EQ(y[i], d.labels[idx[i]]);
    for (int64_t k = 0; k < e; ++k)
      ASSERT_EQ(bits(x[i * e + k]), bits(normalisePixel(d.pixels[idx[i] * e + k])))
          << i << "," << k;
  }
  gatherBatch(d, idx.data(), 0, nullptr, nullptr);  // an empty batch touches nothing
  std::vector<int64_t> bad = {3, 20};
  EXPECT_THROW(gatherBatch(d, bad.data(), bad.size(), x.data(), y.data()),
               InvalidArgument);
  bad = {-1};
  EXPECT_THROW(gatherBatch(d, bad.data(), bad.size(), x.data(), y.data()),
               InvalidArgument);
}

// Augmented batches: each sample is its own crop and flip of (seed, epoch,
// index), the same whatever the thread count, batch or position; another
// epoch draws others; normalised like the plain gather.
TEST(DataTest, AugmentedGatherDependsOnlyOnSeedEpochAndSample) {
  DataSplit s = makeSyntheticCifar(40, 0);
  const Dataset& d = s.train;
  const int64_t e = d.sampleElems();
  std::vector<int64_t> idx(32);
  std::iota(idx.begin(), idx.end(), 3);
  for (Augment a : {Augment::kCropFlip, Augment::kRandomResizedCrop}) {
    const SampleTransform t{.augment = a, .seed = 7, .epoch = 2};
    auto gathered = [&](const std::vector<int64_t>& ids, int threads) {
      WorkPool pool(threads);
      std::vector<float> x(ids.size() * e);
      std::vector<int32_t> y(ids.size());
      gatherBatch(d, ids.data(), ids.size(), x.data(), y.data(), t, &pool);
      return x;
    };
    const std::vector<float> one = gathered(idx, 1), three = gathered(idx, 3);
    ASSERT_EQ(one, three) << augmentName(a);
    // Sample 10 alone, in a batch of its own: the same values.
    const std::vector<float> alone = gathered({10}, 2);
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), one.begin() + 7 * e)) << augmentName(a);
    // Another epoch draws another crop for at least one sample.
    const SampleTransform next{.augment = a, .seed = 7, .epoch = 3};
    std::vector<float> x3(idx.size() * e);
    std::vector<int32_t> y3(idx.size());
    gatherBatch(d, idx.data(), idx.size(), x3.data(), y3.data(), next, nullptr);
    EXPECT_NE(x3, one) << augmentName(a);
  }
  // crop-flip of one sample equals padCropFlip with its drawn parameters.
  std::vector<uint8_t> raw(e);
  d.render(5, raw.data());
  SampleRng rng(7, 2, 5);
  const ImageU8 want =
      padCropFlip({raw.data(), d.channels, d.height, d.width}, kCropFlipPad,
                  drawCropFlip(rng, kCropFlipPad));
  std::vector<float> wantX(e), x(e);
  normalizeToFloat(want.view(), d.mean, d.std, wantX.data());
  int32_t y = -1;
  const int64_t five = 5;
  gatherBatch(d, &five, 1, x.data(), &y, {.augment = Augment::kCropFlip, .seed = 7, .epoch = 2},
              nullptr);
  EXPECT_EQ(x, wantX);
  EXPECT_EQ(y, d.labels[5]);
}

}  // namespace
}  // namespace ddprun::train
