// rdzv_sim's clients (see rdzv_sim.cc): a TcpStore client wrapped with the
// injected latency before each request and connect, counted per agent and
// kind of client, and a kill switch that shuts the agent's sockets as
// kill -9 would. Header-only; for rdzv_sim alone.
//
// Threading: Counters are atomics shared by an agent's clients; a SimStore
// is used by one thread at a time, as any Store.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ddprun/store/tcp_store.h"

namespace ddprun::bench::rdzv_sim {

namespace store = ddprun::store;
using Micros = std::chrono::microseconds;

// ---- counting, latency and the kill switch ---------------------------------

struct Counters {
  std::atomic<int64_t> requests{0}, bytes{0}, connects{0};
};

struct Count {
  int64_t requests = 0, bytes = 0, connects = 0;
  static Count of(const Counters& c) {
    return {c.requests.load(), c.bytes.load(), c.connects.load()};
  }
  Count operator-(const Count& o) const {
    return {requests - o.requests, bytes - o.bytes, connects - o.connects};
  }
  Count& operator+=(const Count& o) {
    requests += o.requests;
    bytes += o.bytes;
    connects += o.connects;
    return *this;
  }
};

// Cancels `target` when any of the tokens it listens to is cancelled; stops
// listening when destroyed.
class TokenLink {
 public:
  explicit TokenLink(std::shared_ptr<store::CancelToken> target)
      : target_(std::move(target)) {}
  ~TokenLink() {
    for (auto& [source, id] : subs_) source->unsubscribe(id);
  }
  TokenLink(const TokenLink&) = delete;
  TokenLink& operator=(const TokenLink&) = delete;
  void listen(const std::shared_ptr<store::CancelToken>& source) {
    if (!source) return;
    subs_.emplace_back(source, source->subscribe([t = target_] { t->cancel(); }));
  }

 private:
  std::shared_ptr<store::CancelToken> target_;
  std::vector<std::pair<std::shared_ptr<store::CancelToken>, store::CancelToken::Id>>
      subs_;
};

// A TcpStore client with latency before each request, counted.
class SimStore final : public store::Store {
 public:
  SimStore(std::unique_ptr<store::TcpStore> inner, std::unique_ptr<TokenLink> link,
           Counters& counters, Micros latency)
      : link_(std::move(link)),
        inner_(std::move(inner)),
        c_(counters),
        latency_(latency) {
    timeout_ = inner_->timeout();
  }

  void set(const std::string& key, std::string_view value) override {
    before(key.size() + value.size());
    inner_->set(key, value);
  }
  std::string get(const std::string& key) override {
    before(key.size());
    return received(inner_->get(key));
  }
  int64_t add(const std::string& key, int64_t delta) override {
    before(key.size() + 8);
    const int64_t v = inner_->add(key, delta);
    c_.bytes += 8;
    return v;
  }
  std::string compareSet(const std::string& key, std::string_view expected,
                         std::string_view desired) override {
    before(key.size() + expected.size() + desired.size());
    return received(inner_->compareSet(key, expected, desired));
  }
  bool check(const std::vector<std::string>& keys) override {
    before(sizeOf(keys));
    return inner_->check(keys);
  }
  void wait(const std::vector<std::string>& keys, store::Millis timeout) override {
    before(sizeOf(keys));
    inner_->wait(keys, timeout);
  }
  using Store::wait;
  bool deleteKey(const std::string& key) override {
    before(key.size());
    return inner_->deleteKey(key);
  }
  int64_t numKeys() override {
    before(0);
    return inner_->numKeys();
  }
  void append(const std::string& key, std::string_view value) override {
    before(key.size() + value.size());
    inner_->append(key, value);
  }
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override {
    before(sizeOf(keys));
    auto values = inner_->multiGet(keys);
    c_.bytes += static_cast<int64_t>(sizeOf(values));
    return values;
  }
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::string>& values) override {
    before(sizeOf(keys) + sizeOf(values));
    inner_->multiSet(keys, values);
  }

 private:
  static size_t sizeOf(const std::vector<std::string>& v) {
    size_t n = 0;
    for (const auto& s : v) n += s.size();
    return n;
  }
  void before(size_t sent) {
    c_.requests++;
    c_.bytes += static_cast<int64_t>(sent);
    if (latency_.count() > 0) std::this_thread::sleep_for(latency_);
  }
  std::string received(std::string v) {
    c_.bytes += static_cast<int64_t>(v.size());
    return v;
  }

  std::unique_ptr<TokenLink> link_;  // outlives inner_: its token is inner_'s
  std::unique_ptr<store::TcpStore> inner_;
  Counters& c_;
  Micros latency_;
};

}  // namespace ddprun::bench::rdzv_sim
