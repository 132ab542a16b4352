// CUDA graphs of training steps (Backend::capture; the trainer's
// StepGraphPlan decides when, step_graph_plan.h): the context's stream
// captured in thread-local mode around the step's body, the caching
// allocator in capture mode (no cudaMalloc; the graph's blocks held while it
// lives: capture_ledger.h), the graph instantiated once and replayed with
// one cudaGraphLaunch a step.
//
// Thread-safety: as the backend (its training thread). Preconditions: the
// body issues its device work through this context's stream only.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "context.h"
#include "ddprun/train/layers.h"

namespace ddprun::train::cuda {

// "" when ctx's steps may be captured, else why not (the switch,
// CudaBackendOptions::cudaGraph; the async allocator).
std::string stepGraphRefusal(Context& ctx);

// Backend::capture on ctx: the graph, or nullptr with *why (nothing of the
// body's device work ran; the stream, the allocator and the context are as
// before, with any CUDA error of the attempt cleared).
std::unique_ptr<Backend::StepGraph> captureStepGraph(const std::shared_ptr<Context>& ctx,
                                                     const std::function<void()>& body,
                                                     std::string* why);

}  // namespace ddprun::train::cuda
