#include "ddprun/train/trainer.h"

#include "run.h"

namespace ddprun::train {
namespace run_detail {

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
  observe_ = std::make_unique<StepObserver>(
      *be_, *model_, *reducer_,
      StepObserver::Options{.benchWarmup = cfg_.benchWarmup,
                            .profileSteps = cfg_.profileSteps,
                            .samplesPerStep = int64_t{cfg_.batchSize} * pg_.size(),
                            .worldSize = pg_.size()});
  graphPlan_ = std::make_unique<StepGraphPlan>(
      StepGraphPlan::Options{.backendRefusal = be_->captureRefusal(),
                             .worldSize = pg_.size(),
                             .lossScaling = scaler_.on(),
                             .commHook = ro.hook != runtime::CommHook::kNone});
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

// What the step measures is observe_'s (step_observer.h), at named points.
void Run::step(const int64_t* idx, int64_t n, const int64_t* next, int64_t nextN,
               int64_t stepsInEpoch) {
  using Point = StepProfile::Point;
  observe_->begin(stepsRun_, pos_.globalStep);
  const BatchFeed::Batch batch = feed_->take(data_.train, idx, n);
  observe_->dataTaken();
  syncBuffers();
  const StepGraphPlan::Action graphed = graphPlan_->next(
      {.batch = n, .lossScale = scaler_.scale(), .layoutVersion = reducer_->layoutVersion()},
      observe_->profiled());
  if (graphPlan_->releaseNow()) graph_.reset();
  optim_->setLr(static_cast<float>(schedule_->lrAt(pos_.epoch, pos_.step)));
  observe_->forwardStart();
  bool optimized = false;  // the optimizer ran in the step's graph
  if (graphed == StepGraphPlan::Action::kEager || !graphedStep(batch, n, graphed, &optimized)) {
    // The loss is summed where it is computed and read when reported: no
    // device synchronisation per step.
    be_->stageLabels(batch.labels, n, data_.train.numClasses);
    forwardBackward(batch.x, [&](size_t i) {
      reducer_->markReady(i);
      observe_->paramReady(i);
    });
  }
  // The next batch is assembled while the device still runs backward.
  observe_->prefetchStart();
  feed_->prepareNext(data_.train, next, nextN);
  observe_->prefetchEnd();
  observe_->backwardEnd();
  const uint64_t layout = reducer_->layoutVersion();
  observe_->point(Point::kReducerStart);
  reducer_->finalize();
  observe_->point(Point::kReducerEnd);
  if (reducer_->layoutVersion() != layout) {  // the buckets were rebuilt (once)
    bindGrads();
    optim_->adoptLayout(bucketLayout());
  }
  observe_->optimizerStart();
  if (!optimized) {
    const bool finite = !scaler_.on() || unscaleGrads(1.0f / scaler_.scale());
    scaler_.update(finite);
    if (finite) optim_->step();  // an overflowed fp16 step is skipped (GradScaler)
  }
  markGradsZero();  // instead of zeroing: the next backward overwrites
  observe_->stepEnd();
  finishStep(n, stepsInEpoch);
}

void Run::forwardBackward(const Tensor& x, const std::function<void(size_t)>& ready) {
  using Point = StepProfile::Point;
  const Tensor& logits = model_->forward(x, true);
  observe_->point(Point::kLossStart);
  be_->crossEntropyStaged(logits, &dlogits_, scaler_.scale());
  observe_->point(Point::kLossEnd);
  model_->backward(dlogits_, ready);
}

// With the optimizer in the graph (StepGraphPlan::optimizerOutside() empty,
// and no bucket rebuild pending at the capture), the step's learning rate and
// step count are staged before each replay, and the step is counted after it
// (the capture's step() counted its own).
bool Run::graphedStep(const BatchFeed::Batch& batch, int64_t n, StepGraphPlan::Action a,
                      bool* optimized) {
  graphInput_.ensure(batch.x.shape(), be_->allocator(), batch.x.dtype());
  be_->copy(batch.x, graphInput_);
  be_->stageLabels(batch.labels, n, data_.train.numClasses);
  if (a == StepGraphPlan::Action::kCapture) {
    graphOptim_ = graphPlan_->optimizerOutside().empty() && !reducer_->rebuildPending();
    if (graphOptim_) optim_->stageStep();
    graphReady_.clear();
    const int64_t optimSteps = optim_->steps();
    std::string why;
    graph_ = be_->capture(
        [&] {
          forwardBackward(graphInput_, [&](size_t i) { graphReady_.push_back(i); });
          if (graphOptim_) optim_->step();
        },
        &why);
    graphPlan_->captured(graph_ != nullptr, why);
    if (graph_ && graphOptim_) ++optimizerCaptures_;
    if (!graph_) {
      if (!graphOffSaid_) notice("CUDA graphs of the step: " + graphPlan_->off());
      graphOffSaid_ = true;
      markGradsZero();  // the capture consumed the layers' overwrite flags
      optim_->setSteps(optimSteps);  // nothing of the recorded step ran
      return false;
    }
  } else if (graphOptim_) {
    optim_->stageStep();
  }
  graph_->replay();
  if (graphOptim_ && a == StepGraphPlan::Action::kReplay) optim_->stepReplayed();
  *optimized = graphOptim_;
  for (const size_t i : graphReady_) {
    reducer_->markReady(i);
    observe_->paramReady(i);
  }
  return true;
}

void Run::dropGraph() {
  graphPlan_->invalidate();
  if (graphPlan_->releaseNow()) graph_.reset();
}

// The step is counted and reported; a checkpoint when due.
void Run::finishStep(int64_t n, int64_t stepsInEpoch) {
  intervalCount_ += static_cast<double>(n);
  samplesTrained_ += n;
  ++pos_.step;
  ++pos_.globalStep;
  ++stepsRun_;
  observe_->finish(stepsRun_);
  const bool last = pos_.step == stepsInEpoch;
  const bool checkpointDue =
      cfg_.checkpointEvery > 0 && pos_.globalStep % cfg_.checkpointEvery == 0;
  if (observe_->mayReport(stepsRun_)) {
    // A checkpoint's totals include the interval's loss: reported first.
    report(stepsInEpoch, last || checkpointDue || pos_.step % cfg_.logInterval == 0);
    reportProgress(last);
  }
  if (checkpointDue) saveCheckpoint();
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
TestCount Run::evaluate() {
  if (data_.test.size == 0) return {};  // an image folder without a test split
  dropGraph();  // evaluation's batches may move the layers' buffers
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
  return {.correct = static_cast<int64_t>(v[0]), .total = static_cast<int64_t>(v[1])};
}

int64_t Run::computeStepsPerEpoch() const {
  const int64_t perRank = (data_.train.size + pg_.size() - 1) / pg_.size();
  int64_t steps = (perRank + cfg_.batchSize - 1) / cfg_.batchSize;
  if (cfg_.maxSteps > 0) steps = std::min(steps, cfg_.maxSteps);
  return steps;
}

nlohmann::json Run::execute() {
  prepare();
  TestCount test = trainEpochs();
  if (test.total == 0) test = evaluate();  // resumed after the last epoch
  if (data_.test.size == 0)
    notice("no test split: an image folder is evaluated with --val-data DIR or --val-fraction F; "
           "test_accuracy is null");
  const nlohmann::json j = summary(test);
  writeFinal(j);
  return j;
}

// The run's identity and shape (every rank agrees on them), the model and
// its reducer, and where this process starts.
void Run::prepare() {
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
  // The window and the profile must fit the steps this process trains.
  observe_->setRunSteps(runSteps_, stepsPerEpoch_ - pos_.step);
  announce();
}

void Run::announce() {
  notice(std::string("model ") + cfg_.model + " (" +
         std::to_string(model_->numParameters()) + " parameters, " +
         std::to_string(reducer_->numBuckets()) + " gradient bucket" +
         (reducer_->numBuckets() == 1 ? "" : "s") + "), " + std::to_string(pg_.size()) +
         " rank" + (pg_.size() == 1 ? "" : "s") + " x batch " +
         std::to_string(cfg_.batchSize) + ", data " + data_.source + ", " +
         be_->describe());
  if (scaler_.on())
    notice("fp16: dynamic loss scaling from " + std::to_string(scaler_.scale()));
}

// Each epoch: train, evaluate, its record and checkpoint. The last
// evaluation's count (none when no epoch was left to train).
TestCount Run::trainEpochs() {
  runStart_ = lastLine_ = lastProgress_ = Clock::now();
  TestCount test;
  // An epoch resumed part way: its record covers the whole epoch (what the
  // checkpoint says earlier attempts did, and this one), this attempt's share
  // as attempt_* fields.
  bool resumedMidEpoch = pos_.step > 0 && resumed_.known;
  for (; pos_.epoch < cfg_.epochs; ++pos_.epoch, pos_.step = 0, resumedMidEpoch = false) {
    beginEpoch(resumedMidEpoch);
    trainEpoch();
    progress_.finish();
    test = evaluate();
    endEpoch(test, resumedMidEpoch);
  }
  return test;
}

void Run::beginEpoch(bool resumedMidEpoch) {
  epochStart_ = Clock::now();
  epochLossSum_ = resumedMidEpoch ? resumed_.epochLossSum : 0;
  epochLossCount_ = resumedMidEpoch ? resumed_.epochLossCount : 0;
  epochPriorSeconds_ = resumedMidEpoch ? resumed_.epochSeconds : 0;
}

// The epoch's record and line, then its checkpoint.
void Run::endEpoch(const TestCount& test, bool resumedMidEpoch) {
  const auto [correct, total] = test;
  const double attemptSecs = since(epochStart_);
  const double epochSecs = epochPriorSeconds_ + attemptSecs;
  const double acc = total ? static_cast<double>(correct) / static_cast<double>(total) : 0.0;
  nlohmann::json record = {
      {"type", "epoch"}, {"epoch", pos_.epoch},
      {"train_loss", epochLossCount_ > 0 ? epochLossSum_ / epochLossCount_ : NAN},
      {"test_accuracy", accuracyJson(correct, total)}, {"test_correct", correct},
      {"test_total", total},
      {"epoch_seconds", epochSecs}};
  if (resumedMidEpoch) {
    const double n = epochLossCount_ - resumed_.epochLossCount;
    record["attempt_train_loss"] = n > 0 ? (epochLossSum_ - resumed_.epochLossSum) / n : NAN;
    record["attempt_epoch_seconds"] = attemptSecs;
  }
  metrics_.write(record);
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

// The final summary (every rank's; rank 0 also writes --save).
nlohmann::json Run::summary(const TestCount& test) {
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
      {"test_accuracy", accuracyJson(test.correct, test.total)},
      {"test_correct", test.correct}, {"test_total", test.total}, {"final_loss", lastLoss_},
      {"params_sha256", paramsSha256},
      {"device", be_->device() == Device::kCpu ? "cpu" : "cuda"},
      {"device_choice", deviceDecision_.summary},
      {"backend", be_->describe()}, {"precision", precisionName(cfg_.precision)},
      {"layout", be_->device() == Device::kCuda && nhwcLayout(cfg_.layout, cfg_.precision)
                     ? "nhwc" : "nchw"},
      {"gradient_buckets", reducer_->numBuckets()},
      {"peak_rss_mb", peakRssMb()}};
  // breakdown, data_wait_s, comm_hidden_fraction; bench, profile when on.
  observe_->addSummary(j, stepsRun_);
  if (be_->device() != Device::kCpu) {
    const StepGraphPlan::Counts& gc = graphPlan_->counts();
    j["cuda_graph"] = {{"state", graphPlan_->off().empty() ? "on" : graphPlan_->off()},
                       {"captures", gc.captures}, {"replays", gc.replays},
                       {"eager_steps", gc.eager}, {"releases", gc.releases},
                       {"optimizer", !graphPlan_->off().empty() ? "eager (no graph)"
                                     : graphPlan_->optimizerOutside().empty()
                                         ? "in the graph"
                                         : graphPlan_->optimizerOutside()},
                       {"optimizer_captures", optimizerCaptures_}};
    j["peak_device_mb"] = static_cast<double>(be_->peakDeviceBytes()) / (1 << 20);
    j["peak_reserved_mb"] = static_cast<double>(be_->peakReservedBytes()) / (1 << 20);
    if (pg_.size() > 1) j["comm_transport"] = runtime::cudaTransportName(pg_);
  }
  if (data_.skipped) j["skipped_images"] = data_.skipped->load();  // --skip-bad-images
  if (scaler_.on()) {
    j["skipped_steps"] = scaler_.skipped();
    j["loss_scale"] = scaler_.scale();
  }
  return j;
}

// The summary as the metrics' last record.
void Run::writeFinal(const nlohmann::json& j) {
  nlohmann::json fin = j;
  fin["type"] = "final";
  metrics_.write(fin);
  const MetricsWriter::Totals m = metrics_.finish();
  if (m.dropped > 0)
    notice("--metrics " + cfg_.metrics + ": " + std::to_string(m.dropped) + " of " +
           std::to_string(m.records) + " records dropped: its reader did not keep up (training "
           "never waits for it)");
}

}  // namespace run_detail

nlohmann::json runTraining(const TrainConfig& cfg, const DataSplit& data,
                           runtime::ProcessGroup& pg, const TrainerIo& io) {
  run_detail::Run run(cfg, data, pg, io);
  return run.execute();
}

}  // namespace ddprun::train
