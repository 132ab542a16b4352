// heartbeat_bench: what the heartbeat's watcher (src/rendezvous/heartbeat.h)
// costs at N watched nodes, on the in-memory store or over a TCP store on
// loopback (an in-process TcpStoreServer on port 0). Uses only Heartbeat's
// public interface, so the same file builds against older heartbeat.cc.
//
//   heartbeat_bench [--nodes 256,10000] [--store memory|tcp] [--wakeups 20]
//                   [--interval-ms 20]
//
// Scenarios (one Heartbeat watching N nodes, a fake clock, real sleeps):
//   steady   every node has a beat; the clock stands still; per wake-up: the
//            watcher thread's CPU time, its store calls, and payload bytes
//            (keys sent + values received; the wire adds framing)
//   keyless  as steady, but half the nodes never beat (no key)
//   expiry   no node ever beat; the clock jumps past the timeout: CPU time and
//            store calls until the last onDead (no-op callbacks)
//   stop     as expiry, each onDead makes one store request (as the
//            rendezvous's does); at the first one the process sends itself
//            SIGTERM, and a signal thread (sigwait) calls stop(): ms from
//            kill() to stop() returning, and onDead calls made in all
// CPU time is CLOCK_THREAD_CPUTIME_ID of the watcher thread.
#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/common/error.h"
#include "ddprun/common/main_guard.h"
#include "ddprun/store/hash_store.h"
#include "ddprun/store/tcp_store.h"
#include "ddprun/store/tcp_store_server.h"
#include "heartbeat.h"

namespace {

using namespace std::chrono_literals;
namespace store = ddprun::store;
namespace hb = ddprun::rendezvous::detail;
using Strings = std::vector<std::string>;
using Steady = std::chrono::steady_clock;

const std::string kPrefix = "hb/";
const std::string kSelfKey = kPrefix + "self";

// What the watcher's connection did (the beater's calls, on its own key, are
// left out). The watcher's CPU clock is noted at its first call.
struct Stats {
  std::atomic<int64_t> calls{0}, bytes{0}, multiGets{0};
  std::atomic<bool> haveClock{false};
  clockid_t watcherClock{};
  int64_t watcherCpuNs() const {
    timespec ts{};
    clock_gettime(watcherClock, &ts);
    return ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
  }
  void noteWatcher() {
    if (haveClock) return;
    pthread_getcpuclockid(pthread_self(), &watcherClock);
    haveClock = true;
  }
  void count(const Strings& keys) {
    noteWatcher();
    ++calls;
    for (const auto& k : keys) bytes += int64_t(k.size());
  }
};

// A client connection that counts the watcher's calls and honours the
// heartbeat's cancel token (HashStore does not know it; TcpStore does).
class Counting : public store::Store {
 public:
  Counting(std::shared_ptr<store::Store> inner, Stats& stats,
           std::shared_ptr<store::CancelToken> cancel)
      : inner_(std::move(inner)), stats_(stats), cancel_(std::move(cancel)) {}
  void set(const std::string& k, std::string_view v) override { enter()->set(k, v); }
  std::string get(const std::string& k) override { return enter()->get(k); }
  int64_t add(const std::string& k, int64_t d) override { return enter()->add(k, d); }
  std::string compareSet(const std::string& k, std::string_view e,
                         std::string_view d) override {
    return enter()->compareSet(k, e, d);
  }
  bool check(const Strings& ks) override {
    if (ks != Strings{kSelfKey}) stats_.count(ks);
    return enter()->check(ks);
  }
  void wait(const Strings& ks, store::Millis t) override { enter()->wait(ks, t); }
  using Store::wait;
  bool deleteKey(const std::string& k) override { return enter()->deleteKey(k); }
  int64_t numKeys() override { return enter()->numKeys(); }
  void append(const std::string& k, std::string_view v) override {
    enter()->append(k, v);
  }
  Strings multiGet(const Strings& ks) override {
    stats_.count(ks);
    auto values = enter()->multiGet(ks);
    for (const auto& v : values) stats_.bytes += int64_t(v.size());
    ++stats_.multiGets;
    return values;
  }
  void multiSet(const Strings& ks, const Strings& vs) override {
    enter()->multiSet(ks, vs);
  }

 private:
  store::Store* enter() {
    if (cancel_ && cancel_->cancelled())
      DDPRUN_THROW(ddprun::CancelledError, "heartbeat_bench: cancelled");
    return inner_.get();
  }
  std::shared_ptr<store::Store> inner_;
  Stats& stats_;
  std::shared_ptr<store::CancelToken> cancel_;
};

// The store under test: one shared HashStore, or a TCP server on loopback
// with a connection per client.
class Backend {
 public:
  explicit Backend(bool tcp) {
    if (!tcp) {
      memory_ = std::make_shared<store::HashStore>();
      return;
    }
    store::TcpStoreServerOptions o;
    o.port = 0;
    server_ = store::TcpStoreServer::start(o);
  }
  std::shared_ptr<store::Store> client(std::shared_ptr<store::CancelToken> cancel) {
    if (memory_) return memory_;
    store::TcpStoreOptions o;
    o.port = server_->port();
    o.timeout = 60s;
    o.cancel = std::move(cancel);
    return store::TcpStore::connect(o);
  }
  hb::Heartbeat::Connect connect(Stats& stats) {
    return [this, &stats](const std::shared_ptr<store::CancelToken>& cancel) {
      return std::make_unique<Counting>(client(cancel), stats, cancel);
    };
  }

 private:
  std::shared_ptr<store::HashStore> memory_;
  std::unique_ptr<store::TcpStoreServer> server_;
};

Strings names(const std::string& stem, int n) {
  Strings out;
  for (int i = 0; i < n; ++i) out.push_back(stem + std::to_string(i));
  return out;
}

void beat(store::Store& s, const Strings& nodes) {
  Strings keys, values;
  for (const auto& n : nodes) {
    keys.push_back(kPrefix + n);
    values.push_back(hb::encodeBeat(0, 0));
  }
  if (!keys.empty()) s.multiSet(keys, values);
  if (!keys.empty()) s.check({keys.back()});  // the writes have landed
}

template <typename Pred>
void await(Pred pred) {
  while (!pred()) std::this_thread::sleep_for(1ms);
}

struct Config {
  std::vector<int> nodes{256, 10000};
  bool tcp = false;
  int wakeups = 20;
  int intervalMs = 20;
};

// steady / keyless: per wake-up averages over cfg.wakeups wake-ups, after two
// to warm up (the first reads find the keys).
void perWakeUp(const Config& cfg, int n, bool halfKeyless) {
  Backend backend(cfg.tcp);
  Stats stats;
  const int live = halfKeyless ? n / 2 : n;
  Strings peers = names("live", live);
  for (const auto& g : names("ghost", n - live)) peers.push_back(g);
  beat(*backend.client(nullptr), names("live", live));
  hb::Heartbeat h({std::chrono::milliseconds(cfg.intervalMs), 3}, backend.connect(stats),
                  kPrefix, "self", [] { return int64_t{0}; });
  h.setPeers(peers, {});
  await([&] { return stats.multiGets >= 2; });
  const int64_t m0 = stats.multiGets, c0 = stats.calls, b0 = stats.bytes;
  const int64_t cpu0 = stats.watcherCpuNs();
  await([&] { return stats.multiGets >= m0 + cfg.wakeups; });
  const int64_t cpu1 = stats.watcherCpuNs();
  const double w = double(stats.multiGets - m0);
  h.stop();
  std::printf(
      "%-8s %-6s %6d  cpu/wake-up %9.1f us  calls/wake-up %8.1f  bytes/wake-up %10.0f\n",
      halfKeyless ? "keyless" : "steady", cfg.tcp ? "tcp" : "memory", n,
      (cpu1 - cpu0) / 1e3 / w, (stats.calls - c0) / w, (stats.bytes - b0) / w);
}

// expiry: every node silent since setPeers; the clock jumps past the timeout.
void expiry(const Config& cfg, int n) {
  Backend backend(cfg.tcp);
  Stats stats;
  std::atomic<int64_t> now{0};
  std::atomic<int> dead{0};
  hb::Heartbeat h({std::chrono::milliseconds(cfg.intervalMs), 3}, backend.connect(stats),
                  kPrefix, "self", [&] { return now.load(); });
  h.setPeers(names("ghost", n), [&](const std::string&, int64_t) { ++dead; });
  await([&] { return stats.haveClock.load(); });
  const int64_t c0 = stats.calls, cpu0 = stats.watcherCpuNs();
  const auto t0 = Steady::now();
  now = int64_t{3} * cfg.intervalMs;
  await([&] { return dead >= n; });
  const double wallMs =
      std::chrono::duration<double, std::milli>(Steady::now() - t0).count();
  const int64_t cpu1 = stats.watcherCpuNs();
  h.stop();
  std::printf("%-8s %-6s %6d  cpu %10.1f ms  calls %8lld  wall %8.1f ms  deaths %d\n",
              "expiry", cfg.tcp ? "tcp" : "memory", n, (cpu1 - cpu0) / 1e6,
              static_cast<long long>(stats.calls - c0), wallMs, dead.load());
}

// stop: SIGTERM (blocked in every thread, taken by sigwait) at the first
// onDead of a mass expiry whose every onDead makes one store request.
void stopLatency(const Config& cfg, int n) {
  Backend backend(cfg.tcp);
  Stats stats;
  auto own = backend.client(nullptr);  // onDead's connection
  std::atomic<int64_t> now{0};
  std::atomic<int> calls{0};
  std::atomic<int64_t> sentNs{0};
  auto h = std::make_unique<hb::Heartbeat>(
      hb::HeartbeatOptions{std::chrono::milliseconds(cfg.intervalMs), 3},
      backend.connect(stats), kPrefix, "self", [&] { return now.load(); });
  std::thread signals([&] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    int sig = 0;
    sigwait(&set, &sig);
    h->stop();
    const auto ns = Steady::now().time_since_epoch().count() - sentNs;
    std::printf("%-8s %-6s %6d  SIGTERM-to-stop() %9.2f ms  onDead calls %d of %d\n",
                "stop", cfg.tcp ? "tcp" : "memory", n, ns / 1e6, calls.load(), n);
  });
  h->setPeers(names("ghost", n), [&](const std::string& node, int64_t) {
    if (++calls == 1) {
      sentNs = Steady::now().time_since_epoch().count();
      kill(getpid(), SIGTERM);
    }
    own->check({kPrefix + node});  // the rendezvous's request for this node
  });
  await([&] { return stats.haveClock.load(); });
  now = int64_t{3} * cfg.intervalMs;
  signals.join();
}

}  // namespace

int main(int argc, char** argv) {
  ddprun::ignoreSigpipe();  // as every ddprun program (main_guard.h): EPIPE, not death
  Config cfg;
  std::string kind = "memory";
  CLI::App app{"heartbeat_bench: the heartbeat watcher's cost at N watched nodes"};
  app.add_option("--nodes", cfg.nodes, "watched node counts")->delimiter(',');
  app.add_option("--store", kind, "memory or tcp")
      ->check(CLI::IsMember({"memory", "tcp"}));
  app.add_option("--wakeups", cfg.wakeups, "wake-ups averaged per figure");
  app.add_option("--interval-ms", cfg.intervalMs, "heartbeat interval");
  CLI11_PARSE(app, argc, argv);
  cfg.tcp = kind == "tcp";
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // inherited by every thread
  for (int n : cfg.nodes) {
    perWakeUp(cfg, n, false);
    perWakeUp(cfg, n, true);
    expiry(cfg, n);
    stopLatency(cfg, n);
  }
  return 0;
}
