// The convolution search's policy, shared by the legacy algorithms and the
// graph-API engines (conv_search.cc runs the searches): which of cuDNN's
// results may run in a precision and mode, the workspace cap, the accuracy
// check's verdicts (conv_check.h), and the choice among what passes. The
// rules themselves are described at the top of conv_search.h.
//
// A search result ("Perf") is cuDNN's cudnnConvolution*AlgoPerf_t, or a
// GraphPerf in the same shape: algo, status, time (ms), memory (bytes),
// determinism, mathType. sumsDirectly(algo) and algoName(algo) exist for
// every algo type.
//
// Thread-safety: pure functions (logChoices reads the environment).
#pragma once

#include <cudnn.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "conv_check.h"
#include "cudnn_graph.h"
#include "ddprun/train/layers.h"

namespace ddprun::train::cuda {

// Of the algorithms that may run, the smallest workspace within this
// fraction of the fastest one's time: cudnnFind's timings vary by about this
// much from run to run, while the workspaces of near-equal algorithms differ
// by up to hundreds of MiB.
inline constexpr double kTimeSlack = 0.03;

// The math type a search asks for: FMA in fp32 (never tensor cores), else
// tensor-op math.
cudnnMathType_t searchMathType(Precision p);

// Algorithms that sum the products directly (implicit/explicit GEMM, direct):
// the only ones fp32 runs in deterministic mode, and the ones it runs
// unchecked in fast mode. FFT and Winograd transforms trade accuracy for
// speed (on an H100 with cuDNN 9.14, the fastest backward-data for LeNet's
// 5x5 conv1 was off by up to 0.9% of the gradient's scale from oneDNN, which
// agrees with a float64 reference; the direct algorithms agree with both).
bool sumsDirectly(cudnnConvolutionFwdAlgo_t a);
bool sumsDirectly(cudnnConvolutionBwdDataAlgo_t a);
bool sumsDirectly(cudnnConvolutionBwdFilterAlgo_t a);

// The names DDPRUN_CONV_LOG and the search's notes print.
const char* algoName(cudnnConvolutionFwdAlgo_t a);
const char* algoName(cudnnConvolutionBwdDataAlgo_t a);
const char* algoName(cudnnConvolutionBwdFilterAlgo_t a);
const char* mathName(cudnnMathType_t m);

// A graph-API engine as a search result, in the legacy results' shape so
// that the same policy (admitted, choosePassing) ranks both: its time is
// ours (cudaEvents around a few runs), its math type and determinism come
// from its numerical notes, and the plan built for the layer's problem
// travels with it.
struct GraphPerf {
  GraphEngine algo;
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  float time = 0.0f;
  size_t memory = 0;
  cudnnDeterminism_t determinism = CUDNN_DETERMINISTIC;
  cudnnMathType_t mathType = CUDNN_FMA_MATH;
  std::shared_ptr<const GraphPlan> plan;
};
inline bool sumsDirectly(const GraphEngine& e) { return !traitsOf(e.notes).transform; }
inline std::string algoName(const GraphEngine& e) { return e.name(); }

// printf-style formatting of one number; bytes in MiB ("%.1f").
std::string format(const char* fmt, double v);
std::string mib(size_t bytes);

// What may run: the precision, and whether only deterministic algorithms.
struct Policy {
  Precision precision;
  bool deterministic;
  size_t workspaceCap;  // the most workspace a candidate may need
  bool fp32() const { return precision == Precision::kFp32; }
};

// Fast mode checks every candidate except fp32's direct sums.
template <typename Algo>
bool needsCheck(Algo a, const Policy& pol) {
  return !pol.deterministic && !(pol.fp32() && sumsDirectly(a));
}

// Whether the policy lets a result of math type m run (never a conversion
// to 16 bits; in fp32 no tensor cores), and the math type it then runs with
// (fp32: FMA, whatever the search labelled it).
inline bool mathAdmitted(cudnnMathType_t m, const Policy& pol) {
  return m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION && !(pol.fp32() && m == CUDNN_TENSOR_OP_MATH);
}
inline cudnnMathType_t runMathType(cudnnMathType_t m, const Policy& pol) {
  return pol.fp32() ? CUDNN_FMA_MATH : m;
}

// cuDNN's successful results that the policy lets run (before any accuracy
// check), fastest first, each with the math type it runs with (fp32: FMA,
// whatever the search labelled it). `notes` (may be null) collects those
// skipped only for the workspace cap.
template <typename Perf>
std::vector<Perf> admitted(const Perf* perfs, int n, const Policy& pol, std::string* notes) {
  std::vector<Perf> out;
  for (int i = 0; i < n; ++i) {
    Perf r = perfs[i];
    if (r.status != CUDNN_STATUS_SUCCESS || !mathAdmitted(r.mathType, pol)) continue;
    if (pol.deterministic &&
        (r.determinism != CUDNN_DETERMINISTIC || (pol.fp32() && !sumsDirectly(r.algo))))
      continue;
    if (r.memory > pol.workspaceCap) {
      if (notes)
        *notes += std::string("; skipped ") + algoName(r.algo) + ": workspace " + mib(r.memory) +
                  " MiB over the " + mib(pol.workspaceCap) + " MiB cap";
      continue;
    }
    r.mathType = runMathType(r.mathType, pol);
    out.push_back(r);
  }
  if (!pol.deterministic)  // deterministic mode keeps the heuristics' order
    std::stable_sort(out.begin(), out.end(),
                     [](const Perf& a, const Perf& b) { return a.time < b.time; });
  return out;
}

// The chosen algorithm and its check's error (kUnchecked: none was needed).
inline constexpr double kUnchecked = -1.0;
template <typename Perf>
struct Choice {
  Perf perf{};
  double error = kUnchecked;
};

// The fastest candidate that passes (needs no check, or its error is within
// the precision's bound), then, among the passing ones within kTimeSlack of
// its time, the one with the smallest workspace. errorOf(perf) runs the
// check; each candidate is checked at most once, and only when reached.
// nullopt: none passes.
template <typename Perf, typename ErrorOf>
std::optional<Choice<Perf>> choosePassing(const std::vector<Perf>& cands, const Policy& pol,
                                          ErrorOf&& errorOf, std::string* notes) {
  const double bound = convErrorBound(pol.precision);
  constexpr double kNotYet = -2.0;
  std::vector<double> err(cands.size(), kNotYet);
  auto passes = [&](size_t i) {
    if (err[i] == kNotYet) {
      err[i] = needsCheck(cands[i].algo, pol) ? errorOf(cands[i]) : kUnchecked;
      if (!(err[i] <= bound) && notes)
        *notes += std::string("; rejected ") + algoName(cands[i].algo) + " (" +
                  mathName(cands[i].mathType) + ", " + format("%.3f", cands[i].time) +
                  " ms): error " + format("%.2e", err[i]) + " > " + format("%.2e", bound);
    }
    return err[i] <= bound;  // false for NaN
  };
  size_t best = cands.size();
  for (size_t i = 0; i < cands.size() && best == cands.size(); ++i)
    if (passes(i)) best = i;
  if (best == cands.size()) return std::nullopt;
  // Deterministic mode ranks by cuDNN's heuristics (no timings): its first
  // admitted candidate, so every process picks the same.
  if (pol.deterministic) return Choice<Perf>{cands[best], err[best]};
  const double limit = static_cast<double>(cands[best].time) * (1.0 + kTimeSlack);
  for (size_t i = best + 1; i < cands.size(); ++i)
    if (cands[i].time <= limit && cands[i].memory < cands[best].memory && passes(i)) best = i;
  return Choice<Perf>{cands[best], err[best]};
}

// DDPRUN_CONV_LOG=1: log each choice (read at each search, which is rare).
bool logChoices();

}  // namespace ddprun::train::cuda
