// Learning-rate schedules equal to PyTorch's (see lr_schedule.h).
#include "ddprun/train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <sstream>

#include "ddprun/common/error.h"

namespace ddprun::train {
namespace {

std::string milestoneList(const std::vector<int64_t>& m, int64_t mult) {
  std::string s;
  for (size_t i = 0; i < m.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(m[i] * mult);
  }
  return s;
}

// gamma applied k times, one multiplication each as PyTorch's recursive
// StepLR/MultiStepLR do (not pow: that rounds differently).
double decayed(double base, double gamma, int64_t k) {
  double lr = base;
  for (int64_t i = 0; i < k; ++i) lr *= gamma;
  return lr;
}

std::string checkMilestones(const LrScheduleSpec& s) {
  if (s.milestones.empty())
    return "--lr-schedule multistep needs milestones (epochs after the warm-up at which the lr "
           "is multiplied by gamma), e.g. --lr-milestones 30,60,80";
  int64_t prev = 0;
  for (int64_t m : s.milestones) {
    if (m <= prev)
      return "lr milestones must be strictly increasing epochs >= 1 (got " +
             milestoneList(s.milestones, 1) + ")";
    prev = m;
  }
  const int64_t mainEpochs = s.epochs - s.warmupEpochs;
  if (prev >= mainEpochs)
    return "lr milestone " + std::to_string(prev) + " would never apply: milestones count the " +
           std::to_string(mainEpochs) + " epochs after the " + std::to_string(s.warmupEpochs) +
           "-epoch warm-up (epochs " + std::to_string(s.epochs) +
           "); give milestones below " + std::to_string(mainEpochs) + " or train longer";
  return "";
}

}  // namespace

std::string checkLrSchedule(const LrScheduleSpec& s) {
  if (!std::isfinite(s.baseLr) || s.baseLr <= 0)
    return "the learning rate must be a finite number > 0 (got " + std::to_string(s.baseLr) + ")";
  if (s.epochs < 1) return "epochs must be >= 1 (got " + std::to_string(s.epochs) + ")";
  if (s.stepsPerEpoch < 1)
    return "steps per epoch must be >= 1 (got " + std::to_string(s.stepsPerEpoch) +
           "): is the training set smaller than one batch?";
  if (s.warmupEpochs < 0 || s.warmupEpochs >= s.epochs)
    return "warm-up epochs must be >= 0 and below the number of epochs (got " +
           std::to_string(s.warmupEpochs) + " of " + std::to_string(s.epochs) +
           "): shorten the warm-up or train longer";
  if (s.warmupEpochs > 0 && !(s.warmupStartFactor > 0 && s.warmupStartFactor <= 1))
    return "the warm-up start factor must be in (0, 1] (got " +
           std::to_string(s.warmupStartFactor) + ")";
  const bool decays = s.kind == LrScheduleKind::kStep || s.kind == LrScheduleKind::kMultiStep;
  if (decays && !(s.gamma > 0 && s.gamma <= 1))
    return "lr gamma must be in (0, 1] (got " + std::to_string(s.gamma) +
           "): the factor the lr is multiplied by at each decay, e.g. 0.1";
  if (s.kind == LrScheduleKind::kStep && s.stepSize < 1)
    return "--lr-schedule step needs a step size >= 1 epoch (got " + std::to_string(s.stepSize) +
           "): the lr is multiplied by gamma every step size epochs";
  if (s.kind == LrScheduleKind::kMultiStep) return checkMilestones(s);
  return "";
}

LrSchedule::LrSchedule(LrScheduleSpec spec) : spec_(std::move(spec)) {
  if (std::string why = checkLrSchedule(spec_); !why.empty()) DDPRUN_THROW(InvalidArgument, why);
  unitSteps_ = spec_.unit == LrStepUnit::kIteration ? spec_.stepsPerEpoch : 1;
  warmup_ = spec_.warmupEpochs * unitSteps_;
}

double LrSchedule::mainLr(int64_t t) const {
  const LrScheduleSpec& s = spec_;
  switch (s.kind) {
    case LrScheduleKind::kConstant:
      return s.baseLr;
    case LrScheduleKind::kStep:
      return decayed(s.baseLr, s.gamma, t / (s.stepSize * unitSteps_));
    case LrScheduleKind::kMultiStep: {
      int64_t passed = 0;
      for (int64_t m : s.milestones) passed += (m * unitSteps_ <= t) ? 1 : 0;
      return decayed(s.baseLr, s.gamma, passed);
    }
    case LrScheduleKind::kCosine: {
      // CosineAnnealingLR._get_closed_form_lr with eta_min = 0, in Python's
      // evaluation order: eta_min + (base - eta_min) * (1 + cos(pi * t / T)) / 2.
      const double tMax = static_cast<double>((s.epochs - s.warmupEpochs) * unitSteps_);
      const double c = std::cos(std::numbers::pi * static_cast<double>(t) / tMax);
      return 0.0 + (s.baseLr - 0.0) * (1 + c) / 2;
    }
  }
  return s.baseLr;
}

double LrSchedule::lrAt(int64_t epoch, int64_t stepInEpoch) const {
  DDPRUN_CHECK(epoch >= 0 && stepInEpoch >= 0 && stepInEpoch < spec_.stepsPerEpoch,
               "lrAt(epoch ", epoch, ", step ", stepInEpoch, "): needs epoch >= 0 and a step in [0, ",
               spec_.stepsPerEpoch, ")");
  const int64_t t = spec_.unit == LrStepUnit::kIteration
                        ? epoch * spec_.stepsPerEpoch + stepInEpoch
                        : epoch;
  const bool constantAfter = spec_.kind == LrScheduleKind::kConstant;
  if (warmup_ > 0 && (t < warmup_ || constantAfter)) {
    // LinearLR._get_closed_form_lr, end_factor 1:
    // base * (start + (end - start) * min(total_iters, t) / total_iters).
    const double s = spec_.warmupStartFactor;
    return spec_.baseLr *
           (s + (1.0 - s) * static_cast<double>(std::min(warmup_, t)) / static_cast<double>(warmup_));
  }
  return mainLr(t - warmup_);
}

std::string LrSchedule::describe() const {
  const LrScheduleSpec& s = spec_;
  std::ostringstream main;
  main.precision(17);
  switch (s.kind) {
    case LrScheduleKind::kConstant: break;
    case LrScheduleKind::kStep:
      main << "StepLR(step_size=" << s.stepSize * unitSteps_ << ", gamma=" << s.gamma << ")";
      break;
    case LrScheduleKind::kMultiStep:
      main << "MultiStepLR(milestones=[" << milestoneList(s.milestones, unitSteps_)
           << "], gamma=" << s.gamma << ")";
      break;
    case LrScheduleKind::kCosine:
      main << "CosineAnnealingLR(T_max=" << (s.epochs - s.warmupEpochs) * unitSteps_ << ")";
      break;
  }
  std::ostringstream out;
  out.precision(17);
  std::ostringstream warm;
  warm.precision(17);
  warm << "LinearLR(start_factor=" << s.warmupStartFactor << ", total_iters=" << warmup_ << ")";
  if (warmup_ == 0) {
    out << (main.str().empty() ? std::string("no scheduler (constant lr)") : main.str());
  } else if (main.str().empty()) {
    out << warm.str();
  } else {
    out << "SequentialLR([" << warm.str() << ", " << main.str() << "], milestones=[" << warmup_
        << "])";
  }
  out << ", base lr " << s.baseLr << ", stepped per " << lrStepUnitName(s.unit);
  return out.str();
}

std::optional<LrScheduleKind> parseLrSchedule(const std::string& name) {
  if (name == "constant") return LrScheduleKind::kConstant;
  if (name == "step") return LrScheduleKind::kStep;
  if (name == "multistep") return LrScheduleKind::kMultiStep;
  if (name == "cosine") return LrScheduleKind::kCosine;
  return std::nullopt;
}

const char* lrScheduleName(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::kConstant: return "constant";
    case LrScheduleKind::kStep: return "step";
    case LrScheduleKind::kMultiStep: return "multistep";
    case LrScheduleKind::kCosine: return "cosine";
  }
  return "?";
}

std::optional<LrStepUnit> parseLrStepUnit(const std::string& name) {
  if (name == "epoch") return LrStepUnit::kEpoch;
  if (name == "iteration" || name == "iter" || name == "step") return LrStepUnit::kIteration;
  return std::nullopt;
}

const char* lrStepUnitName(LrStepUnit unit) {
  return unit == LrStepUnit::kEpoch ? "epoch" : "iteration";
}

std::vector<int64_t> parseMilestones(const std::string& text) {
  const std::string form = "give strictly increasing whole epochs >= 1, comma-separated, e.g. 30,60,80";
  std::vector<int64_t> out;
  std::istringstream in(text);
  std::string part;
  size_t parts = 0;
  while (std::getline(in, part, ',')) {
    ++parts;
    const bool digits = !part.empty() && part.size() <= 9 &&
                        std::all_of(part.begin(), part.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    if (!digits)
      DDPRUN_THROW(InvalidArgument, "lr milestones \"", text, "\": \"", part,
                   "\" is not a whole number: ", form);
    const int64_t m = std::stoll(part);
    if (m < 1 || (!out.empty() && m <= out.back()))
      DDPRUN_THROW(InvalidArgument, "lr milestones \"", text, "\": ", m,
                   (m < 1 ? " is below 1" : " does not increase"), ": ", form);
    out.push_back(m);
  }
  if (out.empty() || text.back() == ',')
    DDPRUN_THROW(InvalidArgument, "lr milestones \"", text, "\": ", parts ? "an empty entry" : "none given",
                 ": ", form);
  return out;
}

}  // namespace ddprun::train
