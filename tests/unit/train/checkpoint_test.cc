#include "ddprun/train/checkpoint.h"
#include "ddprun/train/checkpoint_dir.h"
#include "temp_dir.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

namespace ddprun::train {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

using ddprun::testing::TempDir;

std::string readAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void writeAll(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string lengthPrefix(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out;
}

// A hand-made file: length prefix, `header` as is, then `data`.
std::string craft(const std::string& header, const std::string& data) {
  return lengthPrefix(header.size()) + header + data;
}

std::vector<std::string> filesIn(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string bytesOf(const LoadedTensor& t) { return {t.bytes.begin(), t.bytes.end()}; }
template <typename T>
std::string bytesOf(const std::vector<T>& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T)};
}

// Expects loadSafetensors(path) to throw a CheckpointError naming the file
// and containing `what`.
void expectRefused(const std::string& path, const std::string& what) {
  try {
    loadSafetensors(path);
    ADD_FAILURE() << "no CheckpointError for " << what;
  } catch (const CheckpointError& e) {
    std::string msg = e.message();
    EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg << "\nlacks: " << what;
  }
}

TEST(CheckpointTest, RoundTripOfDtypesShapesAndMetadata) {
  TempDir dir;
  std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
  std::vector<double> f64 = {3.141592653589793, -1e300, 2.0, 0.5};
  std::vector<int64_t> i64 = {-(int64_t{1} << 40)};
  std::vector<int32_t> i32 = {7, -8, 9};
  std::vector<uint8_t> u8 = {0, 1, 254, 255, 128};
  std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x7bff, 0x0001};
  std::vector<uint16_t> bf16 = {0x3f80, 0xbf80, 0x4049};
  std::vector<TensorView> views = {
      {"layer1.weight", "F32", {2, 3}, f32.data()},
      {"u8", "U8", {5}, u8.data()},
      {"f64", "F64", {2, 2}, f64.data()},
      {"step", "I64", {}, i64.data()},
      {"ints", "I32", {3, 1}, i32.data()},
      {"empty", "I32", {0, 4}, nullptr},
      {"half", "F16", {4}, f16.data()},
      {"brain", "BF16", {1, 3}, bf16.data()},
  };
  std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"global_step", "42"}, {"note", "ünïcode \"quoted\""}};
  const std::string path = dir.file("model.safetensors");
  saveSafetensors(path, views, meta);
  SafeTensors st = loadSafetensors(path);
  EXPECT_EQ(st.metadata, meta);
  ASSERT_EQ(st.tensors.size(), views.size());
  for (const auto& v : views) {
    const LoadedTensor* t = st.find(v.name);
    ASSERT_NE(t, nullptr) << v.name;
    EXPECT_EQ(t->dtype, v.dtype);
    EXPECT_EQ(t->shape, v.shape);
    ASSERT_EQ(t->bytes.size(), t->numel() * dtypeSize(t->dtype)) << v.name;
    if (!t->bytes.empty()) {
      EXPECT_EQ(0, std::memcmp(t->bytes.data(), v.data, t->bytes.size())) << v.name;
    }
  }
  EXPECT_EQ(st.find("nope"), nullptr);
  EXPECT_EQ(st.find("step")->numel(), 1u);
  EXPECT_EQ(st.find("empty")->numel(), 0u);
  EXPECT_EQ(bytesOf(*st.find("layer1.weight")), bytesOf(f32));
  // File order: larger dtypes first, then by name (as the reference writer).
  std::vector<std::string> order;
  for (const auto& t : st.tensors) order.push_back(t.name);
  EXPECT_EQ(order, (std::vector<std::string>{"f64", "step", "empty", "ints",
                                             "layer1.weight", "brain", "half", "u8"}));
  EXPECT_EQ(filesIn(dir.path()), std::vector<std::string>{"model.safetensors"});
}

TEST(CheckpointTest, ByteLayoutIsTheSafetensorsFormat) {
  TempDir dir;
  std::vector<float> w = {1, 2, 3, 4, 5, 6};
  std::vector<uint8_t> b = {9, 8, 7};
  const std::string path = dir.file("m.safetensors");
  saveSafetensors(path, {{"w", "F32", {3, 2}, w.data()}, {"b", "U8", {3}, b.data()}},
                  {{"step", "7"}});
  std::string file = readAll(path);
  ASSERT_GE(file.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file[i]);
  EXPECT_EQ(n % 8, 0u);
  ASSERT_EQ(file.size(), 8 + n + 24 + 3);
  std::string header = file.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  EXPECT_EQ(header.find_last_not_of(' '), header.find_last_of('}'));
  EXPECT_LT(n - 1 - header.find_last_of('}'), 8u);  // at most 7 spaces of padding
  Json h = Json::parse(header);
  EXPECT_EQ(h.size(), 3u);
  EXPECT_EQ(h["__metadata__"], (Json{{"step", "7"}}));
  EXPECT_EQ(h["w"]["dtype"], "F32");
  EXPECT_EQ(h["w"]["shape"], (Json{3, 2}));
  EXPECT_EQ(h["w"]["data_offsets"], (Json{0, 24}));
  EXPECT_EQ(h["b"]["dtype"], "U8");
  EXPECT_EQ(h["b"]["shape"], (Json{3}));
  EXPECT_EQ(h["b"]["data_offsets"], (Json{24, 27}));
  EXPECT_EQ(file.substr(8 + n, 24), bytesOf(w));
  EXPECT_EQ(file.substr(8 + n + 24), bytesOf(b));
  // The reference writer puts __metadata__ first; no metadata, no key.
  EXPECT_EQ(header.rfind("{\"__metadata__\":", 0), 0u) << header;
  saveSafetensors(path, {{"b", "U8", {3}, b.data()}}, {});
  file = readAll(path);
  Json h2 = Json::parse(file.substr(8, static_cast<uint8_t>(file[0])));
  EXPECT_FALSE(h2.contains("__metadata__"));
}

TEST(CheckpointTest, MalformedFilesAreRefusedNamingTheFile) {
  TempDir dir;
  const std::string p = dir.file("bad.safetensors");
  std::vector<float> w = {1, 2, 3};
  saveSafetensors(p, {{"w", "F32", {3}, w.data()}}, {});
  const std::string good = readAll(p);

  writeAll(p, good.substr(0, 5));
  expectRefused(p, "truncated");
  writeAll(p, good.substr(0, 20));
  expectRefused(p, "larger than the file");
  writeAll(p, good.substr(0, good.size() - 4));
  expectRefused(p, "run past the end of the data");
  writeAll(p, lengthPrefix(uint64_t{1} << 40) + "{}");
  expectRefused(p, "exceeds the limit");
  writeAll(p, lengthPrefix(1000) + "{}");
  expectRefused(p, "header length 1000 is larger than the file");
  writeAll(p, craft("{\"w\": {\"dtype\": \"F32\", ", ""));
  expectRefused(p, "not valid JSON");
  writeAll(p, craft("[1, 2]", ""));
  expectRefused(p, "not a JSON object");
  const std::string data12(12, '\x01');
  writeAll(p,
           craft(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[4,16]}})", data12));
  expectRefused(p, "run past the end of the data (12 bytes)");
  writeAll(p, craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                    data12));
  expectRefused(p, "tensor 'b' overlaps");
  writeAll(p, craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                    R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                    data12));
  expectRefused(p, "gap in the data before tensor 'b'");
  writeAll(p, craft(R"({"w":{"dtype":"F8","shape":[3],"data_offsets":[0,3]}})", data12));
  expectRefused(p, "unknown dtype \"F8\"");
  writeAll(p,
           craft(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", data12));
  expectRefused(p, "needs 16 bytes but data_offsets [0,12] span 12");
  writeAll(p, craft(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data12));
  expectRefused(p, "cover 8 bytes but the file holds 12");
  writeAll(p,
           craft(R"({"w":{"dtype":"F32","shape":[-3],"data_offsets":[0,12]}})", data12));
  expectRefused(p, "non-negative integer");
  writeAll(p,
           craft(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[12,0]}})", data12));
  expectRefused(p, "end before they begin");
  writeAll(p, craft(R"({"w":{"dtype":"F32","shape":[3]}})", data12));
  expectRefused(p, "has no \"data_offsets\"");
  writeAll(p, craft(R"({"w":{"dtype":"U8","shape":[4611686018427387904,8],)"
                    R"("data_offsets":[0,12]}})",
                    data12));
  expectRefused(p, "too large");
  writeAll(p, craft(R"({"__metadata__":{"step":7}})", ""));
  expectRefused(p, "metadata value of 'step' is not a string");
  expectRefused(dir.file("missing.safetensors"), "cannot open");

  // A file with only a header and no tensors is valid.
  writeAll(p, craft(R"({"__metadata__":{"k":"v"}}      )", ""));
  SafeTensors st = loadSafetensors(p);
  EXPECT_TRUE(st.tensors.empty());
  EXPECT_EQ(st.metadata.at("k"), "v");
}

TEST(CheckpointTest, BadTensorsAreNotSaved) {
  TempDir dir;
  const std::string p = dir.file("x.safetensors");
  float f[4] = {};
  auto refused = [&](std::vector<TensorView> views, const std::string& what) {
    try {
      saveSafetensors(p, views, {});
      ADD_FAILURE() << "saved despite " << what;
    } catch (const CheckpointError& e) {
      EXPECT_NE(e.message().find(what), std::string::npos) << e.message();
    }
  };
  refused({{"a", "F32", {1}, f}, {"a", "F32", {1}, f}}, "appears twice");
  refused({{"a", "F12", {1}, f}}, "unknown dtype");
  refused({{"a", "F32", {-1}, f}}, "negative dimension");
  refused({{"a", "F32", {4}, nullptr}}, "has no data");
  refused({{"__metadata__", "F32", {1}, f}}, "invalid tensor name");
  refused({{"", "F32", {1}, f}}, "invalid tensor name");
  refused({{"a", "U8", {int64_t{1} << 40, int64_t{1} << 40}, f}}, "too large");
  EXPECT_TRUE(filesIn(dir.path()).empty());
  // A write that fails at run time is an I/O failure (exit 1), not bad input.
  try {
    saveSafetensors(dir.file("no/such/dir/x.safetensors"), {{"a", "F32", {1}, f}}, {});
    ADD_FAILURE() << "saved into a missing directory";
  } catch (const CheckpointWriteError& e) {
    EXPECT_NE(e.message().find("cannot create"), std::string::npos) << e.message();
  }
  EXPECT_THROW(dtypeSize("Q8"), CheckpointError);
  EXPECT_EQ(dtypeSize("BF16"), 2u);
  EXPECT_TRUE(isKnownDtype("I64"));
  EXPECT_FALSE(isKnownDtype("BOOL"));
}

TEST(CheckpointTest, SavingReplacesAtomicallyAndLeavesNoTemporaries) {
  TempDir dir;
  const std::string path = dir.file(checkpointFileName("run", 10));
  std::vector<float> a(1000, 1.0f), b(2000, 2.0f);
  saveSafetensors(path, {{"w", "F32", {1000}, a.data()}}, {{"v", "1"}});
  // A leftover of an earlier process that had our pid is replaced.
  writeAll(path + ".tmp." + std::to_string(::getpid()), "stale");
  saveSafetensors(path, {{"w", "F32", {2000}, b.data()}}, {{"v", "2"}});
  SafeTensors st = loadSafetensors(path);
  EXPECT_EQ(st.metadata.at("v"), "2");
  ASSERT_EQ(st.tensors.size(), 1u);
  EXPECT_EQ(bytesOf(st.tensors[0]), bytesOf(b));
  EXPECT_EQ(filesIn(dir.path()), std::vector<std::string>{checkpointFileName("run", 10)});

  // A writer that crashed before its rename leaves "<name>.tmp.<pid>": it is
  // not a checkpoint, so neither listed, loaded on resume, nor pruned.
  const std::string leftover = dir.file(checkpointFileName("run", 20) + ".tmp.12345");
  writeAll(leftover, "partial");
  ASSERT_EQ(listCheckpoints(dir.path()).size(), 1u);
  EXPECT_EQ(listCheckpoints(dir.path())[0].path, path);
  pruneCheckpoints(dir.path(), "run", 0);
  EXPECT_TRUE(fs::exists(leftover));
  EXPECT_FALSE(fs::exists(path));
}

// Only a regular file (or nothing) is replaced: a FIFO, a symbolic link or a
// directory at the target is refused (bad input) and left as it was.
TEST(CheckpointTest, SavingNeverReplacesWhatIsNotARegularFile) {
  TempDir dir;
  float f[1] = {1.0f};
  const std::string fifo = dir.file("fifo"), link = dir.file("link"),
                    target = dir.file("t");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  writeAll(target, "keep");
  fs::create_symlink(target, link);
  fs::create_directory(dir.file("sub"));
  for (const auto& [path, kind] : std::vector<std::pair<std::string, std::string>>{
           {fifo, "FIFO"}, {link, "symbolic link"}, {dir.file("sub"), "directory"}}) {
    try {
      saveSafetensors(path, {{"a", "F32", {1}, f}}, {});
      ADD_FAILURE() << "replaced a " << kind;
    } catch (const CheckpointError& e) {
      EXPECT_EQ(e.message().rfind(path + ": ", 0), 0u) << e.message();
      EXPECT_NE(e.message().find(kind), std::string::npos) << e.message();
    }
  }
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(readAll(target), "keep");
  EXPECT_TRUE(fs::is_directory(dir.file("sub")));
  // Reading a FIFO is refused at once, never waited on (no writer exists).
  expectRefused(fifo, "not a regular file");
}

TEST(CheckpointTest, FileNamesCarryTheRunAndTheStep) {
  EXPECT_EQ(checkpointFileName("r1", 0), "ckpt-r1-000000000.safetensors");
  EXPECT_EQ(checkpointFileName("a-b", 1234), "ckpt-a-b-000001234.safetensors");
  EXPECT_EQ(checkpointFileName("r", 1234567890), "ckpt-r-1234567890.safetensors");
  EXPECT_EQ(checkpointFileName("", 12), "ckpt-000000012.safetensors");  // the older form
  EXPECT_THROW(checkpointFileName("r", -1), InvalidArgument);
  for (const std::string tag : {"r", "a-b", "3f2a-11d2-883f", "123"})
    for (int64_t s :
         {int64_t{0}, int64_t{7}, int64_t{999999999}, int64_t{123456789012}}) {
      auto f = parseCheckpointName(checkpointFileName(tag, s));
      ASSERT_TRUE(f) << tag << " " << s;
      EXPECT_EQ(f->tag, tag);
      EXPECT_EQ(f->step, s);
    }
  auto legacy = parseCheckpointName("ckpt-000000012.safetensors");
  ASSERT_TRUE(legacy);
  EXPECT_EQ(legacy->tag, "");
  EXPECT_EQ(legacy->step, 12);
  EXPECT_EQ(parseCheckpointName("ckpt-12.safetensors"), std::nullopt);
  EXPECT_EQ(parseCheckpointName("ckpt-r-000000012.safetensors.tmp.99"), std::nullopt);
  EXPECT_EQ(parseCheckpointName("ckpt-r-00000001x.safetensors"), std::nullopt);
  EXPECT_EQ(parseCheckpointName("ckpt-r-.safetensors"), std::nullopt);
  EXPECT_EQ(parseCheckpointName("ckpt-a b-000000001.safetensors"), std::nullopt);
  EXPECT_EQ(parseCheckpointName("model.safetensors"), std::nullopt);
  EXPECT_EQ(parseCheckpointName("ckpt-99999999999999999999.safetensors"), std::nullopt);
  // Run ids that are not safe in a file name become a stable hash tag.
  EXPECT_EQ(runTag("job_7.a-b"), "job_7.a-b");
  const std::string hashed = runTag("my job/with spaces");
  EXPECT_EQ(hashed.size(), 17u);
  EXPECT_EQ(hashed[0], 'x');
  EXPECT_EQ(runTag("my job/with spaces"), hashed);
  // Pinned: the tag names files on disk, so a resumed run of an older build
  // must find them (64-bit FNV-1a of the run id).
  EXPECT_EQ(hashed, "xe26f403345d83b84");
  EXPECT_NE(runTag("my job/with spaces!"), hashed);
  EXPECT_EQ(runTag(std::string(65, 'a')).size(), 17u);
}

TEST(CheckpointTest, ListAndPruneTouchOnlyTheRunsOwnFiles) {
  TempDir dir;
  EXPECT_TRUE(listCheckpoints(dir.file("missing")).empty());
  pruneCheckpoints(dir.file("missing"), "r", 1);  // nothing to do
  uint8_t byte = 1;
  auto save = [&](const std::string& tag, int64_t step) {
    saveSafetensors(dir.file(checkpointFileName(tag, step)), {{"b", "U8", {1}, &byte}},
                    {});
  };
  // An older run went further (higher steps) than the new one.
  for (int64_t step : {100, 200, 300}) save("old", step);
  save("", 400);  // a file of the older naming, no run
  for (int64_t step : {5, 1000000000, 20, 7}) save("new", step);
  writeAll(dir.file("notes.txt"), "keep me");
  fs::create_directory(dir.file(checkpointFileName("new", 9)));  // not a regular file
  auto names = [&](const std::string& tag) {
    std::vector<std::string> out;
    for (const auto& f : listCheckpoints(dir.path(), tag))
      out.push_back(fs::path(f.path).filename());
    return out;
  };
  EXPECT_EQ(names("new"),
            (std::vector<std::string>{
                "ckpt-new-1000000000.safetensors", "ckpt-new-000000020.safetensors",
                "ckpt-new-000000007.safetensors", "ckpt-new-000000005.safetensors"}));
  EXPECT_EQ(listCheckpoints(dir.path()).size(), 8u);
  EXPECT_EQ(listCheckpoints(dir.path())[0].step, 1000000000);
  pruneCheckpoints(dir.path(), "new", 10);
  EXPECT_EQ(names("new").size(), 4u);
  pruneCheckpoints(dir.path(), "new", 2);
  EXPECT_EQ(names("new"), (std::vector<std::string>{"ckpt-new-1000000000.safetensors",
                                                    "ckpt-new-000000020.safetensors"}));
  EXPECT_EQ(names("old").size(), 3u) << "another run's checkpoints were pruned";
  EXPECT_EQ(names("").size(), 1u);
  pruneCheckpoints(dir.path(), "new", 0);
  EXPECT_TRUE(names("new").empty());
  EXPECT_EQ(names("old").size(), 3u);
  EXPECT_TRUE(fs::exists(dir.file("notes.txt")));
  EXPECT_TRUE(fs::is_directory(dir.file(checkpointFileName("new", 9))));
  EXPECT_THROW(pruneCheckpoints(dir.path(), "new", -1), InvalidArgument);
  EXPECT_THROW(pruneCheckpoints(dir.path(), "", 1), InvalidArgument);
}

TEST(CheckpointTest, LastWrittenRunIsTheNewestFilesRun) {
  TempDir dir;
  EXPECT_EQ(lastWrittenRun(dir.path()), std::nullopt);
  uint8_t byte = 1;
  const auto t0 = fs::file_time_type::clock::now();
  for (const auto& [tag, step, age] : std::vector<std::tuple<std::string, int64_t, int>>{
           {"a", 900, 30}, {"b", 10, 10}, {"c", 50, 20}}) {
    const std::string p = dir.file(checkpointFileName(tag, step));
    saveSafetensors(p, {{"b", "U8", {1}, &byte}}, {});
    fs::last_write_time(p, t0 - std::chrono::seconds(age));
  }
  EXPECT_EQ(lastWrittenRun(dir.path()), "b");
}

}  // namespace
}  // namespace ddprun::train
