// The folder's lease (arrivals.h): at most one node of a job folds arrivals
// at a time, the holder of the key "ddprun/<run_id>/folder", whose value is
// "<node id> <expiry, wall ms>". The holder renews it while it folds; a
// node finds it free ("" or missing) or expired and takes it with a
// compare_set, so a folder that died or stalled is replaced one lease later.
// Two folders at once (a stalled one waking) cost work, never correctness:
// every fold is a compare_set of the state.
//
// Not thread-safe: one per thread, on that thread's store connection.
#pragma once

#include <cstdint>
#include <string>

#include "ddprun/store/store.h"

namespace ddprun::rendezvous::detail {

class FoldLease {
 public:
  FoldLease(store::Store& store, std::string key, std::string me, int64_t leaseMs)
      : store_(store), key_(std::move(key)), me_(std::move(me)), leaseMs_(leaseMs) {}

  // Takes the lease if it is free or expired at `nowMs`. True if held now.
  bool acquire(int64_t nowMs);
  // Extends a held lease from `nowMs`; false (and not held) if another node
  // took it meanwhile.
  bool renew(int64_t nowMs);
  // Gives a held lease back (best effort: it expires anyway), on `via`
  // when given (the lease's own connection may be cancelled).
  void release(store::Store* via = nullptr);

  bool held() const { return !mine_.empty(); }
  // When the lease last seen (ours or another's) expires: when a waiting
  // node looks again. 0: it was free.
  int64_t expiresMs() const { return expires_; }
  int64_t leaseMs() const { return leaseMs_; }

 private:
  store::Store& store_;
  const std::string key_;
  const std::string me_;
  const int64_t leaseMs_;
  std::string mine_;  // the value we wrote ("" unless held)
  int64_t expires_ = 0;
};

}  // namespace ddprun::rendezvous::detail
