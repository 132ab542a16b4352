// When a training step runs as a CUDA graph replay (issue 44 item 6): the
// trainer's decision, step by step, as pure state transitions (no CUDA):
// tested on the CPU (tests/unit/train/step_graph_plan_test.cc).
//
// What a graph holds: the step's forward, its loss (on the labels staged in
// the backend's fixed slot), its backward and, where nothing between them
// needs the host (optimizerOutside()), the optimizer, reading the step's
// learning rate from a device slot staged before each replay
// (Optimizer::stageStep). The reducer's readiness calls are replayed on the
// host after each replay, in the captured order: with one rank and no hook
// they issue no device work. The optimizer stays eager under fp16's loss
// scaler (whether the step runs depends on the overflow check the host reads)
// and with a communication hook (its compression runs after the replay). The
// graph ends before the reducer, so with several ranks the run stays eager:
// a graph of the whole backward would hold every bucket's all-reduce until
// backward ends, losing the overlap that hides it.
//
// The rules, per step (next()):
//  - off for the whole run (off() says why): the backend cannot capture
//    (the CPU; on CUDA the switch, DDPRUN_CUDA_GRAPH, is off, or the async
//    allocator runs), several ranks, a capture failed, or too many captures
//    between two invalidations (the step's shape keeps changing; the
//    recapture after each epoch's evaluation does not count);
//  - eager: the first step of a shape (it searches the convolution
//    algorithms and allocates; a capture may not), a profiled step (its
//    points record inside the step), or a step whose shape differs from the
//    graph's (batch size, loss scale, bucket layout): the graph is released;
//  - capture: a step with the shape of the eager step just before it and no
//    graph (the capture does not run the work: the trainer replays it at once);
//  - replay: a step with the graph's shape.
// invalidate() releases the graph when anything else ran on the model
// (evaluation, a checkpoint load): its buffers may have moved.
//
// Thread-safety: none (the trainer's thread).
#pragma once

#include <cstdint>
#include <string>

namespace ddprun::train {

// What a step's graph depends on.
struct StepShape {
  int64_t batch = 0;           // this rank's samples in the step
  float lossScale = 1.0f;      // baked into the loss gradient (fp16's scaler)
  uint64_t layoutVersion = 0;  // the reducer's buckets (the gradients' addresses)
  bool operator==(const StepShape&) const = default;
};

class StepGraphPlan {
 public:
  struct Options {
    // Backend::captureRefusal(): "" when the backend can capture, else why
    // not (the CPU; CUDA: the switch, the async allocator).
    std::string backendRefusal = {};
    int worldSize = 1;
    int maxCaptures = 8;
    // What keeps the optimizer out of a graph (optimizerOutside()).
    bool lossScaling = false;  // fp16's dynamic loss scaler
    bool commHook = false;     // a communication hook on the gradient buckets
  };
  enum class Action { kEager, kCapture, kReplay };
  struct Counts {
    int64_t eager = 0, captures = 0, replays = 0, releases = 0;
  };

  explicit StepGraphPlan(Options o);
  // The next step's action. A kEager step may first release the graph
  // (releaseNow()).
  Action next(const StepShape& s, bool profiled);
  // After a kCapture: whether a graph came of it (false: why; graphs are
  // off for the rest of the run, and the step runs eagerly).
  void captured(bool ok, const std::string& why);
  // Something else ran on the model: the graph (if any) is released.
  void invalidate();
  // Whether the trainer must release its graph now (set by next() and
  // invalidate(); cleared by the call).
  bool releaseNow();
  bool holdsGraph() const { return graph_; }
  // Why graphs are off for this run ("" while they may run).
  const std::string& off() const { return off_; }
  // Why a graph would not hold the optimizer ("" when it does): fp16's loss
  // scaler or a communication hook. The trainer also leaves it out of a
  // capture made while the reducer's bucket rebuild is pending (the layout
  // the optimizer's launch records would change after the step).
  const std::string& optimizerOutside() const { return optimOut_; }
  const Counts& counts() const { return counts_; }

 private:
  void release();
  Options o_;
  std::string off_, optimOut_;
  bool graph_ = false;
  bool release_ = false;
  StepShape graphShape_;
  int shapeCaptures_ = 0;   // captures since the last invalidate(): the limit's
  bool haveEager_ = false;  // the step before ran eagerly with lastEager_
  StepShape lastEager_;
  Counts counts_;
};

}  // namespace ddprun::train
