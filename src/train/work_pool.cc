#include "work_pool.h"

#include <algorithm>
#include <utility>

namespace ddprun::train {

WorkPool::WorkPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this] { loop(); });
}

WorkPool::~WorkPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void WorkPool::run(size_t n, const std::function<void(size_t, size_t)>& body) {
  if (n == 0) return;
  if (workers_.empty()) {
    body(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    body_ = &body;
    n_ = n;
    next_ = 0;
    // About four chunks a thread: an uneven sample (a big image) does not
    // leave the others idle, and few enough that handing out costs nothing.
    chunk_ = std::max<size_t>(1, n / (4 * static_cast<size_t>(threads())));
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  work();
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return next_ >= n_ && busy_ == 0; });
  body_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void WorkPool::work() {
  std::unique_lock<std::mutex> lock(mu_);
  while (body_ && next_ < n_) {
    const size_t begin = next_, end = std::min(n_, begin + chunk_);
    next_ = end;
    ++busy_;
    const auto* body = body_;
    lock.unlock();
    std::exception_ptr err;
    try {
      (*body)(begin, end);
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    if (err && !error_) error_ = err;
    --busy_;
  }
  if (next_ >= n_ && busy_ == 0) done_.notify_all();
}

void WorkPool::loop() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    lock.unlock();
    work();
    lock.lock();
  }
}

}  // namespace ddprun::train
