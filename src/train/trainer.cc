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
#include "bench_window.h"
#include "step_profile.h"

namespace ddprun::train {
namespace {

using Clock = std::chrono::steady_clock;
using runtime::DType;
using runtime::ProcessGroup;

// A device backend is synchronised for the step-time breakdown on one step in
// kSampleEvery (the middle one: not the first, which searches algorithms).
constexpr int64_t kSampleEvery = 10;

// correct / total; null without test samples (nothing was measured).
nlohmann::json accuracyJson(int64_t correct, int64_t total) {
  if (total == 0) return nullptr;
  return static_cast<double>(correct) / static_cast<double>(total);
}

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Position {
  int64_t epoch = 0;       // current epoch
  int64_t step = 0;        // next step within it
  int64_t globalStep = 0;  // steps done in the whole run
};

struct Breakdown {
  double data = 0, fwdBwd = 0, comm = 0, optim = 0;
  double commTotal = 0, commExposed = 0;  // for the hidden fraction
  int64_t timedSteps = 0;                  // steps the four times above cover
  // The sums scaled from the timed steps to `steps`.
  double scaled(double v, int64_t steps) const {
    return timedSteps ? v * static_cast<double>(steps) / static_cast<double>(timedSteps) : 0.0;
  }
};

// Sums a few doubles over the group (losses, counts); exact for counts.
void allReduceSum(ProcessGroup& pg, std::vector<double>& v) {
  if (pg.size() > 1)
    runtime::allReduce(pg, {.output = v.data(), .count = v.size(), .dtype = DType::kFloat64});
}

// Gives every rank rank 0's string.
void broadcastString(ProcessGroup& pg, std::string& s) {
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
LossScaler makeLossScaler(const TrainConfig& cfg) {
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
  void trainEpoch();
  // One step on samples idx[0..n); next/nextN: the following step's samples
  // (nullptr at the epoch's end), assembled while this step's backward runs.
  void step(const int64_t* idx, int64_t n, const int64_t* next, int64_t nextN,
            int64_t stepsInEpoch);
  void report(int64_t stepsInEpoch, bool force);
  void timedLine(int64_t stepsInEpoch);
  void reportProgress(bool force);
  std::string progressText(int64_t stepsInEpoch, double loss, double rate,
                           const char* lossNote) const;
  std::pair<int64_t, int64_t> evaluate();
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
  Breakdown time_;
  std::unique_ptr<BatchFeed> feed_;  // the input pipeline
  Tensor dlogits_;
  LossScaler scaler_ = makeLossScaler(cfg_);
  // progress accounting
  double intervalLoss_ = 0, intervalCount_ = 0, lastLoss_ = NAN, epochLossSum_ = 0,
         epochLossCount_ = 0;
  Clock::time_point intervalStart_, runStart_, lastLine_;
  double dataWait_ = 0;  // seconds the training thread spent assembling and taking batches
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

  // --bench-warmup: the timed window (made in setup(), once the backend exists).
  std::unique_ptr<BenchWindow> window_;
  bool windowOpen() const { return window_ && window_->open(); }
  // --profile-steps: the last steps' device profile.
  std::unique_ptr<StepProfile> profile_;
  nlohmann::json profileResult_;
  DeviceDecision deviceDecision_;  // --device: the choice and why
  std::optional<double> deviceHidden_;  // the profile's comm-hidden fraction (GPU clock)
  void checkBenchFlags();
  bool inProfile() const { return cfg_.profileSteps > 0 && stepsRun_ >= runSteps_ - cfg_.profileSteps; }
  void profileStepStart();
  void profileStepEnd();
  void profilePoint(StepProfile::Point p) {
    if (profile_) profile_->point(p);
  }
  // The all-reduce's share hidden behind backward: from the profile's GPU
  // timestamps when the reducer is ordered on streams, else from the host
  // clock of the sampled steps; null when nothing was measured.
  nlohmann::json commHiddenJson() const {
    if (reducer_->streamOrdered())
      return deviceHidden_ ? nlohmann::json(*deviceHidden_) : nlohmann::json(nullptr);
    return time_.commTotal > 0 ? nlohmann::json(1.0 - time_.commExposed / time_.commTotal)
                               : nlohmann::json(nullptr);
  }
};

void Run::setup() {
  be_ = makeBackend(cfg_, &deviceDecision_);
  if (!deviceDecision_.notice.empty()) notice(deviceDecision_.notice);
  // resnet18's input: --image-size, else the data's own side (32 for CIFAR,
  // an image folder's fitted size).
  const int64_t side =
      cfg_.imageSize == 0 && cfg_.model == "resnet18" ? data_.train.height : cfg_.imageSize;
  model_ = Model::create(cfg_.model, *be_, cfg_.syncBn ? &pg_ : nullptr,
                         {.numClasses = data_.train.numClasses, .stem = cfg_.stem,
                          .imageSize = side});
  feed_ = std::make_unique<BatchFeed>(*be_, model_->inputShape(), dataThreads(cfg_));
  if (cfg_.benchWarmup > 0)
    window_ = std::make_unique<BenchWindow>(*be_, cfg_.benchWarmup,
                                            int64_t{cfg_.batchSize} * pg_.size());
  rng_ = Rng(cfg_.seed);
  model_->initialize(rng_);
  if (!cfg_.init.empty()) loadInit();
  // DDP's construction: every rank starts from rank 0's parameters and buffers.
  std::vector<std::pair<float*, size_t>> arrays;
  for (Param* p : model_->params()) arrays.emplace_back(p->value.data(), p->value.numel());
  for (const auto& b : bufferArrays()) arrays.push_back(b);
  runtime::broadcastFromRank0(pg_, arrays, be_->device());

  std::vector<runtime::ParamInfo> infos;
  for (Param* p : model_->params())
    infos.push_back({p->name, static_cast<size_t>(p->value.numel())});
  runtime::ReducerOptions ro;
  ro.bucketCapBytes = static_cast<size_t>(cfg_.bucketCapMb * 1024 * 1024);
  ro.firstBucketBytes = static_cast<size_t>(cfg_.firstBucketMb * 1024 * 1024);
  ro.hook = *runtime::parseCommHook(cfg_.commHook);
  reducer_ = std::make_unique<runtime::Reducer>(pg_, infos, ro, be_->gradientMemory(pg_));
  bindGrads();

  OptimizerOptions oo;
  oo.kind = cfg_.optimizer;
  oo.lr = cfg_.lr * (cfg_.scaleLr ? static_cast<float>(pg_.size()) : 1.0f);
  oo.momentum = cfg_.momentum;
  oo.weightDecay = cfg_.weightDecay;
  oo.nesterov = cfg_.nesterov;
  optim_ = Optimizer::create(oo, *be_, model_->params());
  schedule_ = std::make_unique<LrSchedule>(lrScheduleSpec(cfg_, oo.lr, stepsPerEpoch_));
  be_->setLabelSmoothing(cfg_.labelSmoothing);
  // Parameters and optimizer state flat in the buckets' order: one optimizer
  // launch per step. Gradients start logically zero: the first writer of each
  // step overwrites them, so no step zeroes its buckets.
  optim_->adoptLayout(bucketLayout());
  markGradsZero();
}

std::vector<std::vector<size_t>> Run::bucketLayout() const {
  std::vector<std::vector<size_t>> b;
  for (size_t k = 0; k < reducer_->numBuckets(); ++k) b.push_back(reducer_->bucketParams(k));
  return b;
}

void Run::markGradsZero() {
  for (Param* p : model_->params()) p->overwriteGrad = true;
}

// The model's buffers, each storage once (the batch norms of a CUDA model
// share one step counter).
std::vector<std::pair<float*, size_t>> Run::bufferArrays() const {
  std::vector<std::pair<float*, size_t>> out;
  for (Buffer* b : model_->buffers()) {
    const bool seen = std::any_of(out.begin(), out.end(),
                                  [&](const auto& a) { return a.first == b->value.data(); });
    if (!seen) out.emplace_back(b->value.data(), b->value.numel());
  }
  return out;
}

// PyTorch DDP's broadcast_buffers=True: before each training forward, every
// rank takes rank 0's buffers (batch norm running statistics). Evaluation runs
// the local module as the reference script does (ddp.module, no broadcast), so
// each rank evaluates with rank 0's statistics updated by its own last batch.
// With --sync-bn the statistics are global and the broadcast changes nothing.
// On a device the broadcast is ordered on streams after the compute that
// updated the buffers and before the forward that reads them (the reducer's
// communication stream); the host waits only for its issue.
void Run::syncBuffers() {
  if (pg_.size() == 1 || model_->buffers().empty()) return;
  reducer_->broadcastBuffers(bufferArrays());
}

// fp16: divides every (averaged) gradient by the loss scale, bucket by
// bucket; false when any is not finite (identical on every rank: the
// gradients were all-reduced).
bool Run::unscaleGrads(float invScale) {
  bool finite = true;
  for (size_t b = 0; b < reducer_->numBuckets(); ++b) {
    const auto& ps = reducer_->bucketParams(b);
    if (ps.empty()) continue;
    // The bucket's extent, alignment padding (zeros) included.
    float* first = reducer_->grad(ps.front());
    const size_t n = static_cast<size_t>(reducer_->grad(ps.back()) - first) +
                     reducer_->param(ps.back()).count;
    finite &= be_->scaleAndCheckFinite(first, n, invScale);
  }
  return finite;
}

// Gradients live in the reducer's buckets ("gradient as bucket view").
void Run::bindGrads() {
  const auto& ps = model_->params();
  for (size_t i = 0; i < ps.size(); ++i)
    ps[i]->grad = Tensor::view(reducer_->grad(i), ps[i]->value.shape(), be_->device());
}

void Run::loadInit() {
  const SafeTensors st = loadSafetensors(cfg_.init);
  std::string why;
  if (!copyInto(st, cfg_.init, *model_, nullptr, *be_, &why))
    DDPRUN_THROW(CheckpointError, "--init ", why);
}

RunShape Run::shape() const {
  return {.model = cfg_.model,
          .optimizer = cfg_.optimizer,
          .epochs = cfg_.epochs,
          .stepsPerEpoch = stepsPerEpoch_,
          .world = pg_.size(),
          .batchSize = cfg_.batchSize,
          .seed = cfg_.seed};
}

// Every field is checked before anything of the file is used; the model,
// optimizer and position change only when the whole file fits.
bool Run::applyCheckpoint(const CheckpointFile& file, std::string* why) {
  SafeTensors st;
  try {
    st = loadSafetensors(file.path);
  } catch (const CheckpointError& e) {
    *why = e.message();
    return false;
  }
  CheckpointPosition p;
  *why = readCheckpointMetadata(file.path, st.metadata, shape(), file.tag, &p);
  if (!why->empty() || !copyInto(st, file.path, *model_, optim_.get(), *be_, why)) return false;
  pos_ = {.epoch = p.epoch, .step = p.step, .globalStep = p.globalStep};
  optim_->setSteps(p.optimizerSteps);
  rng_.restore(p.rng);
  resumed_ = p.totals;
  if (!p.sameLayout && pos_.step != 0) {
    notice("checkpoint " + file.path + " was taken with another world size, batch size or "
           "seed: resuming at the start of epoch " + std::to_string(pos_.epoch));
    pos_.step = 0;
  }
  return true;
}

// Rank 0's choice of where to start, made before any rank trains.
struct Run::StartPlan {
  enum Kind : int64_t { kFresh = 0, kResume = 1, kNoUsable = 2, kRefuse = 3 };
  int64_t kind = kFresh;
  std::string path, tag;  // kResume: the checkpoint; kNoUsable, kRefuse: the reason
};

// The checkpoints a start may resume from: this run's own (a launcher
// restart, or a relaunch with the same run id and --resume); with --resume and
// none of its own, those of the run written last.
std::vector<CheckpointFile> Run::resumeCandidates() {
  std::vector<CheckpointFile> mine = listCheckpoints(cfg_.checkpointDir, tag_);
  if (!mine.empty() || !cfg_.resume) return mine;
  const std::optional<std::string> last = lastWrittenRun(cfg_.checkpointDir);
  if (!last) return {};
  notice("--resume: continuing the run whose checkpoint was written last (" +
         (last->empty() ? std::string("files without a run id") : "run '" + *last + "'") +
         "); this run's own checkpoints are named after its id '" + runId_ + "'");
  return listCheckpoints(cfg_.checkpointDir, *last);
}

Run::StartPlan Run::planStart() {
  StartPlan plan;
  if (!io_.restarted && !cfg_.resume) {
    if (!listCheckpoints(cfg_.checkpointDir, tag_).empty()) {
      plan.kind = StartPlan::kRefuse;
      plan.path = cfg_.checkpointDir +
                  " holds checkpoints of an earlier launch with this run id ('" + runId_ +
                  "'): pass --resume to continue them, or give this job another run id "
                  "(--rdzv-id) or another --checkpoint-dir";
    } else if (!listCheckpoints(cfg_.checkpointDir).empty()) {
      notice(cfg_.checkpointDir + " holds checkpoints of other runs: they are kept, and this "
             "run (id '" + runId_ + "') starts from the beginning; pass --resume to "
             "continue the one written last");
    }
    return plan;
  }
  std::string refused;
  for (const CheckpointFile& f : resumeCandidates()) {
    std::string why;
    if (applyCheckpoint(f, &why)) {
      plan = {StartPlan::kResume, f.path, f.tag};
      return plan;
    }
    notice("refusing checkpoint: " + why);
    refused += (refused.empty() ? "" : "; ") + why;
  }
  if (!refused.empty()) plan = {StartPlan::kNoUsable, refused, ""};
  return plan;
}

// Rank 0 decides (naming every checkpoint it refuses); the others follow and
// load the same file.
void Run::start() {
  StartPlan plan;
  if (rank0_) plan = planStart();
  if (pg_.size() > 1) {
    runtime::broadcast(pg_, {.buffer = &plan.kind, .count = 1, .dtype = DType::kInt64});
    broadcastString(pg_, plan.path);
    broadcastString(pg_, plan.tag);
  }
  const std::string why = rank0_ ? ": " + plan.path : std::string(" (rank 0 says why)");
  if (plan.kind == StartPlan::kRefuse) DDPRUN_THROW(InvalidArgument, "cannot start", why);
  if (plan.kind == StartPlan::kNoUsable)
    DDPRUN_THROW(CheckpointError, "no usable checkpoint in ", cfg_.checkpointDir, why,
                 ". Remove the bad files or point --checkpoint-dir elsewhere");
  if (plan.kind == StartPlan::kFresh) {
    if (io_.restarted || cfg_.resume)
      notice("no checkpoint of this run in " + cfg_.checkpointDir +
             ": starting from the beginning");
    return;
  }
  std::string err;
  if (!rank0_ && !applyCheckpoint({plan.path, plan.tag, 0}, &err))
    DDPRUN_THROW(CheckpointError, "cannot resume: ", err);
  reducer_->zeroGrad();
  notice("resuming from " + plan.path + " (epoch " + std::to_string(pos_.epoch) +
         ", step " + std::to_string(pos_.step) + ", global step " +
         std::to_string(pos_.globalStep) + ")");
  metrics_.write({{"type", "resume"},
                  {"checkpoint", plan.path},
                  {"epoch", pos_.epoch},
                  {"step", pos_.step},
                  {"global_step", pos_.globalStep},
                  {"run", runId_}});
}

void Run::saveCheckpoint(bool epochDone) {
  if (!rank0_ || cfg_.checkpointDir.empty()) return;
  RunTotals totals{.runSeconds = runSeconds(),
                   .runSamples = resumed_.runSamples + samplesSeen_};
  if (!epochDone) {
    totals.epochLossSum = epochLossSum_;
    totals.epochLossCount = epochLossCount_;
    totals.epochSeconds = epochPriorSeconds_ + since(epochStart_);
  }
  std::vector<std::vector<int64_t>> counts;
  HostSnapshot snap(*be_);
  const auto tensors = modelTensors(*model_, optim_.get(), snap, counts);
  CheckpointPosition p{.epoch = pos_.epoch,
                       .step = pos_.step,
                       .globalStep = pos_.globalStep,
                       .optimizerSteps = optim_->steps(),
                       .rng = rng_.state(),
                       .run = runId_,
                       .totals = totals};
  saveSafetensors(cfg_.checkpointDir + "/" + checkpointFileName(tag_, pos_.globalStep),
                  tensors, checkpointMetadata(shape(), p));
  pruneCheckpoints(cfg_.checkpointDir, tag_, cfg_.keepCheckpoints);
}

void Run::step(const int64_t* idx, int64_t n, const int64_t* next, int64_t nextN,
               int64_t stepsInEpoch) {
  // On a device the clock reads must bracket finished work: every
  // kSampleEvery-th step synchronises the backend after backward (the bucket
  // all-reduces already run behind it) and after the optimizer, and the
  // breakdown is those steps' times scaled to all steps; the other steps run
  // without waiting.
  // --bench-warmup's window and --profile-steps' steps never synchronise
  // inside a step: the breakdown samples only the steps outside them.
  if (window_ && stepsRun_ == cfg_.benchWarmup) window_->start();
  const bool profiled = inProfile();
  if (profiled) profileStepStart();
  const bool device = be_->device() != Device::kCpu;
  const bool quiet = windowOpen() || profiled;
  const bool timed =
      !quiet && (!device || pos_.globalStep % kSampleEvery == kSampleEvery / 2);
  if (device && timed) be_->synchronize();  // the previous step's work is not this one's
  auto t0 = Clock::now();
  profilePoint(StepProfile::Point::kStepStart);
  const BatchFeed::Batch batch = feed_->take(data_.train, idx, n);
  dataWait_ += since(t0);
  syncBuffers();
  profilePoint(StepProfile::Point::kDataEnd);
  auto t1 = Clock::now();
  const Tensor& logits = model_->forward(batch.x, true);
  // The loss is summed where it is computed and read when reported: no
  // device synchronisation per step.
  profilePoint(StepProfile::Point::kLossStart);
  be_->crossEntropyDeferred(logits, batch.labels, &dlogits_, scaler_.scale());
  profilePoint(StepProfile::Point::kLossEnd);
  model_->backward(dlogits_, [&](size_t i) {
    reducer_->markReady(i);
    if (profile_) profile_->paramReady(i);
  });
  // The next batch is assembled while the device still runs backward.
  const auto p0 = Clock::now();
  feed_->prepareNext(data_.train, next, nextN);
  const double prefetch = since(p0);
  dataWait_ += prefetch;
  if (device && timed) be_->synchronize();
  auto t2 = Clock::now();
  const uint64_t layout = reducer_->layoutVersion();
  profilePoint(StepProfile::Point::kReducerStart);
  reducer_->finalize();
  profilePoint(StepProfile::Point::kReducerEnd);
  if (reducer_->layoutVersion() != layout) {  // the buckets were rebuilt (once)
    bindGrads();
    optim_->adoptLayout(bucketLayout());
  }
  auto t3 = Clock::now();
  profilePoint(StepProfile::Point::kOptimizerStart);
  optim_->setLr(static_cast<float>(schedule_->lrAt(pos_.epoch, pos_.step)));
  const bool finite = !scaler_.on() || unscaleGrads(1.0f / scaler_.scale());
  scaler_.update(finite);
  if (finite) optim_->step();  // an overflowed fp16 step is skipped (GradScaler)
  markGradsZero();  // instead of zeroing: the next backward overwrites
  profilePoint(StepProfile::Point::kOptimizerEnd);
  profilePoint(StepProfile::Point::kStepEnd);
  if (device && timed) be_->synchronize();
  auto t4 = Clock::now();
  if (timed) {
    ++time_.timedSteps;
    time_.data += std::chrono::duration<double>(t1 - t0).count() + prefetch;
    time_.fwdBwd += std::chrono::duration<double>(t2 - t1).count() - prefetch;
    time_.comm += std::chrono::duration<double>(t3 - t2).count();
    time_.optim += std::chrono::duration<double>(t4 - t3).count();
  }
  // The hidden fraction too comes from the timed steps: on the others
  // finalize() also waits for backward's own kernels. Ordered on streams (a
  // device), finalize waits for nothing and the host clock says nothing: the
  // profile's GPU timestamps give the fraction instead.
  if (timed && !reducer_->streamOrdered()) {
    const auto& st = reducer_->lastStats();
    const double ct = st.commTime.count();
    time_.commTotal += ct;
    time_.commExposed += ct * (1.0 - st.hiddenFraction());
  }

  intervalCount_ += static_cast<double>(n);
  samplesTrained_ += n;
  ++pos_.step;
  ++pos_.globalStep;
  ++stepsRun_;
  if (window_) window_->countStep();
  if (windowOpen() && stepsRun_ == runSteps_ - cfg_.profileSteps) window_->end();
  if (profiled) profileStepEnd();
  const bool last = pos_.step == stepsInEpoch;
  // No progress line (a host read of the loss) inside the timed window or
  // the profile; the interval's samples are reported with the next line.
  const bool checkpointDue =
      cfg_.checkpointEvery > 0 && pos_.globalStep % cfg_.checkpointEvery == 0;
  if (!windowOpen() && !(profiled && stepsRun_ < runSteps_)) {
    // A checkpoint's totals include the interval's loss: reported first.
    report(stepsInEpoch, last || checkpointDue || pos_.step % cfg_.logInterval == 0);
    reportProgress(last);
  }
  if (checkpointDue) saveCheckpoint();
}

// The first profiled step sets the profile up; every profiled step records
// its bucket layout (the reducer rebuilds it once, after its first
// iteration).
void Run::profileStepStart() {
  if (!profile_) {
    std::vector<std::string> names;
    for (size_t i = 0; i < model_->numLayers(); ++i) names.push_back(model_->layerName(i));
    profile_ = std::make_unique<StepProfile>(*be_, std::move(names));
    model_->setObserver([this](size_t layer, bool backward, bool end) {
      profile_->layer(layer, backward, end);
    });
    if (reducer_->streamOrdered() && pg_.size() > 1) reducer_->setDeviceTiming(true);
    be_->profilerRange(true);
  }
  profile_->setBuckets(*reducer_);
}

// After the last profiled step: the tracer's window closes, the marks are
// read (one wait, outside every timed step) and averaged.
void Run::profileStepEnd() {
  if (stepsRun_ < runSteps_) return;
  be_->synchronize();
  be_->profilerRange(false);
  model_->setObserver(nullptr);
  profileResult_ = profile_->finish();
  profile_.reset();
  // The communication of the last profiled step, from GPU timestamps (ms
  // from its first bucket's readiness).
  if (const auto t = reducer_->deviceTimings()) {
    profileResult_["comm"] = commProfile(*t);
    deviceHidden_ = t->hiddenFraction;
  }
  reducer_->setDeviceTiming(false);
}

// The window and the profile must fit the steps this process trains (known
// after a resume).
void Run::checkBenchFlags() {
  if (const std::string e = benchFlagsProblem(cfg_.benchWarmup, cfg_.profileSteps, runSteps_,
                                              stepsPerEpoch_ - pos_.step);
      !e.empty())
    DDPRUN_THROW(InvalidArgument, e);
}

// The progress line's text.
std::string Run::progressText(int64_t stepsInEpoch, double loss, double rate,
                              const char* lossNote) const {
  const double perStep = stepsRun_ > 0 ? since(runStart_) / static_cast<double>(stepsRun_) : 0;
  const int64_t left = totalSteps_ - pos_.globalStep;
  char line[256];
  std::snprintf(line, sizeof(line),
                "epoch %lld of %d  step %lld/%lld  loss %.4f%s  %.0f samples/s  ETA %s",
                static_cast<long long>(pos_.epoch), cfg_.epochs,
                static_cast<long long>(pos_.step), static_cast<long long>(stepsInEpoch), loss,
                lossNote, rate, formatSeconds(perStep * static_cast<double>(left)).c_str());
  return line;
}

// Between --log-interval's lines, rank 0 alone prints one every --log-seconds
// with its own loss of the interval so far: no collective (the other ranks
// cannot know when rank 0's clock says so), one read of the loss.
void Run::timedLine(int64_t stepsInEpoch) {
  if (!rank0_ || cfg_.quiet || cfg_.logSeconds <= 0 ||
      since(lastLine_) < cfg_.logSeconds)
    return;
  intervalLoss_ += be_->takeLossSum();
  const double secs = since(intervalStart_);
  const double loss = intervalCount_ > 0 ? intervalLoss_ / intervalCount_ : NAN;
  const double rate = secs > 0 ? intervalCount_ * pg_.size() / secs : 0;
  progress_.update(progressText(stepsInEpoch, loss, rate, pg_.size() > 1 ? " (rank 0)" : ""));
  lastLine_ = Clock::now();
}

// This rank's progress for its launcher (TrainerIo::progressFile), at most
// every kProgressWriteInterval unless forced: its own loss of the interval
// so far (a read of the loss: on a device, a wait for the step's work) and
// its own samples per second since the last report.
void Run::reportProgress(bool force) {
  if (io_.progressFile.empty()) return;
  const auto now = Clock::now();
  if (!force && now - lastProgress_ < kProgressWriteInterval) return;
  intervalLoss_ += be_->takeLossSum();
  ProgressReport r;
  r.step = pos_.globalStep;
  r.epoch = pos_.epoch;
  if (intervalCount_ > 0) r.loss = intervalLoss_ / intervalCount_;
  else if (std::isfinite(lastLoss_)) r.loss = lastLoss_;
  const double secs = std::chrono::duration<double>(now - lastProgress_).count();
  if (secs > 0 && stepsRun_ > 0)
    r.samplesPerSecond = static_cast<double>(samplesTrained_ - progressSamples_) / secs;
  r.totalSteps = totalSteps_;
  writeProgressFile(io_.progressFile, r, true);  // never fails the run
  lastProgress_ = now;
  progressSamples_ = samplesTrained_;
}

// Every rank joins the all-reduce of the interval's loss; rank 0 prints.
void Run::report(int64_t stepsInEpoch, bool force) {
  if (!force) {
    timedLine(stepsInEpoch);
    return;
  }
  intervalLoss_ += be_->takeLossSum();
  std::vector<double> v = {intervalLoss_, intervalCount_};
  allReduceSum(pg_, v);
  const double secs = since(intervalStart_);
  lastLoss_ = v[1] > 0 ? v[0] / v[1] : NAN;
  epochLossSum_ += v[0];
  epochLossCount_ += v[1];
  samplesSeen_ += static_cast<int64_t>(v[1]);
  const double rate = secs > 0 ? v[1] / secs : 0;
  progress_.update(progressText(stepsInEpoch, lastLoss_, rate, ""));
  lastLine_ = Clock::now();
  metrics_.write({{"type", "step"}, {"epoch", pos_.epoch}, {"step", pos_.step},
                  {"global_step", pos_.globalStep}, {"loss", lastLoss_}, {"lr", optim_->lr()},
                  {"samples_per_second", rate}, {"elapsed_s", runSeconds()}});
  intervalLoss_ = intervalCount_ = 0;
  intervalStart_ = Clock::now();
}

void Run::trainEpoch() {
  runtime::SamplerOptions so;
  so.datasetSize = data_.train.size;
  so.numReplicas = pg_.size();
  so.rank = pg_.rank();
  so.shuffle = cfg_.shuffle;
  so.seed = cfg_.seed;
  runtime::DistributedSampler sampler(so);
  sampler.setEpoch(pos_.epoch);
  if (pos_.epoch == 0 && pos_.step == 0 && sampler.totalSize() > so.datasetSize)
    notice(std::to_string(so.datasetSize) + " training samples do not split evenly over " +
           std::to_string(pg_.size()) + " ranks: " +
           std::to_string(sampler.totalSize() - so.datasetSize) + " of them are seen twice per "
           "epoch (PyTorch's DistributedSampler padding); evaluation counts every test sample "
           "exactly once");
  feed_->setTransform({.augment = *parseAugment(cfg_.augment), .seed = cfg_.seed,
                       .epoch = pos_.epoch});
  const std::vector<int64_t>& idx = sampler.indices();
  const int64_t n = static_cast<int64_t>(idx.size()), b = cfg_.batchSize;
  int64_t steps = (n + b - 1) / b;
  if (cfg_.maxSteps > 0) steps = std::min(steps, cfg_.maxSteps);
  intervalStart_ = Clock::now();
  for (int64_t s = pos_.step; s < steps; ++s) {
    const bool last = s + 1 == steps;
    step(idx.data() + s * b, std::min(b, n - s * b), last ? nullptr : idx.data() + (s + 1) * b,
         last ? 0 : std::min(b, n - (s + 1) * b), steps);
  }
}

// Exact split: every test sample is evaluated once across the ranks.
std::pair<int64_t, int64_t> Run::evaluate() {
  if (data_.test.size == 0) return {0, 0};  // an image folder without a test split
  runtime::SamplerOptions so;
  so.datasetSize = data_.test.size;
  so.numReplicas = pg_.size();
  so.rank = pg_.rank();
  so.shuffle = false;
  so.mode = runtime::SamplerOptions::Mode::kExact;
  runtime::DistributedSampler sampler(so);
  const std::vector<int64_t>& idx = sampler.indices();
  const Dataset& d = data_.test;
  // Chunks of the training batch: activations are kept per layer, so a bigger
  // chunk would need more memory than training (ResNet-18 at 500 images).
  const int64_t chunk = cfg_.batchSize;
  int64_t correct = 0;
  for (size_t at = 0; at < idx.size(); at += chunk) {
    const int64_t n = std::min<int64_t>(chunk, static_cast<int64_t>(idx.size() - at));
    const BatchFeed::Batch batch = feed_->once(d, idx.data() + at, n);
    int64_t hits = 0;
    be_->crossEntropy(model_->forward(batch.x, false), batch.labels, nullptr, &hits);
    correct += hits;
  }
  std::vector<double> v = {static_cast<double>(correct), static_cast<double>(idx.size())};
  allReduceSum(pg_, v);
  return {static_cast<int64_t>(v[0]), static_cast<int64_t>(v[1])};
}

int64_t Run::computeStepsPerEpoch() const {
  const int64_t perRank = (data_.train.size + pg_.size() - 1) / pg_.size();
  int64_t steps = (perRank + cfg_.batchSize - 1) / cfg_.batchSize;
  if (cfg_.maxSteps > 0) steps = std::min(steps, cfg_.maxSteps);
  return steps;
}

// Rank 0, at start: the checkpoint directory exists, and the temporaries of
// writers that died mid-save (here or at --save's path) are gone.
void Run::clearStaleTemporaries() {
  std::vector<std::string> removed;
  if (!cfg_.checkpointDir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(cfg_.checkpointDir, ec);
    if (ec)
      DDPRUN_THROW(InvalidArgument, "cannot create --checkpoint-dir ", cfg_.checkpointDir, ": ",
                   ec.message());
    removed = removeStaleTemporaries(cfg_.checkpointDir, [](const std::string& name) {
      return parseCheckpointName(name).has_value();
    });
  }
  if (!cfg_.save.empty()) {
    const std::filesystem::path save(cfg_.save);
    const std::string dir =
        save.parent_path().empty() ? "." : save.parent_path().string();
    const std::string base = save.filename().string();
    for (std::string& n : removeStaleTemporaries(
             dir, [&](const std::string& name) { return name == base; }))
      removed.push_back(std::move(n));
  }
  if (!removed.empty())
    notice("removed " + std::to_string(removed.size()) +
           " temporary file(s) of interrupted saves: " + str::join(removed, ", "));
}

nlohmann::json Run::execute() {
  if (data_.train.size < pg_.size())
    DDPRUN_THROW(InvalidArgument, "the training set has ", data_.train.size,
                 " samples but there are ", pg_.size(),
                 " ranks: every rank needs at least one sample (use fewer workers or more "
                 "--train-samples)");
  runId_ = io_.runId;
  if (runId_.empty() && rank0_) runId_ = "train-" + str::randomToken(12);
  broadcastString(pg_, runId_);
  tag_ = runTag(runId_);
  stepsPerEpoch_ = computeStepsPerEpoch();
  totalSteps_ = stepsPerEpoch_ * cfg_.epochs;
  if (rank0_) clearStaleTemporaries();
  setup();
  if (!cfg_.checkpointDir.empty()) start();
  runSteps_ = totalSteps_ - pos_.globalStep;
  checkBenchFlags();
  notice(std::string("model ") + cfg_.model + " (" +
         std::to_string(model_->numParameters()) + " parameters, " +
         std::to_string(reducer_->numBuckets()) + " gradient bucket" +
         (reducer_->numBuckets() == 1 ? "" : "s") + "), " + std::to_string(pg_.size()) +
         " rank" + (pg_.size() == 1 ? "" : "s") + " x batch " +
         std::to_string(cfg_.batchSize) + ", data " + data_.source + ", " +
         be_->describe());
  if (scaler_.on())
    notice("fp16: dynamic loss scaling from " + std::to_string(scaler_.scale()));
  runStart_ = lastLine_ = lastProgress_ = Clock::now();
  nlohmann::json lastEpoch;
  int64_t correct = 0, total = 0;
  double epochSecs = 0;
  // An epoch resumed part way: its record covers the whole epoch (what the
  // checkpoint says earlier attempts did, and this one), this attempt's share
  // as attempt_* fields.
  bool resumedMidEpoch = pos_.step > 0 && resumed_.known;
  for (; pos_.epoch < cfg_.epochs; ++pos_.epoch, pos_.step = 0, resumedMidEpoch = false) {
    epochStart_ = Clock::now();
    epochLossSum_ = resumedMidEpoch ? resumed_.epochLossSum : 0;
    epochLossCount_ = resumedMidEpoch ? resumed_.epochLossCount : 0;
    epochPriorSeconds_ = resumedMidEpoch ? resumed_.epochSeconds : 0;
    trainEpoch();
    progress_.finish();
    std::tie(correct, total) = evaluate();
    const double attemptSecs = since(epochStart_);
    epochSecs = epochPriorSeconds_ + attemptSecs;
    const double acc = total ? static_cast<double>(correct) / static_cast<double>(total) : 0.0;
    lastEpoch = {{"type", "epoch"}, {"epoch", pos_.epoch},
                 {"train_loss", epochLossCount_ > 0 ? epochLossSum_ / epochLossCount_ : NAN},
                 {"test_accuracy", accuracyJson(correct, total)}, {"test_correct", correct},
                 {"test_total", total},
                 {"epoch_seconds", epochSecs}};
    if (resumedMidEpoch) {
      const double n = epochLossCount_ - resumed_.epochLossCount;
      lastEpoch["attempt_train_loss"] = n > 0 ? (epochLossSum_ - resumed_.epochLossSum) / n : NAN;
      lastEpoch["attempt_epoch_seconds"] = attemptSecs;
    }
    metrics_.write(lastEpoch);
    notice("epoch " + std::to_string(pos_.epoch) + " of " + std::to_string(cfg_.epochs) + ": " +
           (total ? "test accuracy " + std::to_string(acc) + " (" + std::to_string(correct) +
                        "/" + std::to_string(total) + ")"
                  : std::string("no test split")) +
           ", " + formatSeconds(epochSecs));
    // The epoch-end checkpoint points at the next epoch's first step.
    Position keep = pos_;
    pos_.epoch += 1;
    pos_.step = 0;
    saveCheckpoint(true);
    pos_ = keep;
  }
  if (total == 0) std::tie(correct, total) = evaluate();  // resumed after the last epoch
  if (data_.test.size == 0)
    notice("no test split: an image folder is evaluated with --val-data DIR or --val-fraction F; "
           "test_accuracy is null");
  const double attemptSecs = since(runStart_), secs = runSeconds();
  const int64_t runSamples = resumed_.runSamples + samplesSeen_;
  // Rank 0 writes --save; every rank hashes its parameters.
  const std::string paramsSha256 =
      saveAndHashModel(*model_, *be_, rank0_ ? cfg_.save : std::string(),
                       {{"format", "ddprun-train-model"}, {"model", cfg_.model}});
  nlohmann::json j = {
      {"world", pg_.size()}, {"model", cfg_.model}, {"data", data_.source},
      {"epochs", cfg_.epochs},
      // Whole-run totals: a resumed run counts the steps of its earlier
      // attempts too (attempt_steps: this process's). Epochs count from 0.
      {"steps", pos_.globalStep}, {"attempt_steps", stepsRun_},
      {"last_epoch", cfg_.epochs - 1}, {"batch_size", cfg_.batchSize},
      // The run's seconds and samples, earlier attempts' included (from the
      // checkpoint resumed); this process's alone as attempt_*.
      {"train_seconds", secs},
      {"samples_per_second", secs > 0 ? static_cast<double>(runSamples) / secs : 0.0},
      {"attempt_train_seconds", attemptSecs},
      {"attempt_samples_per_second",
       attemptSecs > 0 ? static_cast<double>(samplesSeen_) / attemptSecs : 0.0},
      {"test_accuracy", accuracyJson(correct, total)},
      {"test_correct", correct}, {"test_total", total}, {"final_loss", lastLoss_},
      {"params_sha256", paramsSha256},
      {"device", be_->device() == Device::kCpu ? "cpu" : "cuda"},
      {"device_choice", deviceDecision_.summary},
      {"backend", be_->describe()}, {"precision", precisionName(cfg_.precision)},
      {"layout", be_->device() == Device::kCuda && nhwcLayout(cfg_.layout, cfg_.precision)
                     ? "nhwc" : "nchw"},
      {"breakdown", {{"data_s", time_.scaled(time_.data, stepsRun_)},
                     {"forward_backward_s", time_.scaled(time_.fwdBwd, stepsRun_)},
                     {"comm_wait_s", time_.scaled(time_.comm, stepsRun_)},
                     {"optimizer_s", time_.scaled(time_.optim, stepsRun_)}}},
      // Every step's time on the training thread spent on its data (taking
      // the batch, assembling the next), not sampled: what the pipeline costs.
      {"data_wait_s", dataWait_},
      {"comm_hidden_fraction", commHiddenJson()},
      {"gradient_buckets", reducer_->numBuckets()},
      {"peak_rss_mb", peakRssMb()}};
  if (be_->device() != Device::kCpu) {
    j["peak_device_mb"] = static_cast<double>(be_->peakDeviceBytes()) / (1 << 20);
    j["peak_reserved_mb"] = static_cast<double>(be_->peakReservedBytes()) / (1 << 20);
    if (pg_.size() > 1) j["comm_transport"] = runtime::cudaTransportName(pg_);
  }
  if (data_.skipped) j["skipped_images"] = data_.skipped->load();  // --skip-bad-images
  if (window_) j["bench"] = window_->json();
  if (cfg_.profileSteps > 0) j["profile"] = profileResult_;
  if (scaler_.on()) {
    j["skipped_steps"] = scaler_.skipped();
    j["loss_scale"] = scaler_.scale();
  }
  nlohmann::json fin = j;
  fin["type"] = "final";
  metrics_.write(fin);
  const MetricsWriter::Totals m = metrics_.finish();
  if (m.dropped > 0)
    notice("--metrics " + cfg_.metrics + ": " + std::to_string(m.dropped) + " of " +
           std::to_string(m.records) + " records dropped: its reader did not keep up (training "
           "never waits for it)");
  return j;
}

}  // namespace

nlohmann::json runTraining(const TrainConfig& cfg, const DataSplit& data, ProcessGroup& pg,
                           const TrainerIo& io) {
  Run run(cfg, data, pg, io);
  return run.execute();
}

}  // namespace ddprun::train
