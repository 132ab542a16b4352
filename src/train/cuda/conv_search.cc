// The convolution algorithm search (conv_search.h).
#include "conv_search.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

#include "conv_reference.h"
#include "ddprun/common/error.h"
#include "ddprun/runtime/cuda.h"

namespace ddprun::train::cuda {

ConvSearch::ConvSearch(std::shared_ptr<Context> ctx, std::string name, const Conv2dSpec& spec,
                       cudnnDataType_t type, cudnnTensorDescriptor_t xDesc,
                       cudnnTensorDescriptor_t yDesc, cudnnFilterDescriptor_t wDesc,
                       cudnnConvolutionDescriptor_t conv)
    : ctx_(std::move(ctx)), name_(std::move(name)), s_(spec), type_(type), xDesc_(xDesc),
      yDesc_(yDesc), wDesc_(wDesc), conv_(conv) {}

// Operands of a problem's full size for timing plans, in GraphPlan::
// execute's order, filled with uniform values in [-1, 1), not zeros:
// matrix units can run faster on zeros than on real data, and on an H200
// the graph search's times on zeros were up to 40 % under the legacy
// search's for the same layers while the step gained under 1 %.
struct ConvSearch::GraphScratch {
  GraphScratch(Context& ctx, const kmath::ConvGeom& g, cudnnDataType_t type, ConvDirection dir)
      : x(ctx, static_cast<size_t>(g.n * g.c * g.h * g.w) * elemSize(type)),
        w(ctx, static_cast<size_t>(g.k * g.c * g.kernel * g.kernel) * elemSize(type)),
        y(ctx, static_cast<size_t>(g.n * g.k * g.oh * g.ow) * elemSize(type)) {
    uint64_t seed = 1;
    for (const auto* b : {&x, &w, &y}) {
      const size_t n = b->bytes() / elemSize(type);
      if (type == CUDNN_DATA_FLOAT)
        launchFillUniform(static_cast<float*>(b->get()), n, seed++, ctx.stream());
      else
        launchFillUniform16(b->get(), n, seed++, type == CUDNN_DATA_BFLOAT16, ctx.stream());
    }
    switch (dir) {
      case ConvDirection::kForward: in1 = x.get(), in2 = w.get(), out = y.get(); break;
      case ConvDirection::kBackwardData: in1 = w.get(), in2 = y.get(), out = x.get(); break;
      case ConvDirection::kBackwardFilter: in1 = x.get(), in2 = y.get(), out = w.get(); break;
    }
  }
  static size_t elemSize(cudnnDataType_t t) { return t == CUDNN_DATA_FLOAT ? 4 : 2; }
  ScopedDeviceBytes x, w, y;
  const void* in1 = nullptr;
  const void* in2 = nullptr;
  void* out = nullptr;
};

// The search's policy for this layer now (call at the search: the
// workspace cap reads the allocator; see the header's comment).
Policy ConvSearch::policy() const {
  size_t cap = kConvWorkspaceCap;
  if (!ctx_->deterministic()) {
    const AllocatorStats st = ctx_->allocator().stats();
    if (st.peak > st.inUse) cap = std::max(cap, st.peak - st.inUse);
  }
  return {ctx_->precision(), ctx_->deterministic(), cap};
}
kmath::ConvGeom ConvSearch::geometry(const Shape& x) const {
  return kmath::convGeom(x[0], s_.inC, x[2], x[3], s_.outC, s_.kernel, s_.stride, s_.pad);
}

// Call after the layer's setShapes() (the descriptors hold the searched shape).
void ConvSearch::findForward(ConvAlgos& a, const Shape& x) {
  if (a.fwd || a.graphFwd) return;
  std::optional<ConvAccuracyCheck> check;
  if (ctx_->graphConv() != CudaBackendOptions::GraphConv::kOff &&
      (a.graphFwd = findGraph(ConvDirection::kForward, x, check)))
    return;
  std::array<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT> perfs{};
  int n = 0;
  DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, searchMathType(ctx_->precision())));
  if (ctx_->deterministic())
    DDPRUN_CUDNN_OK(cudnnGetConvolutionForwardAlgorithm_v7(
        ctx_->cudnn(), xDesc_, wDesc_, conv_, yDesc_, perfs.size(), &n, perfs.data()));
  else
    DDPRUN_CUDNN_OK(cudnnFindConvolutionForwardAlgorithm(ctx_->cudnn(), xDesc_, wDesc_, conv_,
                                                         yDesc_, perfs.size(), &n,
                                                         perfs.data()));
  a.fwd = decide(perfs.data(), n, ConvDirection::kForward, x, check);
}
void ConvSearch::findBackward(ConvAlgos& a, const Shape& x, bool needData, bool accumulate) {
  const cudnnMathType_t m = searchMathType(ctx_->precision());
  std::optional<ConvAccuracyCheck> check;  // shared by both directions
  const bool graph = ctx_->graphConv() != CudaBackendOptions::GraphConv::kOff;
  if (graph && !a.filter && !a.graphFilter)
    a.graphFilter = findGraph(ConvDirection::kBackwardFilter, x, check);
  if (graph && needData && !a.data && !a.graphData)
    a.graphData = findGraph(ConvDirection::kBackwardData, x, check);
  if (!a.filter && !a.graphFilter) {
    std::array<cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT> p{};
    int n = 0;
    DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, m));
    if (ctx_->deterministic())
      DDPRUN_CUDNN_OK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          ctx_->cudnn(), xDesc_, yDesc_, conv_, wDesc_, p.size(), &n, p.data()));
    else
      DDPRUN_CUDNN_OK(cudnnFindConvolutionBackwardFilterAlgorithm(
          ctx_->cudnn(), xDesc_, yDesc_, conv_, wDesc_, p.size(), &n, p.data()));
    a.filter = decide(p.data(), n, ConvDirection::kBackwardFilter, x, check);
  }
  if (needData && !a.data && !a.graphData) {
    std::array<cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT> p{};
    int n = 0;
    DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, m));
    if (ctx_->deterministic())
      DDPRUN_CUDNN_OK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
          ctx_->cudnn(), wDesc_, yDesc_, conv_, xDesc_, p.size(), &n, p.data()));
    else
      DDPRUN_CUDNN_OK(cudnnFindConvolutionBackwardDataAlgorithm(
          ctx_->cudnn(), wDesc_, yDesc_, conv_, xDesc_, p.size(), &n, p.data()));
    if (accumulate && !ctx_->deterministic()) retimeAccumulating(p.data(), n, x);
    a.data = decide(p.data(), n, ConvDirection::kBackwardData, x, check);
  }
}

// The graph-API search (CudaBackendOptions::graphConv): the engines cuDNN
// names for this problem that the precision allows (engineAllowed; kAll
// also those compiled at run time), at most kGraphCandidates of them, each
// built for the problem and timed on scratch operands of uniform values (one warm-up
// run, then the mean of kGraphTimedRuns), then the legacy search's policy
// (admitted, choosePassing: the accuracy check on the reduced problem, the
// smallest workspace within kTimeSlack of the fastest). nullptr: none may
// run (said on stderr), and the caller runs the legacy search.
std::shared_ptr<const GraphPlan> ConvSearch::findGraph(ConvDirection dir, const Shape& x,
                                                       std::optional<ConvAccuracyCheck>& check) {
  const kmath::ConvGeom g = geometry(x);
  const Policy pol = policy();
  const bool compiled = ctx_->graphConv() == CudaBackendOptions::GraphConv::kAll;
  std::string why;
  std::vector<GraphPerf> perfs;
  if (std::unique_ptr<GraphConv> gc =
          GraphConv::create(ctx_->cudnn(), {dir, g, type_, ctx_->nhwc()}, &why)) {
    const std::vector<GraphEngine> engines = gc->engines();
    GraphScratch scratch(*ctx_, g, type_, dir);
    for (const GraphEngine& e : engines) {
      if (perfs.size() >= kGraphCandidates) break;
      const EngineTraits t = traitsOf(e.notes);
      if (!engineAllowed(t, pol.precision, pol.deterministic) ||
          (e.runtimeCompiled && !compiled))
        continue;
      GraphPerf r;
      r.algo = e;
      r.mathType = t.tensorCore ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
      r.determinism = t.nondeterministic ? CUDNN_NON_DETERMINISTIC : CUDNN_DETERMINISTIC;
      if (!(r.plan = gc->plan(e))) continue;
      r.memory = r.plan->workspace();
      if (r.memory <= pol.workspaceCap) {  // admitted() notes the others
        const std::optional<float> ms = timePlan(*r.plan, scratch);
        if (ms) r.time = *ms;
        else r.status = CUDNN_STATUS_EXECUTION_FAILED;
      }
      perfs.push_back(std::move(r));
    }
    why = std::to_string(engines.size()) + " engines named, " + std::to_string(perfs.size()) +
          " allowed and built";
  }
  auto errorOf = [&](const GraphPerf& r) {
    if (!check) check.emplace(ctx_, g, type_, wDesc_, conv_);
    return check->error(dir, r.algo);
  };
  std::string notes;
  std::optional<Choice<GraphPerf>> c;
  if (!perfs.empty())
    c = choosePassing(admitted(perfs.data(), static_cast<int>(perfs.size()), pol, &notes), pol,
                      errorOf, &notes);
  if (!c) {
    std::fprintf(stderr,
                 "ddprun conv: warning: %s %s %s: no cuDNN graph-API engine may run (%s%s); "
                 "the legacy API's search runs\n",
                 name().c_str(), directionName(dir), shapeString(x).c_str(), why.c_str(),
                 notes.c_str());
    return nullptr;
  }
  if (logChoices()) logChoice(dir, x, *c, pol, notes);
  return c->perf.plan;
}
// The mean time of kGraphTimedRuns runs after a warm-up; nullopt when the
// plan fails to run.
std::optional<float> ConvSearch::timePlan(const GraphPlan& plan, const GraphScratch& s) {
  ScopedDeviceBytes ws(*ctx_, plan.workspace());
  const cudaStream_t st = ctx_->stream();
  if (plan.execute(ctx_->cudnn(), s.in1, s.in2, s.out, ws.get()) != CUDNN_STATUS_SUCCESS)
    return std::nullopt;
  const Event start = Event::createTiming(), stop = Event::createTiming();
  start.record(st);
  for (int i = 0; i < kGraphTimedRuns; ++i)
    if (plan.execute(ctx_->cudnn(), s.in1, s.in2, s.out, ws.get()) != CUDNN_STATUS_SUCCESS)
      return std::nullopt;
  stop.record(st);
  stop.synchronize();
  float ms = 0.0f;
  DDPRUN_CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
  return ms / kGraphTimedRuns;
}

void ConvSearch::retimeAccumulating(cudnnConvolutionBwdDataAlgoPerf_t* perfs, int n,
                                    const Shape& x) {
  const Policy pol = policy();
  GraphScratch s(*ctx_, geometry(x), type_, ConvDirection::kBackwardData);
  const cudaStream_t st = ctx_->stream();
  for (int i = 0; i < n; ++i) {
    cudnnConvolutionBwdDataAlgoPerf_t& p = perfs[i];
    // Only what admitted() lets run, under the math type it will run with.
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > pol.workspaceCap ||
        !mathAdmitted(p.mathType, pol))
      continue;
    DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, runMathType(p.mathType, pol)));
    ScopedDeviceBytes ws(*ctx_, p.memory);
    auto run = [&] {
      return cudnnConvolutionBackwardData(ctx_->cudnn(), &kCudnnOne, wDesc_, s.in1, yDesc_,
                                          s.in2, conv_, p.algo, ws.get(), p.memory, &kCudnnOne,
                                          xDesc_, s.out);
    };
    cudnnStatus_t status = run();  // warm-up; a refusal of beta = 1 shows here
    const Event start = Event::createTiming(), stop = Event::createTiming();
    start.record(st);
    for (int r = 0; r < kGraphTimedRuns && status == CUDNN_STATUS_SUCCESS; ++r) status = run();
    stop.record(st);
    stop.synchronize();
    if (status != CUDNN_STATUS_SUCCESS) {
      p.status = status;
      continue;
    }
    float ms = 0.0f;
    DDPRUN_CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    p.time = ms / kGraphTimedRuns;
  }
}

// The policy applied to cudnnFind's results (see the header's comment); the
// check is made on first need and kept in `check` for the next direction.
template <typename Perf>
Perf ConvSearch::decide(const Perf* perfs, int n, ConvDirection dir, const Shape& x,
                        std::optional<ConvAccuracyCheck>& check) {
  const Policy pol = policy();
  auto errorOf = [&](const Perf& r) {
    if (!check) check.emplace(ctx_, geometry(x), type_, wDesc_, conv_);
    return check->error(r.algo, r.mathType);
  };
  std::string notes;
  std::optional<Choice<Perf>> c = choosePassing(admitted(perfs, n, pol, &notes), pol, errorOf,
                                                &notes);
  bool fellBack = false;
  if (!c && !pol.deterministic) {
    const Policy safe{pol.precision, true, pol.workspaceCap};
    c = choosePassing(admitted(perfs, n, safe, nullptr), safe, errorOf, nullptr);
    fellBack = c.has_value();
  }
  if (!c)
    DDPRUN_THROW(runtime::CudaError, name(), ": cuDNN found no ", directionName(dir),
                 " algorithm for input ", shapeString(x), " that may run (",
                 pol.deterministic ? "deterministic" : "fast", " mode, precision ",
                 precisionName(pol.precision), ", at most ", pol.workspaceCap >> 20,
                 " MiB of workspace, ", n, " candidates", notes, ")");
  c->perf.memory = std::max(c->perf.memory, workspaceOf(c->perf.algo, c->perf.mathType));
  if (fellBack)
    std::fprintf(stderr,
                 "ddprun conv: warning: %s %s: no algorithm passed the accuracy check%s; "
                 "running the deterministic mode's choice %s\n",
                 name().c_str(), directionName(dir), notes.c_str(), algoName(c->perf.algo));
  if (logChoices()) logChoice(dir, x, *c, pol, notes);
  return c->perf;
}
size_t ConvSearch::workspaceOf(cudnnConvolutionFwdAlgo_t a, cudnnMathType_t m) {
  size_t b = 0;
  DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, m));
  return cudnnGetConvolutionForwardWorkspaceSize(ctx_->cudnn(), xDesc_, wDesc_, conv_, yDesc_,
                                                 a, &b) == CUDNN_STATUS_SUCCESS ? b : 0;
}
size_t ConvSearch::workspaceOf(cudnnConvolutionBwdDataAlgo_t a, cudnnMathType_t m) {
  size_t b = 0;
  DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, m));
  return cudnnGetConvolutionBackwardDataWorkspaceSize(ctx_->cudnn(), wDesc_, yDesc_, conv_,
                                                      xDesc_, a, &b) == CUDNN_STATUS_SUCCESS
             ? b : 0;
}
size_t ConvSearch::workspaceOf(cudnnConvolutionBwdFilterAlgo_t a, cudnnMathType_t m) {
  size_t b = 0;
  DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, m));
  return cudnnGetConvolutionBackwardFilterWorkspaceSize(ctx_->cudnn(), xDesc_, yDesc_, conv_,
                                                        wDesc_, a, &b) == CUDNN_STATUS_SUCCESS
             ? b : 0;
}
// One stderr line per layer, shape and direction (DDPRUN_CONV_LOG=1).
template <typename Perf>
void ConvSearch::logChoice(ConvDirection dir, const Shape& x, const Choice<Perf>& c,
                           const Policy& pol, const std::string& notes) const {
  std::string check;
  if (c.error != kUnchecked)
    check = format("%.2e", c.error) + " (bound " + format("%.2e", convErrorBound(pol.precision)) +
            ")";
  else
    check = pol.deterministic ? "none (deterministic mode)" : "none (direct sum)";
  std::fprintf(stderr,
               "ddprun conv: %s %s %s x %s: %s, math %s, %.3f ms, workspace %s MiB, check %s, "
               "deterministic %s%s\n",
               name().c_str(), directionName(dir), precisionName(pol.precision),
               shapeString(x).c_str(), std::string(algoName(c.perf.algo)).c_str(),
               mathName(c.perf.mathType),
               static_cast<double>(c.perf.time), mib(c.perf.memory).c_str(), check.c_str(),
               c.perf.determinism == CUDNN_DETERMINISTIC ? "yes" : "no", notes.c_str());
}

}  // namespace ddprun::train::cuda
