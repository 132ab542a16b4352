// The transport layer under the collectives. Internal header.
//
// A Comm runs one collective among its members (indices 0..size-1, mapped to
// global ranks for messages) on host memory, synchronously, on the process
// group's thread. Comms throw PeerFailure when a peer dies, closes its
// connection or does not answer before the deadline; the process group turns
// that into a message naming the rank at fault.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "ddprun/common/clock.h"
#include "ddprun/common/error.h"
#include "ddprun/runtime/types.h"

namespace ddprun::runtime {

class PeerFailure : public Error {
 public:
  PeerFailure(const std::string& msg, int peer, bool timedOut, const char* file = "",
              int line = 0)
      : Error(msg, file, line), peer_(peer), timedOut_(timedOut) {}
  int peer() const { return peer_; }  // global rank at fault, or -1
  bool timedOut() const { return timedOut_; }

 private:
  int peer_;
  bool timedOut_;
};

#define DDPRUN_PEER_FAILURE(peer, timedOut, ...)                                      \
  throw ::ddprun::runtime::PeerFailure(::ddprun::detail::concat(__VA_ARGS__), peer, \
                                       timedOut, __FILE__, __LINE__)

// Shared by the transports: who the members are and how long to wait.
struct CommContext {
  std::vector<int> ranks;  // member index -> global rank
  int me = 0;              // my member index
  std::chrono::milliseconds timeout{300'000};
  int size() const { return static_cast<int>(ranks.size()); }
};

class Comm {
 public:
  virtual ~Comm() = default;
  // in == out allowed. Completes kAvg (divides by size()).
  virtual void allReduce(const void* in, void* out, size_t count, DType t, ReduceOp op) = 0;
  // root is a member index.
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  // bytes[i]: piece of member i; pieces land in member order in out. `in` is
  // this member's piece (may already sit at its place in out).
  virtual void allGather(const void* in, void* out, const std::vector<size_t>& bytes) = 0;
  // in: size() blocks of count elements; out: block me, reduced.
  virtual void reduceScatter(const void* in, void* out, size_t count, DType t,
                             ReduceOp op) = 0;
  virtual void barrier() = 0;
  // Makes peers blocked in this comm fail promptly (they see `by` as the
  // reason). Never throws.
  virtual void abort(int by) noexcept = 0;
  virtual int size() const = 0;
  virtual int me() const = 0;
};

// The collectives and abort() of Comm, declared as overrides in one line by a
// host transport's class (ShmComm, TcpRing, HierComm): adding a collective to
// Comm then adds it to each of them, and the compiler names those lacking it.
#define DDPRUN_COMM_COLLECTIVE_OVERRIDES                                                    \
  void allReduce(const void* in, void* out, size_t count, DType t, ReduceOp op) override;   \
  void broadcast(void* buf, size_t bytes, int root) override;                               \
  void allGather(const void* in, void* out, const std::vector<size_t>& bytes) override;     \
  void reduceScatter(const void* in, void* out, size_t count, DType t, ReduceOp op) override; \
  void barrier() override;                                                                  \
  void abort(int by) noexcept override

// Splits `count` elements into `parts` contiguous blocks as evenly as possible.
struct Partition {
  Partition(size_t count, int parts);
  size_t offset(int i) const { return offsets[i]; }
  size_t length(int i) const { return offsets[i + 1] - offsets[i]; }
  std::vector<size_t> offsets;  // parts + 1 entries
};

// Where each piece starts when pieces of `bytes[i]` lie back to back; one
// extra entry holds the total.
std::vector<size_t> prefixOffsets(const std::vector<size_t>& bytes);

}  // namespace ddprun::runtime
