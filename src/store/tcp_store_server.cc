// <utility> must precede Boost 1.74's Asio under C++20 with g++ 12.
#include <utility>

#include "ddprun/store/tcp_store_server.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <cerrno>
#include <cstring>
#include <deque>
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

// Connections accepted per readiness of the listening socket before the io
// thread serves others (then it comes back at once if more are queued). At
// least the usual somaxconn, so one turn empties a full accept queue.
constexpr int kAcceptBatch = 4096;
// Accepted connections made sessions (epoll registration, first read) per
// turn of the io thread.
constexpr size_t kSetupBatch = 256;

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
      auto holder = opts_.nameHolder ? net::findListeningProcess(opts_.port) : std::nullopt;
      msg += holder ? " (held by " + *holder + ")" : "";
      msg += "; choose another port (or 0 for a free one) or stop that process";
    }
    DDPRUN_THROW(IoError, msg);
  }

  void run() {
    if (opts_.acceptThread) {
      stopAccepting_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
      if (stopAccepting_ < 0)
        DDPRUN_THROW(IoError, "eventfd for the accept thread: ", std::strerror(errno));
      acceptThread_ = std::thread([this, fd = acceptor_.native_handle()] { acceptLoop(fd); });
      // The io thread has no operation of its own pending until then.
      work_.emplace(asio::make_work_guard(io_));
    } else {
      accept();
    }
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
    if (acceptThread_.joinable()) {
      uint64_t one = 1;
      (void)!::write(stopAccepting_, &one, sizeof one);
      acceptThread_.join();
      ::close(stopAccepting_);
    }
    asio::post(io_, [this] {
      error_code ec;
      acceptor_.close(ec);
      idleTimer_.cancel();
      for (auto& [id, s] : sessions_) s->socket.close(ec);
      for (auto& f : fresh_) ::close(f.fd);
      fresh_.clear();
      for (auto& f : incoming_) ::close(f.fd);
      incoming_.clear();
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
    tcp::endpoint peer;  // formatted only when logged
    std::string out;      // replies not yet handed to the socket
    std::string writing;  // replies being written
    size_t writingCharge = 0;  // what `writing` is charged (the replies' full size)
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
    acceptor_.listen(opts_.listenBacklog, ec);
    if (ec) return false;
    acceptor_.non_blocking(true, ec);  // accept4 below must never block
    if (ec) return false;
    acceptor_.set_option(tcp::no_delay(true), ec);  // inherited by accepted sockets
    bound_ = acceptor_.local_endpoint(ec);
    return !ec;
  }

  // One accept loop that never waits on a client. Each readiness of the
  // listening socket takes every queued connection off the kernel's accept
  // queue with accept4() (up to kAcceptBatch; the wait is re-armed at once
  // for more), doing nothing else per connection, so the queue (at most
  // net.core.somaxconn long) is emptied as fast as a burst of connects fills
  // it: a connect that finds it full has its SYN dropped and waits for a
  // retransmission (1 s, then 3 s). The accepted descriptors are set up as
  // sessions afterwards, kSetupBatch per turn, between the io thread's other
  // work; a connection waiting for that costs a descriptor and an entry in
  // fresh_, its bytes waiting in the kernel.
  void accept() {
    acceptor_.async_wait(tcp::acceptor::wait_read, [this](error_code ec) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) ec = acceptPending();
      if (!fresh_.empty() && !setupPosted_) {
        setupPosted_ = true;
        asio::post(io_, [this] { setUpFresh(); });
      }
      if (ec) {
        // Out of descriptors and the like: log, back off, keep serving.
        DDPRUN_WARN("accept failed: ", ec.message());
        auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(50));
        timer->async_wait([this, timer](error_code) { accept(); });
        return;
      }
      accept();
    });
  }

  // A descriptor accepted, not yet a session.
  struct Fresh {
    int fd = -1;
    tcp::endpoint peer;
  };

  // The accept thread (TcpStoreServerOptions::acceptThread): sleeps in
  // poll() on the listening socket, takes every queued connection with
  // accept4() when woken, hands the descriptors to the io thread and sleeps
  // again. It touches no state but incoming_ (under incomingMu_). Mostly
  // asleep, it is scheduled at once when connects arrive, even while the
  // io thread is busy or waiting for a CPU, so the kernel's queue stays short.
  void acceptLoop(int listenFd) {
    for (;;) {
      pollfd p[2] = {{listenFd, POLLIN, 0}, {stopAccepting_, POLLIN, 0}};
      if (::poll(p, 2, -1) < 0) {
        if (errno == EINTR) continue;
        DDPRUN_WARN("accept thread: poll failed: ", std::strerror(errno), "; accepting stops");
        return;
      }
      if (p[1].revents != 0) return;
      std::vector<Fresh> got;
      int err = takeQueued(listenFd, got);
      if (!got.empty()) handOver(std::move(got));
      if (err != 0) {
        // Out of descriptors and the like: log, back off, keep serving.
        DDPRUN_WARN("accept failed: ", std::strerror(err));
        pollfd stop{stopAccepting_, POLLIN, 0};
        if (::poll(&stop, 1, 50) > 0) return;
      }
    }
  }

  // accept4() until the queue is empty; returns the errno that stopped it
  // early (0: none).
  static int takeQueued(int listenFd, std::vector<Fresh>& got) {
    while (got.size() < static_cast<size_t>(kAcceptBatch)) {
      Fresh f;
      socklen_t len = static_cast<socklen_t>(f.peer.capacity());
      f.fd = ::accept4(listenFd, f.peer.data(), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (f.fd >= 0) {
        f.peer.resize(std::min<size_t>(len, f.peer.capacity()));
        got.push_back(f);
        continue;
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      return errno;
    }
    return 0;
  }

  void handOver(std::vector<Fresh> got) {
    bool post = false;
    {
      std::lock_guard<std::mutex> lock(incomingMu_);
      incoming_.insert(incoming_.end(), got.begin(), got.end());
      post = !incomingPosted_;
      incomingPosted_ = true;
    }
    if (post) asio::post(io_, [this] { takeIncoming(); });
  }

  // On the io thread: the accept thread's descriptors join fresh_ (or are
  // refused over the connection limit).
  void takeIncoming() {
    std::vector<Fresh> got;
    {
      std::lock_guard<std::mutex> lock(incomingMu_);
      got.swap(incoming_);
      incomingPosted_ = false;
    }
    for (auto& f : got) {
      if (sessions_.size() + fresh_.size() >= opts_.limits.maxConnections)
        refuse(f);
      else
        fresh_.push_back(f);
    }
    if (!fresh_.empty() && !setupPosted_) {
      setupPosted_ = true;
      asio::post(io_, [this] { setUpFresh(); });
    }
  }

  error_code acceptPending() {
    for (int i = 0; i < kAcceptBatch && acceptor_.is_open(); ++i) {
      Fresh f;
      socklen_t len = static_cast<socklen_t>(f.peer.capacity());
      f.fd = ::accept4(acceptor_.native_handle(), f.peer.data(), &len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (f.fd >= 0) {
        f.peer.resize(std::min<size_t>(len, f.peer.capacity()));
        if (sessions_.size() + fresh_.size() >= opts_.limits.maxConnections)
          refuse(f);
        else
          fresh_.push_back(f);
        continue;
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      // That one client reset or gave up while queued: go on with the next.
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      return error_code(errno, asio::error::get_system_category());
    }
    return {};
  }

  void refuse(const Fresh& f) {
    std::string note;
    if (refuseLog_.admit(std::chrono::steady_clock::now(), note))
      DDPRUN_WARN("refusing connection from ", endpointText(f.peer), ": ",
                  opts_.limits.maxConnections,
                  " connections are open (raise --max-connections)", note);
    bumpRejected();
    ::close(f.fd);
  }

  // Sets up to kSetupBatch accepted descriptors as sessions, then yields to
  // whatever else is ready (a new readiness of the listener included).
  void setUpFresh() {
    setupPosted_ = false;
    for (size_t i = 0; i < kSetupBatch && !fresh_.empty(); ++i) {
      Fresh f = fresh_.front();
      fresh_.pop_front();
      open(f);
    }
    if (!fresh_.empty()) {
      setupPosted_ = true;
      asio::post(io_, [this] { setUpFresh(); });
    }
  }

  void open(const Fresh& f) {
    error_code ec;
    tcp::socket sock(io_);
    sock.assign(f.peer.protocol(), f.fd, ec);
    if (ec) {  // epoll registration failed (out of memory)
      DDPRUN_WARN("cannot serve the connection from ", endpointText(f.peer), ": ",
                  ec.message());
      ::close(f.fd);
      return;
    }
    // TCP_NODELAY comes from the listening socket (Linux copies it).
    sock.non_blocking(true, ec);  // already (accept4); tells Asio so
    auto s = std::make_shared<Session>(std::move(sock));
    s->id = nextId_++;
    s->peer = f.peer;
    sessions_[s->id] = s;
    liveConnections_ = sessions_.size();
    state_.open(s->id);
    DDPRUN_DEBUG("connection ", s->id, " from ", endpointText(s->peer));
    onReadable(s, {});  // its first request (the handshake) is usually here already
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
        DDPRUN_DEBUG("read from ", endpointText(s->peer), " failed: ", ec.message());
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
        DDPRUN_WARN("unauthenticated client ", endpointText(s->peer), " closed: ", why, note);
    } else if (closeLog_.admit(now, note)) {
      DDPRUN_WARN("closing connection from ", endpointText(s->peer), ": ", why, note);
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

  // Most replies fit in the socket's send buffer: they are sent here, with
  // no handler to run later. What does not fit (or an error) goes the
  // asynchronous way, whose handler reports errors. Never closes or resumes
  // a session itself: it runs inside flushDirty's loop.
  void write(const SessionPtr& s) {
    if (s->closed || !s->writing.empty() || s->out.empty()) return;
    error_code ec;
    size_t n = s->socket.send(asio::buffer(s->out), 0, ec);  // non-blocking
    if (ec) n = 0;
    if (n == s->out.size()) {
      state_.sent(s->id, n);
      std::string().swap(s->out);  // free it, not only clear
      if (s->readPaused && !state_.paused(s->id))
        asio::post(io_, [this, s] { resumeReads(s); });
      return;
    }
    // The whole reply stays charged (and held: erase keeps the allocation)
    // until the rest is written, as if none of it had gone.
    s->writingCharge = s->out.size();
    s->out.erase(0, n);
    s->writing.swap(s->out);
    asio::async_write(s->socket, asio::buffer(s->writing),
                      [this, s](error_code ec, size_t) {
                        size_t done = std::exchange(s->writingCharge, 0);
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
                        resumeReads(s);
                      });
  }

  // A session paused for backpressure reads on once its output drained.
  void resumeReads(const SessionPtr& s) {
    if (s->closed || !s->readPaused || state_.paused(s->id)) return;
    s->readPaused = false;
    std::string err = guarded([&] { return state_.resume(s->id); });
    afterServing(s, err);
  }

  void close(const SessionPtr& s) {
    if (s->closed) return;
    s->closed = true;
    error_code ec;
    s->socket.shutdown(tcp::socket::shutdown_both, ec);
    s->socket.close(ec);
    // What an in-flight write holds stays charged until its handler frees it.
    s->chargedInFlight = s->writingCharge;
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
  asio::io_context io_{1};  // one thread runs it (others only post to it)
  ServerState state_;
  tcp::acceptor acceptor_;
  tcp::endpoint bound_;
  std::thread thread_;
  std::unordered_map<ConnId, SessionPtr> sessions_;
  std::vector<ConnId> dirty_;
  std::deque<Fresh> fresh_;  // accepted, not yet sessions (setUpFresh)
  bool setupPosted_ = false;
  std::thread acceptThread_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  int stopAccepting_ = -1;  // eventfd: the accept thread ends when it is written
  std::mutex incomingMu_;
  std::vector<Fresh> incoming_;  // accepted by the accept thread, for the io thread
  bool incomingPosted_ = false;
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
