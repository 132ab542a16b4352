// The step graph plan (src/train/step_graph_plan.h): when a training step is
// captured, replayed or run eagerly, as pure state transitions.
#include "step_graph_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ddprun::train {
namespace {

using Action = StepGraphPlan::Action;
constexpr Action E = Action::kEager, C = Action::kCapture, R = Action::kReplay;

StepGraphPlan::Options on() { return {}; }

std::vector<Action> run(StepGraphPlan& p, const std::vector<StepShape>& steps) {
  std::vector<Action> out;
  for (const StepShape& s : steps) {
    const Action a = p.next(s, false);
    if (a == C) p.captured(true, "");
    out.push_back(a);
  }
  return out;
}

TEST(StepGraphPlan, OffSaysWhyOnce) {
  struct Case {
    StepGraphPlan::Options o;
    std::string says;
  };
  for (const Case& k :
       {Case{{.backendRefusal = "off (DDPRUN_CUDA_GRAPH=1 turns CUDA graphs of the step on)"},
             "DDPRUN_CUDA_GRAPH=1"},
        Case{{.backendRefusal = "the cpu backend runs its steps eagerly"}, "the cpu backend"},
        Case{{.worldSize = 2}, "2 ranks"}}) {
    StepGraphPlan p(k.o);
    EXPECT_NE(p.off().find(k.says), std::string::npos) << p.off();
    EXPECT_EQ(run(p, {{32}, {32}, {32}, {32}}), std::vector<Action>({E, E, E, E}));
    EXPECT_EQ(p.counts().captures, 0);
  }
}

TEST(StepGraphPlan, FirstStepEagerThenCaptureThenReplays) {
  StepGraphPlan p(on());
  EXPECT_TRUE(p.off().empty());
  EXPECT_EQ(run(p, {{32}, {32}, {32}, {32}, {32}}), std::vector<Action>({E, C, R, R, R}));
  EXPECT_TRUE(p.holdsGraph());
  EXPECT_EQ(p.counts().eager, 1);
  EXPECT_EQ(p.counts().captures, 1);
  EXPECT_EQ(p.counts().replays, 3);
  EXPECT_FALSE(p.releaseNow());
}

TEST(StepGraphPlan, AnotherShapeReleasesTheGraphAndRunsEagerly) {
  StepGraphPlan p(on());
  // The epoch's short last batch, then the next epoch's full ones.
  EXPECT_EQ(run(p, {{32}, {32}, {32}, {8}}), std::vector<Action>({E, C, R, E}));
  EXPECT_TRUE(p.releaseNow());
  EXPECT_FALSE(p.releaseNow()) << "said once";
  EXPECT_FALSE(p.holdsGraph());
  EXPECT_EQ(run(p, {{32}, {32}, {32}}), std::vector<Action>({E, C, R}));
  // A new loss scale (fp16's scaler) or bucket layout is another shape too.
  EXPECT_EQ(p.next({32, 2.0f, 0}, false), E);
  EXPECT_TRUE(p.releaseNow());
  EXPECT_EQ(run(p, {{32, 2.0f, 0}, {32, 2.0f, 1}, {32, 2.0f, 1}}),
            std::vector<Action>({C, E, C}));
  EXPECT_EQ(p.counts().releases, 3);
}

TEST(StepGraphPlan, ProfiledStepsRunEagerly) {
  StepGraphPlan p(on());
  run(p, {{32}, {32}, {32}});
  EXPECT_EQ(p.next({32}, true), E);
  EXPECT_TRUE(p.releaseNow());
  // A profiled step is not the warm-up of a capture: the next one is eager.
  EXPECT_EQ(p.next({32}, true), E);
  EXPECT_EQ(run(p, {{32}, {32}, {32}}), std::vector<Action>({E, C, R}));
}

TEST(StepGraphPlan, AFailedCaptureTurnsGraphsOffWithTheReason) {
  StepGraphPlan p(on());
  EXPECT_EQ(p.next({32}, false), E);
  EXPECT_EQ(p.next({32}, false), C);
  p.captured(false, "cudaStreamEndCapture: operation not permitted when stream is capturing");
  EXPECT_NE(p.off().find("a capture failed (cudaStreamEndCapture"), std::string::npos)
      << p.off();
  EXPECT_FALSE(p.holdsGraph());
  EXPECT_EQ(run(p, {{32}, {32}}), std::vector<Action>({E, E}));
  EXPECT_EQ(p.counts().eager, 4);
}

TEST(StepGraphPlan, InvalidateReleasesAndWarmsUpAgain) {
  StepGraphPlan p(on());
  run(p, {{32}, {32}, {32}});
  p.invalidate();  // evaluation ran on the model
  EXPECT_TRUE(p.releaseNow());
  EXPECT_EQ(run(p, {{32}, {32}, {32}}), std::vector<Action>({E, C, R}));
  p.invalidate();
  p.invalidate();
  EXPECT_TRUE(p.releaseNow());
  EXPECT_EQ(p.counts().releases, 2);
}

// Every epoch ends with an evaluation (invalidate): its recapture is not a
// shape that keeps changing, however many epochs run.
TEST(StepGraphPlan, EpochsOfRecapturesKeepGraphsOn) {
  StepGraphPlan p({.maxCaptures = 2});
  for (int epoch = 0; epoch < 20; ++epoch) {
    // A full epoch, then its short last batch, then the evaluation.
    EXPECT_EQ(run(p, {{32}, {32}, {32}, {8}}), std::vector<Action>({E, C, R, E})) << epoch;
    p.invalidate();
    p.releaseNow();
  }
  EXPECT_TRUE(p.off().empty()) << p.off();
  EXPECT_EQ(p.counts().captures, 20);
}

TEST(StepGraphPlan, AShapeThatKeepsChangingStopsCapturing) {
  StepGraphPlan p({.maxCaptures = 2});
  EXPECT_EQ(run(p, {{32}, {32}, {16}, {16}, {32}, {32}}), std::vector<Action>({E, C, E, C, E, E}));
  EXPECT_NE(p.off().find("captured 2 times"), std::string::npos) << p.off();
  EXPECT_EQ(run(p, {{32}, {32}}), std::vector<Action>({E, E}));
}

// Whether a graph holds the optimizer: yes unless fp16's loss scaler (the
// host decides after backward whether the step updates) or a communication
// hook (compression after the replay) keeps it out, each saying why.
TEST(StepGraphPlan, OptimizerInsideUnlessTheHostDecidesBetween) {
  EXPECT_EQ(StepGraphPlan(on()).optimizerOutside(), "");
  const StepGraphPlan scaled({.lossScaling = true});
  EXPECT_NE(scaled.optimizerOutside().find("loss scaler"), std::string::npos)
      << scaled.optimizerOutside();
  const StepGraphPlan hooked({.commHook = true});
  EXPECT_NE(hooked.optimizerOutside().find("communication hook"), std::string::npos)
      << hooked.optimizerOutside();
  // Neither changes when steps are captured and replayed.
  StepGraphPlan p({.lossScaling = true});
  EXPECT_EQ(run(p, {{32}, {32}, {32}}), std::vector<Action>({E, C, R}));
}

}  // namespace
}  // namespace ddprun::train
