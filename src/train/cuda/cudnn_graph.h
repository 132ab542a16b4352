// One convolution through cuDNN's graph API: the operation graph of one
// direction (forward, backward-data, backward-filter) built from the
// backend descriptors directly (no cudnn-frontend), the engines cuDNN
// offers for it, and their execution plans.
//
// Why: the legacy API's algorithm search (cudnnFind*) chooses among the
// eight-or-so legacy algorithms; the graph API lists the engines themselves
// (heuristics mode A, then the fallback list), which is the set PyTorch's
// cudnn.benchmark times. On an H200 the legacy search's best for ResNet-18's
// stem backward-filter (3 input channels, NHWC) took 1.70 ms against
// PyTorch's 0.90. conv_search.cc times these plans and applies the same
// accuracy policy as to the legacy algorithms (CudaBackendOptions::graphConv).
//
// The pure parts (strides of a layout, what an engine's numerical notes mean
// for a precision) are free functions tested on the CPU; the rest needs a
// GPU.
//
// Thread-safety: as the layer that owns the objects (one training thread;
// a plan keeps its last variant pack, so execute() is not reentrant).
// Plans hold the graph they were built from (shared), so a plan outlives
// the GraphConv that made it.
#pragma once

#include <cudnn.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../kernel_math.h"
#include "ddprun/train/layers.h"
#include "resources.h"

namespace ddprun::train::cuda {

enum class ConvDirection { kForward, kBackwardData, kBackwardFilter };
const char* directionName(ConvDirection d);

// One convolution problem (cross-correlation, dilation 1, float compute).
struct GraphConvProblem {
  ConvDirection dir = ConvDirection::kForward;
  kmath::ConvGeom g;
  cudnnDataType_t ioType = CUDNN_DATA_FLOAT;  // x, w and y (dx, dw, dy)
  bool nhwc = false;                          // activations NHWC, filter KRSC
};

// Strides of a tensor whose dimensions are in cuDNN's logical order
// [N, C, H, W] (a filter: [K, C, R, S]), stored NCHW (packed, W fastest) or
// NHWC (C fastest).
std::array<int64_t, 4> graphStrides(const std::array<int64_t, 4>& dims, bool nhwc);

// What an engine's numerical notes say about its arithmetic.
struct EngineTraits {
  bool tensorCore = false;         // TF32 on float data
  bool downConvertsInputs = false; // float inputs rounded to 16 bits
  bool reducedReduction = false;   // accumulates in less than float
  bool transform = false;          // FFT or Winograd
  bool nondeterministic = false;   // atomics: not bitwise repeatable
};
EngineTraits traitsOf(const std::vector<cudnnBackendNumericalNote_t>& notes);

// Whether precision p may run an engine with these traits: never one that
// down-converts float inputs or reduces in less than float; in fp32 no
// tensor cores (fp32 stays true fp32, as CUDNN_FMA_MATH in the legacy path);
// deterministic: nothing nondeterministic.
bool engineAllowed(const EngineTraits& t, Precision p, bool deterministic);

// An engine and its knob settings: what a heuristics result names, free of
// any shape, so the same engine can be built for another problem of the
// same layer (the accuracy check's reduced batch).
struct GraphEngine {
  int64_t index = -1;  // CUDNN_ATTR_ENGINE_GLOBAL_INDEX
  std::vector<std::pair<cudnnBackendKnobType_t, int64_t>> knobs;
  std::vector<cudnnBackendNumericalNote_t> notes;
  // CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION: building its plan compiles a
  // kernel (NVRTC, seconds), so a search may leave it out.
  bool runtimeCompiled = false;
  bool operator==(const GraphEngine& o) const { return index == o.index && knobs == o.knobs; }
  // "engine 12 (knobs 3=1 5=0)": for logs and error messages.
  std::string name() const;
};

class GraphConv;

// An executable plan: one engine for one problem.
class GraphPlan {
 public:
  const GraphEngine& engine() const { return engine_; }
  size_t workspace() const { return workspace_; }
  // Forward: (x, w) -> y; backward-data: (w, dy) -> dx; backward-filter:
  // (x, dy) -> dw (the legacy calls' operand order). Overwrites the output
  // (beta 0). `workspace` has at least workspace() bytes. Enqueues on the
  // handle's stream; returns cuDNN's status (not thrown: a search tries
  // plans that may fail).
  cudnnStatus_t execute(cudnnHandle_t h, const void* in1, const void* in2, void* out,
                        void* workspace) const;

 private:
  friend class GraphConv;
  struct Graph;
  GraphPlan(std::shared_ptr<const Graph> g, ConvDirection dir, GraphEngine e, BackendDesc plan,
            size_t ws)
      : graph_(std::move(g)), dir_(dir), engine_(std::move(e)), plan_(std::move(plan)),
        workspace_(ws) {}
  std::shared_ptr<const Graph> graph_;
  ConvDirection dir_;
  GraphEngine engine_;
  BackendDesc plan_;
  size_t workspace_;
  // The last call's variant pack and the pointers it holds (x, w, y, workspace).
  mutable BackendDesc pack_;
  mutable std::array<void*, 4> packFor_{};
};

// The operation graph of one problem.
class GraphConv {
 public:
  // nullptr (with the reason in *why) when cuDNN does not finalize the graph.
  // h may be null: cuDNN builds the graph and runs its heuristics without a
  // device (the CPU tests do), but builds no plan.
  static std::unique_ptr<GraphConv> create(cudnnHandle_t h, const GraphConvProblem& p,
                                           std::string* why);
  const GraphConvProblem& problem() const { return p_; }
  // The engines of heuristics mode A, then those of the fallback list not
  // already named, in cuDNN's order; each with its numerical notes.
  std::vector<GraphEngine> engines() const;
  // The plan of engine e for this problem; nullptr when cuDNN does not
  // finalize it (the engine does not support this problem).
  std::shared_ptr<const GraphPlan> plan(const GraphEngine& e) const;

 private:
  GraphConv(cudnnHandle_t h, GraphConvProblem p, std::shared_ptr<const GraphPlan::Graph> g)
      : h_(h), p_(p), graph_(std::move(g)) {}
  cudnnHandle_t h_;
  GraphConvProblem p_;
  std::shared_ptr<const GraphPlan::Graph> graph_;
};

}  // namespace ddprun::train::cuda
