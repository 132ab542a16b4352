#include "ddprun/runtime/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "ddprun/common/error.h"

namespace ddprun::runtime {
namespace {

using Mode = SamplerOptions::Mode;
using Indices = std::vector<int64_t>;

SamplerOptions opts(int64_t n, int r, int rank, bool shuffle, bool dropLast,
                    Mode mode = Mode::kPadded, uint64_t seed = 0) {
  SamplerOptions o;
  o.datasetSize = n;
  o.numReplicas = r;
  o.rank = rank;
  o.shuffle = shuffle;
  o.seed = seed;
  o.dropLast = dropLast;
  o.mode = mode;
  return o;
}

// torch/utils/data/distributed.py, statement by statement (the shuffled
// order comes from our generator instead of torch.randperm).
Indices pytorchReference(int64_t n, int r, int rank, bool shuffle, bool dropLast, uint64_t seed,
                         int64_t epoch) {
  int64_t numSamples;
  if (dropLast && n % r != 0)
    numSamples = static_cast<int64_t>(std::ceil(static_cast<double>(n - r) / r));
  else
    numSamples = static_cast<int64_t>(std::ceil(static_cast<double>(n) / r));
  const int64_t totalSize = numSamples * r;
  Indices indices;
  if (shuffle) {
    indices = samplerPermutation(n, seed + static_cast<uint64_t>(epoch));
  } else {
    indices.resize(n);
    std::iota(indices.begin(), indices.end(), int64_t{0});
  }
  if (!dropLast) {
    const int64_t pad = totalSize - static_cast<int64_t>(indices.size());
    if (pad <= static_cast<int64_t>(indices.size())) {
      Indices head(indices.begin(), indices.begin() + pad);
      indices.insert(indices.end(), head.begin(), head.end());
    } else {
      const auto times = static_cast<int64_t>(std::ceil(static_cast<double>(pad) / indices.size()));
      Indices rep;
      for (int64_t t = 0; t < times; ++t) rep.insert(rep.end(), indices.begin(), indices.end());
      indices.insert(indices.end(), rep.begin(), rep.begin() + pad);
    }
  } else {
    indices.resize(totalSize);
  }
  EXPECT_EQ(static_cast<int64_t>(indices.size()), totalSize);
  Indices mine;
  for (int64_t i = rank; i < totalSize; i += r) mine.push_back(indices[i]);
  return mine;
}

TEST(SamplerTest, TenSamplesThreeReplicas) {
  const std::vector<Indices> padded{{0, 3, 6, 9}, {1, 4, 7, 0}, {2, 5, 8, 1}};
  const std::vector<Indices> dropped{{0, 3, 6}, {1, 4, 7}, {2, 5, 8}};
  const std::vector<int64_t> repeats{0, 1, 1};
  for (int rank = 0; rank < 3; ++rank) {
    DistributedSampler p(opts(10, 3, rank, false, false));
    EXPECT_EQ(p.indices(), padded[rank]);
    EXPECT_EQ(p.numSamples(), 4);
    EXPECT_EQ(p.totalSize(), 12);
    EXPECT_EQ(p.paddedCount(), repeats[rank]);
    DistributedSampler d(opts(10, 3, rank, false, true));
    EXPECT_EQ(d.indices(), dropped[rank]);
    EXPECT_EQ(d.numSamples(), 3);
    EXPECT_EQ(d.totalSize(), 9);
    EXPECT_EQ(d.paddedCount(), 0);
  }
}

TEST(SamplerTest, MatchesPyTorchRulesEverywhere) {
  std::vector<int64_t> sizes;
  for (int64_t n = 0; n <= 40; ++n) sizes.push_back(n);
  for (int64_t n : {997, 1000, 1001, 60000, 65537}) sizes.push_back(n);
  int cases = 0;
  for (int64_t n : sizes)
    for (int r = 1; r <= 9; ++r)
      for (bool dropLast : {false, true})
        for (bool shuffle : {false, true})
          for (int rank = 0; rank < r; ++rank) {
            if (n > 1001 && r != 1 && r != 7 && r != 8) continue;  // keep it fast
            const uint64_t seed = 7;
            DistributedSampler s(opts(n, r, rank, shuffle, dropLast, Mode::kPadded, seed));
            for (int64_t epoch : {0, 3}) {
              if (epoch) s.setEpoch(epoch);
              const Indices want = pytorchReference(n, r, rank, shuffle, dropLast, seed, epoch);
              ASSERT_EQ(s.indices(), want) << "N=" << n << " R=" << r << " rank=" << rank
                                           << " dropLast=" << dropLast << " shuffle=" << shuffle
                                           << " epoch=" << epoch;
              ASSERT_EQ(s.numSamples(), static_cast<int64_t>(want.size()));
              ASSERT_EQ(s.totalSize(), s.numSamples() * r);
              ++cases;
            }
          }
  EXPECT_GT(cases, 8000);
}

TEST(SamplerTest, PaddedCountsTheRepeatsAtTheEnd) {
  for (int64_t n : {1, 5, 10, 17})
    for (int r : {2, 3, 8}) {
      int64_t repeats = 0, total = 0;
      for (int rank = 0; rank < r; ++rank) {
        DistributedSampler s(opts(n, r, rank, false, false));
        repeats += s.paddedCount();
        total = s.totalSize();
        // Unshuffled, a repeat is an index smaller than the one before it
        // (the order wrapped around); only the last ones may be repeats.
        const auto& ix = s.indices();
        for (int64_t k = 0; k < s.numSamples() - s.paddedCount(); ++k)
          EXPECT_EQ(ix[k], rank + k * r);
      }
      EXPECT_EQ(repeats, total - n) << "N=" << n << " R=" << r;
    }
}

TEST(SamplerTest, ExactModeCoversEverySampleOnce) {
  for (int64_t n : {0, 1, 2, 7, 10, 29, 40, 1001})
    for (int r = 1; r <= 9; ++r)
      for (bool shuffle : {false, true}) {
        std::vector<int> seen(n, 0);
        int64_t sum = 0;
        for (int rank = 0; rank < r; ++rank) {
          DistributedSampler s(opts(n, r, rank, shuffle, false, Mode::kExact, 3));
          s.setEpoch(2);
          EXPECT_EQ(s.totalSize(), n);
          EXPECT_EQ(s.paddedCount(), 0);
          const int64_t want = rank < n ? (n - rank + r - 1) / r : 0;
          EXPECT_EQ(s.numSamples(), want) << "N=" << n << " R=" << r << " rank=" << rank;
          for (int64_t i : s.indices()) ++seen.at(i);
          sum += s.numSamples();
        }
        EXPECT_EQ(sum, n);
        EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }))
            << "N=" << n << " R=" << r;
      }
  // Unshuffled: rank r reads r, r + R, ...
  DistributedSampler s(opts(10, 3, 1, false, false, Mode::kExact));
  EXPECT_EQ(s.indices(), (Indices{1, 4, 7}));
  DistributedSampler last(opts(10, 3, 2, false, false, Mode::kExact));
  EXPECT_EQ(last.indices(), (Indices{2, 5, 8}));
}

// Ranks agree on one order: interleaving their lists rebuilds a permutation
// of 0..N-1 followed by its own start.
TEST(SamplerTest, RanksShareOneOrderPerSeedAndEpoch) {
  const int64_t n = 37;
  const int r = 4;
  for (int64_t epoch : {0, 1, 5}) {
    Indices order(((n + r - 1) / r) * r);
    for (int rank = 0; rank < r; ++rank) {
      DistributedSampler s(opts(n, r, rank, true, false, Mode::kPadded, 11));
      s.setEpoch(epoch);
      DistributedSampler again(opts(n, r, rank, true, false, Mode::kPadded, 11));
      again.setEpoch(epoch);
      EXPECT_EQ(s.indices(), again.indices());
      for (int64_t k = 0; k < s.numSamples(); ++k) order[rank + k * r] = s.indices()[k];
    }
    Indices head(order.begin(), order.begin() + n);
    std::sort(head.begin(), head.end());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(head[i], i);
    for (size_t i = n; i < order.size(); ++i) EXPECT_EQ(order[i], order[i - n]);
    EXPECT_EQ(Indices(order.begin(), order.begin() + n), samplerPermutation(n, 11 + epoch));
  }
}

TEST(SamplerTest, EpochsAndSeedsChangeTheOrder) {
  DistributedSampler s(opts(1000, 2, 0, true, false));
  const Indices e0 = s.indices();
  s.setEpoch(1);
  const Indices e1 = s.indices();
  EXPECT_NE(e0, e1);
  EXPECT_EQ(s.epoch(), 1);
  s.setEpoch(0);
  EXPECT_EQ(s.indices(), e0);  // an epoch's order is reproducible (resuming)
  DistributedSampler other(opts(1000, 2, 0, true, false, Mode::kPadded, 1));
  EXPECT_NE(other.indices(), e0);
  // PyTorch seeds with seed + epoch: seed 1 epoch 0 == seed 0 epoch 1.
  EXPECT_EQ(other.indices(), e1);
  DistributedSampler plain(opts(1000, 2, 0, false, false));
  plain.setEpoch(9);
  for (int64_t k = 0; k < plain.numSamples(); ++k) ASSERT_EQ(plain.indices()[k], 2 * k);
}

// The generator is part of the format: a resumed run must see the same order
// on any platform and standard library. Pinned values catch a change.
TEST(SamplerTest, PermutationIsPinned) {
  EXPECT_EQ(samplerPermutation(0, 0), Indices{});
  EXPECT_EQ(samplerPermutation(1, 5), Indices{0});
  EXPECT_EQ(samplerPermutation(10, 0), (Indices{7, 2, 0, 8, 3, 9, 6, 1, 5, 4}));
  EXPECT_EQ(samplerPermutation(10, 42), (Indices{1, 7, 9, 0, 3, 8, 4, 2, 5, 6}));
}

// Fisher-Yates with unbiased draws: each of the 24 orders of 4 elements is
// about equally likely (expected 1250 of 30000; 6 standard deviations ~ 210).
TEST(SamplerTest, PermutationsAreUniform) {
  std::map<Indices, int> counts;
  for (uint64_t seed = 0; seed < 30000; ++seed) ++counts[samplerPermutation(4, seed)];
  EXPECT_EQ(counts.size(), 24u);
  for (const auto& [perm, c] : counts) {
    EXPECT_GT(c, 1040);
    EXPECT_LT(c, 1460);
  }
}

TEST(SamplerTest, BadOptionsThrowNamingTheValue) {
  auto message = [](const SamplerOptions& o) -> std::string {
    try {
      DistributedSampler s(o);
    } catch (const InvalidArgument& e) {
      return e.message();
    }
    return "no exception";
  };
  EXPECT_NE(message(opts(10, 0, 0, true, false)).find("numReplicas=0"), std::string::npos);
  EXPECT_NE(message(opts(10, 3, 3, true, false)).find("rank=3"), std::string::npos);
  EXPECT_NE(message(opts(10, 3, -1, true, false)).find("rank=-1"), std::string::npos);
  EXPECT_NE(message(opts(-1, 3, 0, true, false)).find("datasetSize=-1"), std::string::npos);
  EXPECT_NE(message(opts(10, 3, 0, true, true, Mode::kExact)).find("dropLast"),
            std::string::npos);
}

}  // namespace
}  // namespace ddprun::runtime
