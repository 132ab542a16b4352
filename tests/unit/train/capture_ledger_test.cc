// The CUDA graph capture's book of allocator blocks (src/train/cuda/
// capture_ledger.h): which blocks a live graph may use, and so must not be
// handed to other work until it is released. Addresses only, no CUDA.
#include "cuda/capture_ledger.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace ddprun::train::cuda {
namespace {

void* block(int i) { return reinterpret_cast<void*>(static_cast<uintptr_t>(0x1000 * (i + 1))); }

bool has(const std::vector<void*>& v, void* p) { return std::find(v.begin(), v.end(), p) != v.end(); }

TEST(CaptureLedger, BlocksTouchedOrLiveAtTheEndAreTheGraphs) {
  CaptureLedger l;
  l.touched(block(0));  // before any capture: not remembered
  l.begin();
  EXPECT_TRUE(l.capturing());
  l.touched(block(1));  // a workspace taken and given back within the capture
  l.touched(block(1));
  EXPECT_FALSE(l.heldByGraph(block(1))) << "frees during the capture are reused within it";
  const uint64_t id = l.end(true, {block(2)});  // block 2: a layer's buffer, live
  EXPECT_GT(id, 0u);
  EXPECT_FALSE(l.capturing());
  EXPECT_TRUE(l.heldByGraph(block(1)));
  EXPECT_TRUE(l.heldByGraph(block(2)));
  EXPECT_FALSE(l.heldByGraph(block(0))) << "neither touched in the capture nor live at its end";
  EXPECT_FALSE(l.heldByGraph(block(3))) << "eager scratch between replays cycles as before";
  EXPECT_EQ(l.liveGraphs(), 1u);
}

TEST(CaptureLedger, AFailedCaptureIsForgotten) {
  CaptureLedger l;
  l.begin();
  l.touched(block(1));
  EXPECT_EQ(l.end(false, {block(2)}), 0u);
  EXPECT_FALSE(l.heldByGraph(block(1)));
  EXPECT_FALSE(l.heldByGraph(block(2)));
  EXPECT_EQ(l.liveGraphs(), 0u);
}

TEST(CaptureLedger, ReleaseReturnsOnlyBlocksNoOtherGraphKnows) {
  CaptureLedger l;
  l.begin();
  l.touched(block(1));
  const uint64_t a = l.end(true, {block(2)});
  l.begin();
  l.touched(block(3));
  const uint64_t b = l.end(true, {block(2)});  // block 2 live in both
  EXPECT_NE(a, b);
  const std::vector<void*> freedA = l.release(a);
  EXPECT_TRUE(has(freedA, block(1)));
  EXPECT_FALSE(has(freedA, block(2))) << "graph b may still use it";
  EXPECT_TRUE(l.heldByGraph(block(2)));
  EXPECT_FALSE(l.heldByGraph(block(1)));
  const std::vector<void*> freedB = l.release(b);
  EXPECT_TRUE(has(freedB, block(2)));
  EXPECT_TRUE(has(freedB, block(3)));
  EXPECT_EQ(l.liveGraphs(), 0u);
  EXPECT_TRUE(l.release(a).empty()) << "a second release of one id returns nothing";
}

}  // namespace
}  // namespace ddprun::train::cuda
