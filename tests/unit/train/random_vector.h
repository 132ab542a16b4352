// Test data for the trainer's tests (CPU and CUDA): n floats drawn uniformly
// from [lo, hi) by a seeded generator, the same on every run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace ddprun::testing {

inline std::vector<float> randomVector(size_t n, uint64_t seed, float lo = -1.0f,
                                       float hi = 1.0f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

}  // namespace ddprun::testing
