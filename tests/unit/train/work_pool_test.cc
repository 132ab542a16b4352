// The batch-assembly pool: every index exactly once, whatever the thread
// count; errors come back to the caller; the pool is reusable.
#include "work_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

namespace ddprun::train {
namespace {

TEST(WorkPool, CoversEveryIndexOnceForAnyThreadCount) {
  for (int threads : {1, 2, 3, 8}) {
    WorkPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}}) {
      std::vector<std::atomic<int>> hits(n);
      pool.run(n, [&](size_t b, size_t e) {
        ASSERT_LE(b, e);
        ASSERT_LE(e, n);
        for (size_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << threads << " " << i;
    }
  }
}

TEST(WorkPool, AChunksExceptionReachesTheCallerAndThePoolGoesOn) {
  WorkPool pool(3);
  std::atomic<size_t> done{0};
  EXPECT_THROW(pool.run(100,
                        [&](size_t b, size_t e) {
                          if (b <= 50 && 50 < e) throw std::runtime_error("bad image");
                          done += e - b;
                        }),
               std::runtime_error);
  EXPECT_LT(done.load(), size_t{100});
  std::atomic<size_t> again{0};
  pool.run(64, [&](size_t b, size_t e) { again += e - b; });
  EXPECT_EQ(again.load(), size_t{64});
}

TEST(WorkPool, ResultsDoNotDependOnTheThreadCount) {
  auto fill = [](int threads) {
    WorkPool pool(threads);
    std::vector<uint64_t> out(513);
    pool.run(out.size(), [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) out[i] = i * 2654435761u ^ (i >> 3);
    });
    return out;
  };
  EXPECT_EQ(fill(1), fill(4));
}

}  // namespace
}  // namespace ddprun::train
