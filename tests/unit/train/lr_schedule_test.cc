// Learning-rate schedules (lr_schedule.h): hand-computed values of each kind,
// warm-up per epoch and per iteration, validation and parsing.
// tests/interop/test_transforms_vs_torchvision.py checks every step against
// PyTorch's schedulers.
#include "ddprun/train/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "ddprun/common/error.h"

namespace ddprun::train {
namespace {

LrScheduleSpec spec(LrScheduleKind kind, int64_t epochs, int64_t steps = 1) {
  LrScheduleSpec s;
  s.kind = kind;
  s.epochs = epochs;
  s.stepsPerEpoch = steps;
  return s;
}

std::vector<double> perEpoch(const LrSchedule& l) {
  std::vector<double> v;
  for (int64_t e = 0; e < l.spec().epochs; ++e) v.push_back(l.lrAt(e, 0));
  return v;
}

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "<no error>";
}

TEST(LrSchedule, ConstantIsTheBaseEverywhere) {
  LrScheduleSpec s = spec(LrScheduleKind::kConstant, 3, 4);
  s.baseLr = 0.05;
  const LrSchedule l(s);
  for (int e = 0; e < 5; ++e)
    for (int i = 0; i < 4; ++i) EXPECT_EQ(l.lrAt(e, i), 0.05);
  EXPECT_EQ(l.describe(), "no scheduler (constant lr), base lr 0.050000000000000003, stepped per epoch");
}

TEST(LrSchedule, MultiStepMultipliesOncePerMilestone) {
  LrScheduleSpec s = spec(LrScheduleKind::kMultiStep, 6, 3);
  s.milestones = {2, 4};
  const LrSchedule l(s);
  // The products PyTorch's recursive form computes: 0.1*0.1 is 0.010000000000000002.
  const double d1 = 0.1 * 0.1, d2 = d1 * 0.1;
  EXPECT_EQ(perEpoch(l), (std::vector<double>{0.1, 0.1, d1, d1, d2, d2}));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(l.lrAt(3, i), d1);  // per epoch: every step alike
  EXPECT_EQ(l.describe(), "MultiStepLR(milestones=[2,4], gamma=0.10000000000000001), base lr "
                          "0.10000000000000001, stepped per epoch");
}

TEST(LrSchedule, StepDecaysEveryStepSizeEpochs) {
  LrScheduleSpec s = spec(LrScheduleKind::kStep, 7);
  s.baseLr = 1.0;
  s.stepSize = 3;
  s.gamma = 0.5;
  EXPECT_EQ(perEpoch(LrSchedule(s)), (std::vector<double>{1, 1, 1, 0.5, 0.5, 0.5, 0.25}));
}

TEST(LrSchedule, CosineClosedForm) {
  LrScheduleSpec s = spec(LrScheduleKind::kCosine, 4);
  s.baseLr = 2.0;
  const std::vector<double> v = perEpoch(LrSchedule(s));
  EXPECT_EQ(v[0], 2.0);
  EXPECT_DOUBLE_EQ(v[1], 1.0 + std::cos(std::numbers::pi / 4));
  EXPECT_DOUBLE_EQ(v[2], 1.0);
  EXPECT_DOUBLE_EQ(v[3], 1.0 + std::cos(3 * std::numbers::pi / 4));
  // Past the end the formula goes on (T_max = 4: 0 at epoch 4).
  EXPECT_NEAR(LrSchedule(s).lrAt(4, 0), 0.0, 1e-16);
}

TEST(LrSchedule, CosinePerIterationDecaysEveryStep) {
  LrScheduleSpec s = spec(LrScheduleKind::kCosine, 3, 5);
  s.unit = LrStepUnit::kIteration;
  const LrSchedule l(s);
  double prev = 1e9;
  for (int e = 0; e < 3; ++e)
    for (int i = 0; i < 5; ++i) {
      const double lr = l.lrAt(e, i);
      EXPECT_LT(lr, prev);
      prev = lr;
    }
  EXPECT_DOUBLE_EQ(l.lrAt(1, 2), 0.1 * (1 + std::cos(std::numbers::pi * 7 / 15)) / 2);
  EXPECT_EQ(l.describe(), "CosineAnnealingLR(T_max=15), base lr 0.10000000000000001, stepped per "
                          "iteration");
}

TEST(LrSchedule, WarmupPerEpochThenTheMainScheduleFromItsStart) {
  LrScheduleSpec s = spec(LrScheduleKind::kMultiStep, 8);
  s.baseLr = 1.0;
  s.warmupEpochs = 2;
  s.warmupStartFactor = 0.01;
  s.milestones = {3};  // after the warm-up: epoch 2 + 3 = 5
  const std::vector<double> v = perEpoch(LrSchedule(s));
  EXPECT_DOUBLE_EQ(v[0], 0.01);
  EXPECT_DOUBLE_EQ(v[1], 0.01 + 0.99 * 0.5);
  EXPECT_EQ((std::vector<double>(v.begin() + 2, v.end())),
            (std::vector<double>{1, 1, 1, 0.1, 0.1, 0.1}));
  EXPECT_EQ(LrSchedule(s).describe(),
            "SequentialLR([LinearLR(start_factor=0.01, total_iters=2), MultiStepLR(milestones=[3], "
            "gamma=0.10000000000000001)], milestones=[2]), base lr 1, stepped per epoch");
}

TEST(LrSchedule, WarmupPerIterationRisesEveryStep) {
  LrScheduleSpec s = spec(LrScheduleKind::kCosine, 4, 5);
  s.baseLr = 0.4;
  s.warmupEpochs = 1;
  s.warmupStartFactor = 0.2;
  s.unit = LrStepUnit::kIteration;
  const LrSchedule l(s);
  for (int i = 0; i < 5; ++i) EXPECT_DOUBLE_EQ(l.lrAt(0, i), 0.4 * (0.2 + 0.8 * i / 5));
  EXPECT_EQ(l.lrAt(1, 0), 0.4);  // the cosine's first step (T_max = 15 iterations)
  EXPECT_DOUBLE_EQ(l.lrAt(1, 1), 0.4 * (1 + std::cos(std::numbers::pi / 15)) / 2);
  EXPECT_DOUBLE_EQ(l.lrAt(3, 4), 0.4 * (1 + std::cos(std::numbers::pi * 14 / 15)) / 2);
}

TEST(LrSchedule, ConstantWithWarmupIsLinearLrAlone) {
  LrScheduleSpec s = spec(LrScheduleKind::kConstant, 5);
  s.baseLr = 1.0;
  s.warmupEpochs = 4;
  s.warmupStartFactor = 0.2;
  EXPECT_EQ(perEpoch(LrSchedule(s)), (std::vector<double>{0.2, 0.4, 0.6000000000000001, 0.8, 1.0}));
  EXPECT_EQ(LrSchedule(s).describe(),
            "LinearLR(start_factor=0.20000000000000001, total_iters=4), base lr 1, stepped per epoch");
}

TEST(LrSchedule, PerIterationStepDecaysAtEpochBoundaries) {
  LrScheduleSpec s = spec(LrScheduleKind::kStep, 4, 3);
  s.baseLr = 1;
  s.stepSize = 2;
  s.gamma = 0.5;
  s.unit = LrStepUnit::kIteration;
  const LrSchedule l(s);
  EXPECT_EQ(l.lrAt(1, 2), 1.0);
  EXPECT_EQ(l.lrAt(2, 0), 0.5);
  EXPECT_EQ(l.lrAt(3, 2), 0.5);
}

TEST(LrSchedule, ChecksSayWhatIsWrong) {
  auto check = [](auto edit) {
    LrScheduleSpec s = spec(LrScheduleKind::kMultiStep, 10);
    s.milestones = {3, 6};
    edit(s);
    return checkLrSchedule(s);
  };
  EXPECT_EQ(check([](LrScheduleSpec&) {}), "");
  EXPECT_NE(check([](LrScheduleSpec& s) { s.gamma = 0; }).find("gamma must be in (0, 1]"),
            std::string::npos);
  EXPECT_NE(check([](LrScheduleSpec& s) { s.gamma = 1.5; }).find("gamma"), std::string::npos);
  EXPECT_NE(check([](LrScheduleSpec& s) { s.warmupEpochs = 10; }).find("shorten the warm-up"),
            std::string::npos);
  EXPECT_NE(check([](LrScheduleSpec& s) { s.warmupEpochs = -1; }).find("warm-up"),
            std::string::npos);
  EXPECT_NE(check([](LrScheduleSpec& s) { s.milestones = {}; }).find("--lr-milestones"),
            std::string::npos);
  EXPECT_NE(check([](LrScheduleSpec& s) { s.milestones = {3, 3}; }).find("strictly increasing"),
            std::string::npos);
  // Milestones count after the warm-up: 8 of the 10 - 3 epochs never comes.
  const std::string late = check([](LrScheduleSpec& s) {
    s.warmupEpochs = 3;
    s.milestones = {2, 8};
  });
  EXPECT_NE(late.find("would never apply"), std::string::npos) << late;
  EXPECT_NE(late.find("below 7"), std::string::npos) << late;
  EXPECT_NE(check([](LrScheduleSpec& s) { s.baseLr = -1; }).find("learning rate"),
            std::string::npos);
  EXPECT_NE(check([](LrScheduleSpec& s) { s.baseLr = NAN; }).find("learning rate"),
            std::string::npos);
  EXPECT_NE(check([](LrScheduleSpec& s) { s.stepsPerEpoch = 0; }).find("steps per epoch"),
            std::string::npos);
  EXPECT_NE(check([](LrScheduleSpec& s) { s.epochs = 0; }).find("epochs must be >= 1"),
            std::string::npos);
  EXPECT_NE(check([](LrScheduleSpec& s) {
              s.warmupEpochs = 1;
              s.warmupStartFactor = 0;
            }).find("start factor"),
            std::string::npos);
  EXPECT_NE(check([](LrScheduleSpec& s) { s.kind = LrScheduleKind::kStep; }).find("step size"),
            std::string::npos);
  // Cosine and constant ignore gamma, milestones and the step size.
  EXPECT_EQ(check([](LrScheduleSpec& s) {
              s.kind = LrScheduleKind::kCosine;
              s.gamma = 7;
              s.milestones = {};
            }),
            "");
  LrScheduleSpec bad = spec(LrScheduleKind::kStep, 3);
  EXPECT_NE(errorOf([&] { LrSchedule{bad}; }).find("step size"), std::string::npos);
}

TEST(LrSchedule, LrAtRejectsStepsOutsideTheEpoch) {
  const LrSchedule l(spec(LrScheduleKind::kConstant, 2, 3));
  EXPECT_THROW(l.lrAt(0, 3), InvalidArgument);
  EXPECT_THROW(l.lrAt(-1, 0), InvalidArgument);
  EXPECT_THROW(l.lrAt(0, -1), InvalidArgument);
}

TEST(LrSchedule, ParseNames) {
  for (LrScheduleKind k : {LrScheduleKind::kConstant, LrScheduleKind::kStep,
                           LrScheduleKind::kMultiStep, LrScheduleKind::kCosine})
    EXPECT_EQ(parseLrSchedule(lrScheduleName(k)), k);
  EXPECT_FALSE(parseLrSchedule("linear"));
  EXPECT_EQ(parseLrStepUnit("epoch"), LrStepUnit::kEpoch);
  EXPECT_EQ(parseLrStepUnit("iteration"), LrStepUnit::kIteration);
  EXPECT_EQ(parseLrStepUnit(lrStepUnitName(LrStepUnit::kIteration)), LrStepUnit::kIteration);
  EXPECT_FALSE(parseLrStepUnit("batch"));
}

TEST(LrSchedule, ParseMilestones) {
  EXPECT_EQ(parseMilestones("30,60,80"), (std::vector<int64_t>{30, 60, 80}));
  EXPECT_EQ(parseMilestones("5"), (std::vector<int64_t>{5}));
  for (const char* bad : {"", "30,,60", "30,60,", "a", "30,-5", "0,5", "60,30", "30,30", "3.5",
                          " 30", "99999999999"}) {
    const std::string msg = errorOf([&] { parseMilestones(bad); });
    EXPECT_NE(msg.find("e.g. 30,60,80"), std::string::npos) << bad << ": " << msg;
  }
}

}  // namespace
}  // namespace ddprun::train
