// <utility> must precede Boost 1.74's Asio under C++20 with g++ 12.
#include <utility>

#include "ddprun/store/tcp_store_server.h"

#include <poll.h>

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "ddprun/common/error.h"
#include "ddprun/common/log.h"
#include "ddprun/common/net.h"
#include "ddprun/store/log_limiter.h"

namespace ddprun::store {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

namespace {
// One read per readiness callback: a large request arrives in chunks of at
// most this, and each chunk costs O(chunk) (the parser resumes), so other
// clients get a turn between chunks of a 32 MiB upload.
constexpr size_t kReadChunk = 64 * 1024;

std::string endpointText(const tcp::endpoint& ep) {
  return net::formatHostPort(ep.address().to_string(), ep.port());
}
}  // namespace

class TcpStoreServer::Impl : public Outbox {
 public:
  explicit Impl(const TcpStoreServerOptions& opts)
      : opts_(opts),
        state_(opts.limits, *this, ServerAuth{opts.authToken, {}}),
        acceptor_(io_) {
    for (const auto& rule : opts.leases) state_.addLeaseRule(rule);
  }

  void bind() {
    net::raiseFileLimit();
    std::vector<tcp::endpoint> candidates;
    if (opts_.host.empty()) {
      candidates.emplace_back(tcp::v6(), opts_.port);
      candidates.emplace_back(tcp::v4(), opts_.port);
    } else {
      error_code ec;
      auto addr = asio::ip::make_address(opts_.host, ec);
      if (!ec) {
        candidates.emplace_back(addr, opts_.port);
      } else {
        tcp::resolver resolver(io_);
        auto results = resolver.resolve(opts_.host, std::to_string(opts_.port), ec);
        if (ec)
          DDPRUN_THROW(IoError, "cannot resolve listen host '", opts_.host,
                       "': ", ec.message());
        for (const auto& r : results) candidates.push_back(r.endpoint());
      }
    }
    error_code ec;
    std::string tried;
    for (const auto& ep : candidates) {
      if (tryBind(ep, ec)) return;
      tried = endpointText(ep);
      if (ec == asio::error::address_in_use) break;  // the v4 fallback would fail too
    }
    std::string msg = "cannot listen on " + tried + ": " + ec.message();
    if (ec == asio::error::address_in_use) {
      auto holder = net::findListeningProcess(opts_.port);
      msg += holder ? " (held by " + *holder + ")" : "";
      msg += "; choose another port (or 0 for a free one) or stop that process";
    }
    DDPRUN_THROW(IoError, msg);
  }

  void run() {
    accept();
    if (opts_.idleTimeout.count() > 0 || !opts_.authToken.empty()) armIdleTimer();
    thread_ = std::thread([this] { loop(); });
  }

  // io_context::run(), but spinning on poll() for opts_.busyPoll after the
  // last handler ran before blocking again (see TcpStoreServerOptions).
  void loop() {
    if (opts_.busyPoll.count() <= 0) {
      io_.run();
      return;
    }
    auto lastWork = std::chrono::steady_clock::now();
    while (!io_.stopped()) {
      if (io_.poll() > 0) {
        lastWork = std::chrono::steady_clock::now();
      } else if (std::chrono::steady_clock::now() - lastWork > opts_.busyPoll) {
        io_.run_one();  // sleeps until the next event
        lastWork = std::chrono::steady_clock::now();
      }
    }
  }

  void stop() {
    std::lock_guard<std::mutex> lock(stopMu_);
    if (stopped_) return;
    stopped_ = true;
    asio::post(io_, [this] {
      error_code ec;
      acceptor_.close(ec);
      idleTimer_.cancel();
      for (auto& [id, s] : sessions_) s->socket.close(ec);
      io_.stop();
    });
    if (thread_.joinable()) thread_.join();
  }

  size_t erase(const std::function<size_t()>& eraseNow) {
    std::promise<size_t> erased;
    auto done = erased.get_future();
    {
      // Under stopMu_, so that stop() cannot slip in between: its io_.stop()
      // is posted after this, and handlers run in the order posted.
      std::lock_guard<std::mutex> lock(stopMu_);
      if (stopped_) return 0;
      asio::post(io_, [this, &eraseNow, &erased] {
        size_t n = 0;
        guarded([&] {
          n = eraseNow();  // watchers' notices are flushed
          return std::string();
        });
        closeDoomed();  // a watcher that does not read its notices
        erased.set_value(n);
      });
    }
    return done.get();
  }

  size_t eraseKeysOutside(const std::string& keep) {
    return erase([&] { return state_.eraseKeysOutside(keep); });
  }
  size_t eraseKeysUnder(const std::vector<std::string>& prefixes) {
    return erase([&] { return state_.eraseKeysUnder(prefixes); });
  }

  uint16_t port() const { return bound_.port(); }
  std::string address() const { return endpointText(bound_); }

  ServerStats stats() const {
    std::lock_guard<std::mutex> lock(statsMu_);
    return stats_;
  }
  size_t connections() const { return liveConnections_; }

  // Outbox: the state machine appends replies here; flushed after each read.
  std::string& bufferFor(ConnId id) override {
    auto& s = sessions_.at(id);
    if (!s->dirty) {
      s->dirty = true;
      dirty_.push_back(id);
    }
    return s->out;
  }

  void closeLater(ConnId id, const std::string& why) override {
    toClose_.emplace_back(id, why);
  }

  // The peer's FIN or RST already arrived (not read yet): POLLRDHUP/HUP/ERR.
  bool peerClosed(ConnId id) override {
    auto it = sessions_.find(id);
    if (it == sessions_.end() || it->second->closed) return true;
    pollfd p{it->second->socket.native_handle(), POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  }
  // An RST (or any socket error) shows as POLLERR; a FIN alone does not.
  ConnEnd peerEnd(ConnId id) override {
    auto it = sessions_.find(id);
    if (it == sessions_.end() || it->second->closed) return ConnEnd::kReset;
    pollfd p{it->second->socket.native_handle(), POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & POLLERR) == 0 && (p.revents & POLLRDHUP) != 0)
      return ConnEnd::kClosed;
    return ConnEnd::kReset;
  }

 private:
  struct Session {
    explicit Session(tcp::socket sock) : socket(std::move(sock)) {}
    tcp::socket socket;
    ConnId id = 0;
    std::string peer;
    std::string out;      // replies not yet handed to the socket
    std::string writing;  // replies being written
    size_t chargedInFlight = 0;  // bytes of `writing` still charged after close
    bool dirty = false;
    bool readPaused = false;
    bool closed = false;
    // How it ends: kClosed only when the peer's FIN is read (its process
    // closed it); a reset, an error or the server's own close is kReset.
    ConnEnd end = ConnEnd::kReset;
    std::chrono::steady_clock::time_point openedAt = std::chrono::steady_clock::now();
    // When the partial request now held began arriving (idle timeout).
    std::optional<std::chrono::steady_clock::time_point> partialSince;
  };
  using SessionPtr = std::shared_ptr<Session>;

  bool tryBind(const tcp::endpoint& ep, error_code& ec) {
    acceptor_.close(ec);
    acceptor_.open(ep.protocol(), ec);
    if (ec) return false;
    acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (ep.address().is_v6()) acceptor_.set_option(asio::ip::v6_only(false), ec);
    acceptor_.bind(ep, ec);
    if (ec) return false;
    acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return false;
    bound_ = acceptor_.local_endpoint(ec);
    return !ec;
  }

  void accept() {
    acceptor_.async_accept([this](error_code ec, tcp::socket sock) {
      if (ec == asio::error::operation_aborted) return;
      if (ec) {
        // Out of descriptors and the like: log, back off, keep serving.
        DDPRUN_WARN("accept failed: ", ec.message());
        auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(50));
        timer->async_wait([this, timer](error_code) { accept(); });
        return;
      }
      onAccept(std::move(sock));
      accept();
    });
  }

  void onAccept(tcp::socket sock) {
    error_code ec;
    auto peer = sock.remote_endpoint(ec);
    std::string peerText = ec ? "unknown peer" : endpointText(peer);
    if (sessions_.size() >= opts_.limits.maxConnections) {
      std::string note;
      if (refuseLog_.admit(std::chrono::steady_clock::now(), note))
        DDPRUN_WARN("refusing connection from ", peerText, ": ",
                    opts_.limits.maxConnections,
                    " connections are open (raise --max-connections)", note);
      bumpRejected();
      sock.close(ec);
      return;
    }
    sock.set_option(tcp::no_delay(true), ec);
    sock.non_blocking(true, ec);
    auto s = std::make_shared<Session>(std::move(sock));
    s->id = nextId_++;
    s->peer = std::move(peerText);
    sessions_[s->id] = s;
    liveConnections_ = sessions_.size();
    state_.open(s->id);
    DDPRUN_DEBUG("connection ", s->id, " from ", s->peer);
    read(s);
  }

  // Reactor style: wait until the socket is readable, then read into the one
  // shared buffer. An idle connection costs no read buffer, so thousands of
  // clients fit in a few MiB.
  void read(const SessionPtr& s) {
    s->socket.async_wait(tcp::socket::wait_read,
                         [this, s](error_code ec) { onReadable(s, ec); });
  }

  void onReadable(const SessionPtr& s, error_code ec) {
    if (s->closed) return;
    size_t n = 0;
    if (!ec) n = s->socket.read_some(asio::buffer(readBuf_), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) {
      read(s);
      return;
    }
    if (ec) {
      if (ec == asio::error::eof) s->end = ConnEnd::kClosed;
      if (ec != asio::error::eof && ec != asio::error::connection_reset &&
          ec != asio::error::operation_aborted)
        DDPRUN_DEBUG("read from ", s->peer, " failed: ", ec.message());
      close(s);
      return;
    }
    std::string_view bytes(readBuf_.data(), n);
    std::string err = guarded([&] { return state_.receive(s->id, bytes); });
    afterServing(s, err);
  }

  // Runs one ServerState call. Any exception (std::bad_alloc included) is
  // blamed on the client being served, which is closed; the io thread and
  // the process go on.
  template <typename F>
  std::string guarded(F&& f) {
    try {
      std::string err = f();
      flushDirty();
      return err;
    } catch (const std::exception& e) {
      // The client being served is closed by the caller. Output made in the
      // same call for others (a woken waiter, a watcher) is still theirs:
      // flush it. Only clearing the list left their `dirty` flags set, so
      // bufferFor() never listed them again and they were never written to.
      ++extraRejected_;
      std::string why = std::string("internal error while serving it: ") + e.what();
      try {
        flushDirty();
      } catch (const std::exception&) {
        forgetDirty();
      }
      return why;
    }
  }

  // Drops the pending flushes and their flags (when even flushing failed).
  void forgetDirty() {
    for (ConnId id : dirty_) {
      auto it = sessions_.find(id);
      if (it != sessions_.end()) it->second->dirty = false;
    }
    dirty_.clear();
  }

  // After receive()/resume(): close whoever must go, apply backpressure,
  // track partial requests for the idle timeout, read on.
  void afterServing(const SessionPtr& s, const std::string& err) {
    closeDoomed();
    if (s->closed) return;
    if (!err.empty()) {
      closeLogged(s, err);
      return;
    }
    bool partial = state_.partial(s->id);
    if (!partial)
      s->partialSince.reset();
    else if (!s->partialSince)
      s->partialSince = std::chrono::steady_clock::now();
    if (state_.paused(s->id)) {
      s->readPaused = true;  // resumed when the writes drain
      return;
    }
    read(s);
  }

  void closeDoomed() {
    auto list = std::move(toClose_);
    toClose_.clear();
    for (auto& [id, why] : list) {
      auto it = sessions_.find(id);
      if (it != sessions_.end()) closeLogged(it->second, why);
    }
  }

  void closeLogged(const SessionPtr& s, const std::string& why) {
    std::string note;
    auto now = std::chrono::steady_clock::now();
    if (!state_.authenticated(s->id)) {
      if (authLog_.admit(now, note))
        DDPRUN_WARN("unauthenticated client ", s->peer, " closed: ", why, note);
    } else if (closeLog_.admit(now, note)) {
      DDPRUN_WARN("closing connection from ", s->peer, ": ", why, note);
    }
    close(s);
  }

  // Closes connections that have held a partial request for longer than
  // opts_.idleTimeout (a slow-loris sender pins its buffers otherwise), and
  // with a secret, those still unauthenticated opts_.authTimeout after
  // they were accepted.
  void armIdleTimer() {
    auto period = std::chrono::steady_clock::duration::max();
    if (opts_.idleTimeout.count() > 0)
      period = std::min<decltype(period)>(period, opts_.idleTimeout / 4);
    if (!opts_.authToken.empty())
      period = std::min<decltype(period)>(period, opts_.authTimeout / 4);
    period = std::max<decltype(period)>(period, std::chrono::milliseconds(10));
    idleTimer_.expires_after(period);
    idleTimer_.async_wait([this](error_code ec) {
      if (ec) return;
      closeIdle(std::chrono::steady_clock::now());
      armIdleTimer();
    });
  }

  void closeIdle(std::chrono::steady_clock::time_point now) {
    std::vector<std::pair<SessionPtr, const char*>> idle;
    for (auto& [id, s] : sessions_) {
      if (opts_.idleTimeout.count() > 0 && s->partialSince &&
          now - *s->partialSince > opts_.idleTimeout)
        idle.emplace_back(s,
                          "a partial request was held longer than the idle timeout "
                          "(--idle-timeout)");
      else if (!opts_.authToken.empty() && now - s->openedAt > opts_.authTimeout &&
               !state_.authenticated(id))
        idle.emplace_back(s, "it did not authenticate in time");
    }
    for (auto& [s, why] : idle) {
      ++extraRejected_;
      closeLogged(s, why);
    }
  }

  void flushDirty() {
    for (ConnId id : dirty_) {
      auto it = sessions_.find(id);
      if (it == sessions_.end()) continue;
      it->second->dirty = false;
      write(it->second);
    }
    dirty_.clear();
    refreshStats();
  }

  void refreshStats() {
    std::lock_guard<std::mutex> lock(statsMu_);
    stats_ = state_.stats();
    stats_.connectionsRejected += extraRejected_;
  }

  void write(const SessionPtr& s) {
    if (s->closed || !s->writing.empty() || s->out.empty()) return;
    s->writing.swap(s->out);
    asio::async_write(s->socket, asio::buffer(s->writing),
                      [this, s](error_code ec, size_t) {
                        size_t done = s->writing.size();
                        std::string().swap(s->writing);  // free it, not only clear
                        if (s->closed) {
                          state_.releaseInFlight(s->chargedInFlight);
                          s->chargedInFlight = 0;
                          return;
                        }
                        if (ec) {
                          close(s);
                          return;
                        }
                        state_.sent(s->id, done);
                        write(s);
                        if (s->readPaused && !state_.paused(s->id)) {
                          s->readPaused = false;
                          std::string err = guarded([&] { return state_.resume(s->id); });
                          afterServing(s, err);
                        }
                      });
  }

  void close(const SessionPtr& s) {
    if (s->closed) return;
    s->closed = true;
    error_code ec;
    s->socket.shutdown(tcp::socket::shutdown_both, ec);
    s->socket.close(ec);
    // What an in-flight write holds stays charged until its handler frees it.
    s->chargedInFlight = s->writing.size();
    std::string().swap(s->out);
    state_.closed(s->id, s->chargedInFlight, s->end);
    sessions_.erase(s->id);
    liveConnections_ = sessions_.size();
    refreshStats();
  }

  void bumpRejected() {
    ++extraRejected_;
    refreshStats();
  }

  TcpStoreServerOptions opts_;
  asio::io_context io_;
  ServerState state_;
  tcp::acceptor acceptor_;
  tcp::endpoint bound_;
  std::thread thread_;
  std::unordered_map<ConnId, SessionPtr> sessions_;
  std::vector<ConnId> dirty_;
  std::vector<std::pair<ConnId, std::string>> toClose_;
  asio::steady_timer idleTimer_{io_};
  LogLimiter refuseLog_;
  LogLimiter closeLog_;
  LogLimiter authLog_;
  std::vector<char> readBuf_ = std::vector<char>(kReadChunk);
  ConnId nextId_ = 1;
  std::atomic<size_t> liveConnections_{0};
  mutable std::mutex statsMu_;
  ServerStats stats_;
  uint64_t extraRejected_ = 0;
  std::mutex stopMu_;
  bool stopped_ = false;
};

TcpStoreServer::TcpStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpStoreServer::~TcpStoreServer() { stop(); }

std::unique_ptr<TcpStoreServer> TcpStoreServer::start(const TcpStoreServerOptions& opts) {
  auto impl = std::make_unique<Impl>(opts);
  impl->bind();
  impl->run();
  return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(std::move(impl)));
}

uint16_t TcpStoreServer::port() const { return impl_->port(); }
std::string TcpStoreServer::address() const { return impl_->address(); }
void TcpStoreServer::stop() { impl_->stop(); }
size_t TcpStoreServer::eraseKeysOutside(const std::string& keep) {
  return impl_->eraseKeysOutside(keep);
}
size_t TcpStoreServer::eraseKeysUnder(const std::vector<std::string>& prefixes) {
  return impl_->eraseKeysUnder(prefixes);
}
ServerStats TcpStoreServer::stats() const { return impl_->stats(); }
size_t TcpStoreServer::connections() const { return impl_->connections(); }

}  // namespace ddprun::store
