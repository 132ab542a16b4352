// CUDA graphs of training steps (step_graph.h).
#include "step_graph.h"

#include <exception>
#include <utility>

#include "ddprun/runtime/cuda_check.h"

namespace ddprun::train::cuda {

namespace {

std::string cudaText(const char* call, cudaError_t e) {
  return std::string(call) + ": " + runtime::cuda_check::statusName(e);
}

class CudaStepGraph final : public Backend::StepGraph {
 public:
  CudaStepGraph(std::shared_ptr<Context> ctx, cudaGraphExec_t exec, uint64_t blocks)
      : ctx_(std::move(ctx)), exec_(exec), blocks_(blocks) {}
  ~CudaStepGraph() override {
    // The graph's blocks may be handed out again only once no replay of it
    // can still be running: the stream orders that (the allocator's reuse
    // is stream ordered), so no wait is needed here.
    (void)cudaGraphExecDestroy(exec_);
    ctx_->allocator().releaseGraph(blocks_);
  }
  CudaStepGraph(const CudaStepGraph&) = delete;
  CudaStepGraph& operator=(const CudaStepGraph&) = delete;
  void replay() override {
    ctx_->bind();
    DDPRUN_CUDA_OK(cudaGraphLaunch(exec_, ctx_->stream()));
  }

 private:
  std::shared_ptr<Context> ctx_;
  cudaGraphExec_t exec_;
  uint64_t blocks_;
};

}  // namespace

std::string stepGraphRefusal(Context& ctx) {
  if (!ctx.cudaGraph())
    return "off (DDPRUN_CUDA_GRAPH=1 turns CUDA graphs of the step on; opt-in until a GPU run "
           "has measured them)";
  if (ctx.allocator().usesAsyncPool())
    return "DDPRUN_CUDA_ALLOCATOR=async: CUDA graphs run on the caching allocator";
  return "";
}

std::unique_ptr<Backend::StepGraph> captureStepGraph(const std::shared_ptr<Context>& ctx,
                                                     const std::function<void()>& body,
                                                     std::string* why) {
  std::string failure = stepGraphRefusal(*ctx);
  if (!failure.empty()) {
    if (why) *why = failure;
    return nullptr;
  }
  ctx->bind();
  const cudaStream_t s = ctx->stream();
  try {
    ctx->allocator().beginCapture();  // refuses a second live graph
  } catch (const std::exception& e) {
    if (why) *why = e.what();
    return nullptr;
  }
  // Thread-local mode: this thread's calls that a capture forbids (cudaMalloc,
  // a synchronisation) fail instead of running; other threads (the data
  // workers, the process group's) are not affected.
  if (const cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
      e != cudaSuccess) {
    (void)cudaGetLastError();
    ctx->allocator().endCapture(false);
    if (why) *why = cudaText("cudaStreamBeginCapture", e);
    return nullptr;
  }
  ctx->setCapturing(true);
  try {
    body();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  ctx->setCapturing(false);
  cudaGraph_t graph = nullptr;
  if (const cudaError_t e = cudaStreamEndCapture(s, &graph); e != cudaSuccess && failure.empty())
    failure = cudaText("cudaStreamEndCapture", e);
  cudaGraphExec_t exec = nullptr;  // set only where the whole capture succeeded
  if (failure.empty())
    if (const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0); e != cudaSuccess)
      failure = cudaText("cudaGraphInstantiate", e);
  if (graph) (void)cudaGraphDestroy(graph);  // the instance keeps what it needs
  if (!failure.empty()) {
    (void)cudaGetLastError();  // the attempt's error is not the next call's
    ctx->allocator().endCapture(false);
    if (why) *why = failure;
    return nullptr;
  }
  return std::make_unique<CudaStepGraph>(ctx, exec, ctx->allocator().endCapture(true));
}

}  // namespace ddprun::train::cuda
