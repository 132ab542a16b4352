// TcpStore::Conn: one TCP connection of the store client (tcp_store.cc),
// kept apart from the client's protocol and reconnect logic: connect with a
// deadline, send all bytes, read whole replies, and tell how the connection
// ended (closed by the peer, broken). Not thread-safe: its TcpStore's lock
// guards it. Internal to ddprun_store.
#pragma once

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "ddprun/common/clock.h"
#include "ddprun/common/error.h"
#include "ddprun/common/net.h"
#include "ddprun/store/tcp_store.h"
#include "ddprun/store/wire.h"

namespace ddprun::store {

// One TCP connection with deadline-bounded blocking I/O. With a cancel token
// its socket is shut down on cancel(), which ends a blocked poll or recv at
// once (the caller then sees EOF or an error and checks the token). The
// callback is removed before the descriptor is closed, so it can never shut
// down a descriptor number reused by someone else.
class TcpStore::Conn {
 public:
  Conn(int fd, std::string addr, std::shared_ptr<CancelToken> cancel)
      : fd_(fd), addr_(std::move(addr)), cancel_(std::move(cancel)) {
    if (cancel_) subscription_ = cancel_->subscribe([fd] { ::shutdown(fd, SHUT_RDWR); });
  }
  ~Conn() {
    if (cancel_) cancel_->unsubscribe(subscription_);
    ::close(fd_);
  }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // Connects to the first address of host:port that accepts. Returns nullptr
  // and sets `err` on failure; never throws for network errors.
  static std::unique_ptr<Conn> open(const std::string& host, uint16_t port,
                                    Deadline deadline, std::string& err,
                                    const std::shared_ptr<CancelToken>& cancel) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (rc != 0) {
      err = std::string("cannot resolve host '") + host + "': " + gai_strerror(rc);
      return nullptr;
    }
    std::unique_ptr<Conn> conn;
    for (addrinfo* ai = res; ai != nullptr && !conn; ai = ai->ai_next)
      conn = tryOne(ai, deadline, err, cancel);
    freeaddrinfo(res);
    if (conn) conn->addr_ = net::formatHostPort(host, port);
    return conn;
  }

  // Sends all bytes or throws IoError. `anySent` (if given) becomes true
  // once a byte has left: the server may have the request.
  void sendAll(std::string_view data, bool* anySent = nullptr) {
    while (!data.empty()) {
      ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        DDPRUN_THROW(IoError, "sending to the store at ", addr_, " failed: ",
                     std::strerror(errno));
      if (n > 0 && anySent) *anySent = true;
      data.remove_prefix(static_cast<size_t>(n));
    }
  }

  // Before a request, when no reply is due: a connection with something to
  // read has been closed or reset by the peer (or carries bytes nobody asked
  // for): IoError, with nothing sent.
  void checkOpen() {
    pollfd p{fd_, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) <= 0) return;
    char byte;
    ssize_t n = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) {
      closedByPeer_ = true;
      DDPRUN_THROW(IoError, "the store at ", addr_, " closed the connection");
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n < 0)
      DDPRUN_THROW(IoError, "the connection to the store at ", addr_,
                   " failed: ", std::strerror(errno));
    broken_ = true;
    DDPRUN_THROW(IoError, "the store at ", addr_, " sent bytes no request asked for");
  }

  // Waits until readable. Returns false on timeout.
  bool waitReadable(Millis timeout) {
    Deadline d(timeout);
    for (;;) {
      pollfd p{fd_, POLLIN, 0};
      // Round up so that poll never returns before the deadline.
      int ms = static_cast<int>(std::min<int64_t>(d.remaining().count() + 1, INT32_MAX));
      int rc = ::poll(&p, 1, ms);
      if (rc > 0) return true;
      if (rc == 0 && d.expired()) return false;
      if (rc == 0) continue;
      if (errno != EINTR)
        DDPRUN_THROW(IoError, "poll on the store connection to ", addr_,
                     " failed: ", std::strerror(errno));
    }
  }

  // Reads exactly n bytes before the deadline.
  void readExact(void* dst, size_t n, Deadline deadline, const char* what) {
    auto* p = static_cast<char*>(dst);
    while (n > 0) {
      if (!waitReadable(deadline.remaining())) {
        broken_ = true;  // a reply may still arrive: this stream is out of step
        DDPRUN_THROW(TimeoutError, "no reply from the store at ", addr_, " to ", what);
      }
      ssize_t got = ::recv(fd_, p, n, 0);
      if (got < 0 && errno == EINTR) continue;
      if (got == 0) {
        closedByPeer_ = true;
        DDPRUN_THROW(IoError, "the store at ", addr_,
                     " closed the connection during ", what);
      }
      if (got < 0)
        DDPRUN_THROW(IoError, "reading from the store at ", addr_, " failed: ",
                     std::strerror(errno));
      p += got;
      n -= static_cast<size_t>(got);
    }
  }
  // Reads one reply to `c` (decoded by wire::ReplyParser), never a byte
  // past it: the parser says how many bytes it still needs.
  wire::Reply readReply(wire::Command c, Deadline d, const char* what, size_t expected = 0) {
    wire::ReplyParser parser(c, expected);
    std::string chunk;
    while (true) {
      auto res = parser.feed(chunk);
      if (res.status == wire::ParseStatus::kOk) {
        ++replies_;
        return std::move(parser.reply());
      }
      if (res.status == wire::ParseStatus::kBad)
        DDPRUN_THROW(ProtocolError, "the store at ", addr_, " sent a bad ", what,
                     " reply (", res.error, ")");
      chunk.resize(std::min<size_t>(parser.wanted(), 1 << 20));
      readExact(chunk.data(), chunk.size(), d, what);
    }
  }
  const std::string& addr() const { return addr_; }
  bool broken() const { return broken_; }
  // The peer closed its end (EOF), as a server does when it refuses a client.
  bool closedByPeer() const { return closedByPeer_; }
  uint64_t replies() const { return replies_; }
  // The numeric IP this end of the connection is bound to ("" if unknown).
  std::string localIp() const { return localEnd(false); }
  // "ip:port" of this end ("" if unknown).
  std::string localEnd(bool withPort = true) const {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "";
    char host[NI_MAXHOST];
    char serv[NI_MAXSERV];
    if (::getnameinfo(reinterpret_cast<sockaddr*>(&a), len, host, sizeof host, serv,
                      sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) != 0)
      return "";
    return withPort ? net::formatHostPort(host, static_cast<uint16_t>(std::stoi(serv)))
                    : std::string(host);
  }

 private:
  // The Conn owns the descriptor from the start, so that cancel() can also
  // end a connect still in progress (shutdown of a connecting socket wakes
  // the poll).
  static std::unique_ptr<Conn> tryOne(addrinfo* ai, Deadline deadline, std::string& err,
                                      const std::shared_ptr<CancelToken>& cancel) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      err = std::strerror(errno);
      return nullptr;
    }
    auto conn = std::make_unique<Conn>(fd, "", cancel);
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = ::poll(&p, 1, static_cast<int>(deadline.remaining().count()));
      if (rc == 0) {
        err = "connect timed out";
        return nullptr;
      }
      int soerr = 0;
      socklen_t len = sizeof soerr;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
      errno = soerr;
      rc = soerr == 0 ? 0 : -1;
    }
    if (cancel && cancel->cancelled()) {
      err = "cancelled";
      return nullptr;
    }
    if (rc != 0) {
      err = std::strerror(errno);
      return nullptr;
    }
    fcntl(fd, F_SETFL, flags);
    net::setNoDelay(fd);
    return conn;
  }

  int fd_;
  std::string addr_;
  std::shared_ptr<CancelToken> cancel_;
  CancelToken::Id subscription_ = 0;
  bool broken_ = false;
  bool closedByPeer_ = false;
  uint64_t replies_ = 0;
};

}  // namespace ddprun::store
