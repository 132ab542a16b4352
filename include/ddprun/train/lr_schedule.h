// Learning-rate schedules for the bundled trainer, each equal to a PyTorch
// scheduler setup (torch.optim.lr_scheduler), so a recipe ported from a
// PyTorch script trains with the same learning rates:
//
//   kind       without warm-up (W = 0)               with warm-up (W > 0)
//   constant   no scheduler                          LinearLR(s, total_iters=W) alone
//   step       StepLR(step_size, gamma)              SequentialLR([LinearLR(s, total_iters=W),
//   multistep  MultiStepLR(milestones, gamma)                      MAIN], milestones=[W])
//   cosine     CosineAnnealingLR(T_max, eta_min=0)   with MAIN the scheduler on the left
//
// s is warmupStartFactor (end_factor 1). This is torchvision's classification
// reference recipe (references/classification/train.py: LinearLR warm-up
// chained to the main scheduler by SequentialLR, T_max = epochs - W).
//
// Units. Stepped per epoch (LrStepUnit::kEpoch, PyTorch's usual: one
// scheduler.step() after each epoch): the counters above are epochs, W =
// warmupEpochs, T_max = epochs - W, and every step of an epoch uses that
// epoch's lr. Stepped per iteration (kIteration: scheduler.step() after every
// optimizer step): every epoch count is multiplied by stepsPerEpoch (W,
// T_max, step_size, milestones), so the warm-up rises linearly over
// warmupEpochs*stepsPerEpoch iterations and the cosine decays every step.
//
// Note what SequentialLR does (and so do we): the main scheduler starts
// counting at the end of the warm-up. Milestones and step_size count epochs
// after the warm-up: milestones 30,60 with 5 warm-up epochs decay the lr at
// epochs 35 and 65. Without warm-up they are plain epoch numbers.
//
// Exactness: step and multistep multiply by gamma once per milestone passed,
// as PyTorch's recursive form does (the same doubles). The warm-up and the
// cosine use PyTorch's closed forms (_get_closed_form_lr):
//   warm-up  base * (s + (1 - s) * min(W, t) / W)
//   cosine   base * (1 + cos(pi * t / T_max)) / 2
// PyTorch's recursive step() differs from them by floating-point rounding
// only (a relative 1e-15 per step, accumulating); the interop test
// (tests/interop/test_transforms_vs_torchvision.py) states the bounds.
//
// Thread-safety: an LrSchedule is immutable after construction; lrAt may be
// called from any thread. The parse functions are pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::train {

enum class LrScheduleKind { kConstant, kStep, kMultiStep, kCosine };
enum class LrStepUnit { kEpoch, kIteration };

struct LrScheduleSpec {
  double baseLr = 0.1;
  LrScheduleKind kind = LrScheduleKind::kConstant;
  // multistep: strictly increasing epochs >= 1 counted from the end of the
  // warm-up (see above), each before the last epoch (< epochs - warmupEpochs).
  std::vector<int64_t> milestones;
  // step: the period in epochs (>= 1), counted from the end of the warm-up.
  int64_t stepSize = 0;
  double gamma = 0.1;  // step, multistep: in (0, 1]
  int64_t warmupEpochs = 0;        // 0 <= warmupEpochs < epochs
  double warmupStartFactor = 0.01; // LinearLR's start_factor, in (0, 1]
  int64_t epochs = 1;              // >= 1
  int64_t stepsPerEpoch = 1;       // >= 1
  LrStepUnit unit = LrStepUnit::kEpoch;
};

// The problem with `spec`, as a message that says what is wrong and how to
// fix it; empty when the spec is valid.
std::string checkLrSchedule(const LrScheduleSpec& spec);

// A learning-rate schedule (see the table above).
class LrSchedule {
 public:
  // Throws InvalidArgument with checkLrSchedule's message for a bad spec.
  explicit LrSchedule(LrScheduleSpec spec);

  // The lr the optimizer step `stepInEpoch` of epoch `epoch` (both from 0)
  // uses: PyTorch's lr after epoch (kEpoch) or epoch*stepsPerEpoch +
  // stepInEpoch (kIteration) scheduler.step() calls. Epochs past the last
  // continue the formulas. Preconditions: epoch >= 0, 0 <= stepInEpoch <
  // stepsPerEpoch (else InvalidArgument).
  double lrAt(int64_t epoch, int64_t stepInEpoch) const;

  const LrScheduleSpec& spec() const { return spec_; }
  // The equivalent PyTorch code, e.g. "SequentialLR([LinearLR(start_factor=0.01,
  // total_iters=5), CosineAnnealingLR(T_max=85)], milestones=[5]), stepped per epoch".
  std::string describe() const;

 private:
  double mainLr(int64_t t) const;  // the main scheduler after t of its own steps
  LrScheduleSpec spec_;
  int64_t warmup_ = 0;  // W in scheduler steps
  int64_t unitSteps_ = 1;  // scheduler steps per epoch (1 or stepsPerEpoch)
};

// "constant", "step", "multistep", "cosine"; empty otherwise.
std::optional<LrScheduleKind> parseLrSchedule(const std::string& name);
const char* lrScheduleName(LrScheduleKind kind);
// "epoch", "iteration" (also "iter", "step"); empty otherwise.
std::optional<LrStepUnit> parseLrStepUnit(const std::string& name);
const char* lrStepUnitName(LrStepUnit unit);

// "30,60,80": strictly increasing integers >= 1, at least one. Throws
// InvalidArgument saying what is wrong and the accepted form.
std::vector<int64_t> parseMilestones(const std::string& text);

}  // namespace ddprun::train
