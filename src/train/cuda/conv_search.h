// The CUDA backend's convolution algorithm search: for one Conv2d layer
// (conv.cc) and one input shape, which cuDNN algorithm (or graph-API plan)
// each direction runs. The layer caches the result (ConvAlgos) per shape.
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
// Thread-safety: as the layer that owns it (one training thread).
#pragma once

#include <cudnn.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "../kernel_math.h"
#include "context.h"
#include "conv_check.h"
#include "conv_policy.h"
#include "cudnn_graph.h"
#include "ddprun/train/layers.h"

namespace ddprun::train::cuda {

// One layer's algorithms at one input shape: per direction, a legacy
// algorithm or (CudaBackendOptions::graphConv) a graph-API plan; exactly one
// of the pair is set once searched.
struct ConvAlgos {
  std::optional<cudnnConvolutionFwdAlgoPerf_t> fwd;
  std::optional<cudnnConvolutionBwdDataAlgoPerf_t> data;
  std::optional<cudnnConvolutionBwdFilterAlgoPerf_t> filter;
  std::shared_ptr<const GraphPlan> graphFwd, graphData, graphFilter;
};

// The search of one Conv2d layer. It borrows the layer's descriptors: they
// must outlive it, and at each find*() hold the searched shape (x, y of
// type `type`, the filter, the convolution). find*() sets the convolution
// descriptor's math type (the layer sets it again before each call).
class ConvSearch {
 public:
  // `name`: the layer's, for messages; `spec`: its geometry; `type`: the
  // data type of x, w and y in its cuDNN calls (float, bf16 or half).
  ConvSearch(std::shared_ptr<Context> ctx, std::string name, const Conv2dSpec& spec,
             cudnnDataType_t type, cudnnTensorDescriptor_t xDesc, cudnnTensorDescriptor_t yDesc,
             cudnnFilterDescriptor_t wDesc, cudnnConvolutionDescriptor_t conv);
  ConvSearch(const ConvSearch&) = delete;
  ConvSearch& operator=(const ConvSearch&) = delete;

  // Searches what `a` lacks for input shape x: the forward; the
  // backward-filter and, with needData, the backward-data. Throws
  // runtime::CudaError when no legacy algorithm may run.
  // accumulate: the layer adds its backward-data into dx (beta = 1,
  // Layer::backwardAccumulate). cudnnFind times with beta = 0; in fast mode
  // each legacy candidate is then timed again with beta = 1 on operands of
  // the problem's size, and one that refuses beta = 1 or fails is not
  // chosen (issue 44 item 4). The choice is cached per shape: the first
  // backward of a shape decides. Graph-API plans only overwrite (the layer
  // adds through a temporary), so their ranking does not change.
  void findForward(ConvAlgos& a, const Shape& x);
  void findBackward(ConvAlgos& a, const Shape& x, bool needData, bool accumulate = false);

 private:
  // The graph-API search times at most this many engines per problem (the
  // first ones in cuDNN's order; PyTorch's cudnn.benchmark_limit is 10), each
  // over this many runs after a warm-up.
  static constexpr size_t kGraphCandidates = 10;
  static constexpr int kGraphTimedRuns = 3;
  struct GraphScratch;  // conv_search.cc

  // The search's policy for this layer now (call at the search: the
  // workspace cap reads the allocator; see the header's comment).
  Policy policy() const;
  kmath::ConvGeom geometry(const Shape& x) const;
  std::shared_ptr<const GraphPlan> findGraph(ConvDirection dir, const Shape& x,
                                             std::optional<ConvAccuracyCheck>& check);
  std::optional<float> timePlan(const GraphPlan& plan, const GraphScratch& s);
  // Each successful candidate of cudnnFindConvolutionBackwardData timed
  // again with beta = 1 (its time replaced; a refusal or failure marks it
  // failed), as timePlan times graph plans.
  void retimeAccumulating(cudnnConvolutionBwdDataAlgoPerf_t* perfs, int n, const Shape& x);
  template <typename Perf>
  Perf decide(const Perf* perfs, int n, ConvDirection dir, const Shape& x,
              std::optional<ConvAccuracyCheck>& check);
  size_t workspaceOf(cudnnConvolutionFwdAlgo_t a, cudnnMathType_t m);
  size_t workspaceOf(cudnnConvolutionBwdDataAlgo_t a, cudnnMathType_t m);
  size_t workspaceOf(cudnnConvolutionBwdFilterAlgo_t a, cudnnMathType_t m);
  template <typename Perf>
  void logChoice(ConvDirection dir, const Shape& x, const Choice<Perf>& c, const Policy& pol,
                 const std::string& notes) const;
  const std::string& name() const { return name_; }

  std::shared_ptr<Context> ctx_;
  std::string name_;
  Conv2dSpec s_;
  cudnnDataType_t type_;
  cudnnTensorDescriptor_t xDesc_, yDesc_;
  cudnnFilterDescriptor_t wDesc_;
  cudnnConvolutionDescriptor_t conv_;
};

}  // namespace ddprun::train::cuda
