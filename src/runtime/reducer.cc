#include "ddprun/runtime/reducer.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <mutex>
#include <sstream>

#include "ddprun/common/error.h"
#include "ddprun/common/hash.h"
#include "device_order.h"
#include "pg_internal.h"

namespace ddprun::runtime {

const char* commHookName(CommHook h) {
  switch (h) {
    case CommHook::kNone: return "none";
    case CommHook::kFp16: return "fp16";
    case CommHook::kBf16: return "bf16";
  }
  return "?";
}

std::optional<CommHook> parseCommHook(std::string_view name) {
  if (name == "none") return CommHook::kNone;
  if (name == "fp16" || name == "float16") return CommHook::kFp16;
  if (name == "bf16" || name == "bfloat16") return CommHook::kBf16;
  return std::nullopt;
}

double ReducerStats::hiddenFraction() const {
  if (commTime.count() <= 0) return 1.0;
  // What the training thread did not have to wait for at the end of
  // backward ran while backward computed. (Timestamps of the collectives
  // against backwardEnd say the same on an idle machine, but with more ranks
  // than cores a descheduled thread moves them by more than they last.)
  return std::clamp(1.0 - waitTime / commTime, 0.0, 1.0);
}

void DeviceTimings::computeTotals() {
  commMs = hiddenMs = 0;
  for (const Bucket& b : buckets) {
    const double d = std::max(0.0, b.endMs - b.startMs);
    commMs += d;
    hiddenMs += std::clamp(backwardEndMs - b.startMs, 0.0, d);
  }
  hiddenFraction = commMs > 0 ? hiddenMs / commMs : 1.0;
}

// ---------------------------------------------------------------- CPU memory
namespace {
constexpr size_t kGradAlign = 64;  // floats

class CpuGradientMemory final : public GradientMemory {
 public:
  explicit CpuGradientMemory(ProcessGroup& pg) : pg_(pg) {}
  Device device() const override { return Device::kCpu; }
  void* alloc(size_t bytes) override {
    void* p = pg_.allocShared(std::max<size_t>(bytes, 64));
    std::memset(p, 0, bytes);
    return p;
  }
  void free(void* p) override { pg_.freeShared(p); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void zero(void* p, size_t bytes) override {
    if (bytes) std::memset(p, 0, bytes);
  }
  void compress(const float* src, void* dst16, size_t n, float scale, DType t) override {
    auto* d = static_cast<uint16_t*>(dst16);
    // PyTorch's fp16_compress_hook casts first, then divides in 16 bits.
    if (t == DType::kFloat16)
      for (size_t i = 0; i < n; ++i) d[i] = floatToHalf(halfToFloat(floatToHalf(src[i])) * scale);
    else
      for (size_t i = 0; i < n; ++i) d[i] = floatToBf16(bf16ToFloat(floatToBf16(src[i])) * scale);
  }
  void decompress(const void* src16, float* dst, size_t n, DType t) override {
    const auto* s = static_cast<const uint16_t*>(src16);
    if (t == DType::kFloat16)
      for (size_t i = 0; i < n; ++i) dst[i] = halfToFloat(s[i]);
    else
      for (size_t i = 0; i < n; ++i) dst[i] = bf16ToFloat(s[i]);
  }

 private:
  ProcessGroup& pg_;
};

DType hookDType(CommHook h) { return h == CommHook::kFp16 ? DType::kFloat16 : DType::kBFloat16; }

// The seed of the parameter hash: not FNV's offset basis (a digit short of
// it), kept so that the hash, compared across ranks, stays what it was
// (pinned in tests/unit/common/hash_test.cc).
constexpr uint64_t kParamHashSeed = 1469598103934665603ull;
}  // namespace

std::unique_ptr<GradientMemory> makeCpuGradientMemory(ProcessGroup& pg) {
  return std::make_unique<CpuGradientMemory>(pg);
}

// ------------------------------------------------------- stream ordering
// The events of stream-ordered memory. One set per bucket index and kind
// (plain; timing-enabled while device timing is on), created on first use
// and reused every iteration: an event is re-recorded only after the waits on
// its previous record were issued (finalize() waits for every collective's
// issue). The sets never shrink, so deviceTimings() can still read the last
// iteration's events after a rebuild changed the layout.
struct Reducer::Ordered {
  using Event = internal::DeviceEvent;
  struct Events {
    Event ready = nullptr;  // compute stream: the bucket's gradients are written
    Event start = nullptr;  // comm stream: past the wait for `ready` (timing only)
    Event done = nullptr;   // comm stream: the collective finished
  };
  // What deviceTimings() reads: the last synchronised iteration's buckets.
  struct Last {
    bool valid = false;  // that iteration ran with timing events
    std::vector<size_t> bytes, wireBytes;
  };

  explicit Ordered(ProcessGroup& g) : pg(g) {}
  ~Ordered() {
    if (!dc) return;
    for (auto* set : {&plain, &timed})
      for (Events& e : *set)
        for (Event ev : {e.ready, e.start, e.done}) dc->destroyEvent(ev);
    for (Event ev : {backwardEnd, bufReady, bufDone}) dc->destroyEvent(ev);
  }
  Ordered(const Ordered&) = delete;
  Ordered& operator=(const Ordered&) = delete;

  internal::DeviceCollectives& collectives() {
    if (!dc) dc = internal::makeDeviceCollectives(pg);
    return *dc;
  }
  // Bucket b's events of the current iteration's kind.
  Events& events(size_t b) {
    std::vector<Events>& v = iterTiming ? timed : plain;
    if (v.size() <= b) v.resize(b + 1);
    Events& e = v[b];
    if (!e.ready) e.ready = collectives().createEvent(iterTiming);
    if (!e.done) e.done = collectives().createEvent(iterTiming);
    if (iterTiming && !e.start) e.start = collectives().createEvent(true);
    return e;
  }
  Event event(Event& slot, bool timing) {
    if (!slot) slot = collectives().createEvent(timing);
    return slot;
  }

  ProcessGroup& pg;
  std::unique_ptr<internal::DeviceCollectives> dc;
  std::vector<Events> plain, timed;
  Event backwardEnd = nullptr;               // timing: the compute stream reached finalize()
  Event bufReady = nullptr, bufDone = nullptr;  // broadcastBuffers()
  bool iterTiming = false;  // this iteration records timing events (latched at its start)
  Last last;
};

namespace internal {
void ReducerAccess::setDeviceCollectives(Reducer& r, std::unique_ptr<DeviceCollectives> dc) {
  if (!r.ordered_) r.ordered_ = std::make_unique<Reducer::Ordered>(r.pg_);
  DDPRUN_CHECK(r.ordered_->plain.empty() && r.ordered_->timed.empty(),
               "device collectives replaced after the reducer used its own");
  r.ordered_->dc = std::move(dc);
}
}  // namespace internal

// ---------------------------------------------------------------- Reducer
Reducer::Reducer(ProcessGroup& pg, std::vector<ParamInfo> params, ReducerOptions opts,
                 std::unique_ptr<GradientMemory> memory)
    : pg_(pg), params_(std::move(params)), opts_(opts), mem_(std::move(memory)) {
  if (!mem_) mem_ = makeCpuGradientMemory(pg_);
  stream_ = mem_->stream();
  if (stream_) ordered_ = std::make_unique<Ordered>(pg_);
  DDPRUN_CHECK(!params_.empty(), "a Reducer needs at least one parameter");
  DDPRUN_CHECK(opts_.bucketCapBytes > 0 && opts_.firstBucketBytes > 0,
               "bucket sizes must be positive");
  checkSameParams();
  std::vector<size_t> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  assign(order, /*reverse=*/true);
  ready_.assign(params_.size(), 0);
  resetIteration();
}

Reducer::~Reducer() {
  for (auto& b : buckets_)
    if (b.work.valid()) try {
        b.work.wait();
      } catch (...) {
      }
  // Collectives issued in an iteration that never reached finalize() (an
  // exception mid-backward): the memory's stream waits for them, so freeing
  // the buckets (after that stream) cannot pull memory from under them.
  if (stream_ && ordered_)
    for (size_t b = 0; b < buckets_.size(); ++b)
      if (buckets_[b].issued) try {
          ordered_->collectives().streamWait(stream_, ordered_->events(b).done);
        } catch (...) {
        }
  releaseBuckets();
  ordered_.reset();
}

// Every rank must register the same parameters: compare count, total size
// and a hash of the names and sizes (one all-gather at construction).
void Reducer::checkSameParams() {
  uint64_t h = kParamHashSeed;
  size_t total = 0;
  for (const auto& p : params_) {
    h = fnv1a(p.name + "#" + std::to_string(p.count), h);
    total += p.count;
  }
  const int64_t mine[3] = {static_cast<int64_t>(params_.size()), static_cast<int64_t>(total),
                           static_cast<int64_t>(h)};
  std::vector<int64_t> all(3 * static_cast<size_t>(pg_.size()));
  allGather(pg_, {.input = mine, .output = all.data(), .count = 3, .counts = {},
                  .dtype = DType::kInt64});
  for (int r = 0; r < pg_.size(); ++r)
    if (!std::equal(mine, mine + 3, all.begin() + 3 * r))
      DDPRUN_THROW(InvalidArgument, "rank ", pg_.rank(), " registered ", params_.size(),
                   " parameters (", total, " elements) but rank ", r, " registered ", all[3 * r],
                   " (", all[3 * r + 1], " elements) or other names: every rank must build the "
                   "same model");
}

// PyTorch's compute_bucket_assignment_by_size: walk the parameters in
// `order`, close a bucket once it reaches its cap (the first bucket's cap is
// firstBucketBytes, later ones bucketCapBytes). `reverse` then flips the
// bucket list (initial layout: the first-registered parameters, in the
// small first bucket, are reduced last).
void Reducer::assign(const std::vector<size_t>& order, bool reverse) {
  std::vector<std::vector<size_t>> groups(1);
  size_t bytes = 0;
  for (size_t i : order) {
    groups.back().push_back(i);
    bytes += params_[i].count * sizeof(float);
    const size_t cap = groups.size() == 1 ? opts_.firstBucketBytes : opts_.bucketCapBytes;
    if (bytes >= cap) {
      groups.emplace_back();
      bytes = 0;
    }
  }
  if (groups.back().empty()) groups.pop_back();
  if (reverse) std::reverse(groups.begin(), groups.end());

  std::vector<Bucket> fresh(groups.size());
  slots_.assign(params_.size(), Slot{});
  for (size_t b = 0; b < groups.size(); ++b) {
    Bucket& bk = fresh[b];
    bk.params = groups[b];
    if (reverse) std::sort(bk.params.begin(), bk.params.end());
    for (size_t i : bk.params) {
      // Every gradient starts kGradAlign elements (256 bytes, cudaMalloc's
      // alignment) into its bucket, whatever the layout: libraries pick
      // kernels by pointer alignment, so a layout change (the rebuild after
      // the first iteration, which a resumed process has not done yet) must
      // not change which kernels write a gradient (seen on an H100: a
      // resumed run ended other bits). The padding stays zero.
      bk.count = (bk.count + kGradAlign - 1) / kGradAlign * kGradAlign;
      bk.offsets.push_back(bk.count);
      slots_[i] = Slot{b, bk.count};
      bk.count += params_[i].count;
    }
    bk.data = static_cast<float*>(mem_->alloc(bk.count * sizeof(float)));
    if (opts_.hook != CommHook::kNone) bk.half = mem_->alloc(bk.count * 2);
  }
  buckets_ = std::move(fresh);
  ++layoutVersion_;
}

void Reducer::releaseBuckets() {
  for (auto& b : buckets_) {
    if (b.data) mem_->free(b.data);
    if (b.half) mem_->free(b.half);
    b.data = nullptr;
    b.half = nullptr;
  }
}

float* Reducer::grad(size_t i) const {
  DDPRUN_CHECK(i < params_.size(), "parameter index ", i, " out of range");
  const Slot& s = slots_[i];
  return buckets_[s.bucket].data + s.offset;
}

void Reducer::zeroGrad() {
  for (auto& b : buckets_) mem_->zero(b.data, b.count * sizeof(float));
}

void Reducer::markReady(size_t i) {
  DDPRUN_CHECK(i < params_.size(), "parameter index ", i, " out of range");
  if (ready_[i])
    DDPRUN_THROW(InvalidArgument, "parameter '", params_[i].name,
                 "' was marked ready twice in one iteration: each parameter's gradient may be "
                 "reported once per backward");
  ready_[i] = 1;
  readyOrder_.push_back(i);
  if (!requireSync_) return;
  Bucket& b = buckets_[slots_[i].bucket];
  if (++b.pending == b.params.size()) launchReady();
}

// Buckets launch strictly in index order on every rank: a ready bucket waits
// for its predecessors (launching by readiness could pair different buckets
// across ranks).
//
// The last bucket is left for finalize(), which runs it on the training
// thread: its gradients are the last of backward, so nothing is left to
// overlap it with, and handing it to the group thread would only add a thread
// hop (most of a small all-reduce's latency) to every step.
void Reducer::launchReady() {
  while (nextLaunch_ + 1 < buckets_.size() &&
         buckets_[nextLaunch_].pending == buckets_[nextLaunch_].params.size()) {
    if (stream_)
      launchOrdered(nextLaunch_++);
    else
      launch(nextLaunch_++, /*inlineLast=*/false);
  }
}

// One bucket's all-reduce (average over ranks). Asynchronous: two markers on
// the group's queue timestamp its start and end for the statistics. Inline
// (the last bucket, from finalize): a blocking all-reduce on this thread.
void Reducer::launch(size_t b, bool inlineLast) {
  Bucket& bk = buckets_[b];
  // One slot per bucket, sized by the iteration's first launch, before any
  // marker of this iteration is queued: the group thread then writes only
  // into existing slots while this thread fills later ones (a push_back here
  // could reallocate under the group thread's write).
  if (b == 0) timing_->assign(buckets_.size(), ReducerStats::Bucket{});
  const size_t slot = b;
  const auto now = ReducerStats::Clock::now();
  (*timing_)[slot] = {bk.count * sizeof(float), now, now, now};
  if (pg_.size() == 1 && opts_.hook == CommHook::kNone) return;
  const AllReduceOptions o = collectiveOf(bk);
  if (inlineLast) {
    if (pg_.size() > 1) allReduce(pg_, o);
    (*timing_)[slot].finished = ReducerStats::Clock::now();
    return;
  }
  auto timing = timing_;
  internal::enqueue(pg_, "reducer timing", [timing, slot] {
    (*timing)[slot].started = ReducerStats::Clock::now();
  });
  if (pg_.size() > 1) allReduceAsync(pg_, o);
  bk.work = internal::enqueue(pg_, "reducer timing", [timing, slot] {
    (*timing)[slot].finished = ReducerStats::Clock::now();
  });
}

// The all-reduce of bucket `bk` (the average over ranks); with a hook, the
// bucket is first compressed (divided by the world size) into its 16-bit
// copy, which is summed instead.
AllReduceOptions Reducer::collectiveOf(Bucket& bk) {
  if (opts_.hook == CommHook::kNone)
    return {.output = bk.data, .count = bk.count, .op = ReduceOp::kAvg, .device = mem_->device()};
  mem_->compress(bk.data, bk.half, bk.count, 1.0f / static_cast<float>(pg_.size()),
                 hookDType(opts_.hook));
  return {.output = bk.half, .count = bk.count, .dtype = hookDType(opts_.hook),
          .op = ReduceOp::kSum, .device = mem_->device()};
}

// Stream-ordered memory: the bucket's "ready" event is recorded on the
// memory's stream after the kernels that wrote its gradients (and, with a
// hook, the compression); its all-reduce waits for that event on the device.
// The training thread goes on with backward at once: the collective is
// issued inline when the transport only enqueues (NCCL) and the group is
// idle, else on the group's thread. Without communication (one rank, no
// hook) only the timing record remains.
void Reducer::launchOrdered(size_t b) {
  Ordered& od = *ordered_;
  Bucket& bk = buckets_[b];
  if (b == 0) {
    timing_->assign(buckets_.size(), ReducerStats::Bucket{});
    od.iterTiming = deviceTiming_;
  }
  const auto now = ReducerStats::Clock::now();
  (*timing_)[b] = {bk.count * sizeof(float), now, now, now};
  const bool comm = pg_.size() > 1 || opts_.hook != CommHook::kNone;
  if (!comm && !od.iterTiming) return;
  const AllReduceOptions o = collectiveOf(bk);
  Ordered::Events& ev = od.events(b);
  internal::DeviceCollectives& dc = od.collectives();
  dc.record(ev.ready, stream_);
  if (!comm) return;
  bk.work = dc.allReduce(o, {ev.ready, od.iterTiming ? ev.start : nullptr, ev.done});
  bk.issued = true;
}

void Reducer::finalize() {
  if (!requireSync_) {  // no_sync: gradients stay local and accumulate
    for (auto& b : buckets_) b.pending = 0;
    resetIteration();
    return;
  }
  stats_.backwardEnd = ReducerStats::Clock::now();
  const std::string missing = unreadyNames();
  if (!missing.empty())
    DDPRUN_THROW(InvalidArgument, "parameters that received no gradient in this iteration: ",
                 missing, ". Every parameter must take part in computing the loss on every "
                 "rank (the reducer has no find_unused_parameters mode)");
  if (stream_)
    finalizeOrdered();
  else
    finalizeHost();
  ++iterations_;
  const bool doRebuild = opts_.rebuildBuckets && !rebuilt_;
  if (doRebuild) rebuild();
  resetIteration();
}

// The host waits for nothing on the device: every collective's issue (a
// thread hand-off at most), then the memory's stream waits for each
// bucket's completion event and decompresses after it.
void Reducer::finalizeOrdered() {
  Ordered& od = *ordered_;
  if (nextLaunch_ == 0) {  // nothing launched yet: the iteration starts here
    timing_->assign(buckets_.size(), ReducerStats::Bucket{});
    od.iterTiming = deviceTiming_;
  }
  if (od.iterTiming)
    od.collectives().record(od.event(od.backwardEnd, /*timing=*/true), stream_);
  while (nextLaunch_ < buckets_.size()) launchOrdered(nextLaunch_++);
  for (auto& bk : buckets_)
    if (bk.work.valid()) bk.work.wait();
  const auto issued = ReducerStats::Clock::now();
  od.last = Ordered::Last{};
  od.last.valid = od.iterTiming;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bk = buckets_[b];
    const size_t bytes = bk.count * sizeof(float);
    od.last.bytes.push_back(bytes);
    od.last.wireBytes.push_back(bk.issued ? (bk.half ? bytes / 2 : bytes) : 0);
    if (!bk.issued) continue;
    (*timing_)[b].finished = issued;
    od.collectives().streamWait(stream_, od.events(b).done);
    if (bk.half) mem_->decompress(bk.half, bk.data, bk.count, hookDType(opts_.hook));
  }
  stats_.waitTime = issued - stats_.backwardEnd;
  stats_.buckets = *timing_;
  stats_.commTime = {};
  for (const auto& t : stats_.buckets) stats_.commTime += t.finished - t.started;
}

// Host memory (no stream): the
// training thread waits for every bucket's all-reduce.
void Reducer::finalizeHost() {
  // Every gradient is ready: whatever is still unlaunched (the last bucket)
  // runs now; earlier ones are on the group's queue.
  while (nextLaunch_ < buckets_.size()) {
    const size_t b = nextLaunch_++;
    launch(b, /*inlineLast=*/b + 1 == buckets_.size());
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bk = buckets_[b];
    if (bk.work.valid()) bk.work.wait();
    if (bk.half) mem_->decompress(bk.half, bk.data, bk.count, hookDType(opts_.hook));
  }
  const auto done = ReducerStats::Clock::now();
  stats_.waitTime = done - stats_.backwardEnd;
  stats_.buckets = *timing_;
  stats_.commTime = {};
  for (const auto& t : stats_.buckets) stats_.commTime += t.finished - t.started;
}

void Reducer::resetIteration() {
  for (auto& b : buckets_) {
    b.pending = 0;
    b.work = Work();
    b.issued = false;
  }
  std::fill(ready_.begin(), ready_.end(), 0);
  readyOrder_.clear();
  nextLaunch_ = 0;
  timing_ = std::make_shared<std::vector<ReducerStats::Bucket>>();
}

// Rebuild once in the order gradients became ready. Rank 0's order wins
// (broadcast), so every rank computes the same layout; gradients move into
// the new buckets (they may hold accumulated values the optimizer still
// needs).
void Reducer::rebuild() {
  rebuilt_ = true;
  std::vector<int64_t> order(readyOrder_.begin(), readyOrder_.end());
  broadcast(pg_, {.buffer = order.data(), .count = order.size(), .dtype = DType::kInt64});
  std::vector<size_t> ord(order.begin(), order.end());
  std::vector<Bucket> old = std::move(buckets_);
  std::vector<Slot> oldSlots = slots_;
  assign(ord, /*reverse=*/false);
  for (size_t i = 0; i < params_.size(); ++i)
    mem_->copy(grad(i), old[oldSlots[i].bucket].data + oldSlots[i].offset,
               params_[i].count * sizeof(float));
  for (auto& b : old) {
    mem_->free(b.data);
    if (b.half) mem_->free(b.half);
  }
}

std::string Reducer::unreadyNames() const {
  std::ostringstream os;
  int n = 0;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!ready_[i]) os << (n++ ? ", " : "") << "'" << params_[i].name << "'";
  return os.str();
}

std::optional<DeviceTimings> Reducer::deviceTimings() const {
  if (!stream_ || !ordered_ || !ordered_->last.valid) return std::nullopt;
  Ordered& od = *ordered_;
  internal::DeviceCollectives& dc = od.collectives();
  const Ordered::Event origin = od.timed.at(0).ready;
  DeviceTimings t;
  for (size_t b = 0; b < od.last.bytes.size(); ++b) {
    const Ordered::Events& e = od.timed.at(b);
    DeviceTimings::Bucket x{.bytes = od.last.bytes[b], .wireBytes = od.last.wireBytes[b]};
    x.readyMs = dc.elapsedMs(origin, e.ready);
    x.startMs = x.endMs = x.readyMs;
    if (x.wireBytes) {
      x.startMs = dc.elapsedMs(origin, e.start);
      x.endMs = dc.elapsedMs(origin, e.done);
    }
    t.buckets.push_back(x);
  }
  t.backwardEndMs = dc.elapsedMs(origin, od.backwardEnd);
  t.computeTotals();
  return t;
}

// Stream-ordered memory: one ordered broadcast of all arrays, after the work
// issued so far to the memory's stream (the previous step's optimizer and
// batch norm updates), and the stream waits for it before what comes next
// (the forward).
void Reducer::broadcastBuffers(const std::vector<std::pair<float*, size_t>>& arrays) {
  if (!stream_) {
    broadcastFromRank0(pg_, arrays, mem_->device());
    return;
  }
  if (pg_.size() == 1) return;
  std::vector<std::pair<void*, size_t>> buffers;
  for (const auto& [p, n] : arrays)
    if (n) buffers.emplace_back(p, n * sizeof(float));
  if (buffers.empty()) return;
  Ordered& od = *ordered_;
  internal::DeviceCollectives& dc = od.collectives();
  const Ordered::Event ready = od.event(od.bufReady, false);
  const Ordered::Event done = od.event(od.bufDone, false);
  dc.record(ready, stream_);
  dc.broadcast(buffers, 0, {ready, nullptr, done}).wait();  // issued
  dc.streamWait(stream_, done);
}

void broadcastFromRank0(ProcessGroup& pg, const std::vector<std::pair<float*, size_t>>& arrays,
                        Device device) {
  if (pg.size() == 1) return;
  std::vector<Work> works;
  for (const auto& [p, n] : arrays)
    if (n) works.push_back(broadcastAsync(pg, {.buffer = p, .count = n, .device = device}));
  for (auto& w : works) w.wait();
}

}  // namespace ddprun::runtime
