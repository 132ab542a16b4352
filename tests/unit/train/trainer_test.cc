// Data-parallel equivalences of the trainer, with ranks as threads over an
// in-memory store: what DDP promises mathematically.
//   - 2 ranks x batch B == 1 rank x batch 2B (same start, 50 steps)
//   - no_sync over k micro-batches == one k-times batch
//   - SyncBatchNorm on 2 ranks x B == plain batch norm on 1 rank x 2B
//   - several buckets: the first all-reduce starts before backward ends, and
//     the result is bitwise the one of a single bucket
//   - the same seed, world and flags give bitwise-identical runs
//   - the step observer: which steps the window and the profile keep quiet
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <mutex>

#include "ddprun/common/error.h"
#include "ddprun/runtime/reducer.h"
#include "ddprun/train/checkpoint.h"
#include "ddprun/train/checkpoint_dir.h"
#include "ddprun/train/models.h"
#include "ddprun/train/trainer.h"
#include "rank_threads.h"
#include "step_observer.h"
#include "temp_dir.h"

namespace ddprun::train {
namespace {

using runtime::ProcessGroup;
using ddprun::testing::runRanks;

class TrainerTest : public ::testing::Test {
 protected:
  // Runs `cfg` on `world` rank threads; returns rank 0's final model file.
  SafeTensors train(TrainConfig cfg, int world, const std::string& tag,
                    nlohmann::json* summary = nullptr) {
    cfg.quiet = true;
    cfg.save = dir_ + "/" + tag + ".safetensors";
    std::mutex mu;
    runRanks(world, [&](ProcessGroup& pg) {
      nlohmann::json j = runTraining(cfg, data_, pg);
      std::lock_guard lock(mu);
      if (pg.rank() == 0 && summary) *summary = j;
    });
    return loadSafetensors(cfg.save);
  }

  static TrainConfig base(const std::string& model, int batch, int steps) {
    TrainConfig c;
    c.model = model;
    c.batchSize = batch;
    c.maxSteps = steps;
    // lr 0.01: at 0.05 with momentum 0.9 this easy synthetic set drives the
    // run into a regime where rounding differences grow exponentially (1e-7
    // relative at step 20, 4e-4 at step 50; 1.7e-7 at step 50 with 0.01).
    c.lr = 0.01f;
    c.momentum = 0.9f;
    c.logInterval = 1000;
    return c;
  }

  // ||a - b|| / ||b|| per tensor.
  static void expectClose(const SafeTensors& a, const SafeTensors& b, double rel) {
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    for (const LoadedTensor& ta : a.tensors) {
      const LoadedTensor* tb = b.find(ta.name);
      ASSERT_NE(tb, nullptr) << ta.name;
      if (ta.dtype != "F32") continue;
      const auto* x = reinterpret_cast<const float*>(ta.bytes.data());
      const auto* y = reinterpret_cast<const float*>(tb->bytes.data());
      double diff = 0, norm = 0;
      for (size_t i = 0; i < ta.numel(); ++i) {
        diff += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
        norm += double(y[i]) * y[i];
      }
      EXPECT_LE(std::sqrt(diff), rel * std::sqrt(norm) + 1e-12) << ta.name;
    }
  }

  ddprun::testing::TempDir tmp_;
  const std::string dir_ = tmp_.path();
  DataSplit data_ = makeSynthetic(4096, 256, 11);
};

TEST_F(TrainerTest, TwoRanksOfBatchBEqualOneRankOfBatch2B) {
  const SafeTensors two = train(base("lenet", 16, 50), 2, "two");
  const SafeTensors one = train(base("lenet", 32, 50), 1, "one");
  expectClose(two, one, 1e-5);
  // And training moved the parameters (the comparison is not of two
  // untouched initialisations).
  const SafeTensors start = train(base("lenet", 32, 0), 1, "start");
  const auto* a = reinterpret_cast<const float*>(one.find("fc3.bias")->bytes.data());
  const auto* b = reinterpret_cast<const float*>(start.find("fc3.bias")->bytes.data());
  EXPECT_GT(std::fabs(a[0] - b[0]), 1e-3);
}

TEST_F(TrainerTest, SyncBatchNormOnTwoRanksEqualsBatchNormOnTwiceTheBatch) {
  TrainConfig two = base("lenet-bn", 16, 10);
  two.syncBn = true;
  const SafeTensors a = train(two, 2, "syncbn");
  const SafeTensors b = train(base("lenet-bn", 32, 10), 1, "bn");
  expectClose(a, b, 1e-5);  // includes running_mean / running_var
  // Without synchronisation the two differ (the test can fail).
  const SafeTensors c = train(base("lenet-bn", 16, 10), 2, "localbn");
  const auto* x = reinterpret_cast<const float*>(c.find("bn1.running_var")->bytes.data());
  const auto* y = reinterpret_cast<const float*>(b.find("bn1.running_var")->bytes.data());
  double d = 0;
  for (int i = 0; i < 6; ++i) d += std::fabs(x[i] - y[i]);
  EXPECT_GT(d, 1e-6);
}

// `train --data synthetic` with every other flag at its default (LeNet, SGD
// lr 0.05, momentum 0.9, batch 64, seed 0), one rank, 20000 samples (313
// steps, about a second). Before the set carried mislabelled samples it was
// separable by so wide a margin that the loss reached 0 by step 40, the
// logits grew until a step on a rare sample killed the ReLUs (loss 15.9 at
// step 61), and the run ended at chance: loss 2.30, accuracy 0.10.
TEST(TrainerDefaults, SyntheticDataLearnsAtTheDefaultFlags) {
  const DataSplit data = makeSynthetic(20000, 1000, 0);
  TrainConfig cfg;  // the command line's defaults
  cfg.quiet = true;
  nlohmann::json summary;
  runRanks(1, [&](ProcessGroup& pg) { summary = runTraining(cfg, data, pg); });
  EXPECT_EQ(summary["model"], "lenet");
  EXPECT_EQ(summary["steps"], 313);
  // The loss fell from ln 10 = 2.30 to near its floor (0.31, the entropy of
  // the labels given the pattern: one training sample in 20 is mislabelled),
  // and the clean test split is learned.
  EXPECT_LT(summary["final_loss"].get<double>(), 0.8) << summary.dump();
  EXPECT_GT(summary["test_accuracy"].get<double>(), 0.95) << summary.dump();
}

TEST_F(TrainerTest, SameSeedWorldAndFlagsAreBitwiseReproducible) {
  nlohmann::json a, b, c;
  train(base("mlp", 16, 30), 2, "a", &a);
  train(base("mlp", 16, 30), 2, "b", &b);
  TrainConfig other = base("mlp", 16, 30);
  other.seed = 1;
  train(other, 2, "c", &c);
  EXPECT_EQ(a["params_sha256"], b["params_sha256"]);
  EXPECT_NE(a["params_sha256"], c["params_sha256"]);
  EXPECT_EQ(a["world"], 2);
  EXPECT_EQ(a["steps"], 30);
}

TEST_F(TrainerTest, ManySmallBucketsGiveTheSameResultAsOne) {
  TrainConfig small = base("mlp", 16, 20);
  small.bucketCapMb = 0.05;
  small.firstBucketMb = 0.05;
  nlohmann::json a, b;
  train(small, 2, "small", &a);
  train(base("mlp", 16, 20), 2, "big", &b);
  EXPECT_GE(a["gradient_buckets"].get<int>(), 3);
  EXPECT_LT(b["gradient_buckets"].get<int>(), a["gradient_buckets"].get<int>());
  EXPECT_EQ(a["params_sha256"], b["params_sha256"]);
}

// Checkpoints carry the run's identity: a fresh run into a directory with an
// older run's (higher-step) checkpoints keeps them and its own; a restart of
// the group resumes its own run on every rank (rank 0 chooses, rank 1 loads
// the file it names) and ends where the uninterrupted run ended.
TEST_F(TrainerTest, ARestartResumesItsOwnRunAndKeepsOtherRuns) {
  const std::string ckpt = dir_ + "/ckpt";
  auto run = [&](const std::string& runId, bool restarted, int steps, uint64_t seed) {
    TrainConfig c = base("mlp", 16, steps);
    c.quiet = true;
    c.seed = seed;
    c.checkpointDir = ckpt;
    c.checkpointEvery = 2;
    c.keepCheckpoints = 2;
    nlohmann::json out;
    std::mutex mu;
    std::FILE* devnull = std::fopen("/dev/null", "w");
    runRanks(2, [&](ProcessGroup& pg) {
      TrainerIo io{.progress = devnull, .runId = runId, .restarted = restarted};
      nlohmann::json j = runTraining(c, data_, pg, io);
      std::lock_guard lock(mu);
      if (pg.rank() == 0) out = j;
    });
    std::fclose(devnull);
    return out;
  };
  auto names = [&](const std::string& tag) {
    std::vector<int64_t> steps;
    for (const CheckpointFile& f : listCheckpoints(ckpt, tag)) steps.push_back(f.step);
    return steps;
  };
  run("old", false, 12, 1);
  EXPECT_EQ(names("old"), (std::vector<int64_t>{12, 10}));
  const nlohmann::json fresh = run("new", false, 6, 2);
  EXPECT_EQ(names("new"), (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(names("old"), (std::vector<int64_t>{12, 10}));
  const nlohmann::json again = run("new", true, 6, 2);
  EXPECT_EQ(again["params_sha256"], fresh["params_sha256"]);
  // Resumed after the last step: nothing left to train in this attempt; the
  // summary counts the whole run.
  EXPECT_EQ(again["attempt_steps"], 0);
  EXPECT_EQ(again["steps"], 6);
  // A first start of a run id that has checkpoints: refused on every rank
  // (none is left waiting in a collective), as bad input.
  try {
    run("new", false, 6, 2);
    ADD_FAILURE() << "a second launch of run 'new' started";
  } catch (const ddprun::testing::RankFailure& f) {
    EXPECT_THROW(std::rethrow_exception(f.cause()), InvalidArgument);
  }
  // No run id given: rank 0 draws one and every rank uses it.
  run("", false, 2, 3);
  size_t drawn = 0;
  for (const CheckpointFile& f : listCheckpoints(ckpt))
    drawn += f.tag.rfind("train-", 0) == 0 ? 1 : 0;
  EXPECT_EQ(drawn, 1u);
}

// The reducer hook and no_sync, on the model directly.
struct Replica {
  std::unique_ptr<Backend> be = makeCpuBackend(1);
  std::unique_ptr<Model> model;
  std::unique_ptr<runtime::Reducer> reducer;

  Replica(ProcessGroup& pg, runtime::ReducerOptions ro) {
    model = Model::create("mlp", *be);
    Rng rng(5);
    model->initialize(rng);
    std::vector<runtime::ParamInfo> infos;
    for (Param* p : model->params()) infos.push_back({p->name, size_t(p->value.numel())});
    reducer = std::make_unique<runtime::Reducer>(pg, infos, ro);
    bind();
  }
  void bind() {
    for (size_t i = 0; i < model->params().size(); ++i)
      model->params()[i]->grad =
          Tensor::view(reducer->grad(i), model->params()[i]->value.shape());
  }
  // forward + backward on samples [from, from + n) of `d`.
  void backward(const Dataset& d, int64_t from, int64_t n) {
    std::vector<int64_t> idx(n);
    for (int64_t i = 0; i < n; ++i) idx[i] = from + i;
    std::vector<float> x(n * d.sampleElems());
    std::vector<int32_t> y(n);
    gatherBatch(d, idx.data(), n, x.data(), y.data());
    Tensor dz;
    be->crossEntropy(model->forward(Tensor::view(x.data(), {n, 1, 28, 28}), true), y.data(), &dz,
                     nullptr);
    model->backward(dz, [&](size_t i) { reducer->markReady(i); });
    const uint64_t v = reducer->layoutVersion();
    reducer->finalize();
    if (v != reducer->layoutVersion()) bind();
  }
  std::vector<float> grads() {
    std::vector<float> g;
    for (Param* p : model->params()) g.insert(g.end(), p->grad.data(), p->grad.data() + p->grad.numel());
    return g;
  }
};

TEST_F(TrainerTest, NoSyncOverKMicroBatchesEqualsOneKTimesBatch) {
  const int k = 3, b = 8;
  std::vector<float> accumulated, whole;
  std::mutex mu;
  runRanks(2, [&](ProcessGroup& pg) {
    Replica r(pg, {});
    const int64_t base = pg.rank() * k * b;
    {
      runtime::NoSyncGuard guard(*r.reducer);
      for (int i = 0; i < k - 1; ++i) r.backward(data_.train, base + i * b, b);
    }
    r.backward(data_.train, base + (k - 1) * b, b);  // synchronises the sum
    std::vector<float> g = r.grads();
    r.reducer->zeroGrad();
    r.backward(data_.train, base, k * b);  // one batch of k*b: a mean, so * k
    std::vector<float> h = r.grads();
    std::lock_guard lock(mu);
    if (pg.rank() == 0) {
      accumulated = g;
      whole = h;
    }
  });
  ASSERT_EQ(accumulated.size(), whole.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < whole.size(); ++i) {
    const double w = double(whole[i]) * k;
    diff += (accumulated[i] - w) * (accumulated[i] - w);
    norm += w * w;
  }
  EXPECT_GT(norm, 0);
  EXPECT_LE(std::sqrt(diff), 1e-5 * std::sqrt(norm));
}

TEST_F(TrainerTest, FirstBucketAllReduceIsIssuedBeforeBackwardEnds) {
  std::vector<runtime::ReducerStats> stats;
  std::mutex mu;
  runRanks(2, [&](ProcessGroup& pg) {
    Replica r(pg, {.bucketCapBytes = 64 << 10, .firstBucketBytes = 64 << 10});
    for (int it = 0; it < 3; ++it) {
      r.backward(data_.train, it * 64 + pg.rank() * 32, 32);
      r.reducer->zeroGrad();
    }
    std::lock_guard lock(mu);
    if (pg.rank() == 0) stats.push_back(r.reducer->lastStats());
  });
  ASSERT_EQ(stats.size(), 1u);
  const runtime::ReducerStats& s = stats[0];
  ASSERT_GE(s.buckets.size(), 3u);
  // Order of recorded events, never durations: the first bucket's
  // all-reduce was issued while backward still ran (before the last bucket's
  // gradients existed), not deferred to finalize(). When the group thread
  // picked it up depends on the scheduler, so that is not asserted.
  EXPECT_LT(s.buckets[0].launched, s.buckets.back().launched);
  EXPECT_LT(s.buckets[0].launched, s.backwardEnd);
  for (const auto& b : s.buckets) EXPECT_LE(b.started, b.finished);
}

// --bench-warmup / --profile-steps on the CPU: the window covers the steps
// between warm-up and profile, no host synchronisation is counted (the CPU
// has no device), the profile names every top-level layer in forward order
// and its intervals nest inside the step, and the numbers do not change the
// training (bitwise the same model as without the flags).
TEST_F(TrainerTest, BenchWindowAndProfileReportWithoutChangingTraining) {
  // mlp: repeated in-process runs of the convolution models are not bitwise
  // equal on the CPU (separate processes are), which would hide the point.
  TrainConfig c = base("mlp", 16, 30);
  nlohmann::json plain;
  const SafeTensors a = train(c, 1, "plain", &plain);
  c.benchWarmup = 10;
  c.profileSteps = 5;
  nlohmann::json j;
  const SafeTensors b = train(c, 1, "bench", &j);
  ASSERT_TRUE(j.contains("bench")) << j.dump();
  const auto& w = j["bench"];
  EXPECT_EQ(w["warmup_steps"], 10);
  EXPECT_EQ(w["steps"], 15);  // 30 - 10 warm-up - 5 profiled
  EXPECT_GT(w["seconds"].get<double>(), 0.0);
  EXPECT_EQ(w["host_sync_calls"], 0);
  const auto& p = j["profile"];
  ASSERT_EQ(p["steps"], 5);
  ASSERT_EQ(p["layers"].size(), 6u);  // mlp's top-level layers, in forward order
  EXPECT_EQ(p["layers"][0]["name"], "flatten");
  EXPECT_EQ(p["layers"][1]["name"], "fc1");
  EXPECT_EQ(p["layers"].back()["name"], "fc3");
  double layerSum = 0;
  for (const auto& l : p["layers"])
    layerSum += l["forward_ms"].get<double>() + l["backward_ms"].get<double>();
  EXPECT_LE(layerSum, p["step_ms"].get<double>() * 1.0001 + 1e-6);
  EXPECT_LE(p["backward_end_ms"].get<double>(), p["step_ms"].get<double>() + 1e-6);
  // Each profiled step's time (the jitter's input); their mean is step_ms.
  ASSERT_EQ(p["step_ms_each"].size(), 5u);
  double each = 0;
  for (const auto& s : p["step_ms_each"]) {
    EXPECT_GE(s.get<double>(), 0.0);
    each += s.get<double>();
  }
  EXPECT_NEAR(each / 5, p["step_ms"].get<double>(), 1e-9 * (1 + each));
  ASSERT_GE(p["buckets"].size(), 1u);
  for (const auto& bk : p["buckets"]) {
    EXPECT_GT(bk["bytes"].get<size_t>(), 0u);
    // Ready when the layer that produced its last gradient ended (on a
    // device the same stream position as the backward's end; here the clock
    // moves on between the two marks).
    EXPECT_GT(bk["ready_ms"].get<double>(), 0.0);
    EXPECT_LE(bk["ready_ms"].get<double>(), p["step_ms"].get<double>());
  }
  expectClose(b, a, 0.0);  // the flags observe, they do not change the arithmetic
  EXPECT_EQ(j["params_sha256"], plain["params_sha256"]);
  EXPECT_EQ(j["final_loss"], plain["final_loss"]);
}

TEST_F(TrainerTest, BenchFlagsThatDoNotFitTheRunAreRefused) {
  TrainConfig c = base("mlp", 16, 10);
  c.benchWarmup = 8;
  c.profileSteps = 2;  // 8 + 2 leaves no timed step of 10
  try {
    train(c, 1, "nofit");
    FAIL() << "expected an error";
  } catch (const std::exception& e) {  // rank threads rethrow what a rank threw
    EXPECT_NE(std::string(e.what()).find("leave no timed step"), std::string::npos) << e.what();
  }
  c.benchWarmup = 0;
  c.profileSteps = 11;
  try {
    train(c, 1, "toomany");
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("--profile-steps 11 is more than"), std::string::npos)
        << e.what();
  }
}

// The step observer alone, on the CPU, over 8 real steps of one rank:
// --bench-warmup 2 and --profile-steps 2. Progress lines may read the loss
// outside the window and the profile, and at each one's last step (the
// window's end is the profile's start); the breakdown samples only the two
// warm-up steps (scaled to all 8); the window counts its 4 steps and the
// profile its 2. A window that does not fit is refused.
TEST(StepObserverTest, WindowAndProfileKeepTheirStepsQuiet) {
  using Point = StepProfile::Point;
  auto be = makeCpuBackend(1);
  testing::runRanks(1, [&](ProcessGroup& pg) {
    auto m = Model::create("mlp", *be);
    Rng rng(5);
    m->initialize(rng);
    std::vector<runtime::ParamInfo> infos;
    for (Param* p : m->params())
      infos.push_back({p->name, static_cast<size_t>(p->value.numel())});
    runtime::Reducer reducer(pg, infos, {}, be->gradientMemory(pg));
    auto bindGrads = [&] {  // gradients in the buckets, as the trainer's
      for (size_t i = 0; i < m->params().size(); ++i)
        m->params()[i]->grad =
            Tensor::view(reducer.grad(i), m->params()[i]->value.shape(), be->device());
    };
    bindGrads();
    StepObserver tooLong(*be, *m, reducer, {.benchWarmup = 7, .profileSteps = 1});
    EXPECT_THROW(tooLong.setRunSteps(8, 8), InvalidArgument);  // no timed step left

    StepObserver obs(*be, *m, reducer,
                     {.benchWarmup = 2, .profileSteps = 2, .samplesPerStep = 8});
    obs.setRunSteps(8, 8);
    Tensor x({8, 1, 28, 28});
    for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = rng.uniform(0, 1);
    const std::vector<int32_t> labels = {0, 1, 2, 3, 4, 5, 6, 7};
    std::vector<bool> reports;
    for (int64_t s = 0; s < 8; ++s) {
      obs.begin(s, s);
      obs.dataTaken();
      obs.forwardStart();
      const Tensor& logits = m->forward(x, true);
      obs.point(Point::kLossStart);
      Tensor dl;
      be->crossEntropy(logits, labels.data(), &dl, nullptr);
      obs.point(Point::kLossEnd);
      m->backward(dl, [&](size_t i) {
        reducer.markReady(i);
        obs.paramReady(i);
      });
      obs.prefetchStart();
      obs.prefetchEnd();
      obs.backwardEnd();
      obs.point(Point::kReducerStart);
      const uint64_t layout = reducer.layoutVersion();
      reducer.finalize();
      obs.point(Point::kReducerEnd);
      if (reducer.layoutVersion() != layout) bindGrads();  // rebuilt after the first step
      obs.optimizerStart();
      obs.stepEnd();
      obs.finish(s + 1);
      reports.push_back(obs.mayReport(s + 1));
    }
    EXPECT_EQ(reports, (std::vector<bool>{true, true, false, false, false, true, false, true}));
    nlohmann::json j;
    obs.addSummary(j, 8);
    EXPECT_EQ(j["bench"]["warmup_steps"], 2);
    EXPECT_EQ(j["bench"]["steps"], 4);
    EXPECT_EQ(j["profile"]["steps"], 2);
    ASSERT_EQ(j["profile"]["layers"].size(), 6u);
    for (const char* k : {"data_s", "forward_backward_s", "comm_wait_s", "optimizer_s"})
      EXPECT_GE(j["breakdown"][k].get<double>(), 0.0) << k;
    EXPECT_GT(j["breakdown"]["forward_backward_s"].get<double>(), 0.0);
    EXPECT_GE(j["data_wait_s"].get<double>(), 0.0);
    EXPECT_TRUE(j.contains("comm_hidden_fraction"));
  });
}

}  // namespace
}  // namespace ddprun::train
