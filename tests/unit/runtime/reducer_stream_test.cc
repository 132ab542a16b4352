// The Reducer's stream ordering against a fake device (no GPU; ranks as
// threads): which events are recorded and waited for, in which order; that
// finalize() returns before any device work ran (it waits for the issue of
// the collectives, never for their completion); device timings; the ordered
// broadcast of buffers; and that CPU memory never takes the device path.
//
// The fake: "device" memory is host memory; the compute stream runs at once
// (its operations happen when called); the communication stream is a queue
// the test runs (runDevice), or that a stream wait on an operation's `done`
// event runs up to that operation (runOnWait: what the device guarantees to
// whatever the compute stream issues after the wait).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ddprun/common/error.h"
#include "ddprun/runtime/reducer.h"
#include "device_order.h"
#include "pg_internal.h"
#include "rank_threads.h"

namespace ddprun::runtime {
namespace {

using ddprun::testing::runRanks;
using internal::DeviceEvent;
using internal::DeviceStream;
using internal::OrderedEvents;
using Lines = std::vector<std::string>;

DeviceStream const kComputeStream = reinterpret_cast<DeviceStream>(0x5eed);

// Device memory in host memory; logs the memory's own stream operations.
class FakeMemory final : public GradientMemory {
 public:
  FakeMemory(ProcessGroup& pg, Lines& log) : cpu_(makeCpuGradientMemory(pg)), log_(log) {}
  Device device() const override { return Device::kCuda; }
  void* alloc(size_t bytes) override { return std::calloc(std::max<size_t>(bytes, 1), 1); }
  void free(void* p) override { std::free(p); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void zero(void* p, size_t bytes) override {
    if (bytes) std::memset(p, 0, bytes);
  }
  void compress(const float* src, void* dst16, size_t n, float scale, DType t) override {
    log_.push_back("compress");
    cpu_->compress(src, dst16, n, scale, t);
  }
  void decompress(const void* src16, float* dst, size_t n, DType t) override {
    log_.push_back("decompress");
    cpu_->decompress(src16, dst, n, t);
  }
  void* stream() const override { return kComputeStream; }

 private:
  std::unique_ptr<GradientMemory> cpu_;
  Lines& log_;
};

// Events are numbered in creation order: "e1", "e2", ...
class FakeDevice final : public internal::DeviceCollectives {
 public:
  FakeDevice(ProcessGroup& pg, Lines& log) : pg_(pg), log_(log) {}

  DeviceEvent createEvent(bool timing) override {
    const auto e = reinterpret_cast<DeviceEvent>(static_cast<uintptr_t>(++counts->created));
    timing_[e] = timing;
    return e;
  }
  void destroyEvent(DeviceEvent e) noexcept override {
    if (e) ++counts->destroyed;
  }
  void record(DeviceEvent e, DeviceStream s) override {
    EXPECT_EQ(s, kComputeStream);
    log_.push_back("record " + name(e));
  }
  void streamWait(DeviceStream s, DeviceEvent e) override {
    EXPECT_EQ(s, kComputeStream);
    log_.push_back("wait " + name(e));
    if (!runOnWait) return;
    for (size_t i = 0; i < queue_.size(); ++i)
      if (queue_[i].done == e) {
        for (size_t j = 0; j <= i; ++j) queue_[j].run();
        queue_.erase(queue_.begin(), queue_.begin() + static_cast<long>(i) + 1);
        return;
      }
  }
  double elapsedMs(DeviceEvent from, DeviceEvent to) override {
    EXPECT_TRUE(timing_.at(from) && timing_.at(to)) << "elapsed time of an event without timing";
    if (!times.count(from) || !times.count(to))
      DDPRUN_THROW(InvalidArgument, "event not completed");
    return times.at(to) - times.at(from);
  }
  Work allReduce(const AllReduceOptions& o, const OrderedEvents& ev) override {
    EXPECT_EQ(o.input, nullptr);
    log_.push_back("allReduce " + std::to_string(o.count) + " x " + dtypeName(o.dtype) +
                   events(ev));
    AllReduceOptions host = o;
    host.device = Device::kCpu;
    ProcessGroup& pg = pg_;
    queue_.push_back({ev.done, [&pg, host] { runtime::allReduce(pg, host); }});
    return issued();
  }
  Work broadcast(const std::vector<std::pair<void*, size_t>>& buffers, int root,
                 const OrderedEvents& ev) override {
    log_.push_back("broadcast " + std::to_string(buffers.size()) + " from " +
                   std::to_string(root) + events(ev));
    ProcessGroup& pg = pg_;
    queue_.push_back({ev.done, [&pg, buffers, root] {
                        for (const auto& [p, bytes] : buffers)
                          runtime::broadcast(pg, {.buffer = p, .count = bytes,
                                                  .dtype = DType::kUInt8, .root = root});
                      }});
    return issued();
  }

  // Runs the communication stream's queue.
  void runDevice() {
    for (auto& op : queue_) op.run();
    queue_.clear();
  }
  size_t queued() const { return queue_.size(); }
  bool timingEvent(DeviceEvent e) const { return timing_.at(e); }
  static DeviceEvent event(int n) { return reinterpret_cast<DeviceEvent>(static_cast<uintptr_t>(n)); }

  struct Counts {
    int created = 0, destroyed = 0;
  };
  bool runOnWait = false;
  std::shared_ptr<Counts> counts = std::make_shared<Counts>();
  std::map<DeviceEvent, double> times;  // completed events' timestamps (ms)

 private:
  struct Op {
    DeviceEvent done;
    std::function<void()> run;
  };
  static std::string name(DeviceEvent e) {
    return "e" + std::to_string(reinterpret_cast<uintptr_t>(e));
  }
  static std::string events(const OrderedEvents& ev) {
    std::string s;
    if (ev.after) s += " after " + name(ev.after);
    if (ev.start) s += " start " + name(ev.start);
    if (ev.done) s += " done " + name(ev.done);
    return s;
  }
  // A Work that is complete (issued): an empty operation on the group.
  Work issued() { return internal::run(pg_, "fake issue", [] {}, true); }

  ProcessGroup& pg_;
  Lines& log_;
  std::vector<Op> queue_;
  std::map<DeviceEvent, bool> timing_;
};

struct Fixture {
  Lines log;
  FakeDevice* device = nullptr;  // owned by the reducer
  std::unique_ptr<Reducer> reducer;

  Fixture(ProcessGroup& pg, std::vector<size_t> counts, ReducerOptions opts) {
    std::vector<ParamInfo> ps;
    for (size_t i = 0; i < counts.size(); ++i) ps.push_back({"p" + std::to_string(i), counts[i]});
    reducer = std::make_unique<Reducer>(pg, ps, opts, std::make_unique<FakeMemory>(pg, log));
    auto dev = std::make_unique<FakeDevice>(pg, log);
    device = dev.get();
    internal::ReducerAccess::setDeviceCollectives(*reducer, std::move(dev));
  }
  // Writes (rank + 1) * (i + 1) into every gradient, marking them in `order`.
  void backward(int rank, const std::vector<size_t>& order) {
    for (size_t i : order) {
      float* g = reducer->grad(i);
      for (size_t j = 0; j < reducer->param(i).count; ++j)
        g[j] = static_cast<float>((rank + 1) * (i + 1));
      reducer->markReady(i);
    }
  }
};

// Three parameters of 100 floats, one per bucket: buckets {2}, {1}, {0}.
constexpr ReducerOptions kThreeBuckets{.bucketCapBytes = 400, .firstBucketBytes = 400,
                                       .rebuildBuckets = false};

TEST(ReducerStreamTest, BucketsWaitOnTheDeviceAndFinalizeNeverWaitsForTheDevice) {
  runRanks(2, [](ProcessGroup& pg) {
    Fixture f(pg, {100, 100, 100}, kThreeBuckets);
    Reducer& r = *f.reducer;
    ASSERT_TRUE(r.streamOrdered());
    ASSERT_EQ(r.numBuckets(), 3u);
    f.backward(pg.rank(), {2, 1, 0});
    // Buckets 0 and 1 launched from markReady; the last one waits for finalize.
    EXPECT_EQ(f.log, (Lines{"record e1", "allReduce 100 x float32 after e1 done e2",
                            "record e3", "allReduce 100 x float32 after e3 done e4"}));
    f.log.clear();
    r.finalize();
    EXPECT_EQ(f.log, (Lines{"record e5", "allReduce 100 x float32 after e5 done e6", "wait e2",
                            "wait e4", "wait e6"}));
    // finalize() returned with every all-reduce still queued on the device.
    EXPECT_EQ(f.device->queued(), 3u);
    EXPECT_FLOAT_EQ(r.grad(0)[0], static_cast<float>(pg.rank() + 1));
    f.device->runDevice();
    for (size_t i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(r.grad(i)[7], 1.5f * (i + 1)) << i;
    for (int e = 1; e <= 6; ++e) EXPECT_FALSE(f.device->timingEvent(FakeDevice::event(e)));

    // The next iteration reuses the same events.
    f.log.clear();
    r.zeroGrad();
    f.backward(pg.rank(), {2, 1, 0});
    r.finalize();
    EXPECT_EQ(f.device->counts->created, 6);
    EXPECT_EQ(f.log.back(), "wait e6");
    f.device->runDevice();
    EXPECT_FLOAT_EQ(r.grad(2)[0], 4.5f);
  });
}

TEST(ReducerStreamTest, BucketsLaunchInIndexOrderWhateverOrderGradientsArrive) {
  runRanks(2, [](ProcessGroup& pg) {
    Fixture f(pg, {100, 100, 100}, kThreeBuckets);
    f.backward(pg.rank(), {0, 1});  // buckets 2 and 1 complete, bucket 0 not yet
    EXPECT_TRUE(f.log.empty());
    f.backward(pg.rank(), {2});
    EXPECT_EQ(f.log, (Lines{"record e1", "allReduce 100 x float32 after e1 done e2",
                            "record e3", "allReduce 100 x float32 after e3 done e4"}));
    f.reducer->finalize();
    f.device->runDevice();
  });
}

TEST(ReducerStreamTest, HookCompressesBeforeTheReadyEventAndDecompressesAfterTheWait) {
  runRanks(1, [](ProcessGroup& pg) {
    Fixture f(pg, {64}, {.hook = CommHook::kBf16});
    f.backward(pg.rank(), {0});
    f.reducer->finalize();
    EXPECT_EQ(f.log, (Lines{"compress", "record e1", "allReduce 64 x bfloat16 after e1 done e2",
                            "wait e2", "decompress"}));
  });
}

TEST(ReducerStreamTest, OneRankWithoutHookTouchesNoDevice) {
  runRanks(1, [](ProcessGroup& pg) {
    Fixture f(pg, {10, 10}, {.bucketCapBytes = 40, .firstBucketBytes = 40});
    f.backward(0, {1, 0});
    f.reducer->finalize();
    EXPECT_TRUE(f.log.empty());
    EXPECT_EQ(f.device->counts->created, 0);
    EXPECT_FLOAT_EQ(f.reducer->grad(1)[3], 2.0f);
  });
}

TEST(ReducerStreamTest, RebuildCopiesAfterTheWaitAndLaterIterationsAgree) {
  runRanks(2, [](ProcessGroup& pg) {
    Fixture f(pg, {3, 5, 2, 4}, {.bucketCapBytes = 16, .firstBucketBytes = 8});
    f.device->runOnWait = true;  // the compute stream sees what it waited for
    const std::vector<size_t> order = {1, 3, 0, 2};
    const uint64_t before = f.reducer->layoutVersion();
    f.backward(pg.rank(), order);
    f.reducer->finalize();
    EXPECT_NE(f.reducer->layoutVersion(), before);
    EXPECT_EQ(f.reducer->bucketParams(0).front(), 1u);
    for (size_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(f.reducer->grad(i)[1], 1.5f * (i + 1)) << i;
    f.reducer->zeroGrad();
    f.backward(pg.rank(), order);
    f.reducer->finalize();
    EXPECT_EQ(f.device->queued(), 0u);
    for (size_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(f.reducer->grad(i)[0], 1.5f * (i + 1)) << i;
  });
}

TEST(ReducerStreamTest, DeviceTimingsComeFromTimingEventsOfTheLastIteration) {
  runRanks(2, [](ProcessGroup& pg) {
    // Two buckets: {1} (launched from markReady) and {0} (from finalize).
    Fixture f(pg, {100, 100}, {.bucketCapBytes = 400, .firstBucketBytes = 400,
                               .rebuildBuckets = false});
    Reducer& r = *f.reducer;
    f.backward(pg.rank(), {1, 0});
    r.finalize();
    f.device->runDevice();
    EXPECT_FALSE(r.deviceTimings().has_value()) << "timing was off";

    r.setDeviceTiming(true);
    f.log.clear();
    f.backward(pg.rank(), {1, 0});
    r.finalize();
    f.device->runDevice();
    // Plain events e1..e4 of the first iteration; timing ones from e5 on:
    // bucket 0 ready e5, done e6, start e7; backward end e8; bucket 1 e9..e11.
    EXPECT_EQ(f.log, (Lines{"record e5", "allReduce 100 x float32 after e5 start e7 done e6",
                            "record e8", "record e9",
                            "allReduce 100 x float32 after e9 start e11 done e10", "wait e6",
                            "wait e10"}));
    for (int e = 5; e <= 11; ++e) EXPECT_TRUE(f.device->timingEvent(FakeDevice::event(e))) << e;
    EXPECT_THROW(r.deviceTimings(), InvalidArgument);  // events not completed
    const double t0 = 100;  // any origin: times are relative to bucket 0's ready
    for (auto [e, t] : std::vector<std::pair<int, double>>{
             {5, 0}, {7, 1}, {6, 3}, {8, 4}, {9, 4.5}, {11, 5}, {10, 6}})
      f.device->times[FakeDevice::event(e)] = t0 + t;
    const auto t = r.deviceTimings();
    ASSERT_TRUE(t.has_value());
    ASSERT_EQ(t->buckets.size(), 2u);
    EXPECT_EQ(t->buckets[0].bytes, 400u);
    EXPECT_EQ(t->buckets[0].wireBytes, 400u);
    EXPECT_DOUBLE_EQ(t->buckets[0].readyMs, 0);
    EXPECT_DOUBLE_EQ(t->buckets[0].startMs, 1);
    EXPECT_DOUBLE_EQ(t->buckets[0].endMs, 3);
    EXPECT_DOUBLE_EQ(t->buckets[1].readyMs, 4.5);
    EXPECT_DOUBLE_EQ(t->buckets[1].startMs, 5);
    EXPECT_DOUBLE_EQ(t->buckets[1].endMs, 6);
    EXPECT_DOUBLE_EQ(t->backwardEndMs, 4);
    EXPECT_DOUBLE_EQ(t->commMs, 3);
    EXPECT_DOUBLE_EQ(t->hiddenMs, 2);
    EXPECT_DOUBLE_EQ(t->hiddenFraction, 2.0 / 3.0);

    // Off again: the plain events come back, no timings for that iteration.
    r.setDeviceTiming(false);
    f.log.clear();
    f.backward(pg.rank(), {1, 0});
    r.finalize();
    f.device->runDevice();
    EXPECT_EQ(f.log.front(), "record e1");
    EXPECT_FALSE(r.deviceTimings().has_value());
  });
}

TEST(ReducerStreamTest, HiddenFractionCountsTheCommunicationBeforeBackwardEnded) {
  DeviceTimings t;
  t.backwardEndMs = 10;
  t.buckets = {{.startMs = 1, .endMs = 3}, {.startMs = 9, .endMs = 13}, {.startMs = 12, .endMs = 14}};
  t.computeTotals();
  EXPECT_DOUBLE_EQ(t.commMs, 2 + 4 + 2);
  EXPECT_DOUBLE_EQ(t.hiddenMs, 2 + 1 + 0);
  EXPECT_DOUBLE_EQ(t.hiddenFraction, 3.0 / 8.0);
  t.buckets = {{.readyMs = 2, .startMs = 2, .endMs = 2}};  // no communication
  t.computeTotals();
  EXPECT_DOUBLE_EQ(t.commMs, 0);
  EXPECT_DOUBLE_EQ(t.hiddenFraction, 1.0);
}

TEST(ReducerStreamTest, BroadcastBuffersIsOneOrderedBroadcastFromRankZero) {
  runRanks(2, [](ProcessGroup& pg) {
    Fixture f(pg, {4}, {});
    std::vector<float> a(5, static_cast<float>(pg.rank() + 1)), b(3, 10.0f * (pg.rank() + 1));
    std::vector<float> none;
    f.reducer->broadcastBuffers({{a.data(), a.size()}, {none.data(), 0}, {b.data(), b.size()}});
    EXPECT_EQ(f.log, (Lines{"record e1", "broadcast 2 from 0 after e1 done e2", "wait e2"}));
    EXPECT_EQ(f.device->queued(), 1u);
    f.device->runDevice();
    EXPECT_EQ(a, std::vector<float>(5, 1.0f));
    EXPECT_EQ(b, std::vector<float>(3, 10.0f));
    f.log.clear();
    f.reducer->broadcastBuffers({{a.data(), a.size()}});
    EXPECT_EQ(f.log.front(), "record e1");  // the same two events every step
    f.device->runDevice();
  });
}

TEST(ReducerStreamTest, CpuMemoryNeverTakesTheDevicePath) {
  runRanks(2, [](ProcessGroup& pg) {
    Lines log;
    Reducer r(pg, {{"w", 6}, {"b", 2}}, {.bucketCapBytes = 8, .firstBucketBytes = 8});
    internal::ReducerAccess::setDeviceCollectives(r, std::make_unique<FakeDevice>(pg, log));
    EXPECT_FALSE(r.streamOrdered());
    r.setDeviceTiming(true);
    for (size_t i : {1, 0}) {
      float* g = r.grad(i);
      for (size_t j = 0; j < r.param(i).count; ++j) g[j] = static_cast<float>(pg.rank() + 1);
      r.markReady(i);
    }
    r.finalize();  // waits on the host: the average is there at once
    EXPECT_FLOAT_EQ(r.grad(0)[5], 1.5f);
    EXPECT_FLOAT_EQ(r.grad(1)[1], 1.5f);
    std::vector<float> buf(3, static_cast<float>(pg.rank()));
    r.broadcastBuffers({{buf.data(), buf.size()}});
    EXPECT_EQ(buf, std::vector<float>(3, 0.0f));
    EXPECT_TRUE(log.empty());
    EXPECT_FALSE(r.deviceTimings().has_value());
  });
}

TEST(ReducerStreamTest, EveryEventIsDestroyedWithTheReducer) {
  runRanks(1, [](ProcessGroup& pg) {
    Fixture f(pg, {8}, {.hook = CommHook::kFp16});
    const auto counts = f.device->counts;
    f.reducer->setDeviceTiming(true);
    f.backward(0, {0});
    f.reducer->finalize();
    f.reducer.reset();
    EXPECT_EQ(counts->created, 4);  // ready, done, start, backward end
    EXPECT_EQ(counts->destroyed, counts->created);
  });
}

}  // namespace
}  // namespace ddprun::runtime
