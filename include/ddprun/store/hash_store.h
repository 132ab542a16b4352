// An in-memory Store in this process: for unit tests, for ranks run as
// threads of one process (tests/unit/rank_threads.h) and for single-process
// use where no TCP store is needed. The counterpart of PyTorch's HashStore.
//
// Semantics are those of the TCP store (server_state.cc): add() works on the
// decimal text of the value (std::stoll rules; absent = 0), compareSet()
// follows PyTorch, get()/multiGet()/wait() block until the keys exist and
// throw TimeoutError after the timeout, numKeys() counts every key. A value
// add() cannot parse, or a sum that overflows 64 bits, throws InvalidArgument
// (the TCP server refuses the same request).
//
// Thread-safety: every operation is safe to call concurrently; blocked
// waiters sleep on a condition variable and wake when a key is written (no
// polling). setTimeout() (inherited from Store) is not synchronised: set it
// before sharing the store, or give each thread its own PrefixStore view.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "ddprun/store/store.h"

namespace ddprun::store {

class HashStore : public Store {
 public:
  HashStore() = default;
  HashStore(const HashStore&) = delete;
  HashStore& operator=(const HashStore&) = delete;

  void set(const std::string& key, std::string_view value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compareSet(const std::string& key, std::string_view expected,
                         std::string_view desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  using Store::wait;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  void append(const std::string& key, std::string_view value) override;
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::string>& values) override;

  // How many calls are blocked right now waiting for absent keys (get, wait,
  // multiGet): lets a test start a writer once a reader is known to block,
  // instead of sleeping and hoping.
  int blockedWaiters();

 private:
  bool presentLocked(const std::vector<std::string>& keys) const;
  // Blocks (releasing the lock) until every key exists; TimeoutError after
  // `timeout`, naming `what` and the keys.
  void waitLocked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                  Millis timeout, const char* what);

  std::mutex mu_;
  std::condition_variable written_;  // notified whenever a key is created or changed
  std::unordered_map<std::string, std::string> kv_;
  int blocked_ = 0;  // guarded by mu_
};

}  // namespace ddprun::store
