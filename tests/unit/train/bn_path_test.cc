// The CUDA backend's batch norm path table (src/train/cuda/bn_path.h), on the
// CPU: every combination of its inputs against the table in the header's
// comment, and the names the trainer's start line shows.
#include "cuda/bn_path.h"

#include <gtest/gtest.h>

#include <string>

namespace ddprun::train::cuda {
namespace {

constexpr BnFusedWith kAllFused[] = {BnFusedWith::kNone, BnFusedWith::kRelu,
                                     BnFusedWith::kReluAdd};

// The header's table as data, the first matching row winning (-1: any;
// fused -1: whenever something follows the batch norm).
struct Row {
  int ours, sync, nhwc, fusion, fusable;
  BnKernels kernels;
  int fused;
};
constexpr Row kTable[] = {
    {1, -1, 1, -1, -1, BnKernels::kOursNhwc, -1},
    {0, 1, -1, -1, -1, BnKernels::kOursSync, 0},
    {0, 0, 1, 1, 1, BnKernels::kCudnnNhwcFused, 1},
    {0, 0, 1, -1, -1, BnKernels::kCudnnNhwc, 0},
    {0, 0, 0, -1, -1, BnKernels::kCudnnNchw, 0},
};
BnPath expected(const BnChoice& c) {
  const bool fusable = c.fusedWith != BnFusedWith::kNone;
  auto fits = [](int want, bool have) { return want < 0 || (want == 1) == have; };
  for (const Row& r : kTable)
    if (fits(r.ours, c.ours) && fits(r.sync, c.sync) && fits(r.nhwc, c.nhwc) &&
        fits(r.fusion, c.cudnnFusion) && fits(r.fusable, fusable))
      return {r.kernels, r.fused < 0 ? fusable : r.fused == 1};
  ADD_FAILURE() << "no row of the table fits";
  return {};
}

TEST(BnPath, EveryCombinationFollowsTheTable) {
  int checked = 0;
  for (const bool nhwc : {false, true})
    for (const bool ours : {false, true})
      for (const bool fusion : {false, true})
        for (const bool sync : {false, true})
          for (const BnFusedWith w : kAllFused) {
            if (ours && !nhwc) continue;  // Context: ours only with NHWC
            const BnChoice c{.nhwc = nhwc, .ours = ours, .cudnnFusion = fusion, .sync = sync,
                             .fusedWith = w};
            const BnPath p = chooseBnPath(c);
            EXPECT_EQ(p, expected(c)) << "nhwc " << nhwc << " ours " << ours << " fusion "
                                      << fusion << " sync " << sync;
            // Invariants the layers rely on.
            if (p.fused) {
              EXPECT_NE(w, BnFusedWith::kNone);
            }
            if (sync) {
              EXPECT_NE(p.kernels, BnKernels::kCudnnNhwcFused) << "cuDNN has no SyncBatchNorm";
              EXPECT_NE(p.kernels, BnKernels::kCudnnNhwc);
              EXPECT_NE(p.kernels, BnKernels::kCudnnNchw);
            }
            if (!nhwc) {
              EXPECT_NE(p.kernels, BnKernels::kCudnnNhwc);
            }
            ++checked;
          }
  EXPECT_EQ(checked, 2 * 2 * 2 * 3 + 2 * 2 * 3);  // NCHW without ours, NHWC with both
}

// The trainer's defaults (train: 16-bit activations or ourBatchNorm, NHWC in
// bf16/fp16): every batch norm of ResNet-18 on our fused kernels.
TEST(BnPath, TrainerDefaultsRunOurFusedKernels) {
  for (const BnFusedWith w : {BnFusedWith::kRelu, BnFusedWith::kReluAdd}) {
    const BnPath p = chooseBnPath({.nhwc = true, .ours = true, .fusedWith = w});
    EXPECT_EQ(p.kernels, BnKernels::kOursNhwc);
    EXPECT_TRUE(p.fused);
  }
  EXPECT_FALSE(chooseBnPath({.nhwc = true, .ours = true}).fused);
}

TEST(BnPath, NamesSayWhereTheReluRuns) {
  const auto name = [](BnChoice c) { return bnPathName(chooseBnPath(c), c.fusedWith); };
  EXPECT_EQ(name({.nhwc = true, .ours = true, .fusedWith = BnFusedWith::kReluAdd}),
            "ours-nhwc+add+relu");
  EXPECT_EQ(name({.nhwc = true, .ours = true}), "ours-nhwc");
  EXPECT_EQ(name({.nhwc = true, .cudnnFusion = true, .fusedWith = BnFusedWith::kRelu}),
            "cudnn-nhwc-fused+relu");
  EXPECT_EQ(name({.nhwc = true, .fusedWith = BnFusedWith::kRelu}), "cudnn-nhwc then relu");
  EXPECT_EQ(name({.nhwc = false, .fusedWith = BnFusedWith::kReluAdd}),
            "cudnn-nchw then add+relu");
  EXPECT_EQ(name({.nhwc = true, .sync = true, .fusedWith = BnFusedWith::kRelu}),
            "ours-sync then relu");
}

}  // namespace
}  // namespace ddprun::train::cuda
