#include "ddprun/train/train_config.h"

#include <sched.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <sstream>
#include <thread>

#include "ddprun/common/strings.h"
#include "ddprun/common/user_input.h"
#include "ddprun/runtime/reducer.h"
#include "ddprun/train/data.h"
#include "ddprun/train/models.h"
#include "ddprun/train/optim.h"

namespace ddprun::train {
namespace {

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Returns an error sentence, or "" when the configuration is usable.
// "" when `v` is finite and within `r` (the low end included only when
// `lowIncluded`), else the error sentence naming the flag and the range.
std::string outOfRange(const char* flag, double v, FlagRange r, bool lowIncluded) {
  const bool ok = std::isfinite(v) && (lowIncluded ? v >= r.lo : v > r.lo) && v <= r.hi;
  if (ok) return "";
  std::ostringstream os;
  os << flag << " must be a finite number in " << (lowIncluded ? "[" : "(") << r.lo
     << ", " << r.hi << "] (got " << v << ")";
  return os.str();
}

// The model, its options and the data fit together: resnet18 takes the
// 3-channel set, the others the 1x28x28 ones; the classes match the data's.
std::string modelDataProblem(const TrainConfig& c) {
  const bool resnet = c.model == "resnet18", cifar = c.data == kSyntheticCifar;
  const auto& stems = Model::stems();
  if (std::find(stems.begin(), stems.end(), c.stem) == stems.end())
    return "unknown --stem '" + c.stem + "': choose one of " + joined(stems);
  if (resnet && !cifar)
    return "--model resnet18 needs 3-channel images: pass --data synthetic-cifar "
           "(Fashion-MNIST and 'synthetic' are 1x28x28)";
  if (!resnet && cifar)
    return "--model " + c.model + " takes 1x28x28 images (Fashion-MNIST or --data "
           "synthetic); --data synthetic-cifar is 3x32x32: use --model resnet18";
  if (c.numClasses < 2 || c.numClasses > 10)
    return "--num-classes must be in [2, 10] (got " + std::to_string(c.numClasses) + ")";
  if (!cifar && c.numClasses != 10)
    return "--num-classes " + std::to_string(c.numClasses) +
           " does not match the data: Fashion-MNIST and 'synthetic' have 10 classes "
           "(synthetic-cifar takes 2 to 10)";
  if (!resnet && c.stem != "imagenet")
    return "--stem is for resnet18 (" + c.model + " has no stem to choose)";
  if (c.imageSize != 0 && !resnet)
    return "--image-size is for resnet18 (" + c.model + " takes 28x28 images)";
  if (c.imageSize != 0 && (c.imageSize < kMinImageSize || c.imageSize > kMaxImageSize))
    return "--image-size must be 0 (the data's size) or in [" +
           std::to_string(kMinImageSize) + ", " + std::to_string(kMaxImageSize) +
           "] (got " + std::to_string(c.imageSize) + ")";
  return "";
}

// The flags' spellings as given on the command line (parsed in validate).
struct DeviceFlags {
  std::string device, precision, layout;
};

// Parses --device, --precision and --layout into c (the one place their spellings are
// read) and refuses the CPU with another precision than fp32.
std::string deviceProblem(TrainConfig& c, const DeviceFlags& f) {
  const std::optional<DeviceChoice> device = parseDeviceChoice(f.device);
  if (!device)
    return "unknown --device '" + f.device + "': choose one of " + kDeviceChoices;
  const std::optional<Precision> precision = parsePrecision(f.precision);
  if (!precision)
    return "unknown --precision '" + f.precision + "': choose one of " + kPrecisionChoices;
  const std::optional<Layout> layout = parseLayout(f.layout);
  if (!layout) return "unknown --layout '" + f.layout + "': choose one of " + kLayoutChoices;
  c.device = *device;
  c.precision = *precision;
  c.layout = *layout;
  if (c.device == DeviceChoice::kCpu && c.precision != Precision::kFp32)
    return std::string("--precision ") + precisionName(c.precision) +
           " needs --device cuda: the CPU computes fp32 only";
  return "";
}

std::string validate(TrainConfig& c, const DeviceFlags& flags, int cpus) {
  const auto& models = Model::names();
  if (std::find(models.begin(), models.end(), c.model) == models.end())
    return "unknown model '" + c.model + "': choose one of " + joined(models);
  if (auto e = modelDataProblem(c); !e.empty()) return e;
  if (auto e = deviceProblem(c, flags); !e.empty()) return e;
  const auto& opts = Optimizer::kinds();
  if (std::find(opts.begin(), opts.end(), c.optimizer) == opts.end())
    return "unknown optimizer '" + c.optimizer + "': choose one of " + joined(opts);
  if (!runtime::parseCommHook(c.commHook))
    return "unknown --comm-hook '" + c.commHook + "': choose one of none, fp16, bf16";
  if (c.epochs <= 0) return "--epochs must be positive (got " + std::to_string(c.epochs) + ")";
  if (c.batchSize <= 0)
    return "--batch-size must be positive (got " + std::to_string(c.batchSize) + ")";
  if (auto e = outOfRange("--lr", c.lr, kLrRange, false); !e.empty()) return e;
  if (auto e = outOfRange("--momentum", c.momentum, kMomentumRange, true); !e.empty())
    return e;
  if (c.momentum >= kMomentumRange.hi)
    return "--momentum must be below 1 (got " + std::to_string(c.momentum) + ")";
  if (auto e = outOfRange("--weight-decay", c.weightDecay, kWeightDecayRange, true);
      !e.empty())
    return e;
  if (auto e = outOfRange("--bucket-cap-mb", c.bucketCapMb, kBucketMbRange, false);
      !e.empty())
    return e;
  if (auto e = outOfRange("--first-bucket-mb", c.firstBucketMb, kBucketMbRange, false);
      !e.empty())
    return e;
  if (c.logInterval <= 0) return "--log-interval must be positive";
  if (c.checkpointEvery < 0) return "--checkpoint-every must be >= 0";
  if (c.checkpointEvery > 0 && c.checkpointDir.empty())
    return "--checkpoint-every needs --checkpoint-dir";
  if (c.keepCheckpoints < 1) return "--keep-checkpoints must be at least 1";
  if (c.resume && c.checkpointDir.empty()) return "--resume needs --checkpoint-dir";
  if (c.maxSteps < 0 || c.trainSamples < 0 || c.testSamples < 0)
    return "--max-steps, --train-samples and --test-samples must be >= 0";
  if (c.trainSamples > kMaxIdxSamples || c.testSamples > kMaxIdxSamples)
    return "--train-samples and --test-samples must be at most " +
           std::to_string(kMaxIdxSamples);
  if (c.benchWarmup < 0 || c.profileSteps < 0)
    return "--bench-warmup and --profile-steps must be >= 0";
  if (c.threads < 1) return "--threads must be at least 1";
  if (c.threads > cpus)
    return "--threads " + std::to_string(c.threads) + " is more than the " +
           std::to_string(cpus) + " CPUs this process may run on: give at most " +
           std::to_string(cpus) + " (more math threads than CPUs only slows each step)";
  return "";
}

// The numeric flags read as every ddprun program reads numbers
// (common/user_input.h): CLI11 alone takes 99999999999999999999 as the
// largest int64, -1 as 2^64-1 for --seed, 010 as 8 and 0x1p-3 as a float.
// Integers are checked, then handed to CLI11 in plain decimal; a float's
// form is checked here, its range (NaN and infinities included) by validate.
std::string strictNumber(std::string& text, const std::string& type) {
  int64_t i = 0;
  uint64_t u = 0;
  double d = 0;
  input::NumberProblem p = type == "UINT"  ? input::parseNumber(text, u)
                           : type == "INT" ? input::parseNumber(text, i)
                                           : input::parseNumber(text, d);
  if (type == "FLOAT" &&
      (p == input::NumberProblem::kNotFinite || p == input::NumberProblem::kOutOfRange))
    return "";
  if (p != input::NumberProblem::kNone)
    return "invalid value '" + str::escape(text) + "': " + input::describe(p) +
           (type == "FLOAT" ? "; expected a decimal number"
            : type == "UINT" ? "; expected an integer from 0 to 18446744073709551615"
                             : "; expected an integer");
  if (type != "FLOAT") text = type == "UINT" ? std::to_string(u) : std::to_string(i);
  return "";
}

void readNumbersStrictly(CLI::App& app) {
  for (CLI::Option* o : app.get_options()) {
    const std::string type = o->get_type_name();
    if (type != "INT" && type != "UINT" && type != "FLOAT") continue;
    o->transform(CLI::Validator(
        [type](std::string& text) { return strictNumber(text, type); }, ""));
  }
}

}  // namespace

ParseResult parseTrainArgs(int argc, const char* const* argv, int cpus) {
  TrainConfig c;
  c.data = kDefaultDataDir;
  DeviceFlags flags{deviceChoiceName(c.device), precisionName(c.precision), layoutName(c.layout)};
  CLI::App app{"train: the bundled data-parallel trainer (run it under ddprun, torchrun or alone)",
               "train"};
  app.set_help_flag("-h,--help", "Print this help and exit");
  app.add_option("--model", c.model, "mlp | lenet | lenet-bn | resnet18")
      ->capture_default_str();
  app.add_option("--data", c.data,
                 "Directory of Fashion-MNIST IDX .gz files (Debian's dataset-fashion-mnist; "
                 "missing, train exits 2 saying how to get them), or 'synthetic' (a generated "
                 "1x28x28 set, used only when named); 'synthetic-cifar' (3x32x32) for resnet18")
      ->capture_default_str();
  app.add_option("--stem", c.stem,
                 "resnet18's stem: imagenet (7x7/2 conv, max pool) | cifar (3x3/1 conv)")
      ->capture_default_str();
  app.add_option("--num-classes", c.numClasses,
                 "Outputs of the last layer: the data's classes (10; synthetic-cifar: "
                 "2 to 10)")
      ->capture_default_str();
  app.add_option("--image-size", c.imageSize,
                 "resnet18's input side, the images resized (bilinear) on the device; 0: the "
                 "data's own")
      ->capture_default_str();
  app.add_option("--device", flags.device, "cpu | cuda | auto (cuda when a GPU is present)")
      ->capture_default_str();
  app.add_option("--precision", flags.precision,
                 "fp32 | tf32 | bf16 | fp16 (autocast; cuda only, the CPU computes fp32)")
      ->capture_default_str();
  app.add_flag("--deterministic", c.deterministic,
               "Bitwise-repeatable GPU runs (slower: deterministic, direct-sum cuDNN algorithms)");
  app.add_option("--layout", flags.layout,
                 "Activations in GPU memory: auto (nhwc in tf32/bf16/fp16, nchw in fp32) | "
                 "nhwc (channels_last) | nchw (cuda only; the CPU computes nchw)")
      ->capture_default_str();
  app.add_option("--epochs", c.epochs)->capture_default_str();
  app.add_option("--batch-size", c.batchSize, "Samples per rank per step")->capture_default_str();
  app.add_option("--lr", c.lr, "Learning rate, in (0, 10]")->capture_default_str();
  app.add_option("--momentum", c.momentum, "SGD momentum, in [0, 1)")
      ->capture_default_str();
  app.add_option("--weight-decay", c.weightDecay, "In [0, 1]")->capture_default_str();
  app.add_option("--optimizer", c.optimizer, "sgd | adam")->capture_default_str();
  app.add_option("--seed", c.seed, "Initialisation and shuffling seed")->capture_default_str();
  app.add_option("--bucket-cap-mb", c.bucketCapMb,
                 "Gradient bucket size (MiB), in (0, 1024]")
      ->capture_default_str();
  app.add_option("--first-bucket-mb", c.firstBucketMb,
                 "Cap of the bucket reduced last (MiB), in (0, 1024]")
      ->capture_default_str();
  app.add_flag("--scale-lr", c.scaleLr, "Multiply --lr by the world size");
  app.add_flag("--sync-bn", c.syncBn, "Synchronise batch norm statistics across ranks");
  app.add_option("--comm-hook", c.commHook, "Gradient compression: none | fp16 | bf16")
      ->capture_default_str();
  app.add_flag("--no-shuffle", [&](int64_t) { c.shuffle = false; }, "Visit samples in order");
  app.add_option("--checkpoint-dir", c.checkpointDir,
                 "Write checkpoints here; a restarted group resumes from the newest");
  app.add_option("--checkpoint-every", c.checkpointEvery,
                 "Also checkpoint every N steps (0: only at epoch ends)")->capture_default_str();
  app.add_option("--keep-checkpoints", c.keepCheckpoints)->capture_default_str();
  app.add_flag(
      "--resume", c.resume,
      "Continue this run's newest checkpoint in --checkpoint-dir, else the run written "
      "last (a group restarted by its launcher always resumes its own)");
  app.add_option(
      "--metrics", c.metrics,
      "Append metrics as JSON lines to this file (or a FIFO, a character device)");
  app.add_option("--log-interval", c.logInterval, "Steps between progress lines")
      ->capture_default_str();
  app.add_option("--init", c.init, "Initial weights (safetensors, a regular file)");
  app.add_option(
      "--save", c.save,
      "Write the final model here (safetensors; an existing path must be a regular "
      "file)");
  app.add_option("--max-steps", c.maxSteps, "Cap on steps per epoch (0: all)");
  app.add_option("--train-samples", c.trainSamples, "Use the first N training samples (0: all)");
  app.add_option("--test-samples", c.testSamples, "Use the first N test samples (0: all)");
  app.add_option("--threads", c.threads,
                 "Math library threads per rank (at most the CPUs this process may use)")
      ->capture_default_str();
  app.add_flag("--quiet", c.quiet, "No progress lines");
  app.add_option("--bench-warmup", c.benchWarmup,
                 "Benchmark: time the steps after the first N (device drained, memory peaks "
                 "reset; no progress lines inside the window); 0: off");
  app.add_option("--profile-steps", c.profileSteps,
                 "Benchmark: profile the last N steps with device events per layer (after the "
                 "timed window); 0: off");

  readNumbersStrictly(app);
  ParseResult r;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    r.output = app.help();
    return r;
  } catch (const CLI::ParseError& e) {
    r.exitCode = 2;
    r.output = std::string(e.what()) + " (see train --help)";
    return r;
  }
  c.dataNamed = app.count("--data") > 0;
  if (const std::string err = validate(c, flags, cpus); !err.empty()) {
    r.exitCode = 2;
    r.output = err;
    return r;
  }
  r.config = c;
  return r;
}

bool printsParseOutput(const std::optional<std::string>& rank,
                       const std::optional<std::string>& localRank) {
  const std::optional<std::string>& which = rank ? rank : localRank;
  int64_t r = 0;
  return !which || !str::parseInt(str::trim(*which), r) || r == 0;
}

}  // namespace ddprun::train
