// CIFAR-10/100 readers (cifar.h) and the pickle reader under them
// (pickle_reader.h): files written here byte for byte in the formats the
// downloads use (Python 2 cPickle protocol 2 with numpy's _reconstruct, the
// same as Python 3 writes protocol 2, and the binary records), read back,
// and every kind of damage refused with a DataError naming the file.
#include "temp_dir.h"
#include "ddprun/train/cifar.h"
#include "ddprun/train/data_choice.h"
#include "ddprun/train/pickle_reader.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace ddprun::train {
namespace {

using ddprun::testing::TempDir;
namespace fs = std::filesystem;

// ---- writing pickles, opcode by opcode

class Pickler {
 public:
  std::string out;
  Pickler& op(uint8_t c) { out.push_back(static_cast<char>(c)); return *this; }
  Pickler& le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  Pickler& proto(int p) { return op(0x80).le(static_cast<uint64_t>(p), 1); }
  Pickler& mark() { return op('('); }
  Pickler& put() { return op('q').le(memo_++ & 0xff, 1); }
  // A str as Python 2 pickles it: SHORT_BINSTRING or BINSTRING.
  Pickler& str2(const std::string& s) {
    if (s.size() < 256) op('U').le(s.size(), 1);
    else op('T').le(s.size(), 4);
    out += s;
    return put();
  }
  // A str as Python 3 pickles it: BINUNICODE (UTF-8).
  Pickler& unicode(const std::string& utf8) {
    op('X').le(utf8.size(), 4);
    out += utf8;
    return put();
  }
  // Python 3's protocol-2 bytes: _codecs.encode(latin-1 text, 'latin1').
  Pickler& bytes3(const std::string& raw) {
    global("_codecs", "encode");
    std::string utf8;
    for (unsigned char c : raw) {
      if (c < 0x80) {
        utf8.push_back(static_cast<char>(c));
      } else {
        utf8.push_back(static_cast<char>(0xC0 | (c >> 6)));
        utf8.push_back(static_cast<char>(0x80 | (c & 0x3F)));
      }
    }
    unicode(utf8).unicode("latin1").op(0x86).put().op('R');
    return put();
  }
  Pickler& int1(int v) { return op('K').le(static_cast<uint64_t>(v), 1); }
  Pickler& int4(int32_t v) { return op('J').le(static_cast<uint32_t>(v), 4); }
  Pickler& integer(int64_t v) {
    if (v >= 0 && v < 256) return int1(static_cast<int>(v));
    if (v >= 0 && v < 65536) return op('M').le(static_cast<uint64_t>(v), 2);
    return int4(static_cast<int32_t>(v));
  }
  Pickler& global(const std::string& module, const std::string& name) {
    op('c');
    out += module + "\n" + name + "\n";
    return put();
  }
  Pickler& stop() { return op('.'); }

 private:
  uint64_t memo_ = 1;
};

// One CIFAR batch's dict, as the files hold it.
struct BatchSpec {
  bool python3 = false;          // Python 3's protocol 2 (BINUNICODE keys, _codecs bytes)
  std::string labelKey = "labels";
  std::vector<int64_t> labels;
  std::string pixels;            // rows of 3072 bytes
  std::vector<int64_t> shape;    // empty: (labels.size(), 3072)
  std::string dtype = "u1";
  bool fortran = false;
  std::string module = "numpy.core.multiarray";
};

std::string batchPickle(const BatchSpec& s) {
  Pickler p;
  auto key = [&](const std::string& k) -> Pickler& { return s.python3 ? p.unicode(k) : p.str2(k); };
  auto raw = [&](const std::string& b) -> Pickler& { return s.python3 ? p.bytes3(b) : p.str2(b); };
  p.proto(2).op('}').put().mark();
  key("batch_label");
  key("training batch 1 of 5");
  key(s.labelKey).op(']').put();
  for (size_t i = 0; i < s.labels.size(); i += 1000) {  // cPickle appends in 1000s
    p.mark();
    for (size_t j = i; j < s.labels.size() && j < i + 1000; ++j) p.integer(s.labels[j]);
    p.op('e');
  }
  if (s.labelKey == "fine_labels") {
    key("coarse_labels").op(']').put().mark();
    for (int64_t l : s.labels) p.integer(l / 5);
    p.op('e');
  }
  key("data");
  p.global(s.module, "_reconstruct").global("numpy", "ndarray");
  p.int1(0).op(0x85).put();
  raw("b");
  p.op(0x87).put().op('R').put();
  p.mark().int1(1);
  std::vector<int64_t> shape = s.shape;
  if (shape.empty()) shape = {static_cast<int64_t>(s.labels.size()), kCifarImageBytes};
  p.mark();
  for (int64_t d : shape) p.integer(d);
  p.op('t').put();
  p.global("numpy", "dtype");
  key(s.dtype);
  p.int1(0).int1(1).op(0x87).put().op('R').put();
  p.mark().int1(3);
  key("|");
  p.op('N').op('N').op('N').int4(-1).int4(-1).int1(0).op('t').put().op('b');
  p.op(s.fortran ? 0x88 : 0x89);
  raw(s.pixels);
  p.op('t').put().op('b');
  key("filenames").op(']').put().mark();
  for (size_t i = 0; i < s.labels.size(); ++i) key("img_" + std::to_string(i) + ".png");
  p.op('e').op('u').stop();
  return p.out;
}

// Image i of a set: bytes that differ per image, channel and position.
std::string imageBytes(int64_t i) {
  std::string b(static_cast<size_t>(kCifarImageBytes), '\0');
  for (int64_t k = 0; k < kCifarImageBytes; ++k)
    b[static_cast<size_t>(k)] = static_cast<char>((i * 131 + k * 7 + (k / 1024) * 50) & 0xff);
  return b;
}

void writeFile(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

// A batch of `n` images numbered from `first`, labels (first + j) % classes.
BatchSpec batch(int64_t first, int64_t n, int classes, bool python3 = false) {
  BatchSpec s;
  s.python3 = python3;
  s.labelKey = classes == 10 ? "labels" : "fine_labels";
  for (int64_t j = 0; j < n; ++j) {
    s.labels.push_back((first + j) * 7 % classes);
    s.pixels += imageBytes(first + j);
  }
  return s;
}

std::string binaryRecords(int64_t first, int64_t n, int classes) {
  std::string out;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t label = (first + j) * 7 % classes;
    if (classes == 100) out.push_back(static_cast<char>(label / 5));
    out.push_back(static_cast<char>(label));
    out += imageBytes(first + j);
  }
  return out;
}

constexpr int64_t kPerBatch = 3, kTest = 2;

// torchvision's CIFAR-10 python directory under root: 5 x 3 train, 2 test.
std::string writeCifar10Py(const TempDir& root, bool python3 = false) {
  const std::string dir = root.file("cifar-10-batches-py");
  for (int b = 0; b < 5; ++b)
    writeFile(dir + "/data_batch_" + std::to_string(b + 1),
              batchPickle(batch(b * kPerBatch, kPerBatch, 10, python3)));
  writeFile(dir + "/test_batch", batchPickle(batch(1000, kTest, 10, python3)));
  writeFile(dir + "/batches.meta", "not read");
  return dir;
}

std::string writeCifar100Py(const TempDir& root, bool python3 = true) {
  const std::string dir = root.file("cifar-100-python");
  writeFile(dir + "/train", batchPickle(batch(0, 5 * kPerBatch, 100, python3)));
  writeFile(dir + "/test", batchPickle(batch(1000, kTest, 100, python3)));
  writeFile(dir + "/meta", "not read");
  return dir;
}

std::string writeCifar10Bin(const TempDir& root) {
  const std::string dir = root.file("cifar-10-batches-bin");
  for (int b = 0; b < 5; ++b)
    writeFile(dir + "/data_batch_" + std::to_string(b + 1) + ".bin",
              binaryRecords(b * kPerBatch, kPerBatch, 10));
  writeFile(dir + "/test_batch.bin", binaryRecords(1000, kTest, 10));
  return dir;
}

std::string writeCifar100Bin(const TempDir& root) {
  const std::string dir = root.file("cifar-100-binary");
  writeFile(dir + "/train.bin", binaryRecords(0, 5 * kPerBatch, 100));
  writeFile(dir + "/test.bin", binaryRecords(1000, kTest, 100));
  return dir;
}

// Expects the split to hold images first..first+n-1 in order.
void expectImages(const Dataset& d, int64_t first, int64_t n, int classes) {
  ASSERT_EQ(d.size, n);
  ASSERT_EQ(d.pixels.size(), static_cast<size_t>(n * kCifarImageBytes));
  ASSERT_EQ(d.labels.size(), static_cast<size_t>(n));
  EXPECT_EQ(d.channels, 3);
  EXPECT_EQ(d.height, 32);
  EXPECT_EQ(d.width, 32);
  EXPECT_EQ(d.numClasses, classes);
  for (int64_t j = 0; j < n; ++j) {
    EXPECT_EQ(d.labels[static_cast<size_t>(j)], (first + j) * 7 % classes) << j;
    const std::string want = imageBytes(first + j);
    EXPECT_EQ(0, std::memcmp(d.pixels.data() + j * kCifarImageBytes, want.data(), want.size()))
        << "image " << j;
  }
  const float* mean = classes == 10 ? kCifarMean : kCifar100Mean;
  const float* std = classes == 10 ? kCifarStd : kCifar100Std;
  EXPECT_EQ(d.mean, std::vector<float>(mean, mean + 3));
  EXPECT_EQ(d.std, std::vector<float>(std, std + 3));
}

void expectDataError(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no DataError thrown";
  } catch (const DataError& e) {
    const std::string msg = e.message();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << msg << "\nlacks: " << p;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
  }
}

// ---- formats and recognition

TEST(CifarTest, DataFormatNamesRoundTrip) {
  for (DataFormat f : {DataFormat::kAuto, DataFormat::kFashionMnist, DataFormat::kCifar10Py,
                       DataFormat::kCifar100Py, DataFormat::kCifar10Bin, DataFormat::kCifar100Bin})
    EXPECT_EQ(parseDataFormat(dataFormatName(f)), f);
  EXPECT_EQ(parseDataFormat("cifar100-bin"), DataFormat::kCifar100Bin);
  EXPECT_FALSE(parseDataFormat("cifar-10").has_value());
  EXPECT_FALSE(parseDataFormat("").has_value());
}

TEST(CifarTest, FindsTheBatchDirectoryOrItsRoot) {
  TempDir root;
  const std::string dir = writeCifar10Py(root);
  for (const std::string& p : {root.path(), dir, dir + "/"}) {
    auto loc = findCifar(p, DataFormat::kAuto);
    ASSERT_TRUE(loc.has_value()) << p;
    EXPECT_EQ(loc->format, DataFormat::kCifar10Py);
    EXPECT_TRUE(fs::equivalent(loc->dir, dir));
  }
  EXPECT_TRUE(findCifar(root.path(), DataFormat::kCifar10Py).has_value());
  EXPECT_FALSE(findCifar(root.path(), DataFormat::kCifar10Bin).has_value());
  EXPECT_FALSE(findCifar(root.path(), DataFormat::kFashionMnist).has_value());
  // A renamed batch directory is recognised by its files.
  const std::string renamed = root.file("mine");
  fs::rename(dir, renamed);
  auto loc = findCifar(renamed, DataFormat::kAuto);
  ASSERT_TRUE(loc.has_value());
  EXPECT_EQ(loc->format, DataFormat::kCifar10Py);
  TempDir empty;
  EXPECT_FALSE(findCifar(empty.path(), DataFormat::kAuto).has_value());
  EXPECT_FALSE(findCifar(empty.file("absent"), DataFormat::kAuto).has_value());
}

TEST(CifarTest, PythonBeforeBinaryAndTwoSetsAreAmbiguous) {
  TempDir root;
  writeCifar10Bin(root);
  const std::string py = writeCifar10Py(root);
  auto loc = findCifar(root.path(), DataFormat::kAuto);
  ASSERT_TRUE(loc.has_value());
  EXPECT_EQ(loc->format, DataFormat::kCifar10Py);
  EXPECT_EQ(findCifar(root.path(), DataFormat::kCifar10Bin)->format, DataFormat::kCifar10Bin);
  const std::string py100 = writeCifar100Py(root);
  expectDataError([&] { findCifar(root.path(), DataFormat::kAuto); },
                  {root.path(), "CIFAR-10", "CIFAR-100", py, py100});
  EXPECT_EQ(findCifar(root.path(), DataFormat::kCifar100Py)->format, DataFormat::kCifar100Py);
  EXPECT_EQ(findCifar(py100, DataFormat::kAuto)->format, DataFormat::kCifar100Py);
}

// ---- reading each layout

TEST(CifarTest, Cifar10PythonTrainIsTheBatchesInOrder) {
  for (bool python3 : {false, true}) {
    TempDir root;
    const std::string dir = writeCifar10Py(root, python3);
    const DataSplit s = loadCifar(*findCifar(root.path(), DataFormat::kAuto));
    expectImages(s.train, 0, 5 * kPerBatch, 10);
    expectImages(s.test, 1000, kTest, 10);
    EXPECT_EQ(s.source, "CIFAR-10 (" + dir + ")");
  }
}

TEST(CifarTest, Cifar100PythonUsesFineLabels) {
  for (bool python3 : {false, true}) {
    TempDir root;
    const std::string dir = writeCifar100Py(root, python3);
    const DataSplit s = loadCifar(*findCifar(root.path(), DataFormat::kAuto));
    expectImages(s.train, 0, 5 * kPerBatch, 100);
    expectImages(s.test, 1000, kTest, 100);
    EXPECT_EQ(s.source, "CIFAR-100 (" + dir + ")");
  }
}

TEST(CifarTest, BinaryVersions) {
  TempDir root;
  const std::string dir10 = writeCifar10Bin(root);
  DataSplit s = loadCifar(*findCifar(dir10, DataFormat::kAuto));
  expectImages(s.train, 0, 5 * kPerBatch, 10);
  expectImages(s.test, 1000, kTest, 10);
  EXPECT_EQ(s.source, "CIFAR-10 (" + dir10 + ")");
  TempDir root100;
  const std::string dir100 = writeCifar100Bin(root100);
  s = loadCifar(*findCifar(root100.path(), DataFormat::kAuto));
  expectImages(s.train, 0, 5 * kPerBatch, 100);
  expectImages(s.test, 1000, kTest, 100);
  EXPECT_EQ(s.source, "CIFAR-100 (" + dir100 + ")");
}

TEST(CifarTest, CapsStopReadingEarly) {
  for (bool binary : {false, true}) {
    TempDir root;
    const std::string dir = binary ? writeCifar10Bin(root) : writeCifar10Py(root);
    const std::string ext = binary ? ".bin" : "";
    // Batches past the cap are not read (damaged here), only required to exist.
    for (int b = 3; b <= 5; ++b) writeFile(dir + "/data_batch_" + std::to_string(b) + ext, "x");
    const DataSplit s = loadCifar(*findCifar(dir, DataFormat::kAuto), kPerBatch + 1, 1);
    expectImages(s.train, 0, kPerBatch + 1, 10);
    expectImages(s.test, 1000, 1, 10);
    const DataSplit two = loadCifar(*findCifar(dir, DataFormat::kAuto), 2 * kPerBatch, 5);
    expectImages(two.train, 0, 2 * kPerBatch, 10);
    expectImages(two.test, 1000, kTest, 10);
    expectDataError([&] { loadCifar(*findCifar(dir, DataFormat::kAuto), 2 * kPerBatch + 1); },
                    {dir + "/data_batch_3" + ext});
  }
}

// ---- damage

TEST(CifarTest, MissingBatchFilesAreListed) {
  TempDir root;
  const std::string dir = writeCifar10Py(root);
  fs::remove(dir + "/data_batch_3");
  fs::remove(dir + "/test_batch");
  expectDataError([&] { loadCifar(*findCifar(root.path(), DataFormat::kAuto)); },
                  {dir + "/data_batch_3 (no such file)", dir + "/test_batch (no such file)",
                   "CIFAR-10", "torchvision"});
  try {
    loadCifar(*findCifar(root.path(), DataFormat::kAuto));
  } catch (const DataError& e) {
    EXPECT_EQ(e.message().find("data_batch_2"), std::string::npos) << e.message();
  }
}

// One damaged CIFAR-10 test_batch: the DataError names it and `parts`.
void expectBadTestBatch(const std::string& bytes, const std::vector<std::string>& parts,
                        int classes = 10) {
  TempDir root;
  const std::string dir = classes == 10 ? writeCifar10Py(root) : writeCifar100Py(root);
  const std::string file = dir + (classes == 10 ? "/test_batch" : "/test");
  writeFile(file, bytes);
  std::vector<std::string> all = parts;
  all.push_back(file + ": ");
  expectDataError([&] { loadCifar(*findCifar(root.path(), DataFormat::kAuto)); }, all);
}

TEST(CifarTest, DamagedPicklesAreRefusedNamingTheFile) {
  const std::string good = batchPickle(batch(0, 2, 10));
  expectBadTestBatch(good.substr(0, good.size() - 1), {"truncated", "without STOP"});
  expectBadTestBatch(good.substr(0, good.size() / 2), {"truncated"});
  expectBadTestBatch(good + "x", {"unexpected bytes after STOP"});
  expectBadTestBatch("", {"truncated"});
  expectBadTestBatch("\x80\x02\x81.", {"NEWOBJ", "offset 2", "unsupported"});
  expectBadTestBatch("\x80\x02\xff.", {"0xff", "offset 2"});
  expectBadTestBatch("\x80\x06}.", {"protocol 6"});
  expectBadTestBatch("\x80\x02" "cos\nsystem\n.", {"refused global os.system", "GLOBAL"});
  expectBadTestBatch("\x80\x02" "X\xff\xff\xff\x7f", {"BINUNICODE", "truncated"});
  expectBadTestBatch("\x80\x02]q\x01.", {"holds a list"});
  expectBadTestBatch("\x80\x02" "a.", {"stack underflow", "APPEND"});
  BatchSpec s = batch(0, 2, 10);
  s.labelKey = "fine_labels";
  expectBadTestBatch(batchPickle(s), {"no 'labels'", "'fine_labels'", "CIFAR-100 file"});
}

TEST(CifarTest, WrongArraysAndLabelsAreRefused) {
  BatchSpec s = batch(0, 2, 10);
  s.shape = {2, 3, 32, 32};  // accepted: the same bytes
  TempDir ok;
  writeCifar10Py(ok);
  writeFile(ok.file("cifar-10-batches-py/test_batch"), batchPickle(s));
  EXPECT_EQ(loadCifar(*findCifar(ok.path(), DataFormat::kAuto)).test.size, 2);

  s = batch(0, 2, 10);
  s.shape = {3, 2048};
  expectBadTestBatch(batchPickle(s), {"3x2048", "expected N x 3072"});
  s = batch(0, 2, 10);
  s.shape = {1, 6144};
  expectBadTestBatch(batchPickle(s), {"1x6144"});
  s = batch(0, 2, 10);
  s.shape = {2, 3072, 1};  // wrong rank, right size
  expectBadTestBatch(batchPickle(s), {"2x3072x1"});
  s = batch(0, 2, 10);
  s.dtype = "<i2";
  s.shape = {1, 3072};
  expectBadTestBatch(batchPickle(s), {"dtype '<i2'", "uint8"});
  s = batch(0, 2, 10);
  s.dtype = "O";
  expectBadTestBatch(batchPickle(s), {"unsupported array dtype 'O'"});
  s = batch(0, 2, 10);
  s.pixels.pop_back();
  expectBadTestBatch(batchPickle(s), {"array data of 6143 bytes", "need 6144"});
  s = batch(0, 2, 10);
  s.fortran = true;
  expectBadTestBatch(batchPickle(s), {"Fortran order"});
  s = batch(0, 2, 10);
  s.labels[1] = 10;
  expectBadTestBatch(batchPickle(s), {"'labels' entry 1 is 10, outside [0, 10)"});
  s = batch(0, 2, 10);
  s.labels[0] = -1;
  expectBadTestBatch(batchPickle(s), {"'labels' entry 0 is -1"});
  s = batch(0, 2, 10);
  s.labels.push_back(3);
  s.shape = {2, 3072};
  expectBadTestBatch(batchPickle(s), {"holds 2 images but 3 'labels'"});
  s = batch(0, 2, 100);
  s.labels[0] = 100;
  expectBadTestBatch(batchPickle(s), {"'fine_labels' entry 0 is 100, outside [0, 100)"}, 100);
  s = batch(0, 2, 10);
  s.module = "numpy._core.multiarray";  // numpy 2's name: fine
  TempDir ok2;
  writeCifar10Py(ok2);
  writeFile(ok2.file("cifar-10-batches-py/test_batch"), batchPickle(s));
  EXPECT_EQ(loadCifar(*findCifar(ok2.path(), DataFormat::kAuto)).test.size, 2);
  s.module = "numpy.core.multiarrayX";
  expectBadTestBatch(batchPickle(s), {"refused global numpy.core.multiarrayX._reconstruct"});
}

TEST(CifarTest, DamagedBinaryFilesAreRefusedNamingTheFile) {
  auto expectBad = [](int classes, const std::string& bytes,
                      const std::vector<std::string>& parts) {
    TempDir root;
    const std::string dir = classes == 10 ? writeCifar10Bin(root) : writeCifar100Bin(root);
    const std::string file = dir + (classes == 10 ? "/data_batch_2.bin" : "/train.bin");
    writeFile(file, bytes);
    std::vector<std::string> all = parts;
    all.push_back(file + ": ");
    expectDataError([&] { loadCifar(*findCifar(root.path(), DataFormat::kAuto)); }, all);
  };
  std::string recs = binaryRecords(0, 3, 10);
  expectBad(10, recs.substr(0, recs.size() - 1), {"not a whole number of 3073-byte records"});
  expectBad(10, "", {"is empty"});
  recs[3073] = 10;
  expectBad(10, recs, {"record 1 has label 10, outside [0, 10)"});
  recs = binaryRecords(0, 3, 100);
  expectBad(100, recs + "x", {"3074-byte records"});
  recs[3074 + 1] = 100;
  expectBad(100, recs, {"record 1 has label 100"});
  recs = binaryRecords(0, 3, 100);
  recs[0] = 20;
  expectBad(100, recs, {"record 0 has coarse label 20"});
}

// Sparse files: the size alone is refused, nothing is read.
TEST(CifarTest, ImplausiblyLargeFilesAreRefusedBeforeReading) {
  TempDir root;
  const std::string py = writeCifar10Py(root);
  ASSERT_EQ(0, ::truncate((py + "/test_batch").c_str(), kMaxCifarPickleBytes + 1));
  expectDataError([&] { loadCifar(*findCifar(py, DataFormat::kAuto)); },
                  {py + "/test_batch: ", "more than a CIFAR batch pickle can be"});
  TempDir root2;
  const std::string bin = writeCifar10Bin(root2);
  ASSERT_EQ(0, ::truncate((bin + "/test_batch.bin").c_str(),
                          (kMaxCifarImagesPerFile + 1) * (kCifarImageBytes + 1)));
  expectDataError([&] { loadCifar(*findCifar(bin, DataFormat::kAuto)); },
                  {bin + "/test_batch.bin: ", "more than a CIFAR binary batch can be"});
}

// ---- the in-memory entry points and the pickle reader's limits

TEST(CifarTest, InMemoryEntryPointsAppend) {
  Dataset d;
  EXPECT_EQ(appendCifarPickle(batchPickle(batch(0, 3, 10)), 10, -1, "a", d), 3);
  EXPECT_EQ(appendCifarBinary(binaryRecords(3, 3, 10), 10, 2, "b", d), 2);
  EXPECT_EQ(d.size, 5);
  for (int64_t j = 0; j < 5; ++j) {
    EXPECT_EQ(d.labels[static_cast<size_t>(j)], j * 7 % 10);
    EXPECT_EQ(0, std::memcmp(d.pixels.data() + j * kCifarImageBytes, imageBytes(j).data(),
                             kCifarImageBytes));
  }
  expectDataError([&] { appendCifarBinary("", 10, -1, "mem.bin", d); }, {"mem.bin: "});
}

TEST(PickleReaderTest, MemoSharingAndCyclesAreSafe) {
  // [[], ref to the same list]: BINGET shares, a list holding itself is fine.
  const std::string cyc = std::string("\x80\x02]q\x00h\x00" "a.", 9);
  PickleResult r = parsePickle(cyc);
  ASSERT_TRUE(r.ok) << r.error;
  const PickleValue& root = r.doc.at(r.doc.root);
  ASSERT_EQ(root.kind, PickleKind::kList);
  ASSERT_EQ(root.items.size(), 1u);
  EXPECT_EQ(root.items[0], r.doc.root);
  r = parsePickle(std::string("\x80\x02h\x05.", 5));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("memo entry 5 was never stored"), std::string::npos) << r.error;
}

TEST(PickleReaderTest, IntegersFloatsAndProtocol4) {
  // (LONG1 -2, LONG1 2**40, BINFLOAT 1.5, BININT2 513, True) with FRAME,
  // SHORT_BINUNICODE and MEMOIZE as protocol 4 writes them.
  std::string p = std::string("\x80\x04\x95\x20\0\0\0\0\0\0\0(", 12);
  p += std::string("\x8a\x01\xfe", 3);
  p += std::string("\x8a\x06\0\0\0\0\0\x01", 8);
  p += std::string("G\x3f\xf8\0\0\0\0\0\0", 9);
  p += std::string("M\x01\x02", 3);
  p += std::string("\x88\x8c\x02hi\x94t.", 8);
  PickleResult r = parsePickle(p);
  ASSERT_TRUE(r.ok) << r.error;
  const PickleValue& t = r.doc.at(r.doc.root);
  ASSERT_EQ(t.kind, PickleKind::kTuple);
  ASSERT_EQ(t.items.size(), 6u);
  EXPECT_EQ(r.doc.at(t.items[0]).integer, -2);
  EXPECT_EQ(r.doc.at(t.items[1]).integer, int64_t{1} << 40);
  EXPECT_EQ(r.doc.at(t.items[2]).real, 1.5);
  EXPECT_EQ(r.doc.at(t.items[3]).integer, 513);
  EXPECT_EQ(r.doc.at(t.items[4]).kind, PickleKind::kBool);
  EXPECT_EQ(r.doc.at(t.items[5]).text, "hi");
}

TEST(PickleReaderTest, LimitsAreEnforced) {
  PickleLimits lim;
  lim.maxMarks = 4;
  EXPECT_NE(parsePickle("\x80\x02(((((", lim).error.find("nested MARKs"), std::string::npos);
  lim = {};
  lim.maxMemo = 2;
  std::string memo = "\x80\x02N";
  for (int i = 0; i < 3; ++i) memo += std::string("q") + static_cast<char>(i);
  EXPECT_NE(parsePickle(memo + ".", lim).error.find("memo entries"), std::string::npos);
  lim = {};
  lim.maxValues = 3;
  EXPECT_NE(parsePickle("\x80\x02NNNN.", lim).error.find("more than 3 values"), std::string::npos);
  lim = {};
  lim.maxStack = 3;
  EXPECT_NE(parsePickle(std::string("\x80\x02Nq\x00h\x00h\x00h\x00.", 12), lim)
                .error.find("stack deeper"),
            std::string::npos);
  lim = {};
  lim.maxSlots = 2;
  EXPECT_NE(parsePickle("\x80\x02](NNNe.", lim).error.find("entries"), std::string::npos);
  // A BINBYTES8 length beyond the input is refused before anything is set aside.
  const std::string huge = std::string("\x80\x04\x8e\xff\xff\xff\xff\xff\xff\xff\x7f", 11);
  PickleResult r = parsePickle(huge);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("BINBYTES8"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("offset 2"), std::string::npos) << r.error;
  EXPECT_NE(parsePickle("\x80\x02NN.").error.find("STOP with 2 values"), std::string::npos);
}

// ---- loadTrainData

TrainConfig dataConfig(const std::string& data) {
  TrainConfig c;
  c.data = data;
  c.dataNamed = true;
  c.model = "resnet18";
  c.trainSamples = 4;
  c.testSamples = 1;
  return c;
}

TEST(CifarDataChoiceTest, DataPathRecognisesCifar) {
  TempDir root;
  const std::string dir = writeCifar100Bin(root);
  DataSplit s = loadTrainData(dataConfig(root.path()));
  EXPECT_EQ(s.source, "CIFAR-100 (" + dir + ")");
  expectImages(s.train, 0, 4, 100);
  expectImages(s.test, 1000, 1, 100);
  s = loadTrainData(dataConfig(root.path()), DataFormat::kCifar100Bin);
  EXPECT_EQ(s.source, "CIFAR-100 (" + dir + ")");
  expectDataError([&] { loadTrainData(dataConfig(root.path()), DataFormat::kCifar10Py); },
                  {"--data " + root.path(), "holds no CIFAR-10", "--data-format cifar10",
                   root.path() + "/cifar-10-batches-py/", "data_batch_1...test_batch"});
  expectDataError([&] { loadTrainData(dataConfig(root.path()), DataFormat::kFashionMnist); },
                  {"--data " + root.path(), "holds no Fashion-MNIST"});
  expectDataError([&] { loadTrainData(dataConfig("synthetic-cifar"), DataFormat::kCifar10Py); },
                  {"--data-format cifar10", "generated"});
}

TEST(CifarDataChoiceTest, NeitherLayoutSaysWhatWasLookedFor) {
  TempDir root;
  expectDataError([&] { loadTrainData(dataConfig(root.path())); },
                  {"--data " + root.path(), "holds no Fashion-MNIST",
                   root.file(kTrainImagesFile) + " (no such file)", "nor CIFAR-10/100",
                   root.path() + "/cifar-10-batches-py/", root.path() + "/cifar-100-python/",
                   root.path() + "/cifar-10-batches-bin/", root.path() + "/cifar-100-binary/",
                   "--data synthetic"});
}

}  // namespace
}  // namespace ddprun::train
