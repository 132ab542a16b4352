// What a training step measures, apart from what it computes: the sampled
// step-time breakdown, the training thread's data wait, --bench-warmup's
// timed window (bench_window.h) and --profile-steps' device profile
// (step_profile.h). Run::step (run.h) calls it at named points of each step;
// the summary takes its fields from it.
//
// On a device the clock reads must bracket finished work: every
// kSampleEvery-th step synchronises the backend after backward (the bucket
// all-reduces already run behind it) and after the optimizer, and the
// breakdown is those steps' times scaled to all steps; the other steps run
// without waiting. The window's and the profile's steps never synchronise
// inside a step: the breakdown samples only the steps outside them.
//
// A step calls, in order: begin, dataTaken, forwardStart, point(kLossStart),
// point(kLossEnd), paramReady (per parameter, during backward),
// prefetchStart, prefetchEnd, backwardEnd, point(kReducerStart),
// point(kReducerEnd), optimizerStart, stepEnd; then, once the step is
// counted, finish and mayReport.
//
// Header only: its functions are the step's few clock reads.
//
// Thread-safety: one training thread. Preconditions: the backend, model and
// reducer outlive it; setRunSteps() before the first step.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_window.h"
#include "ddprun/common/error.h"
#include "ddprun/runtime/reducer.h"
#include "ddprun/train/layers.h"
#include "ddprun/train/models.h"
#include "step_profile.h"

namespace ddprun::train {

// A device backend is synchronised for the step-time breakdown on one step in
// kSampleEvery (the middle one: not the first, which searches algorithms).
inline constexpr int64_t kSampleEvery = 10;

class StepObserver {
 public:
  using Clock = std::chrono::steady_clock;
  using Point = StepProfile::Point;
  struct Options {
    int64_t benchWarmup = 0;     // --bench-warmup (0: no window)
    int64_t profileSteps = 0;    // --profile-steps (0: no profile)
    int64_t samplesPerStep = 0;  // every rank's samples of one step
    int worldSize = 1;
  };

  StepObserver(Backend& backend, Model& model, runtime::Reducer& reducer, Options o)
      : be_(backend), model_(model), reducer_(reducer), o_(o) {
    if (o_.benchWarmup > 0)
      window_ = std::make_unique<BenchWindow>(be_, o_.benchWarmup, o_.samplesPerStep);
  }
  StepObserver(const StepObserver&) = delete;
  StepObserver& operator=(const StepObserver&) = delete;

  // The steps this process trains (known after a resume), `leftInEpoch` of
  // them in the current epoch: the window and the profile must fit them.
  void setRunSteps(int64_t runSteps, int64_t leftInEpoch) {
    runSteps_ = runSteps;
    if (const std::string e =
            benchFlagsProblem(o_.benchWarmup, o_.profileSteps, runSteps, leftInEpoch);
        !e.empty())
      DDPRUN_THROW(InvalidArgument, e);
  }

  // Before the step's data; `stepsRun`: this process's steps before it.
  void begin(int64_t stepsRun, int64_t globalStep) {
    if (window_ && stepsRun == o_.benchWarmup) window_->start();
    profiled_ = o_.profileSteps > 0 && stepsRun >= runSteps_ - o_.profileSteps;
    if (profiled_) profileStepStart();
    device_ = be_.device() != Device::kCpu;
    const bool quiet = windowOpen() || profiled_;
    timed_ = !quiet && (!device_ || globalStep % kSampleEvery == kSampleEvery / 2);
    if (device_ && timed_)
      be_.synchronize();  // the previous step's work is not this one's
    t0_ = Clock::now();
    point(Point::kStepStart);
  }
  // The batch was taken.
  void dataTaken() { dataWait_ += since(t0_); }
  // The buffers are synchronised; the forward starts.
  void forwardStart() {
    point(Point::kDataEnd);
    t1_ = Clock::now();
  }
  void point(Point p) {
    if (profile_) profile_->point(p);
  }
  // Whether this step is profiled (its points record inside the step).
  bool profiled() const { return profiled_; }
  void paramReady(size_t i) {
    if (profile_) profile_->paramReady(i);
  }
  // Around assembling the next batch (while the device runs backward).
  void prefetchStart() { p0_ = Clock::now(); }
  void prefetchEnd() {
    prefetch_ = since(p0_);
    dataWait_ += prefetch_;
  }
  void backwardEnd() {
    if (device_ && timed_) be_.synchronize();
    t2_ = Clock::now();
  }
  // After the reducer (and any rebuild of its buckets).
  void optimizerStart() {
    t3_ = Clock::now();
    point(Point::kOptimizerStart);
  }
  void stepEnd() {
    point(Point::kOptimizerEnd);
    point(Point::kStepEnd);
    if (device_ && timed_) be_.synchronize();
    if (timed_) addTimes(Clock::now());
  }
  // The step is counted: `stepsRun` steps done.
  void finish(int64_t stepsRun) {
    if (window_) window_->countStep();
    if (windowOpen() && stepsRun == runSteps_ - o_.profileSteps) window_->end();
    if (profiled_) profileStepEnd(stepsRun);
  }
  // No progress line (a host read of the loss) inside the timed window or
  // the profile; the interval's samples are reported with the next line.
  bool mayReport(int64_t stepsRun) const {
    return !windowOpen() && !(profiled_ && stepsRun < runSteps_);
  }

  // The final summary's measurements over `stepsRun` steps: breakdown,
  // data_wait_s, comm_hidden_fraction; bench and profile when on.
  void addSummary(nlohmann::json& j, int64_t stepsRun) const {
    j["breakdown"] = {{"data_s", time_.scaled(time_.data, stepsRun)},
                      {"forward_backward_s", time_.scaled(time_.fwdBwd, stepsRun)},
                      {"comm_wait_s", time_.scaled(time_.comm, stepsRun)},
                      {"optimizer_s", time_.scaled(time_.optim, stepsRun)}};
    // Every step's time on the training thread spent on its data (taking
    // the batch, assembling the next), not sampled: what the pipeline costs.
    j["data_wait_s"] = dataWait_;
    j["comm_hidden_fraction"] = commHiddenJson();
    if (window_) j["bench"] = window_->json();
    if (o_.profileSteps > 0) j["profile"] = profileResult_;
  }

 private:
  struct Breakdown {
    double data = 0, fwdBwd = 0, comm = 0, optim = 0;
    double commTotal = 0, commExposed = 0;  // for the hidden fraction
    int64_t timedSteps = 0;                 // steps the four times above cover
    // The sums scaled from the timed steps to `steps`.
    double scaled(double v, int64_t steps) const {
      return timedSteps ? v * static_cast<double>(steps) / static_cast<double>(timedSteps)
                        : 0.0;
    }
  };

  static double since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  }
  static double seconds(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }
  bool windowOpen() const { return window_ && window_->open(); }

  // A timed step's times, ending at t4.
  void addTimes(Clock::time_point t4) {
    ++time_.timedSteps;
    time_.data += seconds(t0_, t1_) + prefetch_;
    time_.fwdBwd += seconds(t1_, t2_) - prefetch_;
    time_.comm += seconds(t2_, t3_);
    time_.optim += seconds(t3_, t4);
    // The hidden fraction too comes from the timed steps: on the others
    // finalize() also waits for backward's own kernels. Ordered on streams (a
    // device), finalize waits for nothing and the host clock says nothing:
    // the profile's GPU timestamps give the fraction instead.
    if (!reducer_.streamOrdered()) {
      const auto& st = reducer_.lastStats();
      const double ct = st.commTime.count();
      time_.commTotal += ct;
      time_.commExposed += ct * (1.0 - st.hiddenFraction());
    }
  }

  // The first profiled step sets the profile up; every profiled step records
  // its bucket layout (the reducer rebuilds it once, after its first
  // iteration).
  void profileStepStart() {
    if (!profile_) {
      std::vector<std::string> names;
      for (size_t i = 0; i < model_.numLayers(); ++i)
        names.push_back(model_.layerName(i));
      profile_ = std::make_unique<StepProfile>(be_, std::move(names));
      model_.setObserver([this](size_t layer, bool backward, bool end) {
        profile_->layer(layer, backward, end);
      });
      if (reducer_.streamOrdered() && o_.worldSize > 1) reducer_.setDeviceTiming(true);
      be_.profilerRange(true);
    }
    profile_->setBuckets(reducer_);
  }

  // After the last profiled step: the tracer's window closes, the marks are
  // read (one wait, outside every timed step) and averaged.
  void profileStepEnd(int64_t stepsRun) {
    if (stepsRun < runSteps_) return;
    be_.synchronize();
    be_.profilerRange(false);
    model_.setObserver(nullptr);
    profileResult_ = profile_->finish();
    profile_.reset();
    // The communication of the last profiled step, from GPU timestamps (ms
    // from its first bucket's readiness).
    if (const auto t = reducer_.deviceTimings()) {
      profileResult_["comm"] = commProfile(*t);
      deviceHidden_ = t->hiddenFraction;
    }
    reducer_.setDeviceTiming(false);
  }

  // The all-reduce's share hidden behind backward: from the profile's GPU
  // timestamps when the reducer is ordered on streams, else from the host
  // clock of the sampled steps; null when nothing was measured.
  nlohmann::json commHiddenJson() const {
    if (reducer_.streamOrdered())
      return deviceHidden_ ? nlohmann::json(*deviceHidden_) : nlohmann::json(nullptr);
    return time_.commTotal > 0 ? nlohmann::json(1.0 - time_.commExposed / time_.commTotal)
                               : nlohmann::json(nullptr);
  }

  Backend& be_;
  Model& model_;
  runtime::Reducer& reducer_;
  const Options o_;
  int64_t runSteps_ = 0;
  std::unique_ptr<BenchWindow> window_;   // --bench-warmup
  std::unique_ptr<StepProfile> profile_;  // --profile-steps, while its steps run
  nlohmann::json profileResult_;
  std::optional<double> deviceHidden_;  // the profile's comm-hidden fraction (GPU clock)
  Breakdown time_;
  double dataWait_ =
      0;  // seconds the training thread spent assembling and taking batches
  // The current step.
  bool device_ = false, timed_ = false, profiled_ = false;
  Clock::time_point t0_, t1_, t2_, t3_, p0_;
  double prefetch_ = 0;
};

}  // namespace ddprun::train
