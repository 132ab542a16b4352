// The per-round watcher of the static and the dynamic rendezvous: a thread
// of its own per round that waits for the round's end key and posts the end
// to the agent as a typed RoundEvent (WatcherThread: the thread;
// RoundWatcher: what runs on it).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "ddprun/common/error.h"
#include "ddprun/rendezvous/rendezvous.h"
#include "ddprun/store/store.h"
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

// What it is for: one round at a time, on a WatcherThread, the watch both
// rendezvous share: open a connection of the watcher's own, wait there for
// the round's end, let the rendezvous note it (its bookkeeping and goodbye),
// then deliver the end as a typed event. A store that fails (any Error)
// delivers kStoreLost (node -1) with the rendezvous's reason; a cancelled
// watcher (the next round's start, stop(), or the rendezvous's token)
// delivers nothing. What differs between the backends (which end to trust,
// what to note, the message) comes in as Hooks.
//
// Thread-safety: start() and stop() from one thread at a time (the
// rendezvous's task thread, then its shutdown); the hooks run on the
// watcher's thread, beside the rendezvous's other threads.
// Preconditions: every hook set; the hooks (and what they capture) outlive
// the watcher; the parent token outlives it too.
class RoundWatcher {
 public:
  struct Hooks {
    // Opens the watcher's connection. Every blocking call on it, connecting
    // included, must end with CancelledError once `token` is cancelled.
    std::function<std::unique_ptr<store::Store>(std::shared_ptr<store::CancelToken> token)>
        connect;
    // Blocks until round `round`'s end can be read; returns it. Store errors
    // and CancelledError propagate.
    std::function<RoundEvent(store::Store& store, int round,
                             const std::shared_ptr<store::CancelToken>& token)>
        awaitEnd;
    // After the end was read, before it is delivered, on the same
    // connection. An Error thrown here delivers kStoreLost instead.
    std::function<void(store::Store& store, int round, const RoundEvent& end)> onEnded;
    // The reason of the kStoreLost event for a store that failed with `e`.
    std::function<std::string(const Error& e)> storeLost;
    // Hands the event to the agent (or drops it while the rendezvous stops).
    std::function<void(const RoundEvent& event)> deliver;
  };

  RoundWatcher(std::shared_ptr<store::CancelToken> parent, Hooks hooks)
      : hooks_(std::move(hooks)), thread_(std::move(parent)) {}

  // Ends the previous round's watch, if any, then watches `round`.
  void start(int round) {
    thread_.start([this, round](const auto& token) { watch(round, token); });
  }
  // Ends the watch, if any, and joins its thread. Idempotent.
  void stop() { thread_.stop(); }

 private:
  void watch(int round, const std::shared_ptr<store::CancelToken>& token);

  const Hooks hooks_;
  WatcherThread thread_;  // last: its thread uses hooks_
};

}  // namespace ddprun::rendezvous::detail
