// The progress file (common/progress_file.h): the writer and the reader
// agree, and the reader trusts nothing it finds.
#include "ddprun/common/progress_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include <gtest/gtest.h>

#include "temp_dir.h"

namespace ddprun {
namespace {

void writeRaw(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// The reader's verdict on `text` written raw: "" when accepted, else why.
std::string whyRefused(const std::string& text) {
  testing::TempDir dir;
  const std::string p = dir.file("progress.json");
  writeRaw(p, text);
  std::string why;
  auto r = readProgressFile(p, &why);
  if (r) return "";
  EXPECT_FALSE(why.empty()) << text;
  return why;
}

ProgressReport full() {
  ProgressReport r;
  r.step = 41;
  r.epoch = 2;
  r.loss = 0.5312345678901234;
  r.samplesPerSecond = 812.5;
  r.totalSteps = 1000;
  r.time = 1714564800.25;
  return r;
}

TEST(ProgressFile, RoundTripKeepsEveryField) {
  testing::TempDir dir;
  const std::string p = dir.file("progress.json");
  ASSERT_TRUE(writeProgressFile(p, full(), /*force=*/true));
  std::string why;
  auto back = readProgressFile(p, &why);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(*back, full());
}

TEST(ProgressFile, RoundTripWithOnlyTheRequiredFields) {
  testing::TempDir dir;
  const std::string p = dir.file("progress.json");
  ProgressReport r;
  r.step = 7;
  r.time = 12.5;
  ASSERT_TRUE(writeProgressFile(p, r, true));
  auto back = readProgressFile(p);
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, r);
  EXPECT_FALSE(back->loss);
  EXPECT_FALSE(back->epoch);
}

TEST(ProgressFile, WriteLeavesNoTemporaryFileAndReplacesTheLastReport) {
  testing::TempDir dir;
  const std::string p = dir.file("progress.json");
  ProgressReport r = full();
  ASSERT_TRUE(writeProgressFile(p, r, true));
  r.step = 42;
  ASSERT_TRUE(writeProgressFile(p, r, true));
  EXPECT_EQ(readProgressFile(p)->step, 42);
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    ++files;
    EXPECT_EQ(e.path().filename(), "progress.json");
  }
  EXPECT_EQ(files, 1u);
}

TEST(ProgressFile, UnforcedWritesAreRateLimitedPerPath) {
  testing::TempDir dir;
  const std::string p = dir.file("progress.json");
  ProgressReport r = full();
  ASSERT_TRUE(writeProgressFile(p, r, true));
  // Within the interval of the last write: nothing written, not a failure.
  // (The interval is 500 ms; these calls follow at once.)
  r.step = 99;
  EXPECT_TRUE(writeProgressFile(p, r));
  EXPECT_EQ(readProgressFile(p)->step, 41);
  EXPECT_TRUE(writeProgressFile(p, r, true));  // forced: written
  EXPECT_EQ(readProgressFile(p)->step, 99);
}

TEST(ProgressFile, WriterLeavesOutWhatIsNotFiniteAndFillsTheTime) {
  ProgressReport r;
  r.step = 3;
  r.loss = std::numeric_limits<double>::quiet_NaN();
  r.samplesPerSecond = std::numeric_limits<double>::infinity();
  const std::string text = formatProgressReport(r);
  EXPECT_EQ(text.find("loss"), std::string::npos) << text;
  EXPECT_EQ(text.find("samples_per_second"), std::string::npos) << text;
  auto back = parseProgressReport(text);
  ASSERT_TRUE(back) << text;
  EXPECT_GT(back->time, 1.5e9);  // the current time, for a time of 0
}

TEST(ProgressFile, WriteFailureReturnsFalseWithoutThrowing) {
  EXPECT_FALSE(writeProgressFile("", full(), true));
  EXPECT_FALSE(writeProgressFile("/nonexistent-dir-ddprun/progress.json", full(), true));
}

TEST(ProgressFile, MissingFileIsNoReportAndNoError) {
  testing::TempDir dir;
  std::string why = "stale";
  EXPECT_FALSE(readProgressFile(dir.file("nope.json"), &why));
  EXPECT_EQ(why, "");
}

TEST(ProgressFile, TooBigIsRefusedBeforeReading) {
  std::string big = R"({"step": 1, "time": 2, "pad": ")" + std::string(5000, 'x') + "\"}";
  EXPECT_NE(whyRefused(big).find("larger than 4096 bytes"), std::string::npos);
}

TEST(ProgressFile, NotJsonOrNotAnObjectIsRefused) {
  EXPECT_EQ(whyRefused("garbage"), "not JSON");
  EXPECT_EQ(whyRefused(""), "not JSON");
  EXPECT_EQ(whyRefused(R"({"step": 1, "time": 2)"), "not JSON");  // cut short
  EXPECT_EQ(whyRefused("[1, 2]"), "not a JSON object");
  EXPECT_EQ(whyRefused("\"step\""), "not a JSON object");
}

TEST(ProgressFile, WrongTypesAreRefusedNamingTheField) {
  EXPECT_EQ(whyRefused(R"({"time": 2})"), "no 'step'");
  EXPECT_EQ(whyRefused(R"({"step": 2})"), "no 'time'");
  EXPECT_EQ(whyRefused(R"({"step": "2", "time": 2})"), "'step' is not an integer");
  EXPECT_EQ(whyRefused(R"({"step": 2.5, "time": 2})"), "'step' is not an integer");
  EXPECT_EQ(whyRefused(R"({"step": -1, "time": 2})"), "'step' is below 0");
  EXPECT_EQ(whyRefused(R"({"step": 18446744073709551615, "time": 2})"),
            "'step' is out of range");
  EXPECT_EQ(whyRefused(R"({"step": 1, "time": "now"})"), "'time' is not a number");
  EXPECT_EQ(whyRefused(R"({"step": 1, "time": -3})"), "'time' is negative");
  EXPECT_EQ(whyRefused(R"({"step": 1, "time": 2, "loss": "low"})"),
            "'loss' is not a number");
  EXPECT_EQ(whyRefused(R"({"step": 1, "time": 2, "epoch": true})"),
            "'epoch' is not an integer");
  EXPECT_EQ(whyRefused(R"({"step": 1, "time": 2, "total_steps": 0})"),
            "'total_steps' is below 1");
  EXPECT_EQ(whyRefused(R"({"step": 1, "time": 2, "samples_per_second": -5})"),
            "'samples_per_second' is negative");
  EXPECT_EQ(whyRefused(R"({"step": 1, "time": 2, "loss": [1]})"),
            "'loss' is not a number");
}

TEST(ProgressFile, NonFiniteNumbersAreRefused) {
  // NaN and Infinity are not JSON; a number beyond a double is not finite.
  EXPECT_EQ(whyRefused(R"({"step": 1, "time": 2, "loss": NaN})"), "not JSON");
  EXPECT_EQ(whyRefused(R"({"step": 1, "time": 2, "loss": Infinity})"), "not JSON");
  const std::string huge = whyRefused(R"({"step": 1, "time": 2, "loss": 1e999})");
  EXPECT_NE(huge, "") << "1e999 accepted";
}

TEST(ProgressFile, NullsAndUnknownFieldsAreAccepted) {
  EXPECT_EQ(whyRefused(R"({"step": 1, "time": 2, "loss": null, "epoch": null, "x": {}})"),
            "");
}

TEST(ProgressFile, SomethingOtherThanARegularFileIsRefused) {
  testing::TempDir dir;
  std::string why;
  // A directory, a FIFO (opened without blocking), a symbolic link.
  std::filesystem::create_directory(dir.file("d"));
  EXPECT_FALSE(readProgressFile(dir.file("d"), &why));
  EXPECT_NE(why.find("not a regular file"), std::string::npos) << why;
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  EXPECT_FALSE(readProgressFile(dir.file("fifo"), &why));
  EXPECT_NE(why.find("not a regular file"), std::string::npos) << why;
  writeRaw(dir.file("real.json"), R"({"step": 1, "time": 2})");
  std::filesystem::create_symlink(dir.file("real.json"), dir.file("link.json"));
  EXPECT_FALSE(readProgressFile(dir.file("link.json"), &why));
  EXPECT_FALSE(why.empty());
}

}  // namespace
}  // namespace ddprun
