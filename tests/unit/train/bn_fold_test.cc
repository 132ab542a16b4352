// The folded launch of the NHWC batch norm's sums (bn_nhwc.h's BnFold;
// bn_nhwc_sums.cu's foldedSumsKernel) emulated on the host from the pieces
// it shares with the device (kernel_math.h): blocks of (channel tile, row
// chunk) arrive in any order, each counts itself in on its tile's counter
// (kmath::bnIsLastArrival), and the tile's last block reduces the tile's
// columns (kmath::bnFoldColumn) over the chunks in the unfolded chunk
// kernel's order (kmath::bnChunkLaneSum, then the lanes' tree). Checked: every
// one of the 2c sums is written once, by the block that arrived last in its
// tile, bit for bit the unfolded reduction's value; each tile has one last
// block; the counters are left zero for the next launch. The device side of
// the same claim (the kernels, folded == unfolded) is cuda_bn_nhwc_test's
// FoldedLaunchesEqualUnfolded, on a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kernel_math.h"

namespace ddprun::train {
namespace {

// The unfolded chunk kernel's value of column j: lanes, then the tree (w =
// 16, 8, 4, 2, 1: lane l += lane l + w).
double chunkKernelSum(const std::vector<double>& ws, int64_t chunks, int64_t n2, int64_t j) {
  double lane[kmath::kBnChunkLanes];
  for (int l = 0; l < kmath::kBnChunkLanes; ++l)
    lane[l] = kmath::bnChunkLaneSum([&](int64_t k) { return ws[k * n2 + j]; }, chunks, l);
  for (int w = kmath::kBnChunkLanes / 2; w > 0; w >>= 1)
    for (int l = 0; l < w; ++l) lane[l] += lane[l + w];
  return lane[0];
}

// Partials of mixed magnitudes and signs, so that the order of the additions
// shows in the last bits.
std::vector<double> partials(int64_t chunks, int64_t n2, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> mant(-1.0, 1.0);
  std::uniform_int_distribution<int> expo(-20, 20);
  std::vector<double> ws(static_cast<size_t>(chunks * n2));
  for (double& v : ws) v = std::ldexp(mant(rng), expo(rng));
  return ws;
}

struct FoldCase {
  int64_t c;
  int v;  // channels a thread: the tile is 16 (bn_nhwc::kBx) x v channels
  int64_t chunks;
};

TEST(BnFold, LastBlockOfEachTileReducesAsTheChunkKernelBitForBit) {
  const FoldCase cases[] = {{3, 1, 1},    {16, 1, 5},  {64, 4, 32},  {64, 4, 33},
                            {100, 2, 98}, {100, 4, 7}, {512, 4, 98}, {256, 2, 512},
                            {1, 1, 512},  {65, 1, 64}};
  unsigned seed = 1;
  for (const FoldCase& k : cases) {
    SCOPED_TRACE("c " + std::to_string(k.c) + " V " + std::to_string(k.v) + " chunks " +
                 std::to_string(k.chunks));
    const int64_t n2 = 2 * k.c, tileCh = 16 * k.v;
    const int64_t tiles = (k.c / k.v + 15) / 16;
    const auto ws = partials(k.chunks, n2, seed++);
    std::vector<unsigned> counters(static_cast<size_t>(tiles), 0);
    std::vector<double> out(static_cast<size_t>(n2), std::nan(""));
    std::vector<int> writes(static_cast<size_t>(n2), 0);
    std::vector<int> lasts(static_cast<size_t>(tiles), 0), arrived(static_cast<size_t>(tiles), 0);
    // The blocks in an arbitrary order of completion.
    std::vector<int64_t> blocks(static_cast<size_t>(tiles * k.chunks));
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), std::mt19937(seed++));
    for (const int64_t b : blocks) {
      const int64_t tile = b % tiles;
      const unsigned before = counters[tile]++;
      ++arrived[tile];
      if (!kmath::bnIsLastArrival(before, static_cast<unsigned>(k.chunks))) continue;
      EXPECT_EQ(arrived[tile], k.chunks) << "tile " << tile << " reduced before all arrived";
      counters[tile] = 0;
      ++lasts[tile];
      for (int64_t q = 0; q < 2 * tileCh; ++q) {
        const int64_t j = kmath::bnFoldColumn(tile * tileCh, tileCh, q, k.c);
        if (j < 0) continue;
        ASSERT_LT(j, n2);
        out[j] = chunkKernelSum(ws, k.chunks, n2, j);
        ++writes[j];
      }
    }
    for (int64_t j = 0; j < n2; ++j) {
      EXPECT_EQ(writes[j], 1) << "sum " << j;
      EXPECT_EQ(out[j], chunkKernelSum(ws, k.chunks, n2, j)) << "sum " << j;
    }
    for (int64_t t = 0; t < tiles; ++t) {
      EXPECT_EQ(lasts[t], 1) << "tile " << t;
      EXPECT_EQ(counters[t], 0u) << "tile " << t;
    }
  }
}

// The order is the chunk kernel's, not a plain left-to-right sum: 1.0 and two
// values each under half an ulp of 1.0 (1e-16; ulp 2.2e-16). Left to right,
// each is rounded away; in lanes 1 and 17 they meet first (the tree's w = 16)
// and their sum, 2e-16, survives when lane 1 joins lane 0 (w = 1).
TEST(BnFold, TheReductionOrderIsLanesThenTree) {
  const int64_t chunks = 64;
  std::vector<double> ws(chunks, 0.0);
  ws[0] = 1.0;
  ws[1] = 1e-16;
  ws[17] = 1e-16;
  double left = 0.0;
  for (const double v : ws) left += v;
  EXPECT_EQ(left, 1.0);
  EXPECT_GT(chunkKernelSum(ws, chunks, 1, 0), 1.0);
  // Chunks 1 and 33 share lane 1: added in turn, as left to right.
  std::vector<double> same(chunks, 0.0);
  same[0] = 1.0;
  same[1] = 1e-16;
  same[33] = 1e-16;
  EXPECT_GT(chunkKernelSum(same, chunks, 1, 0), 1.0);  // 2e-16 in lane 1 first
  same[32] = 1e-16;  // lane 0: 1.0 + 1e-16 rounds away
  same[1] = same[33] = 0.0;
  EXPECT_EQ(chunkKernelSum(same, chunks, 1, 0), 1.0);
}

TEST(BnFold, ColumnsOfATileAreItsChannelsFirstSumsThenSecond) {
  // Tile [32, 48) of c = 40: S1 of channels 32..39 at 32..39, S2 at 72..79; past 39: none.
  EXPECT_EQ(kmath::bnFoldColumn(32, 16, 0, 40), 32);
  EXPECT_EQ(kmath::bnFoldColumn(32, 16, 7, 40), 39);
  EXPECT_EQ(kmath::bnFoldColumn(32, 16, 8, 40), -1);
  EXPECT_EQ(kmath::bnFoldColumn(32, 16, 16, 40), 72);
  EXPECT_EQ(kmath::bnFoldColumn(32, 16, 23, 40), 79);
  EXPECT_EQ(kmath::bnFoldColumn(32, 16, 24, 40), -1);
  EXPECT_FALSE(kmath::bnIsLastArrival(0, 2));
  EXPECT_TRUE(kmath::bnIsLastArrival(1, 2));
  EXPECT_TRUE(kmath::bnIsLastArrival(0, 1));
}

// The parameter gradients the fold's epilogue writes (bn_nchw.cu's kernel
// uses the same function): the first contribution of a step overwrites
// whatever is there, NaN included; a later one adds.
TEST(BnFold, GradAccumulateOverwritesOrAdds) {
  EXPECT_EQ(kmath::bnGradAccumulate(std::nanf(""), 0.1, true), 0.1f);
  EXPECT_EQ(kmath::bnGradAccumulate(2.0f, 0.1, false), 2.0f + 0.1f);
  EXPECT_EQ(kmath::bnGradAccumulate(2.0f, 1e300, true), INFINITY);
}

}  // namespace
}  // namespace ddprun::train
