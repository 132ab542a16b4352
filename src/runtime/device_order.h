// Collectives ordered on device streams: how the Reducer hands a bucket from
// the producer (backward, on the training loop's compute stream) to the
// communication and back to the consumer (the optimizer) without the host
// waiting for the device. Internal header.
//
// The ordering, per bucket:
//   compute stream: ... backward kernels ... record(ready)
//   comm stream:    wait(ready) [record(start)] all-reduce record(done)
//   compute stream: wait(done) ... optimizer ...
// Every wait is a device-side wait (cudaStreamWaitEvent). The host only
// waits for the *issue* of a collective: with NCCL that is an enqueue; with
// the IPC and staged transports the collective itself (host barriers between
// ranks are part of it) runs on the process group's thread, so "issued"
// means "done" there, but the training thread still never waits on a device
// event itself.
//
// Events and streams are opaque here (cudaEvent_t and cudaStream_t in the
// CUDA build), so the Reducer's logic compiles without CUDA and unit tests
// substitute a fake (tests/unit/runtime/reducer_stream_test.cc).
//
// Thread-safety: the methods may be called from any thread; an event must
// not be re-recorded before the waits issued on its previous record were
// issued (the Reducer waits for each collective's issue before reusing its
// events).
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "ddprun/runtime/collectives.h"
#include "ddprun/runtime/process_group.h"

namespace ddprun::runtime {

class Reducer;

namespace internal {

using DeviceEvent = void*;   // cudaEvent_t
using DeviceStream = void*;  // cudaStream_t

// The events of one ordered collective. The transport's stream waits on the
// device for `after` (its last record), records `start` once past that wait
// (optional: timing events only), runs the collective and records `done`
// after it. Null members are skipped.
struct OrderedEvents {
  DeviceEvent after = nullptr;
  DeviceEvent start = nullptr;
  DeviceEvent done = nullptr;
};

class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;
  // An event on the runtime's device; `timing`: with timestamps (for
  // elapsedMs), else the cheaper kind.
  virtual DeviceEvent createEvent(bool timing) = 0;
  virtual void destroyEvent(DeviceEvent e) noexcept = 0;
  // Records `e` on stream `s` after the work issued to it so far.
  virtual void record(DeviceEvent e, DeviceStream s) = 0;
  // Stream `s` waits (on the device) for the last record of `e`.
  virtual void streamWait(DeviceStream s, DeviceEvent e) = 0;
  // Milliseconds from `from` to `to`, both timing events whose records have
  // completed. Throws InvalidArgument when one has not completed yet.
  virtual double elapsedMs(DeviceEvent from, DeviceEvent to) = 0;
  // In-place all-reduce of o.output (o.input must be null), ordered by `ev`.
  // The Work completes once the collective was issued (see the file
  // comment); it fails as the collective's Work would.
  virtual Work allReduce(const AllReduceOptions& o, const OrderedEvents& ev) = 0;
  // Rank `root`'s contents of every buffer (pointer, bytes) to every rank,
  // as one ordered operation.
  virtual Work broadcast(const std::vector<std::pair<void*, size_t>>& buffers, int root,
                         const OrderedEvents& ev) = 0;
};

// Over the process group's CUDA transport (created on first use, as for
// every CUDA collective). Cheap: touches no device until used. Without CUDA
// it throws InvalidArgument saying the build has none.
std::unique_ptr<DeviceCollectives> makeDeviceCollectives(ProcessGroup& pg);

// Tests replace a Reducer's device collectives with a fake before its first
// iteration.
struct ReducerAccess {
  static void setDeviceCollectives(Reducer& r, std::unique_ptr<DeviceCollectives> dc);
};

}  // namespace internal
}  // namespace ddprun::runtime
