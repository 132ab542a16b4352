// The parts of the graph-API convolution (src/train/cuda/cudnn_graph.h) that
// need no GPU: the strides each layout gives cuDNN, which engines each
// precision may run (from their numerical notes), the engines' names, and
// the operation graphs themselves: cuDNN (9.19) finalizes the descriptors
// and runs its heuristics without a device, so every attribute the graphs
// set is checked here; only plans need the GPU. The graph search itself runs
// in cuda_train_test.cc's ConvFastModeWithinTheCheckBounds (skipped without
// a GPU).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <array>
#include <vector>

#include "cuda/cudnn_fusion.h"
#include "cuda/cudnn_graph.h"

namespace ddprun::train::cuda {
namespace {

TEST(CudnnGraph, StridesOfBothLayouts) {
  // [N, C, H, W] = [2, 3, 5, 7]
  EXPECT_EQ(graphStrides({2, 3, 5, 7}, false), (std::array<int64_t, 4>{105, 35, 7, 1}));
  EXPECT_EQ(graphStrides({2, 3, 5, 7}, true), (std::array<int64_t, 4>{105, 1, 21, 3}));
  // A KRSC filter [K, C, R, S] = [64, 3, 7, 7]: C fastest, then S, then R.
  EXPECT_EQ(graphStrides({64, 3, 7, 7}, true), (std::array<int64_t, 4>{147, 1, 21, 3}));
  // One channel: both layouts address the same elements.
  const auto a = graphStrides({4, 1, 6, 8}, false), b = graphStrides({4, 1, 6, 8}, true);
  for (int64_t n = 0; n < 4; ++n)
    for (int64_t h = 0; h < 6; ++h)
      for (int64_t w = 0; w < 8; ++w)
        EXPECT_EQ(n * a[0] + h * a[2] + w * a[3], n * b[0] + h * b[2] + w * b[3]);
}

TEST(CudnnGraph, NotesDecideWhatEachPrecisionMayRun) {
  const EngineTraits plain = traitsOf({});
  const EngineTraits tensorCore = traitsOf({CUDNN_NUMERICAL_NOTE_TENSOR_CORE});
  const EngineTraits winograd =
      traitsOf({CUDNN_NUMERICAL_NOTE_TENSOR_CORE, CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4});
  const EngineTraits fft = traitsOf({CUDNN_NUMERICAL_NOTE_FFT});
  const EngineTraits atomics = traitsOf({CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC});
  const EngineTraits downConvert = traitsOf({CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS});
  const EngineTraits reduced = traitsOf({CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION});
  EXPECT_TRUE(tensorCore.tensorCore && !tensorCore.transform);
  EXPECT_TRUE(winograd.transform && winograd.tensorCore);
  EXPECT_TRUE(fft.transform && atomics.nondeterministic);
  for (const Precision p : {Precision::kFp32, Precision::kTf32, Precision::kBf16,
                            Precision::kFp16}) {
    const bool fp32 = p == Precision::kFp32;
    EXPECT_TRUE(engineAllowed(plain, p, false)) << precisionName(p);
    EXPECT_EQ(engineAllowed(tensorCore, p, false), !fp32) << precisionName(p);
    EXPECT_TRUE(engineAllowed(fft, p, false)) << precisionName(p);  // the accuracy check decides
    EXPECT_TRUE(engineAllowed(atomics, p, false)) << precisionName(p);
    EXPECT_FALSE(engineAllowed(atomics, p, true)) << precisionName(p);
    EXPECT_FALSE(engineAllowed(downConvert, p, false)) << precisionName(p);
    EXPECT_FALSE(engineAllowed(reduced, p, false)) << precisionName(p);
  }
}

TEST(CudnnGraph, EnginesCompareAndNameByIndexAndKnobs) {
  GraphEngine a;
  a.index = 12;
  EXPECT_EQ(a.name(), "engine 12");
  GraphEngine b = a;
  b.knobs = {{CUDNN_KNOB_TYPE_SPLIT_K_BUF, 4}, {CUDNN_KNOB_TYPE_TILE_SIZE, 1}};
  EXPECT_FALSE(a == b);
  EXPECT_EQ(b.name(), "engine 12 (knobs " + std::to_string(CUDNN_KNOB_TYPE_SPLIT_K_BUF) + "=4 " +
                          std::to_string(CUDNN_KNOB_TYPE_TILE_SIZE) + "=1)");
  GraphEngine c = b;
  c.notes = {CUDNN_NUMERICAL_NOTE_TENSOR_CORE};  // notes describe, they do not identify
  EXPECT_TRUE(b == c);
  EXPECT_STREQ(directionName(ConvDirection::kBackwardFilter), "backward-filter");
}

// ResNet-18's convolution problems at batch 128, in every direction, data
// type and layout: cuDNN accepts each graph (the tensors, the convolution
// descriptor, the operation and the graph all finalize).
TEST(CudnnGraph, GraphsOfResNetProblemsFinalizeInEveryDirectionTypeAndLayout) {
  const kmath::ConvGeom problems[] = {
      kmath::convGeom(128, 3, 224, 224, 64, 7, 2, 3),   // the stem
      kmath::convGeom(128, 64, 56, 56, 64, 3, 1, 1),    // layer1
      kmath::convGeom(128, 64, 56, 56, 128, 3, 2, 1),   // layer2.0.conv1
      kmath::convGeom(128, 64, 56, 56, 128, 1, 2, 0),   // a downsample
      kmath::convGeom(2, 512, 7, 7, 512, 3, 1, 1),      // the check's reduced batch
  };
  // Plans need a device: without one, plan() must refuse (no plan for a
  // device that is not there); with one, the graph search's tests
  // (cuda_train_test.cc) execute the plans, so only the refusal is checked.
  int devices = 0;
  const bool noDevice = cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0;
  (void)cudaGetLastError();
  for (const kmath::ConvGeom& g : problems)
    for (const ConvDirection d : {ConvDirection::kForward, ConvDirection::kBackwardData,
                                  ConvDirection::kBackwardFilter})
      for (const cudnnDataType_t t : {CUDNN_DATA_FLOAT, CUDNN_DATA_BFLOAT16, CUDNN_DATA_HALF})
        for (const bool nhwc : {true, false}) {
          std::string why;
          const auto gc = GraphConv::create(nullptr, {d, g, t, nhwc}, &why);
          const std::string what = std::string(directionName(d)) + " c" + std::to_string(g.c) +
                                   " k" + std::to_string(g.k) + " r" + std::to_string(g.kernel) +
                                   " type " + std::to_string(t) + (nhwc ? " nhwc" : " nchw");
          ASSERT_NE(gc, nullptr) << what << ": " << why;
          EXPECT_EQ(gc->problem().dir, d);
          // Without a device the heuristics may name no engine; whatever they
          // name must carry an index, and no plan is built without a device.
          for (const GraphEngine& e : gc->engines()) {
            EXPECT_GE(e.index, 0) << what;
            if (noDevice) {
              EXPECT_EQ(gc->plan(e), nullptr) << what << ": a plan without a device";
            }
          }
        }
}

// A geometry whose output size does not follow from its input (oh, ow set
// by hand) is refused with cuDNN's reason, not thrown.
TEST(CudnnGraph, InconsistentGeometryIsRefusedWithTheReason) {
  kmath::ConvGeom g = kmath::convGeom(8, 16, 20, 20, 32, 3, 1, 1);
  g.oh = 7;
  std::string why;
  EXPECT_EQ(GraphConv::create(nullptr, {ConvDirection::kForward, g, CUDNN_DATA_FLOAT, true}, &why),
            nullptr);
  EXPECT_NE(why.find("the operation graph did not build: CUDNN_STATUS_"), std::string::npos)
      << why;
}

// The fusion probe's graphs (cudnn_fusion.h) build for ResNet-18's layers
// in every activation type, here without a device too (cuDNN builds graphs
// and runs heuristics without one; no plan is tried then). Which of them a
// device supports is the probe's output on a GPU, not a test's assertion.
TEST(CudnnFusion, EveryPatternsGraphBuildsForResNetLayers) {
  int devices = 0;
  const bool noDevice = cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0;
  (void)cudaGetLastError();
  for (const FusionPattern pat : kFusionPatterns)
    for (const cudnnDataType_t t : {CUDNN_DATA_FLOAT, CUDNN_DATA_BFLOAT16, CUDNN_DATA_HALF})
      for (const int64_t c : {64, 512}) {
        const int64_t side = c == 64 ? 56 : 7;
        const FusionSupport r =
            probeFusion(nullptr, {pat, kmath::convGeom(32, c, side, side, c, 3, 1, 1), t});
        SCOPED_TRACE(std::string(fusionPatternName(pat)) + " type " + std::to_string(t) + " c" +
                     std::to_string(c));
        EXPECT_TRUE(r.graphBuilt) << r.graphWhy;
        EXPECT_FALSE(r.supported) << "no plan is built without a handle";
        if (noDevice) {
          EXPECT_NE(r.planWhy.find("no device"), std::string::npos) << r.planWhy;
        }
      }
}

// A convolution whose output size does not follow from its input is refused
// with cuDNN's status, in both convolution patterns.
TEST(CudnnFusion, AnInconsistentGeometryIsRefusedWithCudnnsStatus) {
  kmath::ConvGeom g = kmath::convGeom(8, 16, 20, 20, 16, 3, 1, 1);
  g.oh = 7;
  for (const FusionPattern pat :
       {FusionPattern::kScaleBiasReluConvGenStats, FusionPattern::kDgradDreluDbnWeights}) {
    const FusionSupport r = probeFusion(nullptr, {pat, g, CUDNN_DATA_FLOAT});
    EXPECT_FALSE(r.graphBuilt) << fusionPatternName(pat);
    EXPECT_NE(r.graphWhy.find("CUDNN_STATUS_"), std::string::npos) << r.graphWhy;
  }
}

}  // namespace
}  // namespace ddprun::train::cuda
