#include "ddprun/train/checkpoint_meta.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "ddprun/common/error.h"
#include "ddprun/common/strings.h"
#include "ddprun/train/checkpoint_dir.h"
#include "ddprun/train/layers.h"

namespace ddprun::train {
namespace {

constexpr const char* kFormat = "ddprun-train-1";
constexpr int64_t kMaxGlobalStep = 1'000'000'000'000;

using Meta = std::map<std::string, std::string>;

std::string value(const Meta& m, const char* key) {
  auto it = m.find(key);
  return it == m.end() ? std::string() : it->second;
}

// Reads the integer field `key` within [lo, hi] into *out, or returns the
// error naming the file, the field, its text and the range.
std::string intField(const std::string& path, const Meta& m, const char* key, int64_t lo,
                     int64_t hi, const std::string& why, int64_t* out) {
  const std::string text = value(m, key);
  int64_t v = 0;
  const bool isInt = !text.empty() && text[0] != '+' && str::parseInt(text, v);
  if (isInt && v >= lo && v <= hi) {
    *out = v;
    return "";
  }
  std::string msg =
      path + ": metadata field '" + key + "' is \"" + str::escape(text, 40) + "\"";
  if (!isInt) return msg + ", not an integer (a damaged or hand-edited checkpoint)";
  return msg + ", outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "] (" +
         why + ")";
}

// An optional non-negative decimal field (RunTotals): "" when absent
// (*present false) or valid.
std::string numberField(const std::string& path, const Meta& m, const char* key, double* out,
                        bool* present) {
  const auto it = m.find(key);
  *present = it != m.end();
  if (!*present) return "";
  double v = 0;
  const std::string& text = it->second;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() ||
      !std::isfinite(v) || v < 0)
    return path + ": metadata field '" + key + "' is \"" + str::escape(text, 40) +
           "\", not a finite number >= 0 (a damaged or hand-edited checkpoint)";
  *out = v;
  return "";
}

std::string exact(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

bool isUnsigned(const std::string& text) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  return !text.empty() && ec == std::errc() && p == text.data() + text.size();
}

// The identity fields: format, model, optimizer, run, seed.
std::string checkIdentity(const std::string& path, const Meta& m, const RunShape& s,
                          const std::string& tag, CheckpointPosition* out) {
  if (value(m, "format") != kFormat)
    return path + " is not a checkpoint of ddprun's train (no format marker)";
  if (value(m, "model") != s.model || value(m, "optimizer") != s.optimizer)
    return path + " was written for model '" + value(m, "model") + "' with optimizer '" +
           value(m, "optimizer") + "', this run trains '" + s.model + "' with '" +
           s.optimizer + "'";
  out->run = value(m, "run");
  const bool runFits =
      tag.empty() ? out->run.empty() : !out->run.empty() && runTag(out->run) == tag;
  if (!runFits)
    return path + ": metadata field 'run' is \"" + str::escape(out->run, 80) +
           "\", which does not match the run named in the file name";
  if (!isUnsigned(value(m, "seed")))
    return path + ": metadata field 'seed' is \"" + str::escape(value(m, "seed"), 40) +
           "\", not an unsigned integer";
  return "";
}

}  // namespace

std::map<std::string, std::string> checkpointMetadata(const RunShape& s,
                                                      const CheckpointPosition& p) {
  return {{"format", kFormat},
          {"run", p.run},
          {"model", s.model},
          {"optimizer", s.optimizer},
          {"epoch", std::to_string(p.epoch)},
          {"step", std::to_string(p.step)},
          {"global_step", std::to_string(p.globalStep)},
          {"optimizer_steps", std::to_string(p.optimizerSteps)},
          {"world", std::to_string(s.world)},
          {"batch_size", std::to_string(s.batchSize)},
          {"seed", std::to_string(s.seed)},
          {"rng", p.rng},
          {"epoch_loss_sum", exact(p.totals.epochLossSum)},
          {"epoch_loss_count", exact(p.totals.epochLossCount)},
          {"epoch_seconds", exact(p.totals.epochSeconds)},
          {"run_seconds", exact(p.totals.runSeconds)},
          {"run_samples", std::to_string(p.totals.runSamples)}};
}

std::string readCheckpointMetadata(const std::string& path, const Meta& m,
                                   const RunShape& s, const std::string& tag,
                                   CheckpointPosition* out) {
  CheckpointPosition p;
  if (auto e = checkIdentity(path, m, s, tag, &p); !e.empty()) return e;
  int64_t world = 0, batch = 0;
  if (auto e = intField(path, m, "world", 1, INT32_MAX, "ranks", &world); !e.empty())
    return e;
  if (auto e = intField(path, m, "batch_size", 1, INT32_MAX, "samples per rank", &batch);
      !e.empty())
    return e;
  p.sameLayout = world == s.world && batch == s.batchSize &&
                 value(m, "seed") == std::to_string(s.seed);
  if (auto e = intField(path, m, "epoch", 0, s.epochs,
                        "this run has " + std::to_string(s.epochs) + " epochs", &p.epoch);
      !e.empty())
    return e;
  const int64_t maxStep = p.sameLayout && p.epoch < s.epochs ? s.stepsPerEpoch
                          : p.sameLayout                     ? 0
                                                             : kMaxGlobalStep;
  if (auto e = intField(path, m, "step", 0, maxStep,
                        p.epoch == s.epochs ? "the run's last epoch is done"
                                            : "the steps of an epoch of this run",
                        &p.step);
      !e.empty())
    return e;
  if (auto e = intField(path, m, "global_step", p.step, kMaxGlobalStep,
                        "at least the step within the epoch", &p.globalStep);
      !e.empty())
    return e;
  if (auto e = intField(path, m, "optimizer_steps", p.globalStep, p.globalStep,
                        "one optimizer step per training step: equal to global_step",
                        &p.optimizerSteps);
      !e.empty())
    return e;
  p.rng = value(m, "rng");
  try {
    Rng probe;
    probe.restore(p.rng);
  } catch (const InvalidArgument&) {
    return path + ": metadata field 'rng' is not a random generator state";
  }
  RunTotals& t = p.totals;
  bool present = false;
  int known = 0;
  for (auto [key, field] : {std::pair{"epoch_loss_sum", &t.epochLossSum},
                            {"epoch_loss_count", &t.epochLossCount},
                            {"epoch_seconds", &t.epochSeconds},
                            {"run_seconds", &t.runSeconds}}) {
    if (auto e = numberField(path, m, key, field, &present); !e.empty()) return e;
    known += present;
  }
  if (m.count("run_samples") > 0) {
    if (auto e = intField(path, m, "run_samples", 0, int64_t{1} << 62,
                          "samples trained so far", &t.runSamples);
        !e.empty())
      return e;
    ++known;
  }
  t.known = known == 5;
  if (!t.known) t = RunTotals{.known = false};
  *out = p;
  return "";
}

}  // namespace ddprun::train
