// The dynamic rendezvous's test fixture: nodes are rendezvous objects of
// this process sharing one in-memory store (MemoryHub) with a fake wall
// clock, their results run on the test's thread through PostQueues, and
// heartbeats are fakes whose deaths the test declares. No sockets, no
// sleeps. Shared by dynamic_rendezvous_test.cc and dynamic_departure_test.cc.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <mutex>
#include <set>
#include <thread>

#include "ddprun/common/error.h"
#include "dynamic_rendezvous_internal.h"
#include "dynamic_state.h"
#include "rendezvous/memory_hub.h"
#include "rendezvous/post_queue.h"

namespace ddprun::rendezvous::testing_dynamic {

using namespace std::chrono_literals;
using testing::MemoryHub;
using testing::Node;

inline constexpr int64_t kStart = 1'700'000'000'000;  // the fake clock's first reading

inline std::string messageOf(Node& n) {
  try {
    n.rethrow();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

// A heartbeat whose peers the test reads and whose deaths it declares.
class FakeLiveness final : public detail::Liveness {
 public:
  void setPeers(std::vector<std::string> peers,
                detail::Heartbeat::OnDead onDead) override {
    std::lock_guard lock(mu_);
    peers_ = std::move(peers);
    onDead_ = std::move(onDead);
  }
  void setOnLost(detail::Heartbeat::OnLost onLost) override {
    std::lock_guard lock(mu_);
    onLost_ = std::move(onLost);
  }
  void stop() override {
    std::lock_guard lock(mu_);
    onDead_ = nullptr;
    onLost_ = nullptr;
  }
  // What the heartbeat's beating thread does when this node could not beat.
  void declareLost(int64_t silentMs) {
    detail::Heartbeat::OnLost fn;
    {
      std::lock_guard lock(mu_);
      fn = onLost_;
    }
    if (fn) fn(silentMs);
  }
  std::vector<std::string> peers() {
    std::lock_guard lock(mu_);
    return peers_;
  }
  // What the heartbeat's watcher thread does when `node` went silent.
  void declareDead(const std::string& node, int64_t silentMs) {
    detail::Heartbeat::OnDead fn;
    {
      std::lock_guard lock(mu_);
      fn = onDead_;
    }
    ASSERT_TRUE(fn) << "nobody is watched";
    fn(node, silentMs);
  }

 private:
  std::mutex mu_;
  std::vector<std::string> peers_;
  detail::Heartbeat::OnDead onDead_;
  detail::Heartbeat::OnLost onLost_;
};

// A node of the test: its rendezvous (which owns `beat`) and its address.
struct Member {
  std::unique_ptr<Node> node;
  FakeLiveness* beat = nullptr;
  std::string addr;
  int64_t pid = 0;
  // The host's: what the store calls when a node's heartbeat connection
  // closes (DynamicBackend::watchDepartures).
  std::function<void(const std::string& node, store::ConnEnd how)> onGone;
  Rendezvous& rdzv() { return *node->rdzv; }
};

class DynamicRendezvousTest : public ::testing::Test {
 protected:
  // Node i at 10.0.0.<i+1>, pid 100+i; `host` serves the endpoint; `nonce`
  // fixes the node id's random part ("": a fresh one).
  std::unique_ptr<Member> member(int i, bool host = false, const std::string& nonce = "") {
    auto m = std::make_unique<Member>();
    m->addr = "10.0.0." + std::to_string(i + 1);
    m->pid = 100 + i;
    DynamicOptions o = opts_;
    o.localAddr = m->addr;
    detail::DynamicBackend b;
    b.connect = [this](std::shared_ptr<store::CancelToken> cancel, Millis) {
      return hub_.connect(std::move(cancel));
    };
    b.localAddress = [](store::Store&) { return std::string(); };
    b.startWorkerStore = [this] {
      return static_cast<uint16_t>(40000 + ++workerStores_);
    };
    b.startLiveness = [m = m.get()](const std::string&) {
      auto l = std::make_unique<FakeLiveness>();
      m->beat = l.get();
      return std::unique_ptr<detail::Liveness>(std::move(l));
    };
    b.clock = [this] { return clock_.load(); };
    b.waitUntil = [this](store::Store& s, const std::vector<std::string>& keys,
                         int64_t until) {
      // check() throws CancelledError once the view is cancelled.
      if (!hub_.awaitUntil([&] { return s.check(keys) || clock_ >= until; }))
        throw std::runtime_error("a wait outlived the test's bound");
      return s.check(keys);
    };
    if (host)
      b.watchDepartures = [m = m.get()](std::function<void(const std::string&, store::ConnEnd)> f) {
        m->onGone = std::move(f);
      };
    b.hosting = host;
    b.pid = m->pid;
    b.nonce = nonce;
    b.storeAddress = "memory:29400";
    m->node = std::make_unique<Node>();
    m->node->attach(
        detail::makeDynamicRendezvous(o, m->node->queue.post(), std::move(b)));
    return m;
  }
  std::vector<std::unique_ptr<Member>> members(int n) {
    std::vector<std::unique_ptr<Member>> out;
    for (int i = 0; i < n; ++i) out.push_back(member(i));
    return out;
  }
  // Moves the fake clock and wakes every waiter to look at it.
  void advance(int64_t ms) {
    clock_ += ms;
    hub_.set("tick", "");
  }
  std::string stateKey() const { return "ddprun/job/state"; }
  std::string key(int round, const std::string& name) const {
    return "ddprun/job/round/" + std::to_string(round) + "/" + name;
  }
  detail::State state() { return detail::fromJson(hub_.value(stateKey()), stateKey()); }
  // Waits until the state shows `n` participants in a forming round.
  void awaitForming(size_t n) {
    ASSERT_TRUE(hub_.awaitUntil([&] {
      return hub_.has(stateKey()) && state().participants.size() == n &&
             !state().complete;
    }));
  }
  static void joinAll(std::vector<std::unique_ptr<Member>>& ms, int nproc = 1) {
    for (auto& m : ms) m->node->join(nproc);
    for (auto& m : ms) {
      m->node->awaitJoin();
      ASSERT_FALSE(m->node->error) << "a join failed";
    }
  }

  // The first two of `ms`, survivors of a node dropped from round 0 (of no
  // failure), join round 1 at once: two nodes, no restart counted, no last
  // call waited for, the job open.
  void expectSurvivorsReformAtOnce(std::vector<std::unique_ptr<Member>>& ms) {
    ms[0]->node->join(1);
    ms[1]->node->join(1);
    for (int i : {0, 1}) {
      ms[i]->node->awaitJoin();
      ASSERT_FALSE(ms[i]->node->error) << messageOf(*ms[i]->node);
      EXPECT_EQ(ms[i]->node->info.round, 1);
      EXPECT_EQ(ms[i]->node->info.groupWorldSize, 2);
      EXPECT_EQ(ms[i]->node->info.restartCount, 0);
    }
    EXPECT_EQ(clock_, kStart) << "the survivors waited for a last call";
    EXPECT_FALSE(state().closed);
  }

  DynamicOptions opts_ = [] {
    DynamicOptions o;
    o.runId = "job";
    o.endpointHost = "10.0.0.9";
    o.minNodes = 1;
    o.maxNodes = 8;
    o.closeTimeout = 60s;
    return o;
  }();
  MemoryHub hub_;  // first: outlives the nodes
  std::atomic<int64_t> clock_{kStart};
  std::atomic<int> workerStores_{0};
};

inline void expectEvent(const RoundEvent& e, int round, RoundEnd kind, int node,
                 const std::string& why) {
  EXPECT_EQ(e.round, round);
  EXPECT_EQ(e.kind, kind) << toString(e.kind);
  EXPECT_EQ(e.node, node);
  EXPECT_EQ(e.reason, why);
}


}  // namespace ddprun::rendezvous::testing_dynamic
