// Collectives between ranks of one host through one shared-memory segment.
// Internal header.
//
// Segment layout (created by the host's lowest rank, opened by the others,
// unlinked as soon as everyone has mapped it, so a crash leaks nothing):
//   header | per-member control line (arrival counter, pid, left flag, descriptor)
//   | per-member data slots (2 x slotBytes, double buffered)
//   | per-member heap (allocShared; peers read it in place)
// Synchronisation is one monotonic arrival counter per member: a barrier is
// "bump mine, wait until every peer's reaches the same value". Waiters spin
// briefly (not at all when ranks outnumber cores), then sleep on a futex that
// every arrival bumps. Every wait checks the deadline, the abort flag,
// whether the awaited members left (destroyed their ShmComm) and whether
// their processes still exist, so a dead or departed peer is named within
// tens of milliseconds and a stalled one at the timeout. Members may be
// threads of one process (then only the departure check can tell).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../comm.h"

namespace ddprun::runtime {

class ShmComm : public Comm {
 public:
  static constexpr size_t kDefaultSlotBytes = size_t{4} << 20;

  // The leader creates the segment named `name` (a POSIX shm name, "/...").
  static std::unique_ptr<ShmComm> create(const std::string& name, CommContext ctx,
                                         size_t slotBytes, size_t heapBytes);
  // The others open it (sizes come from the header).
  static std::unique_ptr<ShmComm> open(const std::string& name, CommContext ctx);
  static void unlink(const std::string& name) noexcept;
  // Space /dev/shm has left, for sizing the heap.
  static size_t freeShmBytes();
  ~ShmComm() override;

  DDPRUN_COMM_COLLECTIVE_OVERRIDES;
  int size() const override { return ctx_.size(); }
  int me() const override { return ctx_.me; }

  // This member's heap (for allocShared) and any member's, as mapped here.
  char* heap(int member) const;
  size_t heapBytes() const;
  // Offset of [p, p+bytes) in my heap, or -1 when it is not inside it.
  int64_t heapOffset(const void* p, size_t bytes) const;

 private:
  struct Header;
  struct Control;
  ShmComm(CommContext ctx, void* base, size_t mapBytes);
  Header* header() const;
  Control* control(int member) const;
  char* slot(int member, int buf) const;
  size_t slotBytes() const;
  int nextBuf() { return buf_ ^= 1; }

  // Arrive at the next barrier and wait for every member.
  void sync(const char* what);
  void arrive();
  void waitAll(uint64_t target, const char* what);
  bool allArrived(uint64_t target) const;
  void checkPeers(uint64_t target, const char* what, const Deadline& deadline) const;
  void allReduceSmall(const void* in, void* out, size_t count, DType t, ReduceOp op);

  CommContext ctx_;
  void* base_;
  size_t mapBytes_;
  uint64_t seq_ = 0;
  int buf_ = 0;
  int spinIters_;
};

}  // namespace ddprun::runtime
