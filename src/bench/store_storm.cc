// store_storm: a connection storm against a c10d TCPStore server (ours or
// PyTorch's >= 2.2), as init_process_group makes it: N clients connect at
// once, from one process and one thread (non-blocking sockets on epoll), and
// each does what a rank does:
//
//   connect; VALIDATE + PING (the >= 2.2 handshake, PING answered);
//   ADD <prefix>/counter 1; the client whose ADD returned N sets <prefix>/go;
//   SET <prefix>/addr/<i>; WAIT <prefix>/go; GET <prefix>/go.
//
// Every client keeps its connection open until the last one is done (ranks
// keep theirs for the whole job). Reports the time from the first connect to
// the last client done, per-client p50/p99 (from its own first connect()),
// connect errors and reconnects; then checks over one client's connection that the
// counter is exactly N, that every client read the go value, and that every
// addr/<i> holds what client i set. Exit 0 only when all of that holds.
//
//   store_storm --port P [--host H] [--clients N] [--timeout-s S] [--prefix K] [--json]
//   store_storm --port P --clients N --idle   (connect + handshake, print one
//       line, then hold every connection open until stdin closes: the
//       server's memory per idle connection is measured around it)
//
// A connection that fails before its ADD was sent (refused, reset, closed) is
// retried on a new one after a short pause; one that fails later is a failed
// client (the ADD may have counted). Raises RLIMIT_NOFILE to its hard limit.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/common/main_guard.h"
#include "ddprun/common/net.h"
#include "ddprun/store/wire.h"

namespace wire = ddprun::store::wire;
using wire::Command;
using SteadyClock = std::chrono::steady_clock;

namespace {

struct Config {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  int clients = 1024;
  double timeoutS = 300;
  std::string prefix = "storm";
  bool idle = false;
  bool json = false;
  // Loopback only: clients bind 127.0.0.1 .. 127.0.0.<k> (auto: one address
  // per 4,096 clients), as ranks come from many hosts. From one address,
  // 16,384 connections to one port take more than the even half of Linux's
  // ephemeral range (connect() tries even ports first), and the last
  // thousands of connect()s each scan it whole: seconds of client time that
  // would be billed to the server.
  int sourceAddrs = 0;
};

std::string encode(Command c, std::vector<std::string> keys = {},
                   std::vector<std::string> values = {}, int64_t number = 0, uint32_t u32 = 0) {
  std::string out;
  wire::encodeRequest(wire::Dialect::kV2,
                      wire::makeRequest(c, std::move(keys), std::move(values), number, u32), out);
  return out;
}

// What a client is waiting for.
enum class Step { kConnect, kPing, kAdd, kWait, kGet, kDone, kFailed };

struct Client {
  int fd = -1;
  int index = 0;
  Step step = Step::kConnect;
  std::string out;  // bytes not yet written
  std::optional<wire::ReplyParser> parser;
  SteadyClock::time_point started;   // its first connect()
  SteadyClock::time_point finished;
  SteadyClock::time_point retryAt;   // when a failed connection is tried again
  int retries = 0;
  std::string value;  // what GET go returned
};

class Storm {
 public:
  Storm(const Config& cfg, const sockaddr_storage& addr, socklen_t addrLen)
      : cfg_(cfg), addr_(addr), addrLen_(addrLen), clients_(cfg.clients) {
    ep_ = ::epoll_create1(EPOLL_CLOEXEC);
    pending_ = cfg.clients;
    bool loopback4 = addr.ss_family == AF_INET &&
                     (ntohl(reinterpret_cast<const sockaddr_in&>(addr).sin_addr.s_addr) >> 24) == 127;
    sources_ = !loopback4 ? 1 : cfg.sourceAddrs > 0 ? cfg.sourceAddrs : (cfg.clients + 4095) / 4096;
    for (int i = 0; i < cfg.clients; ++i) clients_[i].index = i;
  }
  // Every connection ends with a reset (SO_LINGER 0), not a FIN: a FIN
  // would leave N sockets in TIME_WAIT on this side for a minute, holding N
  // of the ~28,000 ephemeral ports, and the next storm's connect()s would
  // crawl looking for free ones.
  ~Storm() {
    linger abort{1, 0};
    for (auto& c : clients_) {
      if (c.fd < 0) continue;
      ::setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &abort, sizeof abort);
      ::close(c.fd);
    }
    ::close(ep_);
  }

  // Runs until every client is done or failed, or the deadline.
  bool run() {
    t0_ = SteadyClock::now();
    deadline_ = t0_ + std::chrono::duration_cast<SteadyClock::duration>(
                          std::chrono::duration<double>(cfg_.timeoutS));
    for (auto& c : clients_) {
      c.started = SteadyClock::now();
      connect(c);
    }
    issued_ = SteadyClock::now();
    std::vector<epoll_event> events(4096);
    while (pending_ > 0) {
      auto now = SteadyClock::now();
      if (now > deadline_) return false;
      retryDue(now);
      int timeoutMs = retryQueue_.empty() ? 100 : 5;
      int n = ::epoll_wait(ep_, events.data(), static_cast<int>(events.size()), timeoutMs);
      if (n < 0 && errno != EINTR) {
        std::fprintf(stderr, "store_storm: epoll_wait: %s\n", std::strerror(errno));
        return false;
      }
      for (int i = 0; i < n; ++i) drive(clients_[events[i].data.u32], events[i].events);
    }
    end_ = SteadyClock::now();
    return true;
  }

  const std::vector<Client>& clients() const { return clients_; }
  double seconds() const { return std::chrono::duration<double>(end_ - t0_).count(); }
  // How long issuing every connect() took (on loopback the kernel runs the
  // whole TCP handshake inside connect(), so this is the burst's length).
  double issueMs() const { return msSince(issued_); }
  // When the last handshake (PING) and the last ADD were answered.
  double lastHandshakeMs() const { return msSince(lastHandshake_); }
  double lastAddMs() const { return msSince(lastAdd_); }
  double msSince(SteadyClock::time_point t) const {
    return std::chrono::duration<double, std::milli>(t - t0_).count();
  }
  int connectErrors() const { return connectErrors_; }
  int failed() const { return failed_; }
  int pending() const { return pending_; }

 private:
  void connect(Client& c) {
    c.fd = ::socket(addr_.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) {
      fail(c, std::string("socket: ") + std::strerror(errno) + " (raise ulimit -n)");
      return;
    }
    int one = 1;
    ::setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (!bindSource(c)) return;
    c.step = Step::kConnect;
    c.out = encode(Command::kValidate, {}, {}, 0, wire::kValidationMagic) +
            encode(Command::kPing, {}, {}, 0, static_cast<uint32_t>(c.index + 1));
    c.parser.emplace(Command::kPing);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.u32 = static_cast<uint32_t>(c.index);
    ::epoll_ctl(ep_, EPOLL_CTL_ADD, c.fd, &ev);
    int rc = ::connect(c.fd, reinterpret_cast<const sockaddr*>(&addr_), addrLen_);
    if (rc != 0 && errno != EINPROGRESS) broken(c, std::string("connect: ") + std::strerror(errno));
  }

  // Binds the address only (the port is chosen at connect(), per 4-tuple).
  bool bindSource(Client& c) {
    if (sources_ <= 1) return true;
    int one = 1;
    ::setsockopt(c.fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
    sockaddr_in src{};
    src.sin_family = AF_INET;
    src.sin_addr.s_addr = htonl(0x7F000001u + static_cast<uint32_t>(c.index % sources_));
    if (::bind(c.fd, reinterpret_cast<sockaddr*>(&src), sizeof src) == 0) return true;
    fail(c, std::string("bind to a loopback source address: ") + std::strerror(errno));
    return false;
  }

  void drive(Client& c, uint32_t events) {
    if (c.step == Step::kDone || c.step == Step::kFailed || c.fd < 0) return;
    if (c.step == Step::kConnect) {
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        broken(c, std::string("connect: ") + std::strerror(err));
        return;
      }
      if (!(events & EPOLLOUT)) return;
      c.step = Step::kPing;
    }
    if (!flush(c)) return;
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) readReplies(c);
  }

  // Writes what it can of c.out; false when the connection broke.
  bool flush(Client& c) {
    while (!c.out.empty()) {
      ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        broken(c, std::string("send: ") + std::strerror(errno));
        return false;
      }
      c.out.erase(0, static_cast<size_t>(n));
    }
    return true;
  }

  void readReplies(Client& c) {
    char buf[4096];
    while (c.fd >= 0 && c.step != Step::kDone && c.step != Step::kFailed) {
      ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n <= 0) {
        broken(c, n == 0 ? "the server closed the connection"
                         : std::string("recv: ") + std::strerror(errno));
        return;
      }
      std::string_view data(buf, static_cast<size_t>(n));
      while (!data.empty() && c.parser) {
        auto res = c.parser->feed(data);
        if (res.status == wire::ParseStatus::kBad) {
          fail(c, "bad reply: " + res.error);
          return;
        }
        if (res.status == wire::ParseStatus::kNeedMore) break;
        data.remove_prefix(res.consumed);
        if (!advance(c)) return;
      }
      if (!data.empty()) {
        fail(c, "bytes after the last reply");
        return;
      }
    }
  }

  // One reply completed: send the next request. False when the client ended.
  bool advance(Client& c) {
    wire::Reply reply = std::move(c.parser->reply());
    c.parser.reset();
    const std::string counter = "/" + cfg_.prefix + "/counter";
    const std::string go = "/" + cfg_.prefix + "/go";
    switch (c.step) {
      case Step::kPing:
        lastHandshake_ = SteadyClock::now();
        if (reply.u32 != static_cast<uint32_t>(c.index + 1)) {
          fail(c, "PING echoed " + std::to_string(reply.u32));
          return false;
        }
        if (cfg_.idle) {
          c.step = Step::kDone;
          c.finished = SteadyClock::now();
          --pending_;
          return false;
        }
        next(c, Step::kAdd, encode(Command::kAdd, {counter}, {}, 1));
        return true;
      case Step::kAdd: {
        lastAdd_ = SteadyClock::now();
        std::string req;
        if (reply.number == cfg_.clients) req = encode(Command::kSet, {go}, {"go"});
        req += encode(Command::kSet, {"/" + cfg_.prefix + "/addr/" + std::to_string(c.index)},
                      {addrValue(c.index)});
        req += encode(Command::kWait, {go});
        next(c, Step::kWait, std::move(req));
        return true;
      }
      case Step::kWait:
        next(c, Step::kGet, encode(Command::kGet, {go}));
        return true;
      case Step::kGet:
        c.value = std::move(reply.values.at(0));
        c.step = Step::kDone;
        c.finished = SteadyClock::now();
        --pending_;
        return false;
      default:
        return false;
    }
  }

  void next(Client& c, Step step, std::string req) {
    c.step = step;
    Command replyTo = step == Step::kAdd ? Command::kAdd
                      : step == Step::kWait ? Command::kWait
                                            : Command::kGet;
    c.parser.emplace(replyTo);
    c.out = std::move(req);
    flush(c);
  }

  // Before its ADD went out a client starts over on a new connection (as
  // PyTorch's client retries connecting); after, it has failed.
  void broken(Client& c, const std::string& why) {
    bool beforeAdd = c.step == Step::kConnect || c.step == Step::kPing;
    if (!beforeAdd || cfg_.idle) {
      fail(c, why);
      return;
    }
    if (c.step == Step::kConnect) ++connectErrors_;
    if (c.retries < 3 || cfg_.clients < 100)
      std::fprintf(stderr, "store_storm: client %d: %s; reconnecting\n", c.index, why.c_str());
    ::close(c.fd);
    c.fd = -1;
    ++c.retries;
    c.retryAt = SteadyClock::now() + std::chrono::milliseconds(10 * std::min(c.retries, 100));
    retryQueue_.push_back(c.index);
  }

  void retryDue(SteadyClock::time_point now) {
    size_t n = retryQueue_.size();
    for (size_t i = 0; i < n; ++i) {
      int idx = retryQueue_.front();
      retryQueue_.pop_front();
      if (clients_[idx].retryAt <= now)
        connect(clients_[idx]);
      else
        retryQueue_.push_back(idx);
    }
  }

  void fail(Client& c, const std::string& why) {
    if (failed_++ < 5) std::fprintf(stderr, "store_storm: client %d failed: %s\n", c.index, why.c_str());
    if (c.fd >= 0) ::close(c.fd);
    c.fd = -1;
    c.step = Step::kFailed;
    --pending_;
  }

 public:
  static std::string addrValue(int i) { return "10.0.0." + std::to_string(i) + ":29500"; }

 private:
  const Config& cfg_;
  sockaddr_storage addr_;
  socklen_t addrLen_;
  std::vector<Client> clients_;
  std::deque<int> retryQueue_;
  int ep_ = -1;
  int sources_ = 1;
  int pending_ = 0;
  int connectErrors_ = 0;
  int failed_ = 0;
  SteadyClock::time_point t0_, issued_, end_, deadline_, lastHandshake_, lastAdd_;
};

// Blocking helpers for the check after the storm.
bool sendAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Reads replies to `cmds`, in order, into `out`. False on a broken stream.
bool readReplies(int fd, const std::vector<Command>& cmds, std::vector<wire::Reply>& out) {
  std::string buf(64 * 1024, '\0');
  std::string_view pending;
  std::string carry;
  for (Command c : cmds) {
    wire::ReplyParser p(c);
    for (;;) {
      if (pending.empty()) {
        ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
        if (n <= 0) return false;
        pending = std::string_view(buf.data(), static_cast<size_t>(n));
      }
      auto res = p.feed(pending);
      if (res.status == wire::ParseStatus::kBad) return false;
      if (res.status == wire::ParseStatus::kOk) {
        pending.remove_prefix(res.consumed);
        break;
      }
      pending = {};
    }
    out.push_back(std::move(p.reply()));
  }
  return true;
}

// The counter, every client's go value and every addr/<i>, read over a
// finished client's connection (a new one could be refused by a server at
// its connection limit): the number of mismatches (a broken connection counts
// as one), each named on stderr.
int verify(const Config& cfg, const std::vector<Client>& clients) {
  int bad = 0;
  int fd = -1;
  for (const auto& c : clients) {
    if (c.step == Step::kDone && fd < 0) fd = c.fd;
    if (c.step == Step::kDone && c.value != "go" && bad++ < 5)
      std::fprintf(stderr, "store_storm: client %d read go = '%s'\n", c.index, c.value.c_str());
  }
  if (fd < 0) return bad + 1;
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  std::string req = encode(Command::kAdd, {"/" + cfg.prefix + "/counter"}, {}, 0);
  std::vector<Command> cmds{Command::kAdd};
  for (int i = 0; i < cfg.clients; ++i) {
    req += encode(Command::kGet, {"/" + cfg.prefix + "/addr/" + std::to_string(i)});
    cmds.push_back(Command::kGet);
  }
  std::vector<wire::Reply> replies;
  if (!sendAll(fd, req) || !readReplies(fd, cmds, replies)) {
    std::fprintf(stderr, "store_storm: the check connection broke: %s\n", std::strerror(errno));
    return bad + 1;
  }
  if (replies[0].number != cfg.clients) {
    std::fprintf(stderr, "store_storm: counter = %lld, expected %d\n",
                 static_cast<long long>(replies[0].number), cfg.clients);
    ++bad;
  }
  for (int i = 0; i < cfg.clients; ++i) {
    const auto& v = replies[1 + i].values.at(0);
    if (v != Storm::addrValue(i) && bad++ < 10)
      std::fprintf(stderr, "store_storm: addr/%d = '%s'\n", i, v.c_str());
  }
  return bad;
}

double percentileMs(std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  size_t i = std::min(sorted.size() - 1, static_cast<size_t>(p * sorted.size()));
  return sorted[i];
}

int runStorm(const Config& cfg) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(cfg.host.c_str(), std::to_string(cfg.port).c_str(), &hints, &res);
  if (rc != 0) {
    std::fprintf(stderr, "store_storm: cannot resolve '%s': %s\n", cfg.host.c_str(),
                 gai_strerror(rc));
    return 2;
  }
  sockaddr_storage addr{};
  socklen_t len = res->ai_addrlen;
  std::memcpy(&addr, res->ai_addr, res->ai_addrlen);
  ::freeaddrinfo(res);
  uint64_t limit = ddprun::net::raiseFileLimit();
  if (limit < static_cast<uint64_t>(cfg.clients) + 16) {
    std::fprintf(stderr, "store_storm: %d clients need %d descriptors; the limit is %llu "
                 "(raise the hard limit: ulimit -Hn)\n",
                 cfg.clients, cfg.clients + 16, static_cast<unsigned long long>(limit));
    return 2;
  }

  Storm storm(cfg, addr, len);
  bool finished = storm.run();
  std::vector<double> ms;
  int retries = 0;
  for (const auto& c : storm.clients()) {
    retries += c.retries;
    if (c.step == Step::kDone)
      ms.push_back(std::chrono::duration<double, std::milli>(c.finished - c.started).count());
  }
  std::sort(ms.begin(), ms.end());
  if (cfg.idle) {
    std::printf("{\"idle_connections\": %zu, \"failed\": %d, \"connect_errors\": %d, "
                "\"retries\": %d}\n",
                ms.size(), storm.failed(), storm.connectErrors(), retries);
    std::fflush(stdout);
    char b;
    while (::read(0, &b, 1) > 0) {
    }
    return ms.size() == static_cast<size_t>(cfg.clients) ? 0 : 1;
  }
  int bad = finished && storm.failed() == 0 ? verify(cfg, storm.clients()) : 0;
  double secs = finished ? storm.seconds() : cfg.timeoutS;
  if (!finished)
    std::fprintf(stderr, "store_storm: %d of %d clients not done after %.0f s\n",
                 storm.pending(), cfg.clients, cfg.timeoutS);
  if (cfg.json) {
    std::printf("{\"clients\": %d, \"done\": %zu, \"seconds\": %.4f, \"p50_ms\": %.2f, "
                "\"p99_ms\": %.2f, \"max_ms\": %.2f, \"connect_errors\": %d, \"retries\": %d, "
                "\"failed\": %d, \"verify_mismatches\": %d, \"connect_burst_ms\": %.1f, "
                "\"last_handshake_ms\": %.1f, \"last_add_ms\": %.1f}\n",
                cfg.clients, ms.size(), secs, percentileMs(ms, 0.5), percentileMs(ms, 0.99),
                ms.empty() ? 0.0 : ms.back(), storm.connectErrors(), retries, storm.failed(), bad, storm.issueMs(),
                storm.lastHandshakeMs(), storm.lastAddMs());
  } else {
    std::printf("%d clients: %zu done in %.3f s (last client done); per client p50 %.1f ms, "
                "p99 %.1f ms, max %.1f ms; connect errors %d, reconnects %d, failed %d; "
                "check: %s\n",
                cfg.clients, ms.size(), secs, percentileMs(ms, 0.5), percentileMs(ms, 0.99),
                ms.empty() ? 0.0 : ms.back(), storm.connectErrors(), retries, storm.failed(),
                bad ? "MISMATCH" : (finished ? "counter, go and every addr exact" : "skipped"));
  }
  return finished && storm.failed() == 0 && bad == 0 &&
                 ms.size() == static_cast<size_t>(cfg.clients)
             ? 0
             : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  CLI::App app{"store_storm: N clients connecting at once, as ranks at init_process_group"};
  app.add_option("--host", cfg.host);
  app.add_option("--port", cfg.port)->required();
  app.add_option("--clients,-n", cfg.clients)->check(CLI::Range(1, 1 << 20));
  app.add_option("--timeout-s", cfg.timeoutS, "give up after this long (exit 1)");
  app.add_option("--prefix", cfg.prefix, "key prefix");
  app.add_option("--source-addrs", cfg.sourceAddrs,
                 "loopback only: clients bind 127.0.0.1..127.0.0.K (default: one per 4096 "
                 "clients)")
      ->check(CLI::Range(0, 254));
  app.add_flag("--idle", cfg.idle, "connect and handshake only, then hold until stdin closes");
  app.add_flag("--json", cfg.json);
  CLI11_PARSE(app, argc, argv);
  return ddprun::runMain("store_storm", 2, [&] { return runStorm(cfg); });
}
