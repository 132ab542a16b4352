// bn_kernel_bench's plan (src/bench/bn_bench_plan.h): ResNet-18's batch norm
// layers and the bytes each NHWC batch norm kernel moves, without a GPU.
#include "bn_bench_plan.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace ddprun::bench {
namespace {

TEST(BnBenchPlan, ResNet18At224HasTwentyBatchNormsAtTorchvisionSizes) {
  const auto layers = resnet18BnLayers(128, 224);
  EXPECT_EQ(layers.size(), 12u);  // the stem, layer1's two kinds, layer2-4's three each
  int total = 0;
  int64_t perSample = 0;
  std::map<std::string, int64_t> side;
  std::map<BnKind, int> kinds;
  for (const BnLayerGroup& l : layers) {
    EXPECT_EQ(l.n, 128);
    EXPECT_EQ(l.h, l.w);
    total += l.count;
    perSample += l.count * l.h * l.w * l.c;
    kinds[l.kind] += l.count;
    if (side.count(l.where)) {
      EXPECT_EQ(side[l.where], l.h) << l.where;
    }
    side[l.where] = l.h;
  }
  // The kernel trace of a ResNet-18 step launches each batch norm kernel 20 times.
  EXPECT_EQ(total, 20);
  EXPECT_EQ(kinds[BnKind::kBnRelu], 9);     // the stem + 8 blocks' bn1
  EXPECT_EQ(kinds[BnKind::kBnAddRelu], 8);  // 8 blocks' bn2
  EXPECT_EQ(kinds[BnKind::kBn], 3);         // layer2-4's downsample
  EXPECT_EQ(side["stem"], 112);
  EXPECT_EQ(side["layer1"], 56);
  EXPECT_EQ(side["layer2"], 28);
  EXPECT_EQ(side["layer3"], 14);
  EXPECT_EQ(side["layer4"], 7);
  // 64*112^2 + 4*64*56^2 + 5*128*28^2 + 5*256*14^2 + 5*512*7^2 values a sample.
  EXPECT_EQ(perSample, 802816 + 802816 + 501760 + 250880 + 125440);
  EXPECT_EQ(layers.front().rows(), 128 * 112 * 112);
  EXPECT_EQ(layers.front().elements(), int64_t{128} * 112 * 112 * 64);
}

TEST(BnBenchPlan, OddAndSmallImagesFollowTheWindowFormula) {
  // floor((in + 2 pad - kernel) / stride) + 1, as PyTorch's conv and max pool.
  EXPECT_EQ(windowOut(225, 7, 2, 3), 113);
  EXPECT_EQ(windowOut(113, 3, 2, 1), 57);
  EXPECT_EQ(windowOut(57, 3, 2, 1), 29);
  const auto l225 = resnet18BnLayers(2, 225);
  EXPECT_EQ(l225.back().h, 8);  // 113, 57, 57, 29, 15, 8
  const auto l32 = resnet18BnLayers(1, 32);
  EXPECT_EQ(l32.front().h, 16);
  EXPECT_EQ(l32.back().h, 1);
  EXPECT_EQ(l32.back().c, 512);
}

TEST(BnBenchPlan, KernelTrafficFollowsWhatEachKindReadsAndWrites) {
  // stats: x. forward: x, y (+ z). sums: x, dy (+ y for the mask) (+ g
  // written for the residual). data: x, g, dx with the residual, else x, dy
  // (+ y), dx.
  EXPECT_EQ(bnKernelPasses(BnKernel::kStats, BnKind::kBnAddRelu), 1);
  EXPECT_EQ(bnKernelPasses(BnKernel::kForward, BnKind::kBn), 2);
  EXPECT_EQ(bnKernelPasses(BnKernel::kForward, BnKind::kBnRelu), 2);
  EXPECT_EQ(bnKernelPasses(BnKernel::kForward, BnKind::kBnAddRelu), 3);
  EXPECT_EQ(bnKernelPasses(BnKernel::kBackwardSums, BnKind::kBn), 2);
  EXPECT_EQ(bnKernelPasses(BnKernel::kBackwardSums, BnKind::kBnRelu), 3);
  EXPECT_EQ(bnKernelPasses(BnKernel::kBackwardSums, BnKind::kBnAddRelu), 4);
  EXPECT_EQ(bnKernelPasses(BnKernel::kBackwardData, BnKind::kBn), 3);
  EXPECT_EQ(bnKernelPasses(BnKernel::kBackwardData, BnKind::kBnRelu), 4);
  EXPECT_EQ(bnKernelPasses(BnKernel::kBackwardData, BnKind::kBnAddRelu), 3);
  const BnLayerGroup g{"layer1", 2, 3, 3, 8, BnKind::kBnAddRelu, 2};
  EXPECT_DOUBLE_EQ(bnKernelBytes(BnKernel::kBackwardSums, g, 2), 4.0 * 2 * 3 * 3 * 8 * 2);
  EXPECT_DOUBLE_EQ(bnKernelBytes(BnKernel::kStats, g, 4), 1.0 * 2 * 3 * 3 * 8 * 4);
  EXPECT_STREQ(bnKernelName(BnKernel::kBackwardData), "backward_data");
  EXPECT_STREQ(bnKindName(BnKind::kBnAddRelu), "bn_add_relu");
}

}  // namespace
}  // namespace ddprun::bench
