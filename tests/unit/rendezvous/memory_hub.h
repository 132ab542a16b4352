// Test harness: an in-memory agent store shared by the nodes of a unit test,
// whose blocking calls a store::CancelToken ends, as it ends TcpStore's. Each
// node (and each of its threads) gets its own view through connect().
//
//   MemoryHub hub;
//   auto store = hub.connect(token);   // a Store; waits throw CancelledError
//   hub.awaitWaiters(1);                // somebody is blocked in a wait now
//   hub.fail();                         // every view now throws IoError
//
// The data live in a HashStore; waits sleep on the hub's condition variable,
// which every write through a view (or hub.set) and every cancel notifies.
// Thread-safe. The hub must outlive its views.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddprun/common/error.h"
#include "ddprun/store/hash_store.h"
#include "ddprun/store/tcp_store.h"

namespace ddprun::testing {

class MemoryHub {
 public:
  std::unique_ptr<store::Store> connect(std::shared_ptr<store::CancelToken> cancel);

  // Writes a key as a client would (waiters wake).
  void set(const std::string& key, const std::string& value) {
    data_.set(key, value);
    notify();
  }
  // Deletes a key as a client would.
  void erase(const std::string& key) {
    data_.deleteKey(key);
    notify();
  }
  std::string value(const std::string& key) {
    return data_.check({key}) ? data_.get(key) : "";
  }
  bool has(const std::string& key) { return data_.check({key}); }
  // Every later call on a view throws IoError, and blocked waits end with it.
  void fail() {
    failed_ = true;
    notify();
  }
  // Waits until at least `n` calls are blocked in a wait; false after `within`.
  bool awaitWaiters(int n, std::chrono::milliseconds within = std::chrono::seconds(60)) {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, within, [&] { return waiters_ >= n; });
  }
  // Waits until `pred` (reading the hub) holds after some write; false after `within`.
  bool awaitUntil(const std::function<bool()>& pred,
                  std::chrono::milliseconds within = std::chrono::seconds(60)) {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, within, pred);
  }

 private:
  friend class MemoryView;
  void notify() {
    { std::lock_guard lock(mu_); }  // a waiter between its check and its sleep holds mu_
    changed_.notify_all();
  }
  void checkUp() {
    if (failed_) DDPRUN_THROW(IoError, "the in-memory store is gone");
  }
  // Blocks until every key exists, the view is cancelled or the hub failed.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
            const std::atomic<bool>& cancelled) {
    std::unique_lock lock(mu_);
    ++waiters_;
    changed_.notify_all();
    bool ready = changed_.wait_for(
        lock, timeout, [&] { return cancelled || failed_ || data_.check(keys); });
    --waiters_;
    if (cancelled)
      DDPRUN_THROW(CancelledError, "a wait on the in-memory store was cancelled");
    checkUp();
    if (!ready)
      DDPRUN_THROW(TimeoutError, "wait timed out after ", timeout.count(),
                   " ms on the in-memory store");
  }

  store::HashStore data_;
  std::mutex mu_;
  std::condition_variable changed_;
  int waiters_ = 0;
  std::atomic<bool> failed_{false};
};

// One client's view: every call goes to the hub's data; waits are the hub's.
class MemoryView : public store::Store {
 public:
  MemoryView(MemoryHub& hub, std::shared_ptr<store::CancelToken> cancel)
      : hub_(hub), cancel_(std::move(cancel)) {
    // Runs under the token's lock: touches only the flag and the hub's lock.
    subscription_ = cancel_->subscribe([this] {
      cancelled_ = true;
      hub_.notify();
    });
  }
  ~MemoryView() override { cancel_->unsubscribe(subscription_); }

  void set(const std::string& key, std::string_view value) override {
    enter();
    hub_.data_.set(key, value);
    hub_.notify();
  }
  std::string get(const std::string& key) override {
    wait({key}, timeout_);
    return hub_.data_.get(key);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    enter();
    int64_t v = hub_.data_.add(key, delta);
    hub_.notify();
    return v;
  }
  std::string compareSet(const std::string& key, std::string_view expected,
                         std::string_view desired) override {
    enter();
    auto v = hub_.data_.compareSet(key, expected, desired);
    hub_.notify();
    return v;
  }
  bool check(const std::vector<std::string>& keys) override {
    enter();
    return hub_.data_.check(keys);
  }
  void wait(const std::vector<std::string>& keys,
            std::chrono::milliseconds timeout) override {
    enter();
    hub_.wait(keys, timeout, cancelled_);
  }
  using Store::wait;
  bool deleteKey(const std::string& key) override {
    enter();
    return hub_.data_.deleteKey(key);
  }
  int64_t numKeys() override {
    enter();
    return hub_.data_.numKeys();
  }
  void append(const std::string& key, std::string_view value) override {
    enter();
    hub_.data_.append(key, value);
    hub_.notify();
  }
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override {
    wait(keys, timeout_);
    return hub_.data_.multiGet(keys);
  }
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::string>& values) override {
    enter();
    hub_.data_.multiSet(keys, values);
    hub_.notify();
  }

 private:
  void enter() {
    if (cancelled_)
      DDPRUN_THROW(CancelledError, "the in-memory store view was cancelled");
    hub_.checkUp();
  }

  MemoryHub& hub_;
  std::shared_ptr<store::CancelToken> cancel_;
  store::CancelToken::Id subscription_ = 0;
  std::atomic<bool> cancelled_{false};
};

inline std::unique_ptr<store::Store> MemoryHub::connect(
    std::shared_ptr<store::CancelToken> cancel) {
  if (cancel->cancelled()) DDPRUN_THROW(CancelledError, "connecting was cancelled");
  checkUp();
  return std::make_unique<MemoryView>(*this, std::move(cancel));
}

}  // namespace ddprun::testing
