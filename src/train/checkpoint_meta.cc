#include "ddprun/train/checkpoint_meta.h"

#include <charconv>

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
          {"rng", p.rng}};
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
  *out = p;
  return "";
}

}  // namespace ddprun::train
