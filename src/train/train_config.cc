#include "ddprun/train/train_config.h"

#include <CLI/CLI.hpp>
#include <sstream>

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
std::string validate(const TrainConfig& c) {
  const auto& models = Model::names();
  if (std::find(models.begin(), models.end(), c.model) == models.end())
    return "unknown model '" + c.model + "': choose one of " + joined(models);
  const auto& opts = Optimizer::kinds();
  if (std::find(opts.begin(), opts.end(), c.optimizer) == opts.end())
    return "unknown optimizer '" + c.optimizer + "': choose one of " + joined(opts);
  if (!runtime::parseCommHook(c.commHook))
    return "unknown --comm-hook '" + c.commHook + "': choose one of none, fp16, bf16";
  if (c.epochs <= 0) return "--epochs must be positive (got " + std::to_string(c.epochs) + ")";
  if (c.batchSize <= 0)
    return "--batch-size must be positive (got " + std::to_string(c.batchSize) + ")";
  if (!(c.lr > 0)) return "--lr must be positive";
  if (c.momentum < 0 || c.weightDecay < 0) return "--momentum and --weight-decay must be >= 0";
  if (!(c.bucketCapMb > 0) || !(c.firstBucketMb > 0))
    return "--bucket-cap-mb and --first-bucket-mb must be positive";
  if (c.logInterval <= 0) return "--log-interval must be positive";
  if (c.checkpointEvery < 0) return "--checkpoint-every must be >= 0";
  if (c.checkpointEvery > 0 && c.checkpointDir.empty())
    return "--checkpoint-every needs --checkpoint-dir";
  if (c.keepCheckpoints < 1) return "--keep-checkpoints must be at least 1";
  if (c.resume && c.checkpointDir.empty()) return "--resume needs --checkpoint-dir";
  if (c.maxSteps < 0 || c.trainSamples < 0 || c.testSamples < 0)
    return "--max-steps, --train-samples and --test-samples must be >= 0";
  if (c.threads < 1) return "--threads must be at least 1";
  return "";
}

}  // namespace

ParseResult parseTrainArgs(int argc, const char* const* argv) {
  TrainConfig c;
  c.data = kDefaultDataDir;
  CLI::App app{"train: the bundled data-parallel trainer (run it under ddprun, torchrun or alone)",
               "train"};
  app.set_help_flag("-h,--help", "Print this help and exit");
  app.add_option("--model", c.model, "mlp | lenet | lenet-bn")->capture_default_str();
  app.add_option("--data", c.data,
                 "Directory of Fashion-MNIST IDX .gz files, or 'synthetic' (used, with a notice, "
                 "when the default directory is absent)")->capture_default_str();
  app.add_option("--epochs", c.epochs)->capture_default_str();
  app.add_option("--batch-size", c.batchSize, "Samples per rank per step")->capture_default_str();
  app.add_option("--lr", c.lr, "Learning rate")->capture_default_str();
  app.add_option("--momentum", c.momentum)->capture_default_str();
  app.add_option("--weight-decay", c.weightDecay)->capture_default_str();
  app.add_option("--optimizer", c.optimizer, "sgd | adam")->capture_default_str();
  app.add_option("--seed", c.seed, "Initialisation and shuffling seed")->capture_default_str();
  app.add_option("--bucket-cap-mb", c.bucketCapMb, "Gradient bucket size (MiB)")
      ->capture_default_str();
  app.add_option("--first-bucket-mb", c.firstBucketMb, "Cap of the bucket reduced last (MiB)")
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
  app.add_flag("--resume", c.resume,
               "Continue from the newest checkpoint in --checkpoint-dir (a group restarted by "
               "its launcher always does)");
  app.add_option("--metrics", c.metrics, "Write metrics as JSON lines to this file");
  app.add_option("--log-interval", c.logInterval, "Steps between progress lines")
      ->capture_default_str();
  app.add_option("--init", c.init, "Initial weights (safetensors)");
  app.add_option("--save", c.save, "Write the final model here (safetensors)");
  app.add_option("--max-steps", c.maxSteps, "Cap on steps per epoch (0: all)");
  app.add_option("--train-samples", c.trainSamples, "Use the first N training samples (0: all)");
  app.add_option("--test-samples", c.testSamples, "Use the first N test samples (0: all)");
  app.add_option("--threads", c.threads, "Math library threads per rank")->capture_default_str();
  app.add_flag("--quiet", c.quiet, "No progress lines");

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
  if (const std::string err = validate(c); !err.empty()) {
    r.exitCode = 2;
    r.output = err;
    return r;
  }
  r.config = c;
  return r;
}

}  // namespace ddprun::train
