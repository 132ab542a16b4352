// Every checkpoint metadata field is range-checked against the run before it
// is used: a damaged or hand-edited file is refused, naming the file and the
// field, instead of crashing the trainer (a negative step read memory before
// the sample indices) or training into NaN (a negative Adam step count).
#include "ddprun/train/checkpoint_meta.h"

#include <gtest/gtest.h>

#include "ddprun/train/checkpoint_dir.h"
#include "ddprun/train/layers.h"

namespace ddprun::train {
namespace {

using Meta = std::map<std::string, std::string>;

RunShape shape() {
  return {.model = "lenet",
          .optimizer = "adam",
          .epochs = 3,
          .stepsPerEpoch = 47,
          .world = 2,
          .batchSize = 32,
          .seed = 7};
}

// A valid checkpoint of run "job" at epoch 1, step 5 (global step 52).
Meta good() {
  CheckpointPosition p{.epoch = 1,
                       .step = 5,
                       .globalStep = 52,
                       .optimizerSteps = 52,
                       .rng = Rng(3).state(),
                       .run = "job"};
  return checkpointMetadata(shape(), p);
}

// The error for `meta` with `key` set to `value` ("" when accepted).
std::string with(const std::string& key, const std::string& value,
                 const std::string& tag = "job") {
  Meta m = good();
  m[key] = value;
  CheckpointPosition out;
  return readCheckpointMetadata("/d/ckpt-job-000000052.safetensors", m, shape(), tag,
                                &out);
}

TEST(CheckpointMetaTest, AValidFileRoundTrips) {
  CheckpointPosition out;
  ASSERT_EQ(readCheckpointMetadata("f", good(), shape(), "job", &out), "");
  EXPECT_EQ(out.epoch, 1);
  EXPECT_EQ(out.step, 5);
  EXPECT_EQ(out.globalStep, 52);
  EXPECT_EQ(out.optimizerSteps, 52);
  EXPECT_EQ(out.run, "job");
  EXPECT_TRUE(out.sameLayout);
  // A checkpoint at the last step of an epoch, and the epoch-end checkpoint
  // of the last epoch (the run is done: step 0).
  EXPECT_EQ(with("step", "47"), "");
  Meta done = good();
  done["epoch"] = "3";
  done["step"] = "0";
  EXPECT_EQ(readCheckpointMetadata("f", done, shape(), "job", &out), "");
}

// What earlier attempts did travels with the checkpoint, exactly (the
// doubles round-trip), so a resumed run's records cover the whole epoch and
// run; older files without it read as unknown zeros; damaged values refused.
TEST(CheckpointMetaTest, RunTotalsRoundTripAndAreChecked) {
  CheckpointPosition p{.epoch = 1, .step = 5, .globalStep = 52, .optimizerSteps = 52,
                       .rng = Rng(3).state(), .run = "job",
                       .totals = {.epochLossSum = 123.456789012345678,
                                  .epochLossCount = 160,
                                  .epochSeconds = 0.1 + 0.2,
                                  .runSeconds = 98.7654321,
                                  .runSamples = 3328}};
  CheckpointPosition out;
  ASSERT_EQ(readCheckpointMetadata("f", checkpointMetadata(shape(), p), shape(), "job", &out),
            "");
  EXPECT_TRUE(out.totals.known);
  EXPECT_EQ(out.totals.epochLossSum, p.totals.epochLossSum);
  EXPECT_EQ(out.totals.epochLossCount, 160);
  EXPECT_EQ(out.totals.epochSeconds, 0.1 + 0.2);
  EXPECT_EQ(out.totals.runSeconds, p.totals.runSeconds);
  EXPECT_EQ(out.totals.runSamples, 3328);
  Meta old = good();
  for (const char* k :
       {"epoch_loss_sum", "epoch_loss_count", "epoch_seconds", "run_seconds", "run_samples"})
    old.erase(k);
  ASSERT_EQ(readCheckpointMetadata("f", old, shape(), "job", &out), "");
  EXPECT_FALSE(out.totals.known);
  EXPECT_EQ(out.totals.runSeconds, 0);
  for (const char* v : {"nan", "-1", "inf", "1e400", "12abc", ""})
    EXPECT_NE(with("epoch_loss_sum", v).find("'epoch_loss_sum'"), std::string::npos) << v;
  EXPECT_NE(with("run_samples", "-3").find("'run_samples'"), std::string::npos);
}

TEST(CheckpointMetaTest, OutOfRangeFieldsAreRefusedNamingFileAndField) {
  const struct {
    std::string key, value, needle;
  } cases[] = {
      {"step", "-20", "outside [0, 47]"},
      {"step", "48", "outside [0, 47]"},
      {"epoch", "-5", "outside [0, 3]"},
      {"epoch", "4", "this run has 3 epochs"},
      {"optimizer_steps", "-3", "equal to global_step"},
      {"optimizer_steps", "51", "equal to global_step"},
      {"global_step", "-1", "outside [5, "},
      {"global_step", "4", "outside [5, "},
      {"world", "0", "outside [1, "},
      {"batch_size", "-32", "outside [1, "},
      {"step", "5x", "not an integer"},
      {"step", "+5", "not an integer"},
      {"step", "", "not an integer"},
      {"epoch", "99999999999999999999", "not an integer"},
      {"seed", "-1", "not an unsigned integer"},
      {"rng", "garbage", "'rng'"},
      {"run", "other", "'run'"},
      {"format", "x", "not a checkpoint"},
      {"model", "mlp", "model 'mlp'"},
  };
  for (const auto& c : cases) {
    const std::string err = with(c.key, c.value);
    EXPECT_EQ(err.rfind("/d/ckpt-job-000000052.safetensors", 0), 0u)
        << c.key << ": " << err;
    EXPECT_NE(err.find(c.needle), std::string::npos)
        << c.key << "=" << c.value << ": " << err;
    if (c.key != "format" && c.key != "model") {
      EXPECT_NE(err.find("'" + c.key + "'"), std::string::npos) << err;
    }
  }
  // Past the last epoch nothing is left to do: only step 0 is consistent.
  Meta m = good();
  m["epoch"] = "3";
  m["step"] = "5";
  CheckpointPosition out;
  EXPECT_NE(readCheckpointMetadata("f", m, shape(), "job", &out).find("'step'"),
            std::string::npos);
}

TEST(CheckpointMetaTest, RunIdMustMatchTheFileName) {
  EXPECT_EQ(with("run", "job", "job"), "");
  EXPECT_NE(with("run", "job", "other"), "");
  EXPECT_NE(with("run", "", "job"), "");
  // A long or unsafe run id is named by its hash tag.
  EXPECT_EQ(with("run", "my job", runTag("my job")), "");
  // Files of the older naming carry no run id.
  EXPECT_EQ(with("run", "", ""), "");
  EXPECT_NE(with("run", "job", ""), "");
}

TEST(CheckpointMetaTest, AnotherLayoutRestartsTheEpochButIsStillChecked) {
  Meta m = good();
  m["world"] = "4";
  m["step"] = "60";  // past this run's epoch, fine for the layout it was taken with
  m["global_step"] = "60";
  m["optimizer_steps"] = "60";
  CheckpointPosition out;
  ASSERT_EQ(readCheckpointMetadata("f", m, shape(), "job", &out), "");
  EXPECT_FALSE(out.sameLayout);
  m["epoch"] = "-1";
  EXPECT_NE(readCheckpointMetadata("f", m, shape(), "job", &out).find("'epoch'"),
            std::string::npos);
}

}  // namespace
}  // namespace ddprun::train
