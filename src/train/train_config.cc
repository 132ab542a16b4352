#include "ddprun/train/train_config.h"

#include <sched.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <sstream>
#include <thread>

#include "ddprun/common/env.h"
#include "ddprun/common/error.h"
#include "ddprun/common/strings.h"
#include "ddprun/common/user_input.h"
#include "ddprun/runtime/reducer.h"
#include "ddprun/train/cifar.h"
#include "ddprun/train/data.h"
#include "ddprun/train/lr_schedule.h"
#include "ddprun/train/models.h"
#include "ddprun/train/optim.h"
#include "ddprun/train/transforms.h"

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

constexpr const char* kResnetData =
    "pass a CIFAR-10/100 directory (torchvision's layout) or --data synthetic-cifar";

// The model, its options and the data fit together, as far as the flags
// tell: resnet18 takes 3-channel sets, the others the 1x28x28 ones; the
// classes match the data's. A --data path is checked once loaded
// (modelDataProblem(cfg, data)).
std::string knownDataProblem(const TrainConfig& c) {
  const bool resnet = c.model == "resnet18", cifar = c.data == kSyntheticCifar;
  // Fashion-MNIST by default, or the 1x28x28 synthetic set.
  const bool gray = c.data == "synthetic" || !c.dataNamed;
  const auto& stems = Model::stems();
  if (std::find(stems.begin(), stems.end(), c.stem) == stems.end())
    return "unknown --stem '" + c.stem + "': choose one of " + joined(stems);
  if (resnet && gray)
    return std::string("--model resnet18 needs 3-channel images: ") + kResnetData +
           " (Fashion-MNIST and 'synthetic' are 1x28x28)";
  if (!resnet && cifar)
    return "--model " + c.model + " takes 1x28x28 images (Fashion-MNIST or --data "
           "synthetic); --data synthetic-cifar is 3x32x32: use --model resnet18";
  if (cifar && (c.numClasses < 2 || c.numClasses > 10))
    return "--num-classes must be in [2, 10] (got " + std::to_string(c.numClasses) + ")";
  if (gray && c.numClasses != 10)
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

// The recipe's flags: schedule, Nesterov, label smoothing, augmentation,
// normalisation (their spellings read by lr_schedule.h and transforms.h).
std::string recipeProblem(const TrainConfig& c) {
  if (auto e = outOfRange("--label-smoothing", c.labelSmoothing, kLabelSmoothingRange, true);
      !e.empty())
    return e;
  if (c.labelSmoothing >= kLabelSmoothingRange.hi)
    return "--label-smoothing must be below 1 (got " + std::to_string(c.labelSmoothing) + ")";
  if (auto e = outOfRange("--lr-gamma", c.lrGamma, kLrGammaRange, false); !e.empty())
    return e;
  if (c.nesterov && (c.optimizer != "sgd" || c.momentum <= 0.0f))
    return "--nesterov needs --optimizer sgd with --momentum above 0 (as PyTorch's SGD)";
  if (c.warmupEpochs < 0 || c.warmupEpochs >= c.epochs)
    return "--warmup-epochs must be >= 0 and below --epochs (got " +
           std::to_string(c.warmupEpochs) + " of " + std::to_string(c.epochs) + ")";
  try {
    (void)lrScheduleSpec(c, c.lr, 1);  // its form; the steps per epoch are known later
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  if (!std::isfinite(c.valFraction) || c.valFraction < 0 || c.valFraction >= 1)
    return "--val-fraction must be a finite number in [0, 1) (got " +
           std::to_string(c.valFraction) + ")";
  if (!c.valData.empty() && c.valFraction > 0)
    return "--val-data and --val-fraction both name the test split: give one";
  if (!parseDataFormat(c.dataFormat))
    return "unknown --data-format '" + str::escape(c.dataFormat) + "': choose one of " +
           kDataFormatNames;
  if (!parseAugment(c.augment))
    return "unknown --augment '" + c.augment +
           "': choose none, crop-flip or random-resized-crop";
  if (!c.normalize.empty()) {
    // The channels are the data's, known once it is read: the form is
    // checked here for both kinds of set, the count again at load.
    std::string err;
    for (int channels : {3, 1}) {
      try {
        (void)parseNormalize(c.normalize, channels);
        return "";
      } catch (const InvalidArgument& e) {
        if (err.empty()) err = e.message();
      }
    }
    return "--normalize: " + err;
  }
  return "";
}

std::string validate(TrainConfig& c, const DeviceFlags& flags, int cpus) {
  const auto& models = Model::names();
  if (std::find(models.begin(), models.end(), c.model) == models.end())
    return "unknown model '" + c.model + "': choose one of " + joined(models);
  if (auto e = knownDataProblem(c); !e.empty()) return e;
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
  if (auto e = outOfRange("--log-seconds", c.logSeconds, kLogSecondsRange, true); !e.empty())
    return e;
  if (auto e = recipeProblem(c); !e.empty()) return e;
  if (c.dataThreads < 0 || c.dataThreads > kMaxDataThreads)
    return "--data-threads must be in [0, " + std::to_string(kMaxDataThreads) +
           "] (0: from the CPUs this rank may use; got " + std::to_string(c.dataThreads) + ")";
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
                 "missing, train exits 2 saying how to get them), a CIFAR-10/100 directory as "
                 "torchvision leaves it (python or binary version), or 'synthetic' (a "
                 "generated 1x28x28 set, used only when named); 'synthetic-cifar' (3x32x32)")
      ->capture_default_str();
  app.add_option("--data-format", c.dataFormat,
                 std::string("How to read a --data path (auto: recognised from its files; "
                             "cifar10/cifar100: torchvision's python pickles): ") +
                     kDataFormatNames)
      ->capture_default_str();
  app.add_option("--val-data", c.valData,
                 "An image folder's test split: another folder of the same classes");
  app.add_option("--val-fraction", c.valFraction,
                 "An image folder's test split: this fraction of --data's files per class, "
                 "in [0, 1) (a fixed split)")
      ->capture_default_str();
  app.add_flag("--skip-bad-images", c.skipBadImages,
               "An image that does not decode is replaced by the next one of its class and "
               "counted (default: exit 2 naming the file)");
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
  app.add_flag("--nesterov", c.nesterov, "Nesterov momentum (sgd with --momentum > 0)");
  app.add_option("--lr-schedule", c.lrSchedule,
                 "constant | step | multistep | cosine (PyTorch's StepLR, MultiStepLR, "
                 "CosineAnnealingLR)")
      ->capture_default_str();
  app.add_option("--lr-milestones", c.lrMilestones,
                 "multistep: the epochs where the lr is multiplied by --lr-gamma (e.g. "
                 "30,60,80); step: one number, the period in epochs");
  app.add_option("--lr-gamma", c.lrGamma, "The lr's factor at each milestone, in (0, 1]")
      ->capture_default_str();
  app.add_option("--warmup-epochs", c.warmupEpochs,
                 "Linear warm-up of the lr over the first N epochs, per step (0: none)")
      ->capture_default_str();
  app.add_option("--lr-step-on", c.lrStepOn,
                 "When the schedule advances: epoch (scheduler.step() per epoch, PyTorch's "
                 "usual) | step (per optimizer step)")
      ->capture_default_str();
  app.add_option("--label-smoothing", c.labelSmoothing,
                 "Cross-entropy label smoothing, in [0, 1) (PyTorch's label_smoothing)")
      ->capture_default_str();
  app.add_option("--augment", c.augment,
                 "none | crop-flip (4-pixel padded random crop + horizontal flip, CIFAR's) | "
                 "random-resized-crop (+ flip, ImageNet's)")
      ->capture_default_str();
  app.add_option("--normalize", c.normalize,
                 "Per-channel MEAN,...,STD,... or a preset: cifar10 | cifar100 | imagenet | "
                 "fashion-mnist (default: the data set's own)");
  app.add_option("--data-threads", c.dataThreads,
                 "Threads assembling each batch (0: from the CPUs this rank may use)")
      ->capture_default_str();
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
  app.add_option("--log-seconds", c.logSeconds,
                 "Also a progress line at least every S seconds (0: off)")
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
  c.numClassesNamed = app.count("--num-classes") > 0;
  if (const std::string err = validate(c, flags, cpus); !err.empty()) {
    r.exitCode = 2;
    r.output = err;
    return r;
  }
  r.config = c;
  return r;
}

LrScheduleSpec lrScheduleSpec(const TrainConfig& c, double baseLr, int64_t stepsPerEpoch) {
  LrScheduleSpec spec;
  spec.baseLr = baseLr;
  const std::optional<LrScheduleKind> kind = parseLrSchedule(c.lrSchedule);
  if (!kind)
    DDPRUN_THROW(InvalidArgument, "unknown --lr-schedule '", str::escape(c.lrSchedule),
                 "': choose constant, step, multistep or cosine");
  spec.kind = *kind;
  const std::optional<LrStepUnit> unit = parseLrStepUnit(c.lrStepOn);
  if (!unit)
    DDPRUN_THROW(InvalidArgument, "unknown --lr-step-on '", str::escape(c.lrStepOn),
                 "': choose epoch or step");
  spec.unit = *unit;
  const bool usesMilestones = spec.kind == LrScheduleKind::kStep ||
                              spec.kind == LrScheduleKind::kMultiStep;
  if (usesMilestones && c.lrMilestones.empty())
    DDPRUN_THROW(InvalidArgument, "--lr-schedule ", c.lrSchedule,
                 spec.kind == LrScheduleKind::kStep
                     ? " needs --lr-milestones N: the period in epochs"
                     : " needs --lr-milestones, the epochs where the lr decays (e.g. 30,60,80)");
  if (!usesMilestones && !c.lrMilestones.empty())
    DDPRUN_THROW(InvalidArgument, "--lr-milestones is for --lr-schedule step or multistep (got ",
                 c.lrSchedule, ")");
  if (usesMilestones) {
    std::vector<int64_t> m;
    try {
      m = parseMilestones(c.lrMilestones);
    } catch (const InvalidArgument& e) {
      DDPRUN_THROW(InvalidArgument, "--lr-milestones: ", e.message());
    }
    if (spec.kind == LrScheduleKind::kStep) {
      if (m.size() != 1)
        DDPRUN_THROW(InvalidArgument, "--lr-schedule step takes one --lr-milestones number, "
                     "the period in epochs (got ", m.size(), ")");
      spec.stepSize = m[0];
    } else {
      spec.milestones = std::move(m);
    }
  }
  spec.gamma = c.lrGamma;
  spec.warmupEpochs = c.warmupEpochs;
  spec.epochs = c.epochs;
  spec.stepsPerEpoch = std::max<int64_t>(stepsPerEpoch, 1);
  if (const std::string e = checkLrSchedule(spec); !e.empty()) DDPRUN_THROW(InvalidArgument, e);
  return spec;
}

int defaultDataThreads(int cpus, int localWorld, int mathThreads) {
  const int share = std::max(cpus, 1) / std::max(localWorld, 1);
  return std::clamp(share - mathThreads, 1, 8);
}

int dataThreads(const TrainConfig& c) {
  if (c.dataThreads > 0) return c.dataThreads;
  const int64_t local = env::integer("LOCAL_WORLD_SIZE", 1, 1, 1 << 20);
  return defaultDataThreads(availableCpus(), static_cast<int>(local), c.threads);
}

std::string modelDataProblem(const TrainConfig& c, const Dataset& train) {
  const bool resnet = c.model == "resnet18";
  if (resnet && train.channels != 3)
    return std::string("--model resnet18 needs 3-channel images, and --data ") + c.data +
           " holds " + std::to_string(train.channels) + "x" + std::to_string(train.height) +
           "x" + std::to_string(train.width) + " ones: " + kResnetData;
  if (!resnet && (train.channels != 1 || train.height != 28 || train.width != 28))
    return "--model " + c.model + " takes 1x28x28 images, and --data " + c.data + " holds " +
           std::to_string(train.channels) + "x" + std::to_string(train.height) + "x" +
           std::to_string(train.width) + " ones: use --model resnet18";
  if (c.numClassesNamed && c.numClasses != train.numClasses)
    return "--num-classes " + std::to_string(c.numClasses) + " does not match --data " +
           c.data + ", which has " + std::to_string(train.numClasses) +
           " classes (leave --num-classes out: the model takes the data's)";
  return "";
}

bool printsParseOutput(const std::optional<std::string>& rank,
                       const std::optional<std::string>& localRank) {
  const std::optional<std::string>& which = rank ? rank : localRank;
  int64_t r = 0;
  return !which || !str::parseInt(str::trim(*which), r) || r == 0;
}

}  // namespace ddprun::train
