// A fixed set of threads that split one loop between them (internal to
// ddprun_train): the trainer's batch assembly (decode, augment, normalise)
// runs on it, sample i always written to slot i, so what a batch holds never
// depends on the number of threads.
//
// run(n, body) calls body(begin, end) over contiguous chunks covering
// [0, n) exactly once, on the pool's threads and the caller's, and returns
// when every chunk is done. The first exception a chunk throws is rethrown
// by run() (the other chunks still finish first).
//
// Thread-safety: run() is called from one thread at a time (the owner's);
// body must be safe to call concurrently on disjoint ranges.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ddprun::train {

class WorkPool {
 public:
  // `threads` >= 1 in all, the caller counting as one: threads - 1 are started.
  explicit WorkPool(int threads);
  ~WorkPool();
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  void run(size_t n, const std::function<void(size_t begin, size_t end)>& body);

 private:
  void loop();
  // Takes chunks of the current job until none is left.
  void work();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  bool stop_ = false;
  uint64_t generation_ = 0;  // one per run()
  const std::function<void(size_t, size_t)>* body_ = nullptr;
  size_t n_ = 0, chunk_ = 1, next_ = 0;  // the job: chunks handed out from next_
  size_t busy_ = 0;                      // chunks being worked on
  std::exception_ptr error_;
};

}  // namespace ddprun::train
