// rdzv_sim: N agents' real dynamic rendezvous objects in one process against
// a real ddprun-store in a process of its own (issue 43): how long N nodes
// take to form one round, what each join costs in store requests and bytes,
// what keeping the round alive costs per node and second, and (--kill-one)
// how long the survivors take to notice a node that vanished and to re-form.
//
//   rdzv_sim --nodes 1000 [--latency-us 100] [--kill-one] [--endpoint H:P]
//            [--form-timeout-s 300] [--keepalive-window-s 10] [--json FILE]
//
// Each simulated agent is what a real agent builds: makeDynamicTcpBackend
// (the same clients, heartbeats and worker store) and the rendezvous over it,
// driven only through the public Rendezvous interface (join, events,
// shutdown), so the harness measures whatever protocol the library has.
// Every client of the endpoint (the rendezvous's own, its round watcher's,
// the heartbeat's beater and watcher, ...) is a connection of its own, opened
// through the backend's EndpointConnect seam, which wraps it in a SimStore:
//   - latency: every request waits --latency-us before it is sent (one
//     network round trip; the store's reply then comes over loopback), and
//     so does every connect (its handshake);
//   - counts, per agent and kind of client (rendezvous / heartbeat):
//     requests, connects, and payload bytes (keys and values sent, values
//     received; the wire's framing is left out);
//   - a kill switch: a token that shuts every socket of the agent down (the
//     server sees the connections close, as after kill -9) and refuses every
//     later connect, so the agent says no goodbye: only its silent heartbeat
//     tells the others.
// Each agent has a distinct pid (1000000 + i) in its node id and advertises
// 127.0.0.1. Its callbacks run on one of a few dispatcher threads (agent i on
// i % K): an agent's "one thread", as the Rendezvous interface requires.
// With the store started here (listening on every address), agents connect
// to 127.0.0.1 .. 127.0.0.<spread> in turn: loopback's ephemeral ports
// (about 28,000 per destination address) would not hold 10,000 agents' four
// or five connections to one address.
//
// Every agent's own work (building, parsing and checking what it reads) runs
// on this machine's cores together, as it would not on N machines: the
// harness's CPU seconds are reported beside the times (harness_cpu_s), and a
// protocol whose per-join work grows with N pays N times that here.
//
// Output: one JSON line on stdout (and --json FILE). Exit 0 when the round
// formed (and re-formed, with --kill-one), 1 when it did not within the
// bounds (the JSON says how far it got), 2 on a usage or setup error, 3 when
// this machine cannot hold N agents' threads (the JSON says why).
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/common/error.h"
#include "ddprun/common/log.h"
#include "ddprun/common/main_guard.h"
#include "ddprun/common/net.h"
#include "ddprun/rendezvous/dynamic_rendezvous.h"
#include "ddprun/store/tcp_store.h"
#include "dynamic_rendezvous_internal.h"
#include "rdzv_sim_store.h"

namespace {

using namespace std::chrono_literals;
namespace store = ddprun::store;
namespace rdzv = ddprun::rendezvous;
using Json = nlohmann::json;
using Steady = std::chrono::steady_clock;
using Micros = std::chrono::microseconds;

double secondsSince(Steady::time_point t0, Steady::time_point t) {
  return std::chrono::duration<double>(t - t0).count();
}

// Counting, latency and the kill switch: rdzv_sim_store.h.
using namespace ddprun::bench::rdzv_sim;

// ---- agents and their threads -----------------------------------------------

// One thread running posted work in order: the "agent thread" of the agents
// assigned to it.
class Dispatcher {
 public:
  Dispatcher() : thread_([this] { loop(); }) {}
  ~Dispatcher() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  void post(std::function<void()> fn) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_, and everything posted has run
      auto fn = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: it uses the members above
};

struct Agent {
  int index = 0;
  Counters rdzvC, hbC;  // the rendezvous's clients, the heartbeat's
  std::shared_ptr<store::CancelToken> kill = std::make_shared<store::CancelToken>();
  std::unique_ptr<rdzv::Rendezvous> rdzv;  // after what its connections use
  // Under Sim::mu_:
  int joinsDone = 0;
  int joinsOk = 0;
  bool killed = false;
  rdzv::RoundInfo first, last;  // the first and the latest successful join
  std::string error;            // the latest failed join's
  Steady::time_point firstAt{}, lastAt{}, eventAt{};
  int events = 0;
  rdzv::JoinProgress progress;  // the latest a pending join said
  Count joinRdzv, joinHb;       // spent by the first join's end
};

struct Config {
  int nodes = 64;
  int64_t latencyUs = 0;
  std::string endpoint;  // "" start a ddprun-store here
  std::string storeBin;
  bool killOne = false;
  double formTimeoutS = 300;
  double reformTimeoutS = 300;
  double keepaliveWindowS = 5;
  int keepAliveIntervalMs = 5000;
  int keepAliveMaxAttempt = 3;
  int dispatchers = 8;
  int stackKb = 256;
  int spread = 4;
  std::string jsonPath;
  std::string logLevel = "warning";  // N agents' info lines would drown the figures
};

// The ddprun-store child: started on a free port, stopped at the end.
class StoreProcess {
 public:
  StoreProcess(const std::string& bin, int maxConnections) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) DDPRUN_THROW(ddprun::IoError, "pipe failed");
    const std::string maxConn = std::to_string(maxConnections);
    pid_ = ::fork();
    if (pid_ < 0) DDPRUN_THROW(ddprun::IoError, "fork failed");
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::dup2(fds[1], 1);
      ::execl(bin.c_str(), bin.c_str(), "--port", "0", "--max-connections",
              maxConn.c_str(), "--log-level", "warning", static_cast<char*>(nullptr));
      std::perror("exec ddprun-store");
      ::_exit(127);
    }
    ::close(fds[1]);
    std::string out;
    char buf[256];
    std::smatch m;
    const std::regex listening("listening on .*:([0-9]+)\n");
    ssize_t n;
    while (!std::regex_search(out, m, listening) &&
           (n = ::read(fds[0], buf, sizeof buf)) > 0)
      out.append(buf, static_cast<size_t>(n));
    ::close(fds[0]);  // it prints nothing more on stdout at this log level
    if (!std::regex_search(out, m, listening))
      DDPRUN_THROW(ddprun::IoError, bin, " did not say where it listens: ", out);
    port_ = static_cast<uint16_t>(std::stoi(m[1]));
  }
  ~StoreProcess() {
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  uint16_t port() const { return port_; }
  double cpuSeconds() const { return procCpuSeconds(pid_); }

  static double procCpuSeconds(pid_t pid) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string s((std::istreambuf_iterator<char>(f)), {});
    auto p = s.rfind(')');
    if (p == std::string::npos) return 0;
    std::istringstream rest(s.substr(p + 2));
    std::string field;
    int64_t utime = 0, stime = 0;
    for (int i = 3; rest >> field; ++i) {
      if (i == 14) utime = std::stoll(field);
      if (i == 15) {
        stime = std::stoll(field);
        break;
      }
    }
    return static_cast<double>(utime + stime) /
           static_cast<double>(::sysconf(_SC_CLK_TCK));
  }

 private:
  pid_t pid_ = -1;
  uint16_t port_ = 0;
};

int64_t readProcNumber(const std::string& path) {
  std::ifstream f(path);
  int64_t v = 0;
  f >> v;
  return v;
}

int threadsNow() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  return 0;
}

Json stats(std::vector<int64_t> v) {
  if (v.empty()) return Json::object();
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (auto x : v) sum += static_cast<double>(x);
  return {{"p50", v[v.size() / 2]},
          {"max", v.back()},
          {"min", v.front()},
          {"mean", sum / static_cast<double>(v.size())}};
}

// Every agent's info of one round: the same round and world, ranks 0..M-1.
// Returns "" or what is wrong.
std::string checkRound(const std::vector<const rdzv::RoundInfo*>& infos) {
  const int m = static_cast<int>(infos.size());
  std::set<int> ranks;
  for (const auto* i : infos) {
    if (i->round != infos[0]->round) return "rounds differ";
    if (i->groupWorldSize != m)
      return "group world size " + std::to_string(i->groupWorldSize) + " for " +
             std::to_string(m) + " nodes";
    if (i->worldSize != m) return "world size " + std::to_string(i->worldSize);
    ranks.insert(i->groupRank);
  }
  if (static_cast<int>(ranks.size()) != m || *ranks.begin() != 0 ||
      *ranks.rbegin() != m - 1)
    return "group ranks are not a permutation of 0.." + std::to_string(m - 1);
  return "";
}

class Sim {
 public:
  explicit Sim(Config cfg) : cfg_(std::move(cfg)) {}

  int run() {
    Json out = {{"nodes", cfg_.nodes},
                {"latency_us", cfg_.latencyUs},
                {"keep_alive_interval_ms", cfg_.keepAliveIntervalMs},
                {"keep_alive_max_attempt", cfg_.keepAliveMaxAttempt}};
    int rc = runInto(out);
    out["exit"] = rc;
    emit(out);
    teardown(rc);
    return rc;
  }

 private:
  // Threads of one agent at most (two task threads, the round watcher, the
  // heartbeat's beater and watcher, and slack for a change of protocol).
  static constexpr int kThreadsPerAgent = 6;

  bool fits(Json& out) {
    const int64_t pidMax = readProcNumber("/proc/sys/kernel/pid_max");
    const int64_t threadsMax = readProcNumber("/proc/sys/kernel/threads-max");
    const int64_t maps = readProcNumber("/proc/sys/vm/max_map_count");
    const int64_t need = int64_t{kThreadsPerAgent} * cfg_.nodes + 64;
    std::string why;
    if (pidMax > 0 && need > pidMax)
      why = "kernel.pid_max is " + std::to_string(pidMax);
    else if (threadsMax > 0 && need > threadsMax)
      why = "kernel.threads-max is " + std::to_string(threadsMax);
    else if (maps > 0 && 2 * need + 4096 > maps)  // a stack and its guard each
      why = "vm.max_map_count is " + std::to_string(maps);
    if (why.empty()) return true;
    out["error"] = "cannot run " + std::to_string(cfg_.nodes) +
                   " agents as threads here: up to " + std::to_string(need) +
                   " threads (" + std::to_string(kThreadsPerAgent) + " per agent), and " +
                   why;
    return false;
  }

  void setUpProcess() {
    // Latency sleeps of 100 us are not stretched by the default 50 us of
    // timer slack: every thread created from here on inherits 1 ns.
    ::prctl(PR_SET_TIMERSLACK, 1UL);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, static_cast<size_t>(cfg_.stackKb) * 1024);
    pthread_setattr_default_np(&attr);
    pthread_attr_destroy(&attr);
    // Five connections per agent here, and as many in the store (which
    // inherits the limit): as root, lift the hard limit too.
    const rlim_t want = static_cast<rlim_t>(cfg_.nodes) * 8 + 4096;
    rlimit r{};
    ::getrlimit(RLIMIT_NOFILE, &r);
    if (r.rlim_max < want) {
      rlimit up{want, want};
      ::setrlimit(RLIMIT_NOFILE, &up);
    }
    ddprun::net::raiseFileLimit();
  }

  rdzv::DynamicOptions options(int i, const std::string& host, uint16_t port) const {
    rdzv::DynamicOptions o;
    o.endpointHost = host;
    if (cfg_.endpoint.empty() && cfg_.spread > 1)
      o.endpointHost = "127.0.0." + std::to_string(1 + i % cfg_.spread);
    o.endpointPort = port;
    o.runId = "sim";
    o.isHost = false;
    o.isHostExplicit = false;
    o.maxNodes = cfg_.nodes;
    o.minNodes = cfg_.killOne ? cfg_.nodes - 1 : cfg_.nodes;
    o.localAddr = "127.0.0.1";
    o.keepAliveInterval = std::chrono::milliseconds(cfg_.keepAliveIntervalMs);
    o.keepAliveMaxAttempt = cfg_.keepAliveMaxAttempt;
    const auto bound = std::chrono::milliseconds(
        static_cast<int64_t>((cfg_.formTimeoutS + cfg_.reformTimeoutS) * 1000) + 60'000);
    o.joinTimeout = bound;
    // With --kill-one MIN is N-1: the first round must still wait for all N.
    o.lastCallTimeout = bound;
    o.closeTimeout = 10s;
    return o;
  }

  rdzv::detail::EndpointConnect connectVia(Agent* a) const {
    const Micros latency(cfg_.latencyUs);
    return [a, latency](
               const store::TcpStoreOptions& base) -> std::unique_ptr<store::Store> {
      Counters& c = base.name == "heartbeat" ? a->hbC : a->rdzvC;
      auto token = std::make_shared<store::CancelToken>();
      auto link = std::make_unique<TokenLink>(token);
      link->listen(a->kill);
      link->listen(base.cancel);
      if (token->cancelled())
        DDPRUN_THROW(ddprun::CancelledError, "this simulated node was cut off");
      c.connects++;
      if (latency.count() > 0) std::this_thread::sleep_for(latency);
      store::TcpStoreOptions o = base;
      o.cancel = token;
      auto inner = store::TcpStore::connect(o);
      return std::make_unique<SimStore>(std::move(inner), std::move(link), c, latency);
    };
  }

  void makeAgents(const std::string& host, uint16_t port) {
    for (int i = 0; i < cfg_.dispatchers; ++i)
      dispatchers_.push_back(std::make_unique<Dispatcher>());
    agents_.reserve(static_cast<size_t>(cfg_.nodes));
    for (int i = 0; i < cfg_.nodes; ++i) {
      auto a = std::make_unique<Agent>();
      a->index = i;
      auto opts = options(i, host, port);
      auto backend = rdzv::detail::makeDynamicTcpBackend(opts, connectVia(a.get()));
      backend.pid = 1'000'000 + i;
      Dispatcher* d = dispatchers_[static_cast<size_t>(i % cfg_.dispatchers)].get();
      a->rdzv = rdzv::detail::makeDynamicRendezvous(
          opts, [d](std::function<void()> fn) { d->post(std::move(fn)); },
          std::move(backend));
      Agent* raw = a.get();
      a->rdzv->setEventHandler([this, raw](rdzv::RoundEvent e) { onEvent(*raw, e); });
      a->rdzv->setJoinProgressHandler([this, raw](const rdzv::JoinProgress& p) {
        std::lock_guard lock(mu_);
        raw->progress = p;
      });
      agents_.push_back(std::move(a));
    }
  }

  Dispatcher& dispatcherOf(const Agent& a) {
    return *dispatchers_[static_cast<size_t>(a.index % cfg_.dispatchers)];
  }

  // On the agent's dispatcher.
  void join(Agent& a) {
    a.rdzv->join(1, [this, &a](std::exception_ptr error, rdzv::RoundInfo info) {
      onJoined(a, std::move(error), std::move(info));
    });
  }

  void onJoined(Agent& a, std::exception_ptr error, rdzv::RoundInfo info) {
    const auto now = Steady::now();
    Count r = Count::of(a.rdzvC), h = Count::of(a.hbC);
    std::lock_guard lock(mu_);
    a.joinsDone++;
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        a.error = e.what();
      }
    } else {
      if (a.joinsOk++ == 0) {
        a.first = info;
        a.firstAt = now;
        a.joinRdzv = r;
        a.joinHb = h;
      }
      a.last = info;
      a.lastAt = now;
    }
    cv_.notify_all();
  }

  // On the agent's dispatcher: as an agent does, join the next round.
  void onEvent(Agent& a, const rdzv::RoundEvent&) {
    {
      std::lock_guard lock(mu_);
      a.events++;
      events_++;
      if (a.eventAt == Steady::time_point{} || a.eventAt < killAt_)
        a.eventAt = Steady::now();
      if (stopping_ || a.killed) return;
    }
    join(a);
  }

  // Waits until pred() (under mu_) or the deadline; returns pred().
  template <typename Pred>
  bool awaitUntil(double seconds, Pred pred) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds), pred);
  }

  int runInto(Json& out) {
    if (!fits(out)) return 3;
    setUpProcess();
    std::string host = "127.0.0.1";
    uint16_t port = 0;
    if (cfg_.endpoint.empty()) {
      store_ = std::make_unique<StoreProcess>(cfg_.storeBin, cfg_.nodes * 8 + 1024);
      port = store_->port();
      out["store"] = "ddprun-store started here, port " + std::to_string(port);
    } else {
      auto hp = cfg_.endpoint.rfind(':');
      if (hp == std::string::npos)
        DDPRUN_THROW(ddprun::InvalidArgument, "--endpoint H:P");
      host = cfg_.endpoint.substr(0, hp);
      port = static_cast<uint16_t>(std::stoi(cfg_.endpoint.substr(hp + 1)));
      out["store"] = cfg_.endpoint;
    }
    makeAgents(host, port);
    const int n = cfg_.nodes;

    // ---- forming -------------------------------------------------------
    const auto t0 = Steady::now();
    for (auto& a : agents_) dispatcherOf(*a).post([this, p = a.get()] { join(*p); });
    bool all = awaitUntil(cfg_.formTimeoutS, [&] { return allJoinedOnce(); });
    out["threads"] = threadsNow();
    out["threads_per_node"] = static_cast<double>(threadsNow()) / n;
    int ok = 0, failed = 0;
    std::string firstError;
    std::vector<const rdzv::RoundInfo*> infos;
    std::vector<int64_t> reqR, bytesR, reqAll, bytesAll, conns;
    Steady::time_point lastAt = t0;
    {
      std::lock_guard lock(mu_);
      for (auto& a : agents_) {
        if (a->joinsOk > 0) {
          ++ok;
          infos.push_back(&a->first);
          lastAt = std::max(lastAt, a->firstAt);
          Count sum = a->joinRdzv;
          sum += a->joinHb;
          reqR.push_back(a->joinRdzv.requests);
          bytesR.push_back(a->joinRdzv.bytes);
          reqAll.push_back(sum.requests);
          bytesAll.push_back(sum.bytes);
          conns.push_back(sum.connects);
        } else if (a->joinsDone > 0) {
          ++failed;
          if (firstError.empty()) firstError = a->error;
        }
      }
    }
    const std::string bad = ok == n ? checkRound(infos) : "not every node joined";
    const bool formed = all && ok == n && bad.empty();
    out["formed"] = formed;
    out["joined"] = ok;
    out["join_errors"] = failed;
    if (!firstError.empty()) out["first_error"] = firstError;
    if (!bad.empty()) out["round_check"] = bad;
    if (ok > 0) out["form_s"] = secondsSince(t0, lastAt);
    if (!all) {
      out["form_timeout_s"] = cfg_.formTimeoutS;
      std::lock_guard lock(mu_);
      out["progress"] = progressOfPending();
    }
    out["join"] = {{"rdzv_requests", stats(reqR)},
                   {"rdzv_bytes", stats(bytesR)},
                   {"requests", stats(reqAll)},
                   {"bytes", stats(bytesAll)},
                   {"connects", stats(conns)}};
    out["totals_at_form"] = totals();
    if (store_) out["store_cpu_s_at_form"] = store_->cpuSeconds();
    out["harness_cpu_s_at_form"] = StoreProcess::procCpuSeconds(::getpid());
    out["events_before_kill"] = events_;
    if (!formed) return 1;

    // ---- keeping the round alive --------------------------------------
    if (cfg_.keepaliveWindowS > 0) {
      const Json before = totals();
      const auto w0 = Steady::now();
      std::this_thread::sleep_for(std::chrono::duration<double>(cfg_.keepaliveWindowS));
      const double w = secondsSince(w0, Steady::now());
      const Json after = totals();
      auto per = [&](const char* kind, const char* what) {
        return static_cast<double>(after[kind][what].get<int64_t>() -
                                   before[kind][what].get<int64_t>()) /
               (w * n);
      };
      out["keepalive"] = {{"window_s", w},
                          {"rdzv_requests_per_node_s", per("rdzv", "requests")},
                          {"rdzv_bytes_per_node_s", per("rdzv", "bytes")},
                          {"hb_requests_per_node_s", per("hb", "requests")},
                          {"hb_bytes_per_node_s", per("hb", "bytes")}};
    }
    if (!cfg_.killOne) return 0;
    return killOne(out) ? 0 : 1;
  }

  // What the pending joins said last (Rendezvous::setJoinProgressHandler):
  // how far a round that is not complete got. Under mu_.
  Json progressOfPending() const {
    int reporting = 0, joined = 0, round = -1;
    for (const auto& a : agents_) {
      if (a->progress.round < 0) continue;
      ++reporting;
      if (a->progress.round > round) joined = 0;
      round = std::max(round, a->progress.round);
      if (a->progress.round == round) joined = std::max(joined, a->progress.joined);
    }
    return {{"agents_reporting", reporting}, {"round", round}, {"joined_max", joined}};
  }

  bool allJoinedOnce() const {
    for (const auto& a : agents_)
      if (a->joinsDone == 0) return false;
    return true;
  }

  Json totals() {
    Count r, h;
    for (const auto& a : agents_) {
      r += Count::of(a->rdzvC);
      h += Count::of(a->hbC);
    }
    auto js = [](const Count& c) {
      return Json{{"requests", c.requests}, {"bytes", c.bytes}, {"connects", c.connects}};
    };
    return {{"rdzv", js(r)}, {"hb", js(h)}};
  }

  // ---- a node vanishes ------------------------------------------------------
  bool killOne(Json& out) {
    const int n = cfg_.nodes;
    Agent* victim = nullptr;
    int round0 = 0;
    {
      std::lock_guard lock(mu_);
      for (auto& a : agents_)
        if (a->last.groupRank == n / 2) victim = a.get();
      round0 = victim->last.round;
      victim->killed = true;
      killAt_ = Steady::now();
    }
    const Json spent0 = totals();
    const double cpu0 = StoreProcess::procCpuSeconds(::getpid());
    const double storeCpu0 = store_ ? store_->cpuSeconds() : 0;
    victim->kill->cancel();  // every socket of it shut: the store sees them close
    auto reformed = [&] {
      for (const auto& a : agents_)
        if (!a->killed && (a->joinsOk == 0 || a->last.round <= round0)) return false;
      return true;
    };
    const bool all = awaitUntil(cfg_.reformTimeoutS, reformed);
    const double cpu = StoreProcess::procCpuSeconds(::getpid()) - cpu0;
    const double storeCpu = store_ ? store_->cpuSeconds() - storeCpu0 : 0;
    const Json spent = totals();
    // What the survivors spent from the loss to the end (re-formed or not):
    // per survivor, on the rendezvous's connections and the heartbeat's.
    auto perSurvivor = [&](const char* kind, const char* what) {
      return static_cast<double>(spent[kind][what].get<int64_t>() -
                                 spent0[kind][what].get<int64_t>()) /
             (n - 1);
    };
    std::lock_guard lock(mu_);
    std::vector<const rdzv::RoundInfo*> infos;
    Steady::time_point firstEvent{}, lastEvent{}, lastJoin{};
    int noticed = 0, rejoined = 0;
    for (const auto& a : agents_) {
      if (a->killed) continue;
      if (a->eventAt > killAt_) {
        ++noticed;
        if (firstEvent == Steady::time_point{} || a->eventAt < firstEvent)
          firstEvent = a->eventAt;
        lastEvent = std::max(lastEvent, a->eventAt);
      }
      if (a->joinsOk > 0 && a->last.round > round0) {
        ++rejoined;
        infos.push_back(&a->last);
        lastJoin = std::max(lastJoin, a->lastAt);
      }
    }
    const std::string bad = all ? checkRound(infos) : "not every survivor re-joined";
    Json k = {{"victim_rank", n / 2},
              {"heartbeat_timeout_s",
               cfg_.keepAliveIntervalMs * cfg_.keepAliveMaxAttempt / 1000.0},
              {"survivors", n - 1},
              {"noticed", noticed},
              {"rejoined", rejoined},
              {"reformed", all && bad.empty()},
              {"harness_cpu_s", cpu},
              {"rdzv_requests_per_survivor", perSurvivor("rdzv", "requests")},
              {"rdzv_bytes_per_survivor", perSurvivor("rdzv", "bytes")},
              {"hb_requests_per_survivor", perSurvivor("hb", "requests")},
              {"hb_bytes_per_survivor", perSurvivor("hb", "bytes")},
              {"store_cpu_s", storeCpu}};
    if (noticed > 0) {
      k["detect_first_s"] = secondsSince(killAt_, firstEvent);
      k["detect_s"] = secondsSince(killAt_, lastEvent);
    }
    if (rejoined > 0) {
      k["reform_s"] = secondsSince(killAt_, lastJoin);
      k["round"] = infos[0]->round;
    }
    if (!bad.empty()) k["round_check"] = bad;
    if (!all) {
      k["reform_timeout_s"] = cfg_.reformTimeoutS;
      k["progress"] = progressOfPending();
    }
    out["kill"] = k;
    return all && bad.empty();
  }

  void emit(const Json& out) {
    const std::string line = out.dump();
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    if (!cfg_.jsonPath.empty()) {
      std::ofstream f(cfg_.jsonPath);
      f << out.dump(1) << "\n";
    }
  }

  // Every agent cut off first (no goodbyes: N nodes leaving one by one
  // would rewrite the state N times), then shut down; the store last. A
  // teardown that hangs does not hold the figures back: they are out.
  void teardown(int rc) {
    std::thread([rc] {
      std::this_thread::sleep_for(180s);
      std::fprintf(stderr, "rdzv_sim: teardown took over 180 s; exiting\n");
      ::_exit(rc);
    }).detach();
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    for (auto& a : agents_) a->kill->cancel();
    for (auto& a : agents_) a->rdzv->shutdown();
    dispatchers_.clear();  // runs what was posted, then ends
    agents_.clear();
    store_.reset();
  }

  Config cfg_;
  std::unique_ptr<StoreProcess> store_;
  std::vector<std::unique_ptr<Dispatcher>> dispatchers_;
  std::vector<std::unique_ptr<Agent>> agents_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  int events_ = 0;
  Steady::time_point killAt_ = Steady::time_point::max();
};

std::string besideThisProgram(const std::string& name) {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return name;
  std::string self(buf, static_cast<size_t>(n));
  return self.substr(0, self.rfind('/') + 1) + name;
}

}  // namespace

int main(int argc, char** argv) {
  return ddprun::runMain("rdzv_sim", 2, [&] {
    Config cfg;
    CLI::App app{"N simulated agents' dynamic rendezvous against one ddprun-store"};
    app.add_option("--nodes", cfg.nodes, "simulated agents")
        ->check(CLI::Range(2, 1'000'000));
    app.add_option("--latency-us", cfg.latencyUs, "before every request and connect")
        ->check(CLI::Range(0, 10'000'000));
    app.add_option("--endpoint", cfg.endpoint,
                   "H:P of a running ddprun-store (else one is started)");
    app.add_option("--store-bin", cfg.storeBin,
                   "ddprun-store (default: beside this program)");
    app.add_flag("--kill-one", cfg.killOne,
                 "after forming, cut one node off without a goodbye");
    app.add_option("--form-timeout-s", cfg.formTimeoutS, "bound on forming")
        ->check(CLI::PositiveNumber);
    app.add_option("--reform-timeout-s", cfg.reformTimeoutS, "bound on re-forming")
        ->check(CLI::PositiveNumber);
    app.add_option("--keepalive-window-s", cfg.keepaliveWindowS,
                   "seconds of the formed round's upkeep to count (0: none)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--keep-alive-interval-ms", cfg.keepAliveIntervalMs)
        ->check(CLI::PositiveNumber);
    app.add_option("--keep-alive-max-attempt", cfg.keepAliveMaxAttempt)
        ->check(CLI::PositiveNumber);
    app.add_option("--dispatchers", cfg.dispatchers, "agent threads shared by the agents")
        ->check(CLI::Range(1, 256));
    app.add_option("--stack-kb", cfg.stackKb, "stack of every thread")
        ->check(CLI::Range(64, 8192));
    app.add_option("--spread", cfg.spread,
                   "connect to 127.0.0.1..127.0.0.<spread> in turn")
        ->check(CLI::Range(1, 254));
    app.add_option("--json", cfg.jsonPath, "also write the result here");
    app.add_option("--log-level", cfg.logLevel, "the agents' log (default warning)");
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return app.exit(e) == 0 ? 0 : 2;
    }
    ddprun::setLogLevel(ddprun::parseLogLevel(cfg.logLevel));
    ddprun::setLogTag("rdzv_sim");
    if (cfg.storeBin.empty()) cfg.storeBin = besideThisProgram("ddprun-store");
    if (cfg.killOne && cfg.nodes < 3)
      throw ddprun::InvalidArgument("--kill-one needs at least 3 nodes");
    return Sim(std::move(cfg)).run();
  });
}
