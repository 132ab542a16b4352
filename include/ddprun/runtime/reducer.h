// The data-parallel gradient reducer: PyTorch DistributedDataParallel's
// mathematics for anyone's C++ training loop.
//
// Parameters are registered in model order. Their gradients live in bucket
// memory the reducer owns (from the process group's shared heap on CPU, so
// the all-reduce reads peers in place: "gradient as bucket view"); the
// training loop writes (accumulates) each gradient through grad(i). During
// backward the loop calls markReady(i) as soon as parameter i's gradient is
// final; when the last gradient of a bucket is ready, that bucket's
// asynchronous all-reduce (average over ranks) starts while backward goes on.
// finalize() at the end of backward waits for every bucket.
//
// Device memory with a stream (GradientMemory::stream(), the CUDA trainer's)
// is ordered on streams instead: a bucket's all-reduce waits on the device
// for an event recorded on the compute stream when the bucket launches, and
// finalize() makes the compute stream wait for every bucket's completion
// event rather than waiting itself. The training thread waits only for the
// collectives to have been issued: with NCCL an enqueue; with the IPC and
// staged transports the collective runs on the process group's thread (host
// barriers between ranks are part of it) and the hand-off returns when it is
// done. setDeviceTiming() and deviceTimings() measure the overlap from
// device timestamps.
//
// Within a bucket every gradient starts 256 bytes aligned (zero padding
// between parameters), so its alignment never depends on the layout.
// Buckets: bucketCapBytes (default 25 MiB) each, filled in reverse
// registration order (the order gradients usually become ready), with the
// bucket of the first-registered parameters (reduced last) capped at
// firstBucketBytes (1 MiB) so the tail after backward is short. After the
// first synchronised iteration the buckets are rebuilt once in the order the
// gradients actually became ready (rank 0's order, broadcast so every rank
// agrees). Buckets are launched strictly in bucket order on every rank.
//
// A parameter that received no gradient in a synchronised iteration is an
// error naming it (like PyTorch without find_unused_parameters), not a hang.
//
// Thread-safety: one training thread drives a Reducer (markReady, finalize,
// zeroGrad, broadcastBuffers, the device timing calls). The communication
// runs on the process group's thread (stream-ordered NCCL collectives are
// issued inline on the training thread when the group is idle: an enqueue).
// Preconditions: every rank registers the same parameters (names and sizes,
// checked at construction) and runs the same sequence of iterations.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddprun/runtime/collectives.h"
#include "ddprun/runtime/process_group.h"

namespace ddprun::runtime {

namespace internal {
struct ReducerAccess;  // src/runtime/device_order.h: tests substitute the device collectives
}

// Communication hook applied to each bucket (PyTorch's default_hooks):
// kFp16/kBf16 compress the bucket to 16 bits (divided by the world size
// first), all-reduce the half-size buffer and decompress.
enum class CommHook : uint8_t { kNone, kFp16, kBf16 };
const char* commHookName(CommHook h);
std::optional<CommHook> parseCommHook(std::string_view name);  // none, fp16, bf16

// Where gradient buckets live and the few element operations the reducer
// needs on them. The default (CPU) allocates from the process group's shared
// heap; a device backend (CUDA) supplies its own implementation.
class GradientMemory {
 public:
  virtual ~GradientMemory() = default;
  virtual Device device() const = 0;
  virtual void* alloc(size_t bytes) = 0;  // zero-filled
  virtual void free(void* p) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  // dst16[i] = to16(src[i] * scale); dst[i] = float(src16[i]).
  virtual void compress(const float* src, void* dst16, size_t n, float scale, DType t) = 0;
  virtual void decompress(const void* src16, float* dst, size_t n, DType t) = 0;
  // The device stream (a cudaStream_t) on which the training loop writes the
  // gradients and runs the optimizer, and on which this memory's own
  // operations run. Non-null: the reducer orders its collectives on streams
  // (see the file comment); the memory's device must be the runtime's
  // (cudaSelectedDevice()). Null (the default): memory the host may hand to
  // the collectives at once (CPU).
  virtual void* stream() const { return nullptr; }
};
std::unique_ptr<GradientMemory> makeCpuGradientMemory(ProcessGroup& pg);

struct ReducerOptions {
  size_t bucketCapBytes = size_t{25} << 20;
  size_t firstBucketBytes = size_t{1} << 20;
  CommHook hook = CommHook::kNone;
  bool rebuildBuckets = true;  // once, after the first synchronised iteration
};

struct ParamInfo {
  std::string name;
  size_t count = 0;  // float32 elements
};

// What the last synchronised iteration's communication did, for the
// step-time breakdown and the overlap measurement. Times are steady_clock.
// With stream-ordered device memory these are host times of the issue
// (started/finished bracket the issue of the collective, not its run on the
// device) and hiddenFraction() says nothing: use Reducer::deviceTimings().
struct ReducerStats {
  using Clock = std::chrono::steady_clock;
  struct Bucket {
    size_t bytes = 0;
    Clock::time_point launched;  // issued: markReady of its last gradient (the last
                                 // bucket: finalize)
    Clock::time_point started;   // the all-reduce began on the group thread
    Clock::time_point finished;  // the all-reduce ended
  };
  std::vector<Bucket> buckets;                // in launch order
  Clock::time_point backwardEnd;              // finalize() was called
  std::chrono::duration<double> waitTime{};   // finalize() blocked this long
  std::chrono::duration<double> commTime{};   // sum of all-reduce durations
  // Fraction of the communication the training thread did not wait for:
  // 1 - waitTime / commTime, clamped to [0, 1].
  double hiddenFraction() const;
};

// Device timestamps of one synchronised iteration (Reducer::deviceTimings()),
// in milliseconds relative to the iteration's first ready event (bucket 0's).
struct DeviceTimings {
  struct Bucket {
    size_t bytes = 0;      // float32 gradient bytes of the bucket
    size_t wireBytes = 0;  // bytes all-reduced (half of `bytes` with a 16-bit hook; 0: none)
    double readyMs = 0;    // its gradients were written (the producer event)
    double startMs = 0;    // its all-reduce began on the communication stream
    double endMs = 0;      // its all-reduce finished (startMs == endMs: no communication)
  };
  std::vector<Bucket> buckets;  // in launch order
  double backwardEndMs = 0;     // the compute stream reached finalize()
  double commMs = 0;            // sum of endMs - startMs
  double hiddenMs = 0;          // the part of commMs before backwardEndMs
  double hiddenFraction = 1;    // hiddenMs / commMs; 1 without communication
  // Fills commMs, hiddenMs and hiddenFraction from buckets and backwardEndMs.
  void computeTotals();
};

class Reducer {
 public:
  // Collective: every rank constructs its Reducer at the same point. Throws
  // InvalidArgument when ranks registered different parameters.
  Reducer(ProcessGroup& pg, std::vector<ParamInfo> params, ReducerOptions opts = {},
          std::unique_ptr<GradientMemory> memory = nullptr);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  size_t numParams() const { return params_.size(); }
  const ParamInfo& param(size_t i) const { return params_[i]; }
  // Where parameter i's gradient lives. Moves when buckets are rebuilt:
  // re-read after finalize() when layoutVersion() changed.
  float* grad(size_t i) const;
  uint64_t layoutVersion() const { return layoutVersion_; }
  // Whether the next synchronised finalize() rebuilds the buckets (once,
  // after the first one, unless ReducerOptions::rebuildBuckets is off): the
  // layout version changes then.
  bool rebuildPending() const { return opts_.rebuildBuckets && !rebuilt_; }

  // Sets every gradient to zero (the optimizer's zero_grad).
  void zeroGrad();
  // Gradient accumulation without communication (PyTorch's no_sync): while
  // off, markReady only records and finalize() does not communicate.
  void setRequireSync(bool sync) { requireSync_ = sync; }
  bool requireSync() const { return requireSync_; }
  // Parameter i's gradient is final for this backward. Throws InvalidArgument
  // when it was already marked in this iteration.
  void markReady(size_t i);
  // End of backward: launches what is left, waits for every bucket, applies
  // the hook's decompression. Afterwards every gradient is the average over
  // ranks. Stream-ordered memory: "afterwards" is in the order of the
  // memory's stream (the host waits only for the collectives' issue, and the
  // stream waits for their completion before whatever is issued next).
  // Throws InvalidArgument naming parameters that got no gradient; rethrows
  // communication failures (a dead or stalled peer; with NCCL's stream
  // ordering seen when a later collective is issued, or after the timeout).
  void finalize();

  size_t numBuckets() const { return buckets_.size(); }
  // Parameter indices of bucket b, in memory order (bucket 0 launches first).
  const std::vector<size_t>& bucketParams(size_t b) const { return buckets_[b].params; }
  const ReducerStats& lastStats() const { return stats_; }
  int64_t iterations() const { return iterations_; }

  // True when the collectives are ordered on streams (GradientMemory::stream()).
  bool streamOrdered() const { return stream_ != nullptr; }
  // Stream-ordered memory: record device timestamps (timing-enabled events)
  // from the next iteration on, until turned off. Costs a little per bucket:
  // turn it on for a few profiled steps only. Call between iterations. No
  // effect on other memory.
  void setDeviceTiming(bool on) { deviceTiming_ = on; }
  bool deviceTiming() const { return deviceTiming_; }
  // The device timestamps of the last synchronised iteration, when it ran
  // with device timing on (else nullopt). Precondition: the device finished
  // that iteration (the caller synchronised it after finalize()) and the next
  // iteration has not launched a bucket yet; throws InvalidArgument when its
  // events have not completed.
  std::optional<DeviceTimings> deviceTimings() const;

  // Copies rank 0's values of these float32 arrays (in the memory's device:
  // batch norm buffers) to every rank: DDP's broadcast_buffers before each
  // training forward. Collective. Stream-ordered memory: the broadcast waits
  // on the device for the work issued so far to the memory's stream, and that
  // stream waits for the broadcast; the host waits only for its issue. Other
  // memory: broadcastFromRank0(pg, arrays, memory's device).
  void broadcastBuffers(const std::vector<std::pair<float*, size_t>>& arrays);

 private:
  struct Bucket {
    std::vector<size_t> params;
    std::vector<size_t> offsets;  // element offset of each param in the bucket
    size_t count = 0;
    float* data = nullptr;
    void* half = nullptr;  // compressed copy when a hook is on
    size_t pending = 0;
    Work work;
    bool issued = false;  // stream-ordered: its collective was issued this iteration
  };
  struct Ordered;  // stream ordering state (events, device collectives)
  friend struct internal::ReducerAccess;
  struct Slot {
    size_t bucket = 0;
    size_t offset = 0;
  };

  void assign(const std::vector<size_t>& order, bool reverse);
  void releaseBuckets();
  void launchReady();
  void launch(size_t b, bool inlineLast);
  AllReduceOptions collectiveOf(Bucket& bk);
  void launchOrdered(size_t b);
  void finalizeHost();
  void finalizeOrdered();
  void resetIteration();
  void rebuild();
  void checkSameParams();
  std::string unreadyNames() const;

  ProcessGroup& pg_;
  std::vector<ParamInfo> params_;
  ReducerOptions opts_;
  std::unique_ptr<GradientMemory> mem_;
  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;
  std::vector<char> ready_;
  std::vector<size_t> readyOrder_;
  size_t nextLaunch_ = 0;
  bool requireSync_ = true;
  bool rebuilt_ = false;
  uint64_t layoutVersion_ = 0;
  int64_t iterations_ = 0;
  ReducerStats stats_;
  std::shared_ptr<std::vector<ReducerStats::Bucket>> timing_;
  void* stream_ = nullptr;  // mem_->stream()
  bool deviceTiming_ = false;
  std::unique_ptr<Ordered> ordered_;
};

// Copies rank 0's values of these float32 arrays to every rank (DDP's
// construction-time broadcast of parameters and buffers). Collective.
void broadcastFromRank0(ProcessGroup& pg, const std::vector<std::pair<float*, size_t>>& arrays,
                        Device device = Device::kCpu);

// RAII no_sync: gradients accumulate locally while it lives.
class NoSyncGuard {
 public:
  explicit NoSyncGuard(Reducer& r) : r_(r), prev_(r.requireSync()) { r_.setRequireSync(false); }
  ~NoSyncGuard() { r_.setRequireSync(prev_); }
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;

 private:
  Reducer& r_;
  bool prev_;
};

}  // namespace ddprun::runtime
