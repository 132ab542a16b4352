#include "ddprun/store/hash_store.h"

#include <cerrno>
#include <chrono>
#include <cstdlib>

#include "ddprun/common/error.h"

namespace ddprun::store {

namespace {
// std::stoll semantics, as the TCP server parses counters: optional
// whitespace and sign, at least one digit, trailing bytes ignored.
bool parseCounter(const std::string& text, int64_t& out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || errno == ERANGE) return false;
  out = v;
  return true;
}

std::string joinKeys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) s += (i ? ", " : "") + keys[i];
  if (keys.size() > 8) s += ", ... (" + std::to_string(keys.size()) + " keys)";
  return "[" + s + "]";
}
}  // namespace

bool HashStore::presentLocked(const std::vector<std::string>& keys) const {
  for (const auto& k : keys)
    if (!kv_.count(k)) return false;
  return true;
}

void HashStore::waitLocked(std::unique_lock<std::mutex>& lock,
                           const std::vector<std::string>& keys, Millis timeout,
                           const char* what) {
  using Clock = std::chrono::steady_clock;
  const auto ready = [&] { return presentLocked(keys); };
  if (ready()) return;
  ++blocked_;  // under mu_; blockedWaiters() reads it under mu_ too
  struct Unblock {
    int& n;
    ~Unblock() { --n; }
  } unblock{blocked_};
  // A timeout too large to add to now() means "wait for ever".
  if (timeout >= std::chrono::duration_cast<Millis>(Clock::time_point::max() - Clock::now())) {
    written_.wait(lock, ready);
    return;
  }
  if (!written_.wait_until(lock, Clock::now() + timeout, ready))
    DDPRUN_THROW(TimeoutError, what, " timed out after ", timeout.count(),
                 " ms waiting for keys ", joinKeys(keys), " in the in-memory store");
}

int HashStore::blockedWaiters() {
  std::lock_guard lock(mu_);
  return blocked_;
}

void HashStore::set(const std::string& key, std::string_view value) {
  {
    std::lock_guard lock(mu_);
    kv_[key] = std::string(value);
  }
  written_.notify_all();
}

std::string HashStore::get(const std::string& key) {
  std::unique_lock lock(mu_);
  waitLocked(lock, {key}, timeout_, "get");
  return kv_.at(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t out = 0;
  {
    std::lock_guard lock(mu_);
    int64_t current = 0;
    auto it = kv_.find(key);
    if (it != kv_.end() && !parseCounter(it->second, current))
      DDPRUN_THROW(InvalidArgument, "add on key '", key, "' whose value is not a decimal integer");
    if (__builtin_add_overflow(current, delta, &out))
      DDPRUN_THROW(InvalidArgument, "add on key '", key, "' overflows a 64-bit integer");
    kv_[key] = std::to_string(out);
  }
  written_.notify_all();
  return out;
}

// PyTorch's rule: a missing key is created only when `expected` is empty
// (the reply is then `desired`); otherwise the reply is `expected` itself.
// A present key is replaced when it equals `expected`; the reply is the
// value it holds afterwards.
std::string HashStore::compareSet(const std::string& key, std::string_view expected,
                                  std::string_view desired) {
  std::string out;
  {
    std::lock_guard lock(mu_);
    auto it = kv_.find(key);
    if (it == kv_.end()) {
      if (!expected.empty()) return std::string(expected);
      it = kv_.emplace(key, std::string(desired)).first;
    } else if (it->second == expected) {
      it->second = std::string(desired);
    } else {
      return it->second;  // unchanged: nobody to wake
    }
    out = it->second;
  }
  written_.notify_all();
  return out;
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mu_);
  return presentLocked(keys);
}

void HashStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  std::unique_lock lock(mu_);
  waitLocked(lock, keys, timeout, "wait");
}

bool HashStore::deleteKey(const std::string& key) {
  std::lock_guard lock(mu_);
  return kv_.erase(key) > 0;
}

int64_t HashStore::numKeys() {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(kv_.size());
}

void HashStore::append(const std::string& key, std::string_view value) {
  {
    std::lock_guard lock(mu_);
    kv_[key].append(value);
  }
  written_.notify_all();
}

std::vector<std::string> HashStore::multiGet(const std::vector<std::string>& keys) {
  std::unique_lock lock(mu_);
  waitLocked(lock, keys, timeout_, "multiGet");
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(kv_.at(k));
  return out;
}

void HashStore::multiSet(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values) {
  DDPRUN_CHECK(keys.size() == values.size(), "multiSet got ", keys.size(), " keys but ",
               values.size(), " values");
  {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < keys.size(); ++i) kv_[keys[i]] = values[i];
  }
  written_.notify_all();
}

}  // namespace ddprun::store
