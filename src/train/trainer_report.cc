// What a run tells: progress lines, step records, the progress file (run.h).
#include "run.h"

#include <cmath>
#include <cstdio>

namespace ddprun::train::run_detail {

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

}  // namespace ddprun::train::run_detail
