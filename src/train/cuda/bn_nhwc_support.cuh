// What the NHWC batch norm kernels (bn_nhwc.cu: the element-wise passes;
// bn_nhwc_sums.cu: the sums) share: the thread mapping's constants and launch
// shapes (the vector loads and stores of V channels: vector_access.cuh).
// Internal to src/train/cuda/; include from those two .cu files only (the
// thread mapping and the memory traffic: bn_nhwc.cu's comment).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "../kernel_math.h"
#include "kernel_support.cuh"
#include "vector_access.cuh"

namespace ddprun::train::cuda::bn_nhwc {

constexpr int kBx = 16;  // channel groups per block
constexpr int kBy = 16;  // rows per block
constexpr int kUnroll = 4;
// The backward sums' float groups are the rows of one loop step.
static_assert(kUnroll == kmath::kBnGradGroup, "a float group is one loop step's rows");
constexpr int kMaxV = 4;
// The element-wise kernels' row blocks (each thread then loops over rows).
constexpr int64_t kMaxRowBlocks = 1024;

// ------------------------------------------------------- dispatch
inline unsigned channelTiles(int64_t c, int v) {
  return static_cast<unsigned>((c / v + kBx - 1) / kBx);
}
inline unsigned rowBlocks(int64_t rows) {
  return static_cast<unsigned>(
      std::min<int64_t>((rows + kBy * kUnroll - 1) / (kBy * kUnroll), kMaxRowBlocks));
}
inline void checkShape(const char* what, int64_t rows, int64_t c) {
  DDPRUN_CHECK(rows >= 0 && c >= 0, what, ": rows (", rows, ") and channels (", c,
               ") must not be negative");
}

}  // namespace ddprun::train::cuda::bn_nhwc
