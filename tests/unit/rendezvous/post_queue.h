// Test harness: stands in for the agent's event loop. A rendezvous posts its
// results and events through post(); the test runs them on its own thread
// with runOne(), as the agent's thread would. A node bundles one queue, one
// rendezvous and what the rendezvous has delivered to it so far.
//
// Thread-safety: post() from any thread; runOne() and Node from one thread.
// A queue must outlive the rendezvous posting to it (Node declares it first).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <vector>

#include "ddprun/rendezvous/rendezvous.h"

namespace ddprun::testing {

class PostQueue {
 public:
  rendezvous::Rendezvous::Post post() {
    return [this](std::function<void()> fn) {
      {
        std::lock_guard lock(mu_);
        queue_.push_back(std::move(fn));
      }
      posted_.notify_all();
    };
  }
  // Runs the next posted closure. Throws if none arrives within `within`
  // (a generous bound: a test that hangs fails instead).
  void runOne(std::chrono::milliseconds within = std::chrono::seconds(60)) {
    std::unique_lock lock(mu_);
    if (!posted_.wait_for(lock, within, [this] { return !queue_.empty(); }))
      throw std::runtime_error("nothing was posted within the test's bound");
    auto fn = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    fn();
  }
  size_t pending() {
    std::lock_guard lock(mu_);
    return queue_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable posted_;
  std::deque<std::function<void()>> queue_;
};

struct Node {
  PostQueue queue;  // first: outlives rdzv
  std::unique_ptr<rendezvous::Rendezvous> rdzv;
  std::vector<rendezvous::RoundEvent> events;
  // The last join's outcome.
  bool joined = false;
  std::exception_ptr error;
  rendezvous::RoundInfo info;

  void attach(std::unique_ptr<rendezvous::Rendezvous> r) {
    rdzv = std::move(r);
    rdzv->setEventHandler(
        [this](rendezvous::RoundEvent e) { events.push_back(std::move(e)); });
  }
  void join(int localWorldSize) {
    joined = false;
    rdzv->join(localWorldSize, [this](std::exception_ptr e, rendezvous::RoundInfo i) {
      joined = true;
      error = e;
      info = std::move(i);
    });
  }
  // Runs posted closures until the join's outcome has arrived.
  void awaitJoin() {
    while (!joined) queue.runOne();
  }
  // Runs posted closures until one more event has arrived; returns it.
  rendezvous::RoundEvent awaitEvent() {
    const size_t seen = events.size();
    while (events.size() == seen) queue.runOne();
    return events.back();
  }
  // The last join's error rethrown, for EXPECT_THROW and message checks.
  void rethrow() const {
    if (error) std::rethrow_exception(error);
  }
};

}  // namespace ddprun::testing
