// The `train` command line: flags, defaults that train well, validation.
// parseTrainArgs never exits the process; the caller maps the result to an
// exit code (0 after --help, 2 for bad input).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/common/cpus.h"
#include "ddprun/train/precision.h"

namespace ddprun::train {

struct TrainConfig {
  std::string model = "lenet";
  // Directory of Fashion-MNIST IDX .gz files, "synthetic" (both 1x28x28, 10
  // classes: mlp, lenet, lenet-bn) or "synthetic-cifar" (3x32x32: resnet18).
  std::string data;
  // --data was given (data_choice.h words a missing directory's error by it:
  // the user's --data, or the default set train looked for).
  bool dataNamed = false;
  // --data-format: how to read a --data path (auto: recognised from the
  // files; data_choice.h lists the formats).
  std::string dataFormat = "auto";
  // An image folder's test split (image_folder.h): a second folder, or a
  // fraction of --data held out (not both; neither: no test split).
  std::string valData;
  double valFraction = 0;
  bool skipBadImages = false;  // an undecodable image replaced and counted
  std::string stem = "imagenet";   // resnet18's stem: imagenet | cifar
  // The model's outputs are always the data's classes; this only picks
  // synthetic-cifar's (2..10) and, when named, must equal a data set's.
  int64_t numClasses = 10;
  bool numClassesNamed = false;
  int64_t imageSize = 0;           // resnet18's input side; 0: the data's own (32)
  // Parsed from their spellings here, once (precision.h); the CPU takes fp32
  // only (a refusal of --device cpu with another precision is made here,
  // auto's choice against the machine in backend_choice.h).
  DeviceChoice device = DeviceChoice::kAuto;  // cuda when a GPU is there
  Precision precision = Precision::kFp32;
  // Bitwise-repeatable device arithmetic (CUDA: deterministic cuDNN algorithms,
  // and in fp32 only those that sum products directly); the default takes the
  // fastest algorithms that pass the accuracy check. The CPU is always
  // deterministic. DDPRUN_CUDNN_DETERMINISTIC=1 sets it too.
  bool deterministic = false;
  // How CUDA lays activations out in memory: nhwc (channels_last: cuDNN's
  // tensor-core kernels without transposes), nchw (the A/B and fallback) or
  // auto: NHWC in tf32/bf16/fp16, NCHW in fp32 (nhwcLayout(),
  // backend_choice.h). The CPU computes NCHW whatever this says.
  Layout layout = Layout::kAuto;
  int epochs = 1;
  int batchSize = 64;  // per rank
  float lr = 0.05f;
  float momentum = 0.9f;
  float weightDecay = 0.0f;
  std::string optimizer = "sgd";
  uint64_t seed = 0;
  double bucketCapMb = 25.0;
  double firstBucketMb = 1.0;
  bool scaleLr = false;  // lr * world size (linear scaling rule)
  bool syncBn = false;
  // The seeds' recipe (docs/train.md): lr schedule (lr_schedule.h), SGD's
  // Nesterov momentum, label smoothing, augmentation and normalisation
  // (transforms.h; "" normalises with the data set's own constants).
  std::string lrSchedule = "constant";
  std::string lrMilestones;  // epochs, "30,60,80" (multistep; step: the period)
  float lrGamma = 0.1f;
  int64_t warmupEpochs = 0;
  std::string lrStepOn = "epoch";  // epoch | step: when the schedule advances
  bool nesterov = false;
  float labelSmoothing = 0.0f;
  std::string augment = "none";
  std::string normalize;
  // Threads that assemble (decode, augment, normalise) each batch; 0: as
  // many as the CPUs this rank may use beyond --threads, at least 1, at most 8.
  int dataThreads = 0;
  std::string commHook = "none";
  bool shuffle = true;
  std::string checkpointDir;
  int64_t checkpointEvery = 0;  // steps; 0: only at epoch ends
  int keepCheckpoints = 3;
  bool resume = false;  // also on a first start (a restarted group always resumes)
  std::string metrics;  // JSON lines file
  int64_t logInterval = 50;
  // A progress line also at least this often (seconds; rank 0's clock, its
  // own loss): 0 turns it off.
  double logSeconds = 30.0;
  std::string init;  // safetensors with initial weights
  std::string save;  // safetensors for the final model
  int64_t maxSteps = 0;      // per epoch, 0: all
  int64_t trainSamples = 0;  // 0: all
  int64_t testSamples = 0;
  int threads = 1;
  bool quiet = false;  // no progress lines
  // Benchmark aids (docs/train.md): after benchWarmup steps the device is
  // drained, memory peaks reset and a clock started; the window ends before
  // the last profileSteps steps, which are profiled with device events.
  int64_t benchWarmup = 0;   // 0: no timed window
  int64_t profileSteps = 0;  // 0: no profile
};

// The accepted ranges of the float flags (finite numbers only; docs/train.md
// lists them). --lr's low end and the buckets' are excluded, --momentum's high
// end is excluded.
struct FlagRange {
  double lo, hi;
};
inline constexpr FlagRange kLrRange{0.0, 10.0};
inline constexpr FlagRange kMomentumRange{0.0, 1.0};
inline constexpr FlagRange kWeightDecayRange{0.0, 1.0};
inline constexpr FlagRange kBucketMbRange{0.0, 1024.0};
inline constexpr FlagRange kLabelSmoothingRange{0.0, 1.0};  // high end excluded
inline constexpr FlagRange kLrGammaRange{0.0, 1.0};         // low end excluded
inline constexpr FlagRange kLogSecondsRange{0.0, 86400.0};
inline constexpr int kMaxDataThreads = 64;
// --image-size's range (besides 0): down to 8 pixels, up to 1024 (memory grows
// with its square).
inline constexpr int64_t kMinImageSize = 8, kMaxImageSize = 1024;

struct Dataset;
struct LrScheduleSpec;

// The schedule --lr-schedule, --lr-milestones, --lr-gamma, --warmup-epochs
// and --lr-step-on describe, from `baseLr` (--lr after --scale-lr) over
// `stepsPerEpoch` steps. Throws InvalidArgument naming the flag at fault.
LrScheduleSpec lrScheduleSpec(const TrainConfig& cfg, double baseLr, int64_t stepsPerEpoch);

// --data-threads 0's choice: the CPUs this process may use shared by the
// node's ranks (`localWorld`, LOCAL_WORLD_SIZE), less the rank's math
// threads, at least 1 and at most 8.
int defaultDataThreads(int cpus, int localWorld, int mathThreads);
// The threads this rank assembles batches on (--data-threads, else the
// default above from this process's CPUs and LOCAL_WORLD_SIZE).
int dataThreads(const TrainConfig& cfg);

// After the data is loaded (a --data path's kind is known only then): "" when
// the model takes the data's images and --num-classes, where named, equals
// the data's classes; else the error sentence.
std::string modelDataProblem(const TrainConfig& cfg, const Dataset& train);

// The CPUs this process may run on (its affinity mask): --threads' limit.
using ddprun::availableCpus;

struct ParseResult {
  std::optional<TrainConfig> config;  // empty: exit with exitCode
  int exitCode = 0;
  std::string output;  // help text (exit 0) or the error (exit 2)
};
// `cpus` bounds --threads (injected by tests).
ParseResult parseTrainArgs(int argc, const char* const* argv, int cpus = availableCpus());

// Whether this process prints the help parseTrainArgs gives: every rank of
// a group parses the same command line, so only the first prints it; the
// others exit 0 silently. (A usage error is printed by every rank: the first
// rank to exit ends the group, and its message must not be lost.) The rank
// is RANK (set by ddprun and torchrun), else LOCAL_RANK; unset or not a
// number counts as rank 0 (train run alone).
bool printsParseOutput(const std::optional<std::string>& rank,
                       const std::optional<std::string>& localRank);

}  // namespace ddprun::train
