// The Reducer's logic with ranks as threads: bucket layout (reverse order,
// small first bucket, rebuild in ready order), averaging, strict launch
// order, hooks, and the errors that replace hangs.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>

#include "ddprun/common/error.h"
#include "ddprun/runtime/reducer.h"
#include "rank_threads.h"

namespace ddprun::runtime {
namespace {

using ddprun::testing::runRanks;

// runRanks wraps a rank's exception; the cause is what the caller sees.
template <typename F>
void runRanksUnwrapped(int n, F body) {
  try {
    runRanks(n, body);
  } catch (const ddprun::testing::RankFailure& f) {
    std::rethrow_exception(f.cause());
  }
}

std::vector<ParamInfo> params(const std::vector<size_t>& counts) {
  std::vector<ParamInfo> p;
  for (size_t i = 0; i < counts.size(); ++i) p.push_back({"p" + std::to_string(i), counts[i]});
  return p;
}

// Fills every gradient with (rank + 1) * (i + 1) + j and marks it ready in
// `order`, then finalizes.
void iterate(Reducer& r, int rank, const std::vector<size_t>& order) {
  for (size_t i : order) {
    float* g = r.grad(i);
    for (size_t j = 0; j < r.param(i).count; ++j)
      g[j] = static_cast<float>((rank + 1) * (i + 1) + j);
    r.markReady(i);
  }
  r.finalize();
}

TEST(ReducerTest, InitialBucketsAreReversedWithASmallLastReducedBucket) {
  runRanks(1, [](ProcessGroup& pg) {
    // 4 params of 100 floats = 400 B each; first-bucket cap 500 B, cap 900 B.
    Reducer r(pg, params({100, 100, 100, 100, 100}),
              {.bucketCapBytes = 900, .firstBucketBytes = 500});
    // Forward pass over registration order: {0,1} (>= 500), {2,3,4} (>= 900
    // not reached: the tail); reversed: {2,3,4} first, {0,1} last.
    ASSERT_EQ(r.numBuckets(), 2u);
    EXPECT_EQ(r.bucketParams(0), (std::vector<size_t>{2, 3, 4}));
    EXPECT_EQ(r.bucketParams(1), (std::vector<size_t>{0, 1}));
  });
}

TEST(ReducerTest, AveragesOverRanksAndRebuildsOnceInReadyOrder) {
  std::mutex mu;
  std::vector<std::vector<size_t>> layouts;
  runRanks(3, [&](ProcessGroup& pg) {
    Reducer r(pg, params({3, 5, 2, 4}), {.bucketCapBytes = 16, .firstBucketBytes = 8});
    const std::vector<size_t> order = {1, 3, 0, 2};  // not the reverse of registration
    const uint64_t before = r.layoutVersion();
    iterate(r, pg.rank(), order);
    EXPECT_NE(r.layoutVersion(), before);  // rebuilt after the first iteration
    // Average of (rank+1)*(i+1)+j over ranks 0..2 = 2*(i+1)+j.
    for (size_t i = 0; i < 4; ++i)
      for (size_t j = 0; j < r.param(i).count; ++j)
        EXPECT_FLOAT_EQ(r.grad(i)[j], static_cast<float>(2 * (i + 1) + j)) << i << "," << j;
    // The rebuilt layout follows the ready order: param 1 is in bucket 0.
    EXPECT_EQ(r.bucketParams(0).front(), 1u);
    const uint64_t after = r.layoutVersion();
    r.zeroGrad();
    iterate(r, pg.rank(), order);
    EXPECT_EQ(r.layoutVersion(), after);  // only once
    EXPECT_FLOAT_EQ(r.grad(2)[1], 7.0f);
    std::lock_guard lock(mu);
    std::vector<size_t> flat;
    for (size_t b = 0; b < r.numBuckets(); ++b)
      flat.insert(flat.end(), r.bucketParams(b).begin(), r.bucketParams(b).end());
    layouts.push_back(flat);
  });
  ASSERT_EQ(layouts.size(), 3u);
  EXPECT_EQ(layouts[0], layouts[1]);
  EXPECT_EQ(layouts[0], layouts[2]);
}

// Every gradient is 256-byte aligned relative to its bucket, in the initial
// and in the rebuilt layout (libraries choose kernels by pointer alignment: a
// layout change must not change the arithmetic), and the padding between
// parameters stays zero after the all-reduce.
TEST(ReducerTest, GradientsStayAlignedInEveryLayout) {
  runRanks(2, [](ProcessGroup& pg) {
    Reducer r(pg, params({3, 10, 1, 84, 7}), {.bucketCapBytes = 400, .firstBucketBytes = 64});
    auto checkAligned = [&] {
      for (size_t b = 0; b < r.numBuckets(); ++b) {
        const float* base = r.grad(r.bucketParams(b).front());
        for (size_t i : r.bucketParams(b))
          EXPECT_EQ((r.grad(i) - base) % 64, 0) << "param " << i << " bucket " << b;
      }
    };
    checkAligned();
    iterate(r, pg.rank(), {4, 2, 0, 3, 1});  // another order than the initial one
    checkAligned();
    for (size_t b = 0; b < r.numBuckets(); ++b) {
      const auto& ps = r.bucketParams(b);
      for (size_t k = 0; k + 1 < ps.size(); ++k)
        for (const float* p = r.grad(ps[k]) + r.param(ps[k]).count; p < r.grad(ps[k + 1]); ++p)
          ASSERT_EQ(*p, 0.0f) << "padding after param " << ps[k];
    }
  });
}

TEST(ReducerTest, RanksMarkingInDifferentOrdersStillAgree) {
  runRanks(2, [](ProcessGroup& pg) {
    Reducer r(pg, params({4, 4, 4, 4}), {.bucketCapBytes = 16, .firstBucketBytes = 16});
    // Rank 1 reports gradients in another order: buckets still launch in
    // index order on both ranks, so they pair up correctly.
    const std::vector<size_t> order =
        pg.rank() == 0 ? std::vector<size_t>{3, 2, 1, 0} : std::vector<size_t>{0, 1, 2, 3};
    iterate(r, pg.rank(), order);
    for (size_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(r.grad(i)[0], 1.5f * (i + 1));
  });
}

TEST(ReducerTest, NoSyncKeepsGradientsLocalUntilTheSynchronisedIteration) {
  runRanks(2, [](ProcessGroup& pg) {
    Reducer r(pg, params({2}), {});
    {
      NoSyncGuard g(r);
      iterate(r, pg.rank(), {0});  // local only
      EXPECT_FLOAT_EQ(r.grad(0)[0], static_cast<float>(pg.rank() + 1));
    }
    // Accumulate a second gradient on top, then synchronise: avg of 2*(rank+1).
    float* g = r.grad(0);
    g[0] += static_cast<float>(pg.rank() + 1);
    r.markReady(0);
    r.finalize();
    EXPECT_FLOAT_EQ(r.grad(0)[0], 3.0f);
  });
}

TEST(ReducerTest, UnusedParameterIsAnErrorNamingIt) {
  runRanks(2, [](ProcessGroup& pg) {
    Reducer r(pg, {{"encoder.weight", 4}, {"head.bias", 2}}, {});
    r.markReady(0);
    try {
      r.finalize();
      FAIL() << "finalize accepted a parameter without gradient";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(e.message().find("'head.bias'"), std::string::npos) << e.message();
      EXPECT_EQ(e.message().find("encoder.weight"), std::string::npos) << e.message();
    }
  });
}

TEST(ReducerTest, MarkingTwiceIsAnError) {
  runRanks(1, [](ProcessGroup& pg) {
    Reducer r(pg, {{"w", 4}, {"b", 1}}, {});
    r.markReady(1);
    EXPECT_THROW(r.markReady(1), InvalidArgument);
  });
}

TEST(ReducerTest, DifferentModelsOnDifferentRanksAreRefused) {
  EXPECT_THROW(runRanksUnwrapped(2, [](ProcessGroup& pg) {
                 Reducer r(pg, params(pg.rank() == 0 ? std::vector<size_t>{4, 4}
                                                     : std::vector<size_t>{4, 5}),
                           {});
               }),
               InvalidArgument);
}

TEST(ReducerTest, Fp16AndBf16HooksAverageWithinTheirPrecision) {
  for (CommHook h : {CommHook::kFp16, CommHook::kBf16}) {
    runRanks(2, [h](ProcessGroup& pg) {
      Reducer r(pg, params({64}), {.hook = h});
      iterate(r, pg.rank(), {0});
      const double tol = h == CommHook::kFp16 ? 1e-3 : 1e-2;
      for (size_t j = 0; j < 64; ++j) {
        const double want = 1.5 + j;  // avg of (1 + j) and (2 + j)
        EXPECT_NEAR(r.grad(0)[j], want, tol * want) << commHookName(h) << " " << j;
      }
    });
  }
  EXPECT_EQ(parseCommHook("bf16"), CommHook::kBf16);
  EXPECT_FALSE(parseCommHook("powersgd").has_value());
}

}  // namespace
}  // namespace ddprun::runtime
