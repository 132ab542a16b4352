// TaskThread: runs a rendezvous's store requests one at a time, in order, on
// a thread of its own, off the agent's thread (the static and the dynamic
// rendezvous).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace ddprun::rendezvous::detail {

// Runs tasks one at a time, in order, on its own thread: the rendezvous's
// store requests, kept off the agent's thread. Tasks must not throw.
class TaskThread {
 public:
  TaskThread() : thread_([this] { loop(); }) {}
  ~TaskThread() { stop(); }
  TaskThread(const TaskThread&) = delete;
  TaskThread& operator=(const TaskThread&) = delete;

  void push(std::function<void()> task) {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      queue_.push_back(std::move(task));
    }
    wake_.notify_all();
  }
  // Waits until every task queued so far has run; false if `within` passed.
  bool drain(std::chrono::milliseconds within) {
    std::unique_lock lock(mu_);
    return idle_.wait_for(lock, within, [this] { return queue_.empty() && !running_; });
  }
  // Runs what is queued, then joins. Idempotent.
  void stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      auto task = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
      lock.unlock();
      task();
      lock.lock();
      running_ = false;
      idle_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::deque<std::function<void()>> queue_;
  bool running_ = false;
  bool stopping_ = false;
  std::thread thread_;  // last: it uses the members above
};

}  // namespace ddprun::rendezvous::detail
