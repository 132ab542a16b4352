// The CUDA backend's convolution (cuDNN); pooling and batch norm are in
// cudnn_layers.cc.
//
// API choice: cuDNN's legacy ("v7") descriptor API (cudnnConvolutionForward,
// cudnnFindConvolution*Algorithm, cudnnPoolingForward,
// cudnnBatchNormalization*), deprecated in cuDNN 9 but present in 9.19: it
// covers every operation here with a few calls each, and its algorithm
// search is one call per direction whose result we cache per input shape.
// CudaBackendOptions::graphConv searches cuDNN's graph-API engines instead
// (cudnn_graph.h, the backend descriptors, no cudnn-frontend): PyTorch's
// candidate set, under the same policy (conv_policy.h). Opt-in: on an H200
// it gained 2 % in bf16 and 0.7 % in tf32 for 27-68 % more reserved memory
// (docs/benchmarks.md).
//
// Precision: fp32 sets CUDNN_FMA_MATH on every convolution (no tensor cores,
// no TF32, whatever the algorithm: fp32 stays true fp32); tf32, bf16 and fp16
// search with CUDNN_TENSOR_OP_MATH (tensor cores) and use the math type
// cuDNN's search reports for the chosen algorithm.
//
// Algorithms: per direction, once per (data type, N, H, W), cached.
// - Deterministic mode (train --deterministic, or DDPRUN_CUDNN_DETERMINISTIC=1,
//   both mapped onto Context::deterministic()): cuDNN's heuristics
//   (cudnnGet*Algorithm_v7, no timing, so every process of a job, and a
//   process resumed after a crash, picks the same), their first result that
//   cuDNN reports as deterministic (backward-filter/data have
//   non-deterministic atomics algorithms, which are skipped), in fp32 only
//   among those that sum products directly (no FFT or Winograd transforms,
//   whose rounding error is larger, see sumsDirectly()). Results then repeat
//   bitwise, also across processes (seen on an H100: cudnnFind's timings
//   picked another deterministic algorithm in a resumed process, and its
//   weights ended other bits).
// - Fast mode (the default): cudnnFind*, then every algorithm, non-deterministic, Winograd and
//   FFT included, in every precision, except one that fails its accuracy
//   check: the candidate runs on a reduced problem of the layer's geometry
//   and is compared with a float64 reference (conv_check.h); an error above
//   convErrorBound(precision) skips it and the next one is tried (fp32 direct
//   sums are not checked: their error is fp32's). Should nothing pass (a
//   broken reference, say), the deterministic mode's choice runs, with a
//   warning on stderr.
// In fast mode, among the algorithms that may run, the one with the smallest
// workspace whose time is within kTimeSlack (3 %) of the fastest's; in both
// none needing more than the layer's workspace cap: kConvWorkspaceCap (256
// MiB), and in fast mode more where the run has already held that much more
// memory than is in use at the search (the allocator's peak less its use
// now), so that the workspace does not raise the peak. That is the case at
// the end of backward, where most activations are gone: ResNet-18's stem
// backward-filter at batch 128 has a tensor-core algorithm (ALGO_1) that
// needs 496 MiB, which the fixed cap kept out (an H200, cuDNN 9.19: our
// 1.74 ms against PyTorch's 0.90, whose cuDNN takes what is free).
// Deterministic mode keeps the fixed cap, so its choice never depends on the
// allocator's history (a resumed process chooses as the first one did). The
// workspace comes from the caching allocator for each call and goes back as
// soon as the call is enqueued (ScopedDeviceBytes). DDPRUN_CONV_LOG=1 prints each choice on
// stderr: one line per layer, shape and direction (algorithm, math type,
// time, workspace, the check's error and bound, deterministic or not, and
// the candidates rejected).
//
// Gradients: Param::overwriteGrad set means the gradient is logically zero:
// backward writes it (beta = 0 in cudnnConvolutionBackwardFilter/Bias, whose
// output is then not read) and clears the flag; otherwise backward adds to it
// (beta = 1). An empty batch zeroes a flagged gradient.
//
// bf16/fp16 with 16-bit activations (CudaBackendOptions::activations16): x,
// y, dy and dx are 16-bit tensors that cuDNN reads and writes directly; only
// the filter is cast (once per forward) and the weight gradient cast back;
// the bias is added to the 16-bit output by our kernel and its gradient is
// dy's column sums in double. Otherwise, as follows.
// bf16/fp16 (torch.autocast semantics): activations between layers, weights,
// gradients and batch norm stay float; a convolution casts its input and its
// weights to 16 bits (our kernel, into allocator memory; the weights once per
// forward, reused by backward, the input kept from forward to backward, as
// autocast saves the 16-bit input) and runs cuDNN on 16-bit tensors with
// float compute (CUDNN_DATA_FLOAT in the convolution descriptor: cuDNN's
// PSEUDO_HALF / PSEUDO_BFLOAT16 configurations). The legacy API wants x, w
// and y (dx, dw, dy) of one data type (a float output from 16-bit inputs is
// not a supported configuration), so:
//   forward   y16 = conv(x16, w16), then y = float(y16) + bias in one kernel;
//   dW        dw16 = conv_bwd_filter(x16, dy16) with beta = 0, then our kernel
//             adds float(dw16) into the float gradient (or writes it, for
//             overwriteGrad); as in PyTorch, where the 16-bit weight's
//             gradient is 16-bit before the cast back to float accumulates it;
//   dx        dx16 = conv_bwd_data(w16, dy16), cast into the float dx;
//   db        cudnnConvolutionBackwardBias on the float dy.
// Nothing is clamped: in fp16 a value beyond 65504 becomes inf in a cast or
// a cuDNN output, and inf/NaN flows into the float gradients, which is what
// the fp16 loss scaler (Backend::scaleAndCheckFinite) detects.
#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "conv_check.h"
#include "conv_policy.h"
#include "conv_reference.h"
#include "cuda_layers.h"
#include "ddprun/common/error.h"
#include "ddprun/runtime/cuda.h"
#include "elementwise.h"
#include "transpose.h"

namespace ddprun::train::cuda {

namespace {
const float kOne = 1.0f, kZero = 0.0f;
// The graph-API search times at most this many engines per problem (the
// first ones in cuDNN's order; PyTorch's cudnn.benchmark_limit is 10), each
// over this many runs after a warm-up.
constexpr size_t kGraphCandidates = 10;
constexpr int kGraphTimedRuns = 3;

// ------------------------------------------------------------ convolution
class Conv2d final : public Layer {
 public:
  Conv2d(std::shared_ptr<Context> ctx, std::string name, const Conv2dSpec& s)
      : Layer(name), ctx_(std::move(ctx)), s_(s),
        w_(makeDeviceParam(*ctx_, name + ".weight", {s.outC, s.inC, s.kernel, s.kernel})),
        x16_(ctx_), w16_(ctx_), wK_(ctx_) {
    DDPRUN_CHECK(s.inC > 0 && s.outC > 0 && s.kernel > 0 && s.stride > 0 && s.pad >= 0, name,
                 ": invalid convolution (in ", s.inC, ", out ", s.outC, ", kernel ", s.kernel,
                 ", stride ", s.stride, ", pad ", s.pad, ")");
    if (s.bias) b_ = makeDeviceParam(*ctx_, name + ".bias", {s.outC});
    type_ = !ctx_->autocast() ? CUDNN_DATA_FLOAT
                              : (ctx_->bf16() ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF);
    xDesc_ = TensorDesc::create();
    yDesc_ = TensorDesc::create();
    dyDesc_ = TensorDesc::create();
    biasDesc_ = TensorDesc::create();
    wDesc_ = FilterDesc::create();
    conv_ = ConvDesc::create();
    setTensor4d(biasDesc_, 1, s.outC, 1, 1, CUDNN_DATA_FLOAT, ctx_->nhwc());
    // NHWC: the filter in KRSC (filterForCudnn()), as cuDNN's NHWC kernels read it.
    DDPRUN_CUDNN_OK(cudnnSetFilter4dDescriptor(wDesc_, type_,
                                               ctx_->nhwc() ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                               static_cast<int>(s.outC), static_cast<int>(s.inC),
                                               s.kernel, s.kernel));
    // Float compute in every precision (16-bit data: cuDNN's "pseudo" half
    // and bfloat16 configurations, fp32 accumulation).
    DDPRUN_CUDNN_OK(cudnnSetConvolution2dDescriptor(conv_, s.pad, s.pad, s.stride, s.stride, 1, 1,
                                                    CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  }
  Shape outputShape(const Shape& x) const override {
    DDPRUN_CHECK(x.size() == 4 && x[1] == s_.inC && x[2] + 2 * s_.pad >= s_.kernel &&
                     x[3] + 2 * s_.pad >= s_.kernel,
                 name(), " expects [N, ", s_.inC, ", H, W] with H, W + 2*", s_.pad, " >= ",
                 s_.kernel, ", got ", shapeString(x));
    return {x[0], s_.outC, (x[2] + 2 * s_.pad - s_.kernel) / s_.stride + 1,
            (x[3] + 2 * s_.pad - s_.kernel) / s_.stride + 1};
  }
  void forward(const Tensor& x, Tensor& y, bool training) override {
    ctx_->bind();
    checkInput(x);
    y.ensure(outputShape(x.shape()), ctx_->allocator(), ctx_->actType());
    if (x.dim(0) == 0) return;
    setShapes(x.shape(), y.shape());
    Algos& a = algos(x.shape());
    findForward(a, x.shape());
    if (ctx_->autocast()) return forward16(x, y, training, a);
    runForward(x.data(), filterForCudnn(), y.data(), a);
    if (s_.bias)
      DDPRUN_CUDNN_OK(cudnnAddTensor(ctx_->cudnn(), &kOne, biasDesc_, b_.value.data(), &kOne,
                                     yDesc_, y.data()));
  }
  bool backwardReadsOutput() const override { return false; }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override {
    ctx_->bind();
    checkType(dy, y, name().c_str());
    if (dx) dx->ensureLike(x, ctx_->allocator());
    if (x.dim(0) == 0) return zeroFlaggedGrads();
    setShapes(x.shape(), y.shape());
    Algos& a = algos(x.shape());
    findBackward(a, x.shape(), dx != nullptr);
    if (s_.bias && dy.is16()) {  // 16-bit activations (NHWC): dy's column sums in double
      launchColumnSum(dy.raw(), dy.dtype(), b_.grad.data(), dy.numel() / s_.outC, s_.outC,
                      !b_.overwriteGrad, ctx_->stream());
      b_.overwriteGrad = false;
    } else if (s_.bias) {  // from the float dy in every precision
      DDPRUN_CUDNN_OK(cudnnConvolutionBackwardBias(ctx_->cudnn(), &kOne, dyDesc_, dy.data(),
                                                   beta(b_), biasDesc_, b_.grad.data()));
      b_.overwriteGrad = false;
    }
    if (ctx_->autocast()) return backward16(x, dy, dx, a);
    if (ctx_->nhwc()) {  // KRSC from cuDNN, transposed into (or added to) the OIHW gradient
      DeviceArray<float> dwK(ctx_);
      runBackwardFilter(x.data(), dy.data(), dwK.ensure(weightCount()), &kZero, a);
      launchTranspose(dwK.get(), w_.grad.data(), s_.outC, kernelArea(), s_.inC, !w_.overwriteGrad,
                      ctx_->stream());
    } else {
      runBackwardFilter(x.data(), dy.data(), w_.grad.data(), beta(w_), a);
    }
    w_.overwriteGrad = false;
    if (dx) runBackwardData(ctx_->nhwc() ? wK_.get() : w_.value.data(), dy.data(), dx->data(),
                            a);
  }
  std::vector<Param*> params() override {
    if (s_.bias) return {&w_, &b_};
    return {&w_};
  }

 private:
  // Per direction, a legacy algorithm or (CudaBackendOptions::graphConv) a
  // graph-API plan; exactly one of the pair is set once searched.
  struct Algos {
    std::optional<cudnnConvolutionFwdAlgoPerf_t> fwd;
    std::optional<cudnnConvolutionBwdDataAlgoPerf_t> data;
    std::optional<cudnnConvolutionBwdFilterAlgoPerf_t> filter;
    std::shared_ptr<const GraphPlan> graphFwd, graphData, graphFilter;
  };
  size_t weightCount() const { return static_cast<size_t>(w_.value.numel()); }
  // x is float, or of the context's 16-bit activation type.
  void checkInput(const Tensor& x) const {
    DDPRUN_CHECK(!x.is16() || x.dtype() == ctx_->actType(), name(), ": a ",
                 runtime::dtypeName(x.dtype()), " input, but this backend's activations are ",
                 runtime::dtypeName(ctx_->actType()));
  }
  int64_t kernelArea() const { return static_cast<int64_t>(s_.kernel) * s_.kernel; }
  // The filter as cuDNN reads it: the OIHW parameter itself, or (NHWC) its
  // KRSC copy, made here and kept for backward (one transpose per forward:
  // the parameters keep PyTorch's layout for checkpoints and the optimizer).
  const float* filterForCudnn() {
    if (!ctx_->nhwc()) return w_.value.data();
    float* k = wK_.ensure(weightCount());
    launchTranspose(w_.value.data(), k, s_.outC, s_.inC, kernelArea(), false, ctx_->stream());
    return k;
  }
  // Autocast: the filter's 16-bit copy in cuDNN's layout (KRSC with NHWC:
  // cast and transpose in one pass), kept in w16_.
  const void* filter16() {
    void* p = w16_.ensure(weightCount());
    if (ctx_->nhwc())
      launchTransposeTo16(w_.value.data(), p, s_.outC, s_.inC, kernelArea(), ctx_->bf16(),
                          ctx_->stream());
    else
      launchTo16(w_.value.data(), p, weightCount(), ctx_->bf16(), ctx_->stream());
    return p;
  }
  // The blending factor of a gradient's output: 0 writes it (overwriteGrad),
  // 1 adds to it.
  static const float* beta(const Param& p) { return p.overwriteGrad ? &kZero : &kOne; }
  // An empty batch produces no gradient: a gradient due to be overwritten
  // becomes zero (the contract of Param::overwriteGrad), others stay.
  void zeroFlaggedGrads() {
    for (Param* p : params()) {
      if (!p->overwriteGrad) continue;
      DDPRUN_CUDA_OK(cudaMemsetAsync(p->grad.data(), 0, p->grad.bytes(), ctx_->stream()));
      p->overwriteGrad = false;
    }
  }
  void setShapes(const Shape& x, const Shape& y) {
    const bool nhwc = ctx_->nhwc();
    setTensor4d(xDesc_, x[0], x[1], x[2], x[3], type_, nhwc);
    setTensor4d(yDesc_, y[0], y[1], y[2], y[3], type_, nhwc);
    setTensor4d(dyDesc_, y[0], y[1], y[2], y[3], CUDNN_DATA_FLOAT, nhwc);  // the bias gradient's input
  }
  Algos& algos(const Shape& x) { return cache_[{static_cast<int64_t>(type_), x[0], x[2], x[3]}]; }
  // The search's policy for this layer now (call at the search: the
  // workspace cap reads the allocator; see the file's comment).
  Policy policy() const {
    size_t cap = kConvWorkspaceCap;
    if (!ctx_->deterministic()) {
      const AllocatorStats st = ctx_->allocator().stats();
      if (st.peak > st.inUse) cap = std::max(cap, st.peak - st.inUse);
    }
    return {ctx_->precision(), ctx_->deterministic(), cap};
  }
  kmath::ConvGeom geometry(const Shape& x) const {
    return kmath::convGeom(x[0], s_.inC, x[2], x[3], s_.outC, s_.kernel, s_.stride, s_.pad);
  }

  // --------------------------------------------------- the cuDNN calls
  // Each with its own workspace from the allocator, returned once enqueued;
  // the direction's graph plan where the search chose one.
  void runForward(const void* x, const void* w, void* y, const Algos& a) {
    if (a.graphFwd) return runPlan(*a.graphFwd, x, w, y);
    const cudnnConvolutionFwdAlgoPerf_t& f = *a.fwd;
    DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, f.mathType));
    ScopedDeviceBytes ws(*ctx_, f.memory);
    DDPRUN_CUDNN_OK(cudnnConvolutionForward(ctx_->cudnn(), &kOne, xDesc_, x, wDesc_, w, conv_,
                                            f.algo, ws.get(), f.memory, &kZero, yDesc_, y));
  }
  void runBackwardFilter(const void* x, const void* dy, void* dw, const float* beta,
                         const Algos& a) {
    if (a.graphFilter) {
      // Graph plans overwrite (beta 0): only NHWC searches them, and NHWC
      // writes dW into a KRSC temporary first.
      DDPRUN_CHECK(*beta == 0.0f, name(), ": a graph-API backward-filter plan cannot accumulate");
      return runPlan(*a.graphFilter, x, dy, dw);
    }
    const cudnnConvolutionBwdFilterAlgoPerf_t& f = *a.filter;
    DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, f.mathType));
    ScopedDeviceBytes ws(*ctx_, f.memory);
    DDPRUN_CUDNN_OK(cudnnConvolutionBackwardFilter(ctx_->cudnn(), &kOne, xDesc_, x, yDesc_, dy,
                                                   conv_, f.algo, ws.get(), f.memory, beta,
                                                   wDesc_, dw));
  }
  void runBackwardData(const void* w, const void* dy, void* dx, const Algos& a) {
    if (a.graphData) return runPlan(*a.graphData, w, dy, dx);
    const cudnnConvolutionBwdDataAlgoPerf_t& f = *a.data;
    DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, f.mathType));
    ScopedDeviceBytes ws(*ctx_, f.memory);
    DDPRUN_CUDNN_OK(cudnnConvolutionBackwardData(ctx_->cudnn(), &kOne, wDesc_, w, yDesc_, dy,
                                                 conv_, f.algo, ws.get(), f.memory, &kZero,
                                                 xDesc_, dx));
  }
  void runPlan(const GraphPlan& plan, const void* in1, const void* in2, void* out) {
    ScopedDeviceBytes ws(*ctx_, plan.workspace());
    DDPRUN_CUDNN_OK(plan.execute(ctx_->cudnn(), in1, in2, out, ws.get()));
  }

  // ------------------------------------------------ algorithm search
  // Call after setShapes() (the descriptors hold the searched shape).
  void findForward(Algos& a, const Shape& x) {
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
  void findBackward(Algos& a, const Shape& x, bool needData) {
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
  std::shared_ptr<const GraphPlan> findGraph(ConvDirection dir, const Shape& x,
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
  // Operands of a problem's full size for timing plans, in GraphPlan::
  // execute's order, filled with uniform values in [-1, 1), not zeros:
  // matrix units can run faster on zeros than on real data, and on an H200
  // the graph search's times on zeros were up to 40 % under the legacy
  // search's for the same layers while the step gained under 1 %.
  struct GraphScratch {
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
  // The mean time of kGraphTimedRuns runs after a warm-up; nullopt when the
  // plan fails to run.
  std::optional<float> timePlan(const GraphPlan& plan, const GraphScratch& s) {
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

  // The policy applied to cudnnFind's results (see the file's comment); the
  // check is made on first need and kept in `check` for the next direction.
  template <typename Perf>
  Perf decide(const Perf* perfs, int n, ConvDirection dir, const Shape& x,
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
  size_t workspaceOf(cudnnConvolutionFwdAlgo_t a, cudnnMathType_t m) {
    size_t b = 0;
    DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, m));
    return cudnnGetConvolutionForwardWorkspaceSize(ctx_->cudnn(), xDesc_, wDesc_, conv_, yDesc_,
                                                   a, &b) == CUDNN_STATUS_SUCCESS ? b : 0;
  }
  size_t workspaceOf(cudnnConvolutionBwdDataAlgo_t a, cudnnMathType_t m) {
    size_t b = 0;
    DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, m));
    return cudnnGetConvolutionBackwardDataWorkspaceSize(ctx_->cudnn(), wDesc_, yDesc_, conv_,
                                                        xDesc_, a, &b) == CUDNN_STATUS_SUCCESS
               ? b : 0;
  }
  size_t workspaceOf(cudnnConvolutionBwdFilterAlgo_t a, cudnnMathType_t m) {
    size_t b = 0;
    DDPRUN_CUDNN_OK(cudnnSetConvolutionMathType(conv_, m));
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(ctx_->cudnn(), xDesc_, yDesc_, conv_,
                                                          wDesc_, a, &b) == CUDNN_STATUS_SUCCESS
               ? b : 0;
  }
  // One stderr line per layer, shape and direction (DDPRUN_CONV_LOG=1).
  template <typename Perf>
  void logChoice(ConvDirection dir, const Shape& x, const Choice<Perf>& c, const Policy& pol,
                 const std::string& notes) const {
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

  // ------------------------------------------------------- autocast
  // 16-bit x and w (kept for backward: x until then, w until the next
  // forward), 16-bit output cast to float with the bias added. With 16-bit
  // activations x is read and y written as they are (no casts; the bias
  // added in place), and the model keeps x for backward.
  void forward16(const Tensor& x, Tensor& y, bool training, const Algos& a) {
    const void* w16 = filter16();
    const void* x16 = x.is16() ? x.raw()
                               : castTo16(*ctx_, x.data(), static_cast<size_t>(x.numel()), x16_);
    if (y.is16()) {
      runForward(x16, w16, y.raw(), a);
      if (s_.bias)
        launchAddChannelBias(y.raw(), y.dtype(), b_.value.data(), y.numel() / s_.outC, s_.outC,
                             ctx_->stream());
      if (x.is16() || !training)
        releaseInput16();  // the model keeps a 16-bit x; no backward follows evaluation
      else
        x16Of_ = x.data();
      return;
    }
    DeviceArray<uint16_t> y16(ctx_);
    runForward(x16, w16, y16.ensure(static_cast<size_t>(y.numel())), a);
    // The bias by channel: NCHW as [N, C, H*W], NHWC as [N*H*W, C, 1].
    const int64_t hw = y.dim(2) * y.dim(3);
    if (ctx_->nhwc())
      launchFrom16(y16.get(), s_.bias ? b_.value.data() : nullptr, y.data(), y.dim(0) * hw,
                   y.dim(1), 1, ctx_->bf16(), ctx_->stream());
    else
      launchFrom16(y16.get(), s_.bias ? b_.value.data() : nullptr, y.data(), y.dim(0), y.dim(1),
                   hw, ctx_->bf16(), ctx_->stream());
    x16Of_ = x.data();
    if (!training) releaseInput16();  // no backward follows: do not hold the memory
  }
  // dy to 16 bits; dW in 16 bits (cuDNN's legacy API wants dw in x's type)
  // added into, or written over, the float gradient; dx in 16 bits cast
  // into *dx.
  // 16-bit x, dy and dx (16-bit activations) are used as they are.
  void backward16(const Tensor& x, const Tensor& dy, Tensor* dx, const Algos& a) {
    const bool bf16 = ctx_->bf16();
    const void* x16 = x.is16() ? x.raw()
                      : x16Of_ == x.data() && x16_.get()
                          ? x16_.get()
                          : castTo16(*ctx_, x.data(), static_cast<size_t>(x.numel()), x16_);
    const void* w16 = w16_.get() ? w16_.get() : filter16();
    DeviceArray<uint16_t> dy16(ctx_), dw16(ctx_);
    const void* g16 = dy.is16() ? dy.raw()
                                : castTo16(*ctx_, dy.data(), static_cast<size_t>(dy.numel()), dy16);
    runBackwardFilter(x16, g16, dw16.ensure(weightCount()), &kZero, a);
    if (ctx_->nhwc())
      launchTransposeFrom16(dw16.get(), w_.grad.data(), s_.outC, kernelArea(), s_.inC, bf16,
                            !w_.overwriteGrad, ctx_->stream());
    else if (w_.overwriteGrad)
      launchFrom16(dw16.get(), nullptr, w_.grad.data(), static_cast<int64_t>(weightCount()), 1, 1,
                   bf16, ctx_->stream());
    else
      launchAccumulate16(dw16.get(), w_.grad.data(), weightCount(), bf16, ctx_->stream());
    w_.overwriteGrad = false;
    if (dx && dx->is16()) {
      runBackwardData(w16, g16, dx->raw(), a);
    } else if (dx) {
      DeviceArray<uint16_t> dx16(ctx_);
      runBackwardData(w16, g16, dx16.ensure(static_cast<size_t>(x.numel())), a);
      launchFrom16(dx16.get(), nullptr, dx->data(), x.numel(), 1, 1, bf16, ctx_->stream());
    }
    releaseInput16();  // one backward per forward
  }
  void releaseInput16() {
    x16_.reset();
    x16Of_ = nullptr;
  }

  std::shared_ptr<Context> ctx_;
  Conv2dSpec s_;
  Param w_, b_;
  cudnnDataType_t type_;  // of x, w, y in the cuDNN calls: float, or bf16/fp16 (autocast)
  TensorDesc xDesc_, yDesc_, dyDesc_, biasDesc_;
  FilterDesc wDesc_;
  ConvDesc conv_;
  // (data type, N, H, W) -> algorithms
  std::map<std::array<int64_t, 4>, Algos> cache_;
  // Autocast: the 16-bit input of the last training forward (and the float
  // tensor it came from) and weights of the last forward.
  DeviceArray<uint16_t> x16_, w16_;
  const float* x16Of_ = nullptr;
  DeviceArray<float> wK_;  // NHWC: the float filter in KRSC (filterForCudnn)
};
}  // namespace

std::unique_ptr<Layer> makeConv2d(std::shared_ptr<Context> ctx, std::string name,
                                  const Conv2dSpec& spec) {
  return std::make_unique<Conv2d>(std::move(ctx), std::move(name), spec);
}

}  // namespace ddprun::train::cuda
