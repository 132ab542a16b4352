// The trainer's run (internal to ddprun_train): one rank's whole job, the
// `Run` behind runTraining (trainer.h), and the few helpers its files share.
// Its member functions live by concern:
//   trainer.cc         setup, one step, epochs, evaluation, the summary
//                      (execute: prepare, trainEpochs, summary, writeFinal)
//   trainer_resume.cc  where a run starts (fresh or a checkpoint), saving
//                      checkpoints, clearing dead writers' temporaries
//   trainer_report.cc  progress lines, metrics step records, the progress file
// What a step measures (breakdown, bench window, profile) is its
// StepObserver's (step_observer.h).
//
// Thread-safety: a Run runs on one thread; several (one per rank) may run in
// one process over distinct ProcessGroups (tests).
#pragma once

#include "ddprun/train/trainer.h"
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include "ddprun/common/env.h"
#include "ddprun/common/error.h"
#include "ddprun/common/progress_file.h"
#include "ddprun/common/strings.h"
#include "ddprun/runtime/collectives.h"
#include "ddprun/runtime/cuda.h"
#include "ddprun/runtime/reducer.h"
#include "ddprun/runtime/sampler.h"
#include "ddprun/train/backend_choice.h"
#include "ddprun/train/checkpoint.h"
#include "ddprun/train/checkpoint_dir.h"
#include "ddprun/train/checkpoint_meta.h"
#include "ddprun/train/files.h"
#include "ddprun/train/loss_scaler.h"
#include "ddprun/train/lr_schedule.h"
#include "ddprun/train/metrics.h"
#include "ddprun/train/model_state.h"
#include "ddprun/train/models.h"
#include "ddprun/train/optim.h"
#include "ddprun/train/transforms.h"
#include "batch_feed.h"
#include "step_graph_plan.h"
#include "step_observer.h"

namespace ddprun::train::run_detail {

using Clock = std::chrono::steady_clock;
using runtime::DType;
using runtime::ProcessGroup;

// correct / total; null without test samples (nothing was measured).
inline nlohmann::json accuracyJson(int64_t correct, int64_t total) {
  if (total == 0) return nullptr;
  return static_cast<double>(correct) / static_cast<double>(total);
}

inline double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Position {
  int64_t epoch = 0;       // current epoch
  int64_t step = 0;        // next step within it
  int64_t globalStep = 0;  // steps done in the whole run
};

// Test samples evaluated over the group, and of them those classified right.
struct TestCount {
  int64_t correct = 0, total = 0;
};

// Sums a few doubles over the group (losses, counts); exact for counts.
inline void allReduceSum(ProcessGroup& pg, std::vector<double>& v) {
  if (pg.size() > 1)
    runtime::allReduce(pg, {.output = v.data(), .count = v.size(), .dtype = DType::kFloat64});
}

// Gives every rank rank 0's string.
inline void broadcastString(ProcessGroup& pg, std::string& s) {
  if (pg.size() == 1) return;
  auto n = static_cast<int64_t>(s.size());
  runtime::broadcast(pg, {.buffer = &n, .count = 1, .dtype = DType::kInt64});
  s.resize(static_cast<size_t>(n));
  if (n > 0)
    runtime::broadcast(pg,
                       {.buffer = s.data(), .count = s.size(), .dtype = DType::kUInt8});
}

// fp16's loss scaler; DDPRUN_LOSS_SCALE (an integer) sets its start (tests
// force an overflow with it).
inline LossScaler makeLossScaler(const TrainConfig& cfg) {
  if (cfg.precision != Precision::kFp16) return LossScaler();
  return LossScaler({.initScale = static_cast<float>(
                         env::integer("DDPRUN_LOSS_SCALE", 65536, 1, int64_t{1} << 62))});
}

class Run {
 public:
  Run(const TrainConfig& cfg, const DataSplit& data, ProcessGroup& pg,
      const TrainerIo& io)
      : cfg_(cfg),
        data_(data),
        pg_(pg),
        io_(io),
        rank0_(pg.rank() == 0),
        metrics_(rank0_ ? cfg.metrics : std::string(), io.restarted || cfg.resume),
        progress_(io.progress, rank0_ && !cfg.quiet) {}

  nlohmann::json execute();

 private:
  void notice(const std::string& s) {
    if (rank0_) {
      progress_.finish();
      std::fprintf(io_.progress, "train: %s\n", s.c_str());
      std::fflush(io_.progress);
    }
  }
  void setup();
  void syncBuffers();
  bool unscaleGrads(float invScale);
  void bindGrads();
  std::vector<std::vector<size_t>> bucketLayout() const;
  void markGradsZero();
  std::vector<std::pair<float*, size_t>> bufferArrays() const;
  void loadInit();
  struct StartPlan;
  void clearStaleTemporaries();
  int64_t computeStepsPerEpoch() const;
  RunShape shape() const;
  std::vector<CheckpointFile> resumeCandidates();
  StartPlan planStart();
  void start();
  bool applyCheckpoint(const CheckpointFile& file, std::string* why);
  // execute()'s steps: the run's identity, shape, model and start; the
  // epochs (the last evaluation's count); the final summary, then its record.
  void prepare();
  void announce();
  TestCount trainEpochs();
  void beginEpoch(bool resumedMidEpoch);
  void endEpoch(const TestCount& test, bool resumedMidEpoch);
  nlohmann::json summary(const TestCount& test);
  void writeFinal(const nlohmann::json& j);
  void trainEpoch();
  // One step on samples idx[0..n); next/nextN: the following step's samples
  // (nullptr at the epoch's end), assembled while this step's backward runs.
  void step(const int64_t* idx, int64_t n, const int64_t* next, int64_t nextN,
            int64_t stepsInEpoch);
  void finishStep(int64_t n, int64_t stepsInEpoch);
  // The step's forward, loss and backward on the staged labels, each
  // parameter's readiness to `ready`: what a graph records.
  void forwardBackward(const Tensor& x, const std::function<void(size_t)>& ready);
  // A graphed step (StepGraphPlan's capture or replay) on batch's input and
  // labels, copied into the graph's slots; false when the capture failed
  // (graphs are then off, and the step runs eagerly).
  // *optimized: the graph ran the optimizer too (the step's update is done).
  bool graphedStep(const BatchFeed::Batch& batch, int64_t n, StepGraphPlan::Action a,
                   bool* optimized);
  // Evaluation and the like ran on the model: the graph goes.
  void dropGraph();
  void report(int64_t stepsInEpoch, bool force);
  void timedLine(int64_t stepsInEpoch);
  void reportProgress(bool force);
  std::string progressText(int64_t stepsInEpoch, double loss, double rate,
                           const char* lossNote) const;
  TestCount evaluate();
  // `epochDone`: at an epoch's end (the position is the next epoch's start).
  void saveCheckpoint(bool epochDone = false);
  // Training seconds of the whole run: earlier attempts' and this one's.
  double runSeconds() const { return resumed_.runSeconds + since(runStart_); }

  const TrainConfig& cfg_;
  const DataSplit& data_;
  ProcessGroup& pg_;
  TrainerIo io_;
  bool rank0_;
  std::string runId_, tag_;  // this run's identity (checkpoint_dir.h)
  int64_t stepsPerEpoch_ = 0;
  MetricsWriter metrics_;
  Progress progress_;
  std::unique_ptr<Backend> be_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<runtime::Reducer> reducer_;
  std::unique_ptr<Optimizer> optim_;
  std::unique_ptr<LrSchedule> schedule_;  // --lr-schedule, --warmup-epochs
  Rng rng_;
  Position pos_;
  std::unique_ptr<BatchFeed> feed_;  // the input pipeline
  Tensor dlogits_;
  LossScaler scaler_ = makeLossScaler(cfg_);
  // progress accounting
  double intervalLoss_ = 0, intervalCount_ = 0, lastLoss_ = NAN, epochLossSum_ = 0,
         epochLossCount_ = 0;
  Clock::time_point intervalStart_, runStart_, lastLine_;
  // The progress file's bookkeeping: this rank's samples, and at the last report.
  Clock::time_point lastProgress_;
  int64_t samplesTrained_ = 0, progressSamples_ = 0;
  int64_t samplesSeen_ = 0;  // global samples trained in this process
  // What the checkpoint this process resumed from says earlier attempts did
  // (zeros on a fresh start); the current epoch's start on this process.
  RunTotals resumed_{.known = false};
  Clock::time_point epochStart_;
  double epochPriorSeconds_ = 0;  // the current epoch's seconds in earlier attempts
  int64_t stepsRun_ = 0;
  int64_t totalSteps_ = 0;
  int64_t runSteps_ = 0;  // steps this process trains (after a resume: the rest)

  // The breakdown, --bench-warmup's window, --profile-steps' profile (made
  // in setup(), once the reducer exists).
  std::unique_ptr<StepObserver> observe_;
  // CUDA graphs of the step (step_graph_plan.h): the plan, the live graph
  // (destroyed before the backend: declared after it), its input slot and
  // the parameters' ready order its capture recorded.
  std::unique_ptr<StepGraphPlan> graphPlan_;
  std::unique_ptr<Backend::StepGraph> graph_;
  Tensor graphInput_;
  std::vector<size_t> graphReady_;
  bool graphOffSaid_ = false;
  bool graphOptim_ = false;  // the live graph holds the optimizer's step
  int64_t optimizerCaptures_ = 0;  // captures that held it (the final JSON)
  DeviceDecision deviceDecision_;  // --device: the choice and why
};

}  // namespace ddprun::train::run_detail
