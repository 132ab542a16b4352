// WatcherThread: the thread of a round's watcher (the static and the dynamic
// rendezvous), moved out of task_thread.h.
#pragma once

#include <functional>
#include <memory>
#include <thread>

#include "ddprun/store/tcp_store.h"

namespace ddprun::rendezvous::detail {

// One watcher thread at a time (a round's), with a cancel token of its own
// that the rendezvous's token also cancels: starting the next round's
// watcher ends the previous one, and cancelling the rendezvous ends any.
// Used from one thread (the rendezvous's task thread, then its shutdown).
class WatcherThread {
 public:
  using Body = std::function<void(const std::shared_ptr<store::CancelToken>&)>;
  explicit WatcherThread(std::shared_ptr<store::CancelToken> parent)
      : parent_(std::move(parent)) {}
  ~WatcherThread() { stop(); }
  WatcherThread(const WatcherThread&) = delete;
  WatcherThread& operator=(const WatcherThread&) = delete;

  // Stops the running body, if any, then runs `body(token)` on a new thread.
  void start(Body body) {
    stop();
    auto token = std::make_shared<store::CancelToken>();
    link_ = parent_->subscribe([token] { token->cancel(); });
    token_ = token;
    thread_ = std::thread([body = std::move(body), token] { body(token); });
  }
  // Cancels the body's token and joins it. Idempotent.
  void stop() {
    if (!thread_.joinable()) return;
    token_->cancel();
    thread_.join();
    parent_->unsubscribe(link_);
  }

 private:
  std::shared_ptr<store::CancelToken> parent_;
  std::shared_ptr<store::CancelToken> token_;
  store::CancelToken::Id link_ = 0;
  std::thread thread_;
};

}  // namespace ddprun::rendezvous::detail
