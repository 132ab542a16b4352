// Test harness: runs the ranks of one process group as threads of the test
// process, so collective code can be unit-tested without spawning processes.
//
//   runRanks(4, [](ProcessGroup& pg) { ... collectives ... }, opts);
//
// Every call makes a fresh in-memory HashStore and a fresh key prefix, joins
// `n` ranks through ProcessGroup::create() on `n` threads, runs `body` on
// each, and joins the threads. Every rank gets the same opts, hence the same
// host identity: kAuto resolves to shm (one segment per group, its name
// random); opts.transport = kTcp gives a TCP ring over loopback. Hierarchical
// would need a host id per rank, which this harness does not provide.
//
// Failure: if a rank throws (in create() or in body), its group is destroyed
// at once, so peers blocked in a collective fail promptly (shm notices the
// departure, TCP the closed connection) instead of at opts.timeout. A rank
// that fails before joining leaves the others waiting in the store until
// opts.timeout: tests should pass a short one. After all threads are joined,
// the first exception caught (in time: usually the cause, not a consequence)
// is rethrown as RankFailure, which names the rank and keeps the original.
// Ranks that succeed keep their group until every rank's body has returned,
// so no teardown races with a slower peer's last collective.
//
// Thread-safety: body runs concurrently on n threads; share nothing mutable
// between ranks without a lock. gtest EXPECT_* may be used in body; ASSERT_*
// only returns from body (the rank then counts as successful).
#pragma once

#include <atomic>
#include <exception>
#include <functional>
#include <latch>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/runtime/process_group.h"
#include "ddprun/store/hash_store.h"
#include "ddprun/store/prefix_store.h"

namespace ddprun::testing {

// A rank of runRanks() threw. what(): "rank R of N: <original what()>".
class RankFailure : public std::runtime_error {
 public:
  RankFailure(int rank, int size, std::exception_ptr cause, const std::string& what)
      : std::runtime_error("rank " + std::to_string(rank) + " of " + std::to_string(size) +
                           ": " + what),
        rank_(rank),
        cause_(std::move(cause)) {}
  int rank() const { return rank_; }
  // The exception the rank threw, for checking its type:
  //   try { runRanks(...); } catch (const RankFailure& f) { std::rethrow_exception(f.cause()); }
  std::exception_ptr cause() const { return cause_; }

 private:
  int rank_;
  std::exception_ptr cause_;
};

inline void runRanks(int n, std::function<void(runtime::ProcessGroup&)> body,
                     runtime::ProcessGroupOptions opts = {}) {
  if (n < 1) throw std::invalid_argument("runRanks: n must be >= 1, got " + std::to_string(n));
  static std::atomic<int> calls{0};
  // A fresh prefix per call also restarts ProcessGroup's per-prefix group
  // numbering, so a failed earlier call cannot leave ranks out of step.
  opts.prefix += "/runRanks" + std::to_string(calls++);
  auto shared = std::make_shared<store::HashStore>();
  shared->setTimeout(opts.timeout);

  std::mutex mu;
  std::exception_ptr first;
  int firstRank = -1;
  std::string firstWhat;
  std::latch done(n);
  auto fail = [&](int rank) {
    std::lock_guard lock(mu);
    if (first) return;
    first = std::current_exception();
    firstRank = rank;
    try {
      throw;
    } catch (const std::exception& e) {
      firstWhat = e.what();
    } catch (...) {
      firstWhat = "unknown exception";
    }
  };
  auto rankMain = [&](int rank) {
    std::unique_ptr<runtime::ProcessGroup> pg;
    try {
      // Each rank gets its own view: setTimeout() on a shared store would race.
      auto view = std::make_shared<store::PrefixStore>("threads", shared);
      pg = runtime::ProcessGroup::create(std::move(view), rank, n, opts);
      body(*pg);
    } catch (...) {
      fail(rank);
      pg.reset();  // peers blocked on this rank fail now
      done.count_down();
      return;
    }
    done.arrive_and_wait();
    pg.reset();
  };
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int r = 0; r < n; ++r) threads.emplace_back(rankMain, r);
  for (auto& t : threads) t.join();
  if (first) throw RankFailure(firstRank, n, first, firstWhat);
}

}  // namespace ddprun::testing
