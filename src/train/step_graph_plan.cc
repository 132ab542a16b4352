// The step graph plan (step_graph_plan.h).
#include "step_graph_plan.h"

namespace ddprun::train {

StepGraphPlan::StepGraphPlan(Options o) : o_(std::move(o)) {
  if (!o_.backendRefusal.empty())
    off_ = o_.backendRefusal;
  else if (o_.worldSize > 1)
    off_ = std::to_string(o_.worldSize) + " ranks: a graph ends before the reducer, and one "
           "of the whole backward would hold its buckets' all-reduces until backward ends; "
           "steps run eagerly";
  if (o_.lossScaling)
    optimOut_ = "fp16's loss scaler: whether a step updates depends on the overflow check the "
                "host reads after backward; the optimizer runs eagerly after the replay";
  else if (o_.commHook)
    optimOut_ = "a communication hook: its compression of the buckets runs after the replay, "
                "before the optimizer; the optimizer runs eagerly";
}

StepGraphPlan::Action StepGraphPlan::next(const StepShape& s, bool profiled) {
  auto eager = [&] {
    ++counts_.eager;
    haveEager_ = !profiled;
    lastEager_ = s;
    return Action::kEager;
  };
  if (!off_.empty()) return eager();
  if (profiled) {
    release();
    return eager();
  }
  if (graph_) {
    if (s == graphShape_) {
      ++counts_.replays;
      haveEager_ = false;
      return Action::kReplay;
    }
    release();
    return eager();
  }
  if (haveEager_ && lastEager_ == s) {
    if (shapeCaptures_ >= o_.maxCaptures) {
      off_ = "captured " + std::to_string(shapeCaptures_) + " times: the step's shape keeps "
             "changing; steps run eagerly from here";
      return eager();
    }
    ++counts_.captures;
    ++shapeCaptures_;
    graphShape_ = s;
    haveEager_ = false;
    return Action::kCapture;
  }
  return eager();
}

void StepGraphPlan::captured(bool ok, const std::string& why) {
  if (ok) {
    graph_ = true;
    return;
  }
  off_ = "a capture failed (" + why + "); steps run eagerly";
  ++counts_.eager;  // the step runs eagerly after all
}

void StepGraphPlan::invalidate() {
  release();
  haveEager_ = false;
  shapeCaptures_ = 0;
}

void StepGraphPlan::release() {
  if (!graph_) return;
  graph_ = false;
  release_ = true;
  ++counts_.releases;
}

bool StepGraphPlan::releaseNow() {
  const bool r = release_;
  release_ = false;
  return r;
}

}  // namespace ddprun::train
