// The `train` flags: float flags finite and within their documented ranges,
// --threads bounded by the machine, each refusal naming the flag (exit 2).
#include "ddprun/train/train_config.h"

#include <gtest/gtest.h>

#include <vector>

namespace ddprun::train {
namespace {

ParseResult parse(std::vector<const char*> args, int cpus = 4) {
  args.insert(args.begin(), "train");
  return parseTrainArgs(static_cast<int>(args.size()), args.data(), cpus);
}

void expectRefused(std::vector<const char*> args, const std::string& needle,
                   int cpus = 4) {
  const ParseResult r = parse(args, cpus);
  EXPECT_FALSE(r.config) << args[0] << " " << args[1];
  EXPECT_EQ(r.exitCode, 2) << args[0] << " " << args[1];
  EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
}

TEST(TrainConfigTest, FloatFlagsMustBeFiniteAndInRange) {
  for (const char* v : {"inf", "-inf", "nan", "1e308", "0", "-0.1", "10.5"})
    expectRefused({"--lr", v}, "--lr");
  for (const char* v : {"nan", "inf", "-0.1", "1", "1.5"})
    expectRefused({"--momentum", v}, "--momentum");
  for (const char* v : {"nan", "inf", "-1e-9", "2"})
    expectRefused({"--weight-decay", v}, "--weight-decay");
  for (const char* v : {"nan", "inf", "0", "4096"}) {
    expectRefused({"--bucket-cap-mb", v}, "--bucket-cap-mb");
    expectRefused({"--first-bucket-mb", v}, "--first-bucket-mb");
  }
  const ParseResult r = parse({"--lr", "inf"});
  EXPECT_NE(r.output.find("(0, 10]"), std::string::npos) << r.output;
  // The ends of the ranges that are included.
  for (std::vector<const char*> ok : {std::vector<const char*>{"--lr", "10"},
                                      {"--lr", "1e-6"},
                                      {"--momentum", "0"},
                                      {"--momentum", "0.99"},
                                      {"--weight-decay", "0"},
                                      {"--weight-decay", "1"},
                                      {"--bucket-cap-mb", "1024"},
                                      {"--first-bucket-mb", "0.01"}})
    EXPECT_TRUE(parse(ok).config) << ok[0] << " " << ok[1] << ": " << parse(ok).output;
}

TEST(TrainConfigTest, ThreadsAreBoundedByTheCpusThisProcessMayUse) {
  EXPECT_TRUE(parse({"--threads", "4"}, 4).config);
  expectRefused({"--threads", "5"}, "--threads 5 is more than the 4 CPUs", 4);
  expectRefused({"--threads", "40000"}, "--threads", 64);
  expectRefused({"--threads", "65536"}, "at most 64", 64);
  expectRefused({"--threads", "0"}, "--threads");
  EXPECT_GE(availableCpus(), 1);
}

TEST(TrainConfigTest, SampleCountsAreBounded) {
  expectRefused({"--train-samples", "5000000"}, "--train-samples");
  EXPECT_TRUE(parse({"--train-samples", "60000"}).config);
}

}  // namespace
}  // namespace ddprun::train
