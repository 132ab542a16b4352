// Reduction kernels, 16-bit float conversions and small runtime helpers.
#include "reduce.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <thread>
#include <tuple>
#include <vector>

#include "comm.h"
#include "ddprun/runtime/collectives.h"
#include "ddprun/runtime/process_group.h"
#include "rank_threads.h"
#include "shm/shm_comm.h"
#include "timing.h"

using namespace ddprun::runtime;

TEST(HalfTest, KnownValuesRoundTrip) {
  EXPECT_EQ(floatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(floatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(1e6f), 0x7c00);                 // overflow -> inf
  EXPECT_EQ(floatToHalf(5.9604645e-8f), 0x0001);        // smallest subnormal
  EXPECT_EQ(floatToHalf(1.0f + 1.0f / 2048), 0x3c00);   // tie rounds to even
  EXPECT_EQ(floatToHalf(1.0f + 3.0f / 2048), 0x3c02);   // tie rounds to even (up)
  EXPECT_FLOAT_EQ(halfToFloat(0x3555), 0.33325195f);
  EXPECT_TRUE(std::isnan(halfToFloat(floatToHalf(std::nanf("")))));
  for (uint32_t h = 0; h < 0x7c00; ++h)  // every finite positive half survives
    ASSERT_EQ(floatToHalf(halfToFloat(static_cast<uint16_t>(h))), h) << h;
}

TEST(Bf16Test, RoundsToNearestEven) {
  EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
  EXPECT_FLOAT_EQ(bf16ToFloat(floatToBf16(3.140625f)), 3.140625f);
  EXPECT_EQ(floatToBf16(bf16ToFloat(0x4049)), 0x4049);
  float tie;  // 1 + 2^-8: exactly halfway between two bf16 values
  tie = 1.0f + 1.0f / 256;
  EXPECT_EQ(floatToBf16(tie), 0x3f80);
}

TEST(ReduceTest, EveryOpOnInt32WithAliasedDestination) {
  std::vector<int32_t> a{1, -5, 7, 3}, b{4, 2, -7, 3}, c{-2, 2, 2, 0};
  const void* srcs[3] = {a.data(), b.data(), c.data()};
  std::vector<int32_t> out(4);
  reduceN(DType::kInt32, ReduceOp::kSum, out.data(), srcs, 3, 4);
  EXPECT_EQ(out, (std::vector<int32_t>{3, -1, 2, 6}));
  reduceN(DType::kInt32, ReduceOp::kMin, out.data(), srcs, 3, 4);
  EXPECT_EQ(out, (std::vector<int32_t>{-2, -5, -7, 0}));
  reduceN(DType::kInt32, ReduceOp::kMax, out.data(), srcs, 3, 4);
  EXPECT_EQ(out, (std::vector<int32_t>{4, 2, 7, 3}));
  reduceN(DType::kInt32, ReduceOp::kProduct, out.data(), srcs, 3, 4);
  EXPECT_EQ(out, (std::vector<int32_t>{-8, -20, -98, 0}));
  // dst aliases the first source
  reduceN(DType::kInt32, ReduceOp::kSum, a.data(), srcs, 3, 4);
  EXPECT_EQ(a, (std::vector<int32_t>{3, -1, 2, 6}));
  divideBy(DType::kInt32, a.data(), 4, 2);
  EXPECT_EQ(a, (std::vector<int32_t>{1, 0, 1, 3}));  // truncation toward zero
}

TEST(ReduceTest, UInt8AndInt64Wrap) {
  std::vector<uint8_t> a{200, 16}, b{100, 16};
  reduceInto(DType::kUInt8, ReduceOp::kSum, a.data(), b.data(), 2);
  EXPECT_EQ(a[0], 44);
  reduceInto(DType::kUInt8, ReduceOp::kProduct, a.data(), b.data(), 2);
  EXPECT_EQ(a[1], 0);  // 32 * 16 = 512 wraps to 0
  std::vector<int64_t> x{std::numeric_limits<int64_t>::max()}, y{1};
  reduceInto(DType::kInt64, ReduceOp::kSum, x.data(), y.data(), 1);
  EXPECT_EQ(x[0], std::numeric_limits<int64_t>::min());
}

TEST(ReduceTest, LongFloatVectorsAcrossBlocks) {
  const size_t n = 10007;  // several 2048-element blocks plus a tail
  std::vector<float> a(n), b(n);
  std::vector<double> c(n), d(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = 0.5f * i;
    b[i] = 1.0f;
    c[i] = i;
    d[i] = -2.0 * i;
  }
  reduceInto(DType::kFloat32, ReduceOp::kSum, a.data(), b.data(), n);
  reduceInto(DType::kFloat64, ReduceOp::kMax, c.data(), d.data(), n);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_FLOAT_EQ(a[i], 0.5f * i + 1.0f);
    ASSERT_EQ(c[i], static_cast<double>(i));
  }
  divideBy(DType::kFloat32, b.data(), n, 4);
  EXPECT_FLOAT_EQ(b[n - 1], 0.25f);
}

TEST(ReduceTest, SixteenBitFloatsAccumulateInFloat) {
  // 2048 + 1 + 1 in fp16: pairwise in fp16 would lose both ones; the n-way
  // reduce keeps them in the float accumulator and rounds once.
  std::vector<uint16_t> a{floatToHalf(2048)}, b{floatToHalf(1)}, c{floatToHalf(1)};
  const void* srcs[3] = {a.data(), b.data(), c.data()};
  uint16_t out;
  reduceN(DType::kFloat16, ReduceOp::kSum, &out, srcs, 3, 1);
  EXPECT_EQ(halfToFloat(out), 2050.0f);
  std::vector<uint16_t> p{floatToBf16(1.5f)}, q{floatToBf16(-4.0f)};
  reduceInto(DType::kBFloat16, ReduceOp::kProduct, p.data(), q.data(), 1);
  EXPECT_EQ(bf16ToFloat(p[0]), -6.0f);
}

TEST(PartitionTest, CoversEveryElementOnce) {
  for (size_t count : {0u, 1u, 7u, 4097u})
    for (int parts : {1, 2, 3, 8}) {
      Partition p(count, parts);
      EXPECT_EQ(p.offset(0), 0u);
      EXPECT_EQ(p.offsets.back(), count);
      for (int i = 0; i < parts; ++i) {
        EXPECT_LE(p.length(i), count / parts + 1);
        EXPECT_GE(p.length(i), count / parts);
      }
    }
}

TEST(NamesTest, ParseAndPrint) {
  for (DType t : kAllDTypes) EXPECT_EQ(parseDType(dtypeName(t)), t);
  for (ReduceOp op : kAllReduceOps) EXPECT_EQ(parseReduceOp(reduceOpName(op)), op);
  EXPECT_EQ(parseDType("bf16"), DType::kBFloat16);
  EXPECT_FALSE(parseDType("complex64").has_value());
  EXPECT_EQ(parseTransport("hierarchical"), Transport::kHierarchical);
  EXPECT_THROW(parseTransport("rdma"), ddprun::InvalidArgument);
}

TEST(OptionsTest, EnvironmentOverridesAndRejectsGarbage) {
  setenv("DDPRUN_COLLECTIVE_TIMEOUT", "2.5", 1);
  setenv("DDPRUN_TRANSPORT", "tcp", 1);
  auto o = optionsFromEnv();
  EXPECT_EQ(o.timeout.count(), 2500);
  EXPECT_EQ(o.transport, Transport::kTcp);
  setenv("DDPRUN_COLLECTIVE_TIMEOUT", "soon", 1);
  try {
    optionsFromEnv();
    FAIL() << "expected InvalidArgument";
  } catch (const ddprun::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("DDPRUN_COLLECTIVE_TIMEOUT"), std::string::npos);
  }
  unsetenv("DDPRUN_COLLECTIVE_TIMEOUT");
  unsetenv("DDPRUN_TRANSPORT");
}

TEST(SingleRankTest, CollectivesAreCopiesAndWorkIsOrdered) {
  ProcessGroupOptions o;
  auto pg = ProcessGroup::create(nullptr, 0, 1, o);
  std::vector<float> in{1, 2, 3}, out(3);
  AllReduceOptions ar;
  ar.input = in.data();
  ar.output = out.data();
  ar.count = 3;
  ar.op = ReduceOp::kAvg;
  Work w = allReduceAsync(*pg, ar);
  barrier(*pg);  // issued after: completes after the all-reduce
  EXPECT_TRUE(w.completed());
  w.wait();
  EXPECT_EQ(out, in);
  AllReduceOptions bad;
  bad.count = 4;  // null output
  EXPECT_THROW(allReduce(*pg, bad), ddprun::InvalidArgument);
  void* p = pg->allocShared(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  pg->freeShared(p);
}

// Two members of one segment, driven from two threads (no processes).
TEST(ShmCommTest, TwoMembersAllReduceAndHeapPath) {
  const std::string name = "/ddprun.unittest." + std::to_string(::getpid());
  CommContext c0{{0, 1}, 0, std::chrono::milliseconds(5000)}, c1{{0, 1}, 1, c0.timeout};
  auto a = ShmComm::create(name, c0, 4096, 1 << 20);
  auto b = ShmComm::open(name, c1);
  ShmComm::unlink(name);
  const size_t n = 3000;  // > one 4 KiB slot of floats: several chunks
  std::vector<float> x(n, 1.5f), y(n, 2.0f);
  float* hx = reinterpret_cast<float*>(a->heap(0));
  float* hy = reinterpret_cast<float*>(b->heap(1));
  std::fill(hx, hx + n, 3.0f);
  std::fill(hy, hy + n, 4.0f);
  std::thread t([&] {
    b->allReduce(y.data(), y.data(), n, DType::kFloat32, ReduceOp::kSum);
    b->allReduce(hy, hy, n, DType::kFloat32, ReduceOp::kMax);
    b->barrier();
  });
  a->allReduce(x.data(), x.data(), n, DType::kFloat32, ReduceOp::kSum);
  a->allReduce(hx, hx, n, DType::kFloat32, ReduceOp::kMax);  // both in the heap: in place
  a->barrier();
  t.join();
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(x[i], 3.5f);
    ASSERT_EQ(y[i], 3.5f);
    ASSERT_EQ(hx[i], 4.0f);
    ASSERT_EQ(hy[i], 4.0f);
  }
  EXPECT_EQ(a->heapOffset(hx, 16), 0);
  EXPECT_EQ(a->heapOffset(x.data(), 16), -1);
}

TEST(ShmCommTest, StalledPeerTimesOutNamingIt) {
  const std::string name = "/ddprun.unittest2." + std::to_string(::getpid());
  CommContext c0{{0, 5}, 0, std::chrono::milliseconds(300)}, c1{{0, 5}, 1, c0.timeout};
  auto a = ShmComm::create(name, c0, 4096, 0);
  auto b = ShmComm::open(name, c1);  // never takes part
  ShmComm::unlink(name);
  try {
    a->barrier();
    FAIL() << "expected PeerFailure";
  } catch (const PeerFailure& e) {
    EXPECT_EQ(e.peer(), 5);
    EXPECT_TRUE(e.timedOut());
    EXPECT_NE(std::string(e.what()).find("rank(s) 5"), std::string::npos) << e.what();
  }
}

// ------------------------------------------- ranks as threads (rank_threads.h)
using ddprun::testing::RankFailure;
using ddprun::testing::runRanks;

class ThreadRanksTest : public ::testing::TestWithParam<std::tuple<int, Transport>> {
 protected:
  int ranks() const { return std::get<0>(GetParam()); }
  ProcessGroupOptions options() const {
    ProcessGroupOptions o;
    o.transport = std::get<1>(GetParam());
    o.timeout = std::chrono::milliseconds(20'000);
    o.sharedHeapBytes = size_t{8} << 20;
    return o;
  }
};

// Small (one barrier) and chunked all-reduce, in place from the shared heap,
// broadcast from the last rank, async work ordered before a barrier.
TEST_P(ThreadRanksTest, AllReduceAndBroadcast) {
  const int n = ranks();
  const Transport want = std::get<1>(GetParam());
  runRanks(n, [&](ProcessGroup& pg) {
    EXPECT_EQ(pg.size(), n);
    EXPECT_EQ(pg.topology().numHosts, 1);
    EXPECT_EQ(pg.transport(), want);
    const int r = pg.rank();
    const float sumRanks = n * (n - 1) / 2.0f;
    for (size_t count : {size_t{5}, size_t{300'000}}) {
      std::vector<float> x(count);
      for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(r) + static_cast<float>(i % 7);
      AllReduceOptions ar;
      ar.output = x.data();
      ar.count = count;
      allReduce(pg, ar);
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(x[i], sumRanks + n * static_cast<float>(i % 7)) << "rank " << r << " i " << i;
    }
    const size_t heapCount = 100'000;
    auto* h = static_cast<int32_t*>(pg.allocShared(heapCount * sizeof(int32_t)));
    std::fill(h, h + heapCount, r + 1);
    AllReduceOptions mx;
    mx.output = h;
    mx.count = heapCount;
    mx.dtype = DType::kInt32;
    mx.op = ReduceOp::kMax;
    Work w = allReduceAsync(pg, mx);
    std::vector<double> b(1000, r == n - 1 ? 2.5 : -1.0);
    BroadcastOptions bc;
    bc.buffer = b.data();
    bc.count = b.size();
    bc.dtype = DType::kFloat64;
    bc.root = n - 1;
    Work wb = broadcastAsync(pg, bc);
    barrier(pg);
    EXPECT_TRUE(w.completed());
    w.wait();
    wb.wait();
    EXPECT_EQ(std::count(h, h + heapCount, n), static_cast<long>(heapCount));
    EXPECT_EQ(std::count(b.begin(), b.end(), 2.5), static_cast<long>(b.size()));
    pg.freeShared(h);
  }, options());
}

// A rank that throws destroys its group: its peers, blocked in a collective,
// fail because it left, not at the timeout (no peer throws TimeoutError), and
// runRanks reports the rank that threw. How long it took is printed against
// the stated bound, asserted only with DDPRUN_TIMING_ASSERTS=1 (timing.h).
TEST_P(ThreadRanksTest, RankThatLeavesFailsItsPeersPromptly) {
  const int n = ranks();
  std::atomic<int> timedOut{0};
  const auto t0 = std::chrono::steady_clock::now();
  try {
    runRanks(n, [&](ProcessGroup& pg) {
      barrier(pg);
      if (pg.rank() == 1) throw ddprun::InvalidArgument("rank 1 gives up");
      std::vector<float> x(10, 1.0f);
      AllReduceOptions ar;
      ar.output = x.data();
      ar.count = x.size();
      try {
        allReduce(pg, ar);
      } catch (const ddprun::TimeoutError&) {
        ++timedOut;
        throw;
      }
    }, options());
    FAIL() << "expected RankFailure";
  } catch (const RankFailure& f) {
    EXPECT_EQ(f.rank(), 1) << f.what();
    EXPECT_NE(std::string(f.what()).find("rank 1 gives up"), std::string::npos) << f.what();
    EXPECT_THROW(std::rethrow_exception(f.cause()), ddprun::InvalidArgument);
  }
  EXPECT_EQ(timedOut.load(), 0)
      << "a peer waited for the timeout instead of seeing rank 1 leave";
  ddprun::testing::timingBound("peers failing after rank 1 left",
                               std::chrono::steady_clock::now() - t0,
                               std::chrono::seconds(10));
}

INSTANTIATE_TEST_SUITE_P(
    RanksAndTransports, ThreadRanksTest,
    ::testing::Combine(::testing::Values(2, 4), ::testing::Values(Transport::kShm, Transport::kTcp)),
    [](const auto& info) {
      return std::to_string(std::get<0>(info.param)) + "ranks_" +
             transportName(std::get<1>(info.param));
    });

TEST(RunRanksTest, GroupsOfOneCallAgreeAndCallsDoNotInterfere) {
  for (int call = 0; call < 3; ++call)
    runRanks(3, [](ProcessGroup& pg) {
      int32_t v = pg.rank() == 0 ? 42 : 0;
      BroadcastOptions bc;
      bc.buffer = &v;
      bc.count = 1;
      bc.dtype = DType::kInt32;
      broadcast(pg, bc);
      EXPECT_EQ(v, 42);
    });
}
