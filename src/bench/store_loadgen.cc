// store_loadgen: drives a c10d TCPStore server (ours or PyTorch's >= 2.5) with
// N concurrent connections, each issuing its requests one at a time as
// PyTorch clients do, and reports throughput and latency percentiles.
//
//   store_loadgen --port P [--host H] [--connections N] [--ops M] [--op add|get|set|mixed]
//                 [--keys K] [--value-bytes B] [--threads T] [--verify] [--json]
//
// --op set sends SET then PING (SET has no reply) and counts the pair as one op.
// --max-seconds D stops starting new ops after D seconds (for servers that stall).
// --verify (add only): afterwards reads every counter with ADD 0 and checks it
// equals the exact number of increments sent to it; exit 1 on any mismatch.
#include <utility>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "ddprun/common/main_guard.h"
#include "ddprun/common/net.h"
#include "ddprun/store/wire.h"

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;
namespace wire = ddprun::store::wire;
using ddprun::store::wire::Command;
using ddprun::store::wire::Dialect;
using ddprun::store::wire::Request;
using SteadyClock = std::chrono::steady_clock;

namespace {

struct Config {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  int connections = 1;
  int ops = 1000;
  std::string op = "add";
  int keys = 16;
  int valueBytes = 16;
  int threads = 1;
  bool verify = false;
  bool json = false;
  double maxSeconds = 0;  // 0: run every op
  std::string prefix;
};

std::string encode(Command c, std::vector<std::string> keys, std::vector<std::string> values = {},
                   int64_t number = 0, uint32_t u32 = 0) {
  std::string out;
  ddprun::store::wire::encodeRequest(
      Dialect::kV2,
      ddprun::store::wire::makeRequest(c, std::move(keys), std::move(values), number, u32),
      out);
  return out;
}

std::string handshake() {
  return encode(Command::kValidate, {}, {}, 0, ddprun::store::wire::kValidationMagic) +
         encode(Command::kPing, {}, {}, 0, 1);
}

// One client connection running its ops back to back.
class Conn : public std::enable_shared_from_this<Conn> {
 public:
  Conn(asio::io_context& io, const Config& cfg, int index, std::atomic<int>& errors)
      : sock_(io), cfg_(cfg), index_(index), errors_(errors) {
    latencies_.reserve(cfg.ops);
  }
  void start(const tcp::endpoint& ep, SteadyClock::time_point deadline) {
    deadline_ = deadline;
    auto self = shared_from_this();
    sock_.async_connect(ep, [this, self](error_code ec) {
      if (fail(ec, "connect")) return;
      sock_.set_option(tcp::no_delay(true));
      out_ = handshake();
      asio::async_write(sock_, asio::buffer(out_), [this, self](error_code ec, size_t) {
        if (fail(ec, "handshake")) return;
        replyTo_ = Command::kPing;  // the handshake's PING echo
        parser_.emplace(replyTo_);
        handshaking_ = true;
        pump(0);
      });
    });
  }
  std::vector<uint64_t>& latencies() { return latencies_; }

 private:
  std::string key(int j) const {
    return "/" + cfg_.prefix + "/counter_" + std::to_string((index_ + j) % cfg_.keys);
  }
  void next() {
    if (done_ == cfg_.ops) return;
    if (cfg_.maxSeconds > 0 && SteadyClock::now() > deadline_) return;
    std::string op = cfg_.op;
    if (op == "mixed") op = (done_ % 2) ? "get" : "add";
    std::string k = key(done_);
    if (op == "add") {
      out_ = encode(Command::kAdd, {k}, {}, 1);
      replyTo_ = Command::kAdd;
    } else if (op == "get") {
      out_ = encode(Command::kGet, {k});
      replyTo_ = Command::kGet;
    } else {
      out_ = encode(Command::kSet, {k}, {std::string(cfg_.valueBytes, 'v')}) +
             encode(Command::kPing, {}, {}, 0, 7);
      replyTo_ = Command::kPing;
    }
    t0_ = SteadyClock::now();
    auto self = shared_from_this();
    asio::async_write(sock_, asio::buffer(out_), [this, self](error_code ec, size_t) {
      if (fail(ec, "write")) return;
      parser_.emplace(replyTo_);
      pump(0);
    });
  }
  // Feeds the n bytes just read to the reply codec, then reads exactly what
  // it still needs (never past the reply).
  void pump(size_t n) {
    auto res = parser_->feed(std::string_view(in_.data(), n));
    if (res.status == wire::ParseStatus::kOk) {
      if (std::exchange(handshaking_, false)) {
        next();
      } else {
        finish({});
      }
      return;
    }
    if (res.status == wire::ParseStatus::kBad) {
      if (errors_++ < 5)
        std::fprintf(stderr, "store_loadgen: connection %d: %s\n", index_,
                     res.error.c_str());
      return;
    }
    in_.resize(std::min<size_t>(parser_->wanted(), 1 << 20));
    auto self = shared_from_this();
    asio::async_read(sock_, asio::buffer(in_), [this, self](error_code ec, size_t got) {
      if (fail(ec, "read")) return;
      pump(got);
    });
  }
  void finish(error_code ec) {
    if (fail(ec, "read")) return;
    auto us = std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now() - t0_);
    latencies_.push_back(static_cast<uint64_t>(us.count()));
    ++done_;
    next();
  }
  bool fail(error_code ec, const char* what) {
    if (!ec) return false;
    if (errors_++ < 5)
      std::fprintf(stderr, "store_loadgen: connection %d %s: %s\n", index_, what,
                   ec.message().c_str());
    return true;
  }

  tcp::socket sock_;
  const Config& cfg_;
  int index_;
  std::atomic<int>& errors_;
  std::string out_;
  std::string in_;
  Command replyTo_ = Command::kPing;
  std::optional<wire::ReplyParser> parser_;
  bool handshaking_ = false;
  int done_ = 0;
  SteadyClock::time_point t0_, deadline_;
  std::vector<uint64_t> latencies_;
};

// Reads each counter with ADD 0 over a blocking connection and compares it
// with the number of increments the run sent to it.
int verifyCounters(const Config& cfg, const tcp::endpoint& ep) {
  asio::io_context io;
  tcp::socket s(io);
  s.connect(ep);
  asio::write(s, asio::buffer(handshake()));
  char buf[8];
  asio::read(s, asio::buffer(buf, 4));
  std::vector<int64_t> expected(cfg.keys, 0);
  for (int c = 0; c < cfg.connections; ++c)
    for (int j = 0; j < cfg.ops; ++j) ++expected[(c + j) % cfg.keys];
  int bad = 0;
  for (int i = 0; i < cfg.keys; ++i) {
    asio::write(s, asio::buffer(encode(
                       Command::kAdd, {"/" + cfg.prefix + "/counter_" + std::to_string(i)}, {}, 0)));
    asio::read(s, asio::buffer(buf, 8));
    wire::ReplyParser reply(Command::kAdd);
    reply.feed(std::string_view(buf, 8));
    int64_t got = reply.reply().number;
    if (got != expected[i]) {
      std::fprintf(stderr, "store_loadgen: counter_%d = %lld, expected %lld\n", i,
                   static_cast<long long>(got), static_cast<long long>(expected[i]));
      ++bad;
    }
  }
  return bad;
}

double percentile(const std::vector<uint64_t>& sorted, double p) {  // ns -> us
  if (sorted.empty()) return 0;
  size_t i = std::min(sorted.size() - 1, static_cast<size_t>(p * sorted.size()));
  return sorted[i] / 1000.0;
}

}  // namespace

int main(int argc, char** argv) {
  ddprun::ignoreSigpipe();  // as every ddprun program (main_guard.h): EPIPE, not death
  Config cfg;
  CLI::App app{"store_loadgen: load generator for c10d TCPStore servers"};
  app.add_option("--host", cfg.host);
  app.add_option("--port", cfg.port)->required();
  app.add_option("--connections,-c", cfg.connections)->check(CLI::PositiveNumber);
  app.add_option("--ops,-n", cfg.ops, "ops per connection")->check(CLI::PositiveNumber);
  app.add_option("--op", cfg.op)->check(CLI::IsMember({"add", "get", "set", "mixed"}));
  app.add_option("--keys", cfg.keys)->check(CLI::PositiveNumber);
  app.add_option("--value-bytes", cfg.valueBytes)->check(CLI::NonNegativeNumber);
  app.add_option("--threads", cfg.threads)->check(CLI::PositiveNumber);
  app.add_flag("--verify", cfg.verify);
  app.add_option("--max-seconds", cfg.maxSeconds,
                 "stop starting new ops after this long (reports what completed)");
  app.add_flag("--json", cfg.json);
  app.add_option("--prefix", cfg.prefix, "key prefix (default: unique per run)");
  CLI11_PARSE(app, argc, argv);
  if (cfg.prefix.empty())
    cfg.prefix = "loadgen_" + std::to_string(::getpid()) + "_" +
                 std::to_string(SteadyClock::now().time_since_epoch().count());
  ddprun::net::raiseFileLimit();

  asio::io_context io;
  tcp::resolver resolver(io);
  tcp::endpoint ep = *resolver.resolve(cfg.host, std::to_string(cfg.port)).begin();
  std::atomic<int> errors{0};
  if (cfg.op == "get") {  // make sure the keys exist with the requested size
    asio::io_context io2;
    tcp::socket s(io2);
    s.connect(ep);
    std::string req = handshake();
    for (int i = 0; i < cfg.keys; ++i)
      req += encode(Command::kSet, {"/" + cfg.prefix + "/counter_" + std::to_string(i)},
                    {std::string(cfg.valueBytes, 'v')});
    asio::write(s, asio::buffer(req));
    char b[4];
    asio::read(s, asio::buffer(b, 4));
  }
  std::vector<std::shared_ptr<Conn>> conns;
  for (int i = 0; i < cfg.connections; ++i)
    conns.push_back(std::make_shared<Conn>(io, cfg, i, errors));
  auto t0 = SteadyClock::now();
  auto deadline = t0 + std::chrono::duration_cast<SteadyClock::duration>(
                            std::chrono::duration<double>(cfg.maxSeconds));
  for (auto& c : conns) c->start(ep, deadline);
  std::vector<std::thread> pool;
  for (int t = 1; t < cfg.threads; ++t) pool.emplace_back([&] { io.run(); });
  io.run();
  for (auto& t : pool) t.join();
  double secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();

  std::vector<uint64_t> all;
  for (auto& c : conns) all.insert(all.end(), c->latencies().begin(), c->latencies().end());
  std::sort(all.begin(), all.end());
  double opsPerS = all.size() / secs;
  int bad = 0;
  if (cfg.verify && cfg.op == "add" && errors == 0) bad = verifyCounters(cfg, ep);
  if (cfg.json) {
    std::printf("{\"op\": \"%s\", \"connections\": %d, \"ops\": %zu, \"seconds\": %.4f, "
                "\"ops_per_s\": %.1f, \"p50_us\": %.1f, \"p99_us\": %.1f, \"p999_us\": %.1f, "
                "\"errors\": %d, \"verify_mismatches\": %d}\n",
                cfg.op.c_str(), cfg.connections, all.size(), secs, opsPerS,
                percentile(all, 0.5), percentile(all, 0.99), percentile(all, 0.999),
                errors.load(), bad);
  } else {
    std::printf("%s x %d connections: %zu ops in %.3f s = %.0f ops/s; latency p50 %.1f us, "
                "p99 %.1f us, p99.9 %.1f us; errors %d\n",
                cfg.op.c_str(), cfg.connections, all.size(), secs, opsPerS,
                percentile(all, 0.5), percentile(all, 0.99), percentile(all, 0.999),
                errors.load());
    if (cfg.verify) std::printf("verify: %s\n", bad ? "MISMATCH" : "all counters exact");
  }
  if (errors > 0 || bad > 0) return 1;
  if (cfg.maxSeconds == 0 &&
      static_cast<long>(all.size()) != static_cast<long>(cfg.connections) * cfg.ops)
    return 1;
  return 0;
}
