// The abstract key-value store that agents, rendezvous and workers meet in.
//
// Values are arbitrary bytes held in std::string. get() and wait() block until
// the keys exist or the timeout passes (TimeoutError). Implementations say
// whether they are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ddprun/common/error.h"

namespace ddprun::store {

using Millis = std::chrono::milliseconds;

// A request that is not sent twice (ADD, APPEND, QUEUE_PUSH, QUEUE_POP,
// BARRIER) went out and its connection broke before the reply: the store may
// or may not have applied it, and the store itself may be fine (a client
// that reconnects: TcpStore). The caller decides what an unknown outcome
// means; a store out of reach is a plain IoError.
class UnconfirmedError : public IoError {
  using IoError::IoError;
};

// PyTorch's Store::kDefaultTimeout.
constexpr Millis kDefaultTimeout{300'000};

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, std::string_view value) = 0;
  // Waits (up to timeout()) for the key, then returns its value.
  virtual std::string get(const std::string& key) = 0;
  // Adds to the decimal integer stored at key (absent = 0); returns the sum.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // PyTorch semantics: if key is missing, stores desired only when expected
  // is empty (and returns desired), else returns expected; if present,
  // replaces it when equal to expected; returns the current value.
  virtual std::string compareSet(const std::string& key, std::string_view expected,
                                 std::string_view desired) = 0;
  // True iff every key exists. Never blocks.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Blocks until every key exists; throws TimeoutError after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }
  // Returns whether the key existed.
  virtual bool deleteKey(const std::string& key) = 0;
  // Number of keys in the whole store (all prefixes), as PyTorch reports it.
  virtual int64_t numKeys() = 0;
  virtual void append(const std::string& key, std::string_view value) = 0;
  // Waits for every key, then returns their values in order.
  virtual std::vector<std::string> multiGet(const std::vector<std::string>& keys) = 0;
  virtual void multiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values) = 0;

  Millis timeout() const { return timeout_; }
  void setTimeout(Millis t) { timeout_ = t; }

 protected:
  Millis timeout_ = kDefaultTimeout;
};

}  // namespace ddprun::store
