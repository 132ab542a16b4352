// cuDNN's runtime-fusion patterns, probed (issue 44 item 7): whether cuDNN
// builds each pattern's operation graph, which engines its heuristics name,
// and whether one of them finalizes an execution plan on this device (what
// cudnn-frontend's check_support asks). The patterns are those of NVIDIA's
// ResNet recipes (the cuDNN developer guide's ConvBNfprop, BN finalize and
// DgradDreluBNBwdWeight), over NHWC tensors with float intermediates:
//  - scale_bias_relu_conv_genstats: y = conv(relu(x * scale + bias), w) with
//    the per-channel sum and sum of squares of y (the next batch norm's
//    statistics) in the same kernel;
//  - bn_finalize: from those sums, the batch's mean and inverse standard
//    deviation, the running statistics and the equivalent scale and bias;
//  - dgrad_drelu_dbn_weights: dx = conv_dgrad(dy, w) through the ReLU's mask
//    recomputed from the batch norm's input (x - mean) * invstd * scale +
//    bias, with the batch norm's weight gradients and its backward's
//    equivalent scales.
// Nothing here runs a plan: a probe says what a later change may build on,
// and only where it is measured faster than our kernels.
//
// Thread-safety: none (one thread per handle). Without a handle (no device)
// the graphs and the heuristics are still built: the CPU tests build them.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <string>

#include "../kernel_math.h"
#include "cudnn_graph.h"

namespace ddprun::train::cuda {

enum class FusionPattern { kScaleBiasReluConvGenStats, kBnFinalize, kDgradDreluDbnWeights };
constexpr FusionPattern kFusionPatterns[] = {FusionPattern::kScaleBiasReluConvGenStats,
                                             FusionPattern::kBnFinalize,
                                             FusionPattern::kDgradDreluDbnWeights};
const char* fusionPatternName(FusionPattern p);

struct FusionProblem {
  FusionPattern pattern = FusionPattern::kScaleBiasReluConvGenStats;
  // The convolution: x [n, c, h, w] -> y [n, k, oh, ow] (bn_finalize: its
  // k channels; dgrad_drelu_dbn_weights: the batch norm is on x's c).
  kmath::ConvGeom g;
  cudnnDataType_t ioType = CUDNN_DATA_FLOAT;  // activations and filters
};

struct FusionSupport {
  bool graphBuilt = false;
  std::string graphWhy;   // cuDNN's status when the graph did not build
  int engines = 0;        // what the heuristics named (mode A, then the fallback list)
  bool supported = false; // an engine's plan finalized
  GraphEngine engine;     // the first such engine
  int64_t workspace = 0;  // its plan's workspace, bytes
  std::string planWhy;    // when none finalized: the last plan's status, or why none was tried
};

FusionSupport probeFusion(cudnnHandle_t h, const FusionProblem& p);

}  // namespace ddprun::train::cuda
