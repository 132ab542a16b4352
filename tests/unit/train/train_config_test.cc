// The `train` flags: float flags finite and within their documented ranges,
// --threads bounded by the machine, each refusal naming the flag (exit 2).
#include "ddprun/train/train_config.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "bench_window.h"
#include "ddprun/train/backend_choice.h"
#include "ddprun/train/data.h"

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

TEST(TrainConfigTest, ResNetFlagsAndTheirDefaults) {
  const ParseResult d = parse({});
  ASSERT_TRUE(d.config) << d.output;
  EXPECT_EQ(d.config->stem, "imagenet");
  EXPECT_EQ(d.config->numClasses, 10);
  EXPECT_EQ(d.config->imageSize, 0);
  EXPECT_EQ(d.config->device, DeviceChoice::kAuto);
  EXPECT_EQ(d.config->precision, Precision::kFp32);
  const ParseResult r = parse({"--model", "resnet18", "--data", "synthetic-cifar",
                               "--stem", "cifar", "--num-classes", "4", "--image-size",
                               "64", "--device", "cuda", "--precision", "bf16"});
  ASSERT_TRUE(r.config) << r.output;
  EXPECT_EQ(r.config->model, "resnet18");
  EXPECT_EQ(r.config->data, "synthetic-cifar");
  EXPECT_EQ(r.config->stem, "cifar");
  EXPECT_EQ(r.config->numClasses, 4);
  EXPECT_EQ(r.config->imageSize, 64);
  EXPECT_EQ(r.config->device, DeviceChoice::kCuda);
  EXPECT_EQ(r.config->precision, Precision::kBf16);
  for (const char* p : {"fp32", "tf32", "bf16", "fp16"})
    EXPECT_TRUE(parse({"--device", "auto", "--precision", p}).config) << p;
  EXPECT_TRUE(parse({"--device", "cpu", "--precision", "fp32"}).config);
  EXPECT_NE(parse({"--help"}).output.find("--image-size"), std::string::npos);
}

TEST(TrainConfigTest, ResNetNeedsThreeChannelDataAndTheSmallModelsTheirs) {
  expectRefused({"--model", "resnet18"}, "--data synthetic-cifar");
  expectRefused({"--model", "resnet18", "--data", "synthetic"}, "3-channel");
  expectRefused({"--model", "lenet", "--data", "synthetic-cifar"}, "--model resnet18");
  expectRefused({"--data", "synthetic-cifar"}, "1x28x28");  // the default model, lenet
  EXPECT_TRUE(parse({"--model", "mlp", "--data", "synthetic"}).config);
}

TEST(TrainConfigTest, ClassesMatchTheData) {
  const std::vector<const char*> cifar = {"--model", "resnet18", "--data",
                                          "synthetic-cifar"};
  auto with = [&](std::vector<const char*> extra) {
    std::vector<const char*> a = cifar;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  for (const char* n : {"2", "7", "10"})
    EXPECT_TRUE(parse(with({"--num-classes", n})).config) << n;
  for (const char* n : {"1", "0", "-3", "11", "1000"})
    expectRefused(with({"--num-classes", n}), "--num-classes must be in [2, 10]");
  expectRefused({"--num-classes", "5"}, "10 classes");  // Fashion-MNIST
  expectRefused({"--data", "synthetic", "--num-classes", "9"}, "does not match the data");
  EXPECT_TRUE(parse({"--data", "synthetic", "--num-classes", "10"}).config);
}

// A --data path's kind is known once read: the model and --num-classes are
// checked against the loaded set.
TEST(TrainConfigTest, APathsDataIsCheckedAgainstTheModelOnceLoaded) {
  const ParseResult r = parse({"--model", "resnet18", "--data", "/some/cifar"});
  ASSERT_TRUE(r.config) << r.output;
  Dataset rgb;
  rgb.channels = 3;
  rgb.height = rgb.width = 32;
  rgb.numClasses = 100;
  EXPECT_EQ(modelDataProblem(*r.config, rgb), "");
  Dataset gray;  // 1x28x28, 10 classes
  EXPECT_NE(modelDataProblem(*r.config, gray).find("needs 3-channel images"), std::string::npos);
  const ParseResult lenet = parse({"--data", "/some/cifar"});
  ASSERT_TRUE(lenet.config);
  EXPECT_NE(modelDataProblem(*lenet.config, rgb).find("takes 1x28x28"), std::string::npos);
  EXPECT_EQ(modelDataProblem(*lenet.config, gray), "");
  const ParseResult named =
      parse({"--model", "resnet18", "--data", "/some/cifar", "--num-classes", "10"});
  ASSERT_TRUE(named.config);
  EXPECT_NE(modelDataProblem(*named.config, rgb).find("which has 100 classes"),
            std::string::npos);
  // Not named: the model takes the data's classes.
  EXPECT_FALSE(r.config->numClassesNamed);
}

TEST(TrainConfigTest, RecipeFlagsAreCheckedAndNamed) {
  const ParseResult ok =
      parse({"--epochs", "10", "--lr-schedule", "multistep", "--lr-milestones", "3,6",
             "--lr-gamma", "0.2", "--warmup-epochs", "1", "--nesterov", "--label-smoothing",
             "0.1", "--augment", "crop-flip", "--normalize", "cifar10", "--lr-step-on", "step",
             "--log-seconds", "5", "--data-threads", "3"});
  ASSERT_TRUE(ok.config) << ok.output;
  EXPECT_TRUE(ok.config->nesterov);
  EXPECT_FLOAT_EQ(ok.config->labelSmoothing, 0.1f);
  EXPECT_EQ(ok.config->lrMilestones, "3,6");
  EXPECT_EQ(ok.config->warmupEpochs, 1);
  EXPECT_EQ(ok.config->dataThreads, 3);
  EXPECT_DOUBLE_EQ(ok.config->logSeconds, 5.0);
  for (const char* v : {"nan", "1", "-0.1", "inf"})
    expectRefused({"--label-smoothing", v}, "--label-smoothing");
  for (const char* v : {"0", "nan", "1.5"}) expectRefused({"--lr-gamma", v}, "--lr-gamma");
  expectRefused({"--nesterov", "--momentum", "0"}, "--nesterov needs");
  expectRefused({"--nesterov", "--optimizer", "adam"}, "--nesterov needs");
  expectRefused({"--warmup-epochs", "1"}, "--warmup-epochs");  // 1 epoch in all
  expectRefused({"--lr-step-on", "batch"}, "--lr-step-on");
  expectRefused({"--data-threads", "65"}, "--data-threads");
  expectRefused({"--log-seconds", "-1"}, "--log-seconds");
}

TEST(TrainConfigTest, StemAndImageSizeAreResNetsOnly) {
  const std::vector<const char*> cifar = {"--model", "resnet18", "--data",
                                          "synthetic-cifar"};
  auto with = [&](std::vector<const char*> extra) {
    std::vector<const char*> a = cifar;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  expectRefused(with({"--stem", "tiny"}),
                "unknown --stem 'tiny': choose one of imagenet, cifar");
  expectRefused({"--stem", "cifar"}, "--stem is for resnet18");
  for (const char* s : {"8", "32", "224", "1024", "0"})
    EXPECT_TRUE(parse(with({"--image-size", s})).config) << s;
  for (const char* s : {"7", "1", "-32", "1025"})
    expectRefused(with({"--image-size", s}),
                  "--image-size must be 0 (the data's size) or in "
                  "[8, 1024]");
  expectRefused({"--image-size", "32"}, "--image-size is for resnet18");
  expectRefused({"--model", "mlp", "--image-size", "28"}, "--image-size is for resnet18");
}

TEST(TrainConfigTest, DeviceAndPrecision) {
  expectRefused({"--device", "tpu"},
                "unknown --device 'tpu': choose one of cpu, cuda, auto");
  expectRefused({"--precision", "fp64"},
                "unknown --precision 'fp64': choose one of fp32, tf32, bf16, fp16");
  for (const char* p : {"tf32", "bf16", "fp16"})
    expectRefused({"--device", "cpu", "--precision", p}, "--precision");
  const ParseResult r = parse({"--device", "cpu", "--precision", "bf16"});
  EXPECT_NE(r.output.find("--device cuda"), std::string::npos) << r.output;
  // Spellings are exact: no case folding, no fallback to a default.
  expectRefused({"--precision", "FP16"}, "unknown --precision 'FP16'");
  expectRefused({"--precision", ""}, "unknown --precision ''");
  expectRefused({"--device", "CPU"}, "unknown --device 'CPU'");
}

// CUDA's activation layout: auto unless --layout nhwc|nchw; auto is NHWC
// in the tensor-core precisions and NCHW in fp32; anything else is refused
// with the choices.
TEST(TrainConfigTest, LayoutDefaultsToAutoNhwcExceptInFp32) {
  const ParseResult d = parse({});
  ASSERT_TRUE(d.config);
  EXPECT_EQ(d.config->layout, Layout::kAuto);
  for (const char* l : {"nchw", "nhwc"}) {
    const ParseResult n = parse({"--layout", l});
    ASSERT_TRUE(n.config);
    EXPECT_STREQ(layoutName(n.config->layout), l);
  }
  expectRefused({"--layout", "NHWC"},
                "unknown --layout 'NHWC': choose one of auto, nhwc, nchw");
  expectRefused({"--layout", "channels_last"}, "unknown --layout 'channels_last'");
  EXPECT_FALSE(nhwcLayout(Layout::kAuto, Precision::kFp32));
  for (const Precision p : {Precision::kTf32, Precision::kBf16, Precision::kFp16}) {
    EXPECT_TRUE(nhwcLayout(Layout::kAuto, p));
    EXPECT_FALSE(nhwcLayout(Layout::kNchw, p));
  }
  EXPECT_TRUE(nhwcLayout(Layout::kNhwc, Precision::kFp32));
}

// Every spelling parses to its value and back; nothing else parses.
TEST(TrainConfigTest, DeviceAndPrecisionSpellings) {
  for (Precision p : {Precision::kFp32, Precision::kTf32, Precision::kBf16, Precision::kFp16}) {
    EXPECT_EQ(parsePrecision(precisionName(p)), p);
    const ParseResult r = parse({"--device", "cuda", "--precision", precisionName(p)});
    ASSERT_TRUE(r.config) << r.output;
    EXPECT_EQ(r.config->precision, p);
  }
  for (DeviceChoice d : {DeviceChoice::kCpu, DeviceChoice::kCuda, DeviceChoice::kAuto}) {
    EXPECT_EQ(parseDeviceChoice(deviceChoiceName(d)), d);
    const ParseResult r = parse({"--device", deviceChoiceName(d)});
    ASSERT_TRUE(r.config) << r.output;
    EXPECT_EQ(r.config->device, d);
  }
  EXPECT_EQ(parsePrecision("fp64"), std::nullopt);
  EXPECT_EQ(parsePrecision("Fp32"), std::nullopt);
  EXPECT_EQ(parseDeviceChoice("gpu"), std::nullopt);
}

// Only a --data the user gave is "named" (a missing directory's error says
// whether the user named it or train looked in its default one).
TEST(TrainConfigTest, DataNamedOnlyWhenGiven) {
  const ParseResult d = parse({});
  ASSERT_TRUE(d.config) << d.output;
  EXPECT_FALSE(d.config->dataNamed);
  EXPECT_EQ(d.config->data, kDefaultDataDir);
  const ParseResult n = parse({"--data", kDefaultDataDir});
  ASSERT_TRUE(n.config) << n.output;
  EXPECT_TRUE(n.config->dataNamed);
}

TEST(TrainConfigTest, SampleCountsAreBounded) {
  expectRefused({"--train-samples", "5000000"}, "--train-samples");
  EXPECT_TRUE(parse({"--train-samples", "60000"}).config);
}

// Under a launcher every rank parses the same argv: only rank 0 prints the
// help or the usage error (`ddprun --nproc-per-node=4 train --help` shows it once).
TEST(TrainConfigTest, OnlyTheFirstRankPrintsTheHelpOrAUsageError) {
  using O = std::optional<std::string>;
  EXPECT_TRUE(printsParseOutput(O(), O()));      // run alone
  EXPECT_TRUE(printsParseOutput(O("0"), O("0")));
  EXPECT_FALSE(printsParseOutput(O("3"), O("3")));
  EXPECT_FALSE(printsParseOutput(O("4"), O("0")));  // node 1's local rank 0: RANK decides
  EXPECT_TRUE(printsParseOutput(O("0"), O("2")));
  EXPECT_FALSE(printsParseOutput(O(), O("1")));  // only LOCAL_RANK: it decides
  EXPECT_TRUE(printsParseOutput(O("x"), O("1")));  // unreadable: better twice than never
  const char* help[] = {"train", "--help"};
  EXPECT_EQ(parseTrainArgs(2, help, 4).exitCode, 0);  // the exit code is every rank's
}

}  // namespace
}  // namespace ddprun::train

namespace ddprun::train {
namespace {

TEST(TrainConfigBench, BenchmarkAidsAndDeterminismDefaultOff) {
  const ParseResult d = parseTrainArgs(1, std::vector<const char*>{"train"}.data(), 4);
  ASSERT_TRUE(d.config);
  EXPECT_EQ(d.config->benchWarmup, 0);
  EXPECT_EQ(d.config->profileSteps, 0);
  EXPECT_FALSE(d.config->deterministic);
  std::vector<const char*> on = {"train", "--bench-warmup", "8", "--profile-steps", "5",
                                 "--deterministic"};
  const ParseResult r = parseTrainArgs(static_cast<int>(on.size()), on.data(), 4);
  ASSERT_TRUE(r.config) << r.output;
  EXPECT_EQ(r.config->benchWarmup, 8);
  EXPECT_EQ(r.config->profileSteps, 5);
  EXPECT_TRUE(r.config->deterministic);
  for (const char* flag : {"--bench-warmup", "--profile-steps"}) {
    std::vector<const char*> bad = {"train", flag, "-1"};
    const ParseResult e = parseTrainArgs(3, bad.data(), 4);
    EXPECT_EQ(e.exitCode, 2) << flag;
    EXPECT_NE(e.output.find("must be >= 0"), std::string::npos) << e.output;
  }
}

}  // namespace
}  // namespace ddprun::train

namespace ddprun::train {
namespace {

TEST(BenchFlags, TheWindowAndTheProfileMustFitTheRunAndOneEpoch) {
  EXPECT_EQ(benchFlagsProblem(0, 0, 5, 5), "");
  EXPECT_EQ(benchFlagsProblem(8, 5, 40, 40), "");
  EXPECT_EQ(benchFlagsProblem(0, 5, 5, 5), "");  // a profile of every step
  EXPECT_NE(benchFlagsProblem(0, 6, 5, 5).find("--profile-steps 6 is more than the 5"),
            std::string::npos);
  EXPECT_NE(benchFlagsProblem(8, 2, 10, 10).find("leave no timed step of the 10"),
            std::string::npos);
  // 40 steps over two epochs of 20: the window (steps 9 to 35) crosses the end.
  EXPECT_NE(benchFlagsProblem(8, 5, 40, 20).find("crosses the end of an epoch after 20"),
            std::string::npos);
  // The profile may run into the next epoch; the window may not.
  EXPECT_EQ(benchFlagsProblem(8, 20, 40, 20), "");
}

}  // namespace
}  // namespace ddprun::train
