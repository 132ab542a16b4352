#include "tcp_ring.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "../reduce.h"
#include "ddprun/common/net.h"

namespace ddprun::runtime {

namespace {
constexpr uint32_t kHelloMagic = 0x64647252;  // "ddrR"
// Received data is reduced in pieces of at least this size while the rest of
// the block is still arriving (overlap of reduction with the transfer).
constexpr size_t kReduceGrain = 256 * 1024;

struct Hello {
  uint32_t magic;
  uint32_t ringId;
  int32_t fromRank;
  int32_t pad;
};

void setNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

int connectTo(const std::string& host, uint16_t port, const Deadline& deadline, int peerRank) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0)
    DDPRUN_THROW(IoError, "cannot resolve ", host, " (address of rank ", peerRank,
                 "): ", gai_strerror(rc));
  std::string lastErr = "no address";
  while (!deadline.expired()) {
    for (addrinfo* a = res; a; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        ::freeaddrinfo(res);
        net::setNoDelay(fd);
        return fd;
      }
      lastErr = std::strerror(errno);
      ::close(fd);
    }
    ::usleep(20'000);
  }
  ::freeaddrinfo(res);
  DDPRUN_PEER_FAILURE(peerRank, true, "cannot connect to rank ", peerRank, " at ",
                      net::formatHostPort(host, port), ": ", lastErr);
}

bool readFull(int fd, void* buf, size_t len, const Deadline& deadline) {
  char* p = static_cast<char*>(buf);
  size_t got = 0;
  while (got < len) {
    pollfd pfd{fd, POLLIN, 0};
    const int ms = static_cast<int>(std::min<int64_t>(deadline.remaining().count(), 1000));
    if (::poll(&pfd, 1, ms) <= 0) {
      if (deadline.expired()) return false;
      continue;
    }
    const ssize_t n = ::recv(fd, p + got, len - got, 0);
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  return true;
}
}  // namespace

std::unique_ptr<TcpListener> TcpListener::open(const std::string& host) {
  const bool v6 = host.find(':') != std::string::npos;
  const int fd = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) DDPRUN_THROW(IoError, "socket(): ", std::strerror(errno));
  sockaddr_storage ss{};
  socklen_t len;
  if (v6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    if (::inet_pton(AF_INET6, host.c_str(), &a->sin6_addr) != 1)
      DDPRUN_THROW(InvalidArgument, "bad IPv6 address '", host, "' for the collective listener");
    len = sizeof(*a);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_ANY);
    if (!host.empty() && ::inet_pton(AF_INET, host.c_str(), &a->sin_addr) != 1)
      DDPRUN_THROW(InvalidArgument, "bad IPv4 address '", host,
                   "' for the collective listener (DDPRUN_SOCKET_ADDR must be an IP literal)");
    len = sizeof(*a);
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 || ::listen(fd, 128) != 0) {
    const int err = errno;
    ::close(fd);
    DDPRUN_THROW(IoError, "cannot listen on ", host.empty() ? "*" : host, ": ",
                 std::strerror(err));
  }
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  const uint16_t port = ntohs(v6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                 : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return std::unique_ptr<TcpListener>(new TcpListener(fd, port));
}

TcpListener::~TcpListener() { ::close(fd_); }

std::unique_ptr<TcpRing> TcpRing::connect(CommContext ctx, TcpListener* listener,
                                          const std::vector<std::string>& hosts,
                                          const std::vector<uint16_t>& ports, uint32_t ringId) {
  const int n = ctx.size();
  if (n == 1) return std::unique_ptr<TcpRing>(new TcpRing(std::move(ctx), -1, -1));
  const Deadline deadline(ctx.timeout);
  const int nextM = (ctx.me + 1) % n, prevM = (ctx.me + n - 1) % n;
  const int sendFd = connectTo(hosts[nextM], ports[nextM], deadline, ctx.ranks[nextM]);
  const Hello hello{kHelloMagic, ringId, ctx.ranks[ctx.me], 0};
  if (::send(sendFd, &hello, sizeof(hello), MSG_NOSIGNAL) != sizeof(hello)) {
    ::close(sendFd);
    DDPRUN_PEER_FAILURE(ctx.ranks[nextM], false, "rank ", ctx.ranks[nextM],
                        " closed the connection during the ring handshake");
  }
  int recvFd = -1;
  while (recvFd < 0) {
    pollfd pfd{listener->fd(), POLLIN, 0};
    const int ms = static_cast<int>(std::min<int64_t>(deadline.remaining().count(), 1000));
    if (::poll(&pfd, 1, ms) <= 0) {
      if (deadline.expired()) {
        ::close(sendFd);
        DDPRUN_PEER_FAILURE(ctx.ranks[prevM], true, "rank ", ctx.ranks[prevM],
                            " did not connect to this rank within the timeout");
      }
      continue;
    }
    const int fd = ::accept4(listener->fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Hello h{};
    if (readFull(fd, &h, sizeof(h), deadline) && h.magic == kHelloMagic && h.ringId == ringId &&
        h.fromRank == ctx.ranks[prevM]) {
      recvFd = fd;
      net::setNoDelay(fd);
    } else {
      ::close(fd);  // a stale or foreign connection
    }
  }
  setNonBlocking(sendFd);
  setNonBlocking(recvFd);
  return std::unique_ptr<TcpRing>(new TcpRing(std::move(ctx), sendFd, recvFd));
}

TcpRing::TcpRing(CommContext ctx, int sendFd, int recvFd)
    : ctx_(std::move(ctx)), sendFd_(sendFd), recvFd_(recvFd) {}

TcpRing::~TcpRing() {
  if (sendFd_ >= 0) ::close(sendFd_);
  if (recvFd_ >= 0) ::close(recvFd_);
}

void TcpRing::abort(int) noexcept {
  if (sendFd_ >= 0) ::shutdown(sendFd_, SHUT_RDWR);
  if (recvFd_ >= 0) ::shutdown(recvFd_, SHUT_RDWR);
}

char* TcpRing::scratch(size_t bytes, int which) {
  auto& v = scratch_[which];
  if (v.size() < bytes) v.resize(bytes);
  return v.data();
}

void TcpRing::exchange(Xfer& x, const char* what, const Deadline& deadline) {
  size_t sent = 0, recvd = 0;
  const int nextRank = ctx_.ranks[next()], prevRank = ctx_.ranks[prev()];
  while (sent < x.sendLen || recvd < x.recvLen) {
    bool progress = false;
    const size_t sendable = x.forward ? std::min(x.sendLen, recvd) : x.sendLen;
    if (sent < sendable) {
      const ssize_t n = ::send(sendFd_, x.send + sent, sendable - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        progress = true;
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        DDPRUN_PEER_FAILURE(nextRank, false, what, ": connection to rank ", nextRank,
                            " failed (", std::strerror(errno), "): it probably died");
      }
    }
    if (recvd < x.recvLen) {
      const ssize_t n = ::recv(recvFd_, x.recv + recvd, x.recvLen - recvd, MSG_DONTWAIT);
      if (n > 0) {
        recvd += static_cast<size_t>(n);
        progress = true;
        if (x.onRecv) x.onRecv(recvd);
      } else if (n == 0) {
        DDPRUN_PEER_FAILURE(prevRank, false, what, ": rank ", prevRank,
                            " closed its connection mid-collective: it probably died");
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        DDPRUN_PEER_FAILURE(prevRank, false, what, ": connection from rank ", prevRank,
                            " failed (", std::strerror(errno), "): it probably died");
      }
    }
    if (progress) continue;
    pollfd fds[2];
    int nfds = 0;
    if (sent < sendable) fds[nfds++] = {sendFd_, POLLOUT, 0};
    if (recvd < x.recvLen) fds[nfds++] = {recvFd_, POLLIN, 0};
    const int ms = static_cast<int>(std::min<int64_t>(deadline.remaining().count(), 100));
    if (::poll(fds, nfds, ms) == 0 && deadline.expired()) {
      const int who = recvd < x.recvLen ? prevRank : nextRank;
      DDPRUN_PEER_FAILURE(who, true, what, ": timed out after ",
                          static_cast<double>(ctx_.timeout.count()) / 1000.0,
                          " s waiting for rank ", who,
                          " (stalled, or blocked behind another rank)");
    }
  }
}

// Ring reduce-scatter, shifted so that member r ends owning block r. Step s
// (0..n-2): send block r-s-1 (step 0 straight from the input, later the block
// reduced in the previous step), receive block r-s-2 and reduce it with the
// local input while it arrives. Each member sends and receives (n-1)/n * S.
void TcpRing::reduceScatterRing(const char* in, const Partition& part, DType t, ReduceOp op,
                                char* keep, char* dst, const char* what,
                                const Deadline& deadline) {
  const int n = size(), r = ctx_.me;
  const size_t es = dtypeSize(t);
  size_t maxBlock = 0;
  for (int b = 0; b < n; ++b) maxBlock = std::max(maxBlock, part.length(b) * es);
  char* tmp = scratch(maxBlock, 2);
  const char* lastAcc = nullptr;
  for (int s = 0; s <= n - 2; ++s) {
    const int sb = (r - s - 1 + 2 * n) % n, rb = (r - s - 2 + 2 * n) % n;
    const char* sendPtr = s == 0 ? in + part.offset(sb) * es
                                 : (keep ? keep + part.offset(sb) * es : lastAcc);
    char* acc = s == n - 2 ? dst : (keep ? keep + part.offset(rb) * es : scratch(maxBlock, s % 2));
    const char* local = in + part.offset(rb) * es;
    const size_t rbBytes = part.length(rb) * es;
    size_t reduced = 0;  // bytes of block rb already reduced into acc
    auto reduceUpTo = [&](size_t bytes) {
      const size_t upto = bytes / es * es;
      if (upto <= reduced || (upto - reduced < kReduceGrain && upto < rbBytes)) return;
      const void* srcs[2] = {local + reduced, tmp + reduced};
      reduceN(t, op, acc + reduced, srcs, 2, (upto - reduced) / es);
      reduced = upto;
    };
    Xfer x;
    x.send = sendPtr;
    x.sendLen = part.length(sb) * es;
    x.recv = tmp;
    x.recvLen = rbBytes;
    x.onRecv = reduceUpTo;
    exchange(x, what, deadline);
    reduceUpTo(rbBytes);
    lastAcc = acc;
  }
}

// Ring all-reduce: reduce-scatter (n-1 steps) then all-gather (n-1 steps).
// Each member sends and receives 2(n-1)/n * S bytes, the bandwidth-optimal
// amount (t >= 2(n-1)/n * S/B + 2(n-1) * alpha).
void TcpRing::allReduce(const void* in, void* out, size_t count, DType t, ReduceOp op) {
  const size_t es = dtypeSize(t);
  const int n = size(), r = ctx_.me;
  char* o = static_cast<char*>(out);
  if (n == 1 || count == 0) {
    if (in != out && count) std::memcpy(out, in, count * es);
    return;
  }
  const Deadline deadline(ctx_.timeout);
  const Partition part(count, n);
  reduceScatterRing(static_cast<const char*>(in), part, t, op, o, o + part.offset(r) * es,
                    "allReduce", deadline);
  if (op == ReduceOp::kAvg) divideBy(t, o + part.offset(r) * es, part.length(r), n);
  for (int s = 0; s <= n - 2; ++s) {
    const int sb = (r - s + n) % n, rb = (r - s - 1 + n) % n;
    Xfer x;
    x.send = o + part.offset(sb) * es;
    x.sendLen = part.length(sb) * es;
    x.recv = o + part.offset(rb) * es;
    x.recvLen = part.length(rb) * es;
    exchange(x, "allReduce", deadline);
  }
}

// Pipelined chain from the root: each member forwards bytes as soon as they
// arrive, so the time is ~S/B + (n-1) * alpha rather than (n-1) * S/B.
void TcpRing::broadcast(void* buf, size_t bytes, int root) {
  const int n = size();
  if (n == 1 || bytes == 0) return;
  const int pos = (ctx_.me - root + n) % n;
  Xfer x;
  char* b = static_cast<char*>(buf);
  if (pos != n - 1) {
    x.send = b;
    x.sendLen = bytes;
  }
  if (pos != 0) {
    x.recv = b;
    x.recvLen = bytes;
    x.forward = pos != n - 1;
  }
  exchange(x, "broadcast", Deadline(ctx_.timeout));
}

// Ring all-gather: n-1 steps, each forwarding the piece received last.
void TcpRing::allGather(const void* in, void* out, const std::vector<size_t>& bytes) {
  const int n = size(), r = ctx_.me;
  const std::vector<size_t> off = prefixOffsets(bytes);
  char* o = static_cast<char*>(out);
  if (in != o + off[r] && bytes[r] > 0) std::memcpy(o + off[r], in, bytes[r]);
  const Deadline deadline(ctx_.timeout);
  for (int s = 0; s <= n - 2; ++s) {
    const int sb = (r - s + n) % n, rb = (r - s - 1 + n) % n;
    Xfer x;
    x.send = o + off[sb];
    x.sendLen = bytes[sb];
    x.recv = o + off[rb];
    x.recvLen = bytes[rb];
    exchange(x, "allGather", deadline);
  }
}

void TcpRing::reduceScatter(const void* in, void* out, size_t count, DType t, ReduceOp op) {
  const int n = size();
  if (n == 1) {
    if (in != out && count) std::memmove(out, in, count * dtypeSize(t));
    return;
  }
  Partition part(0, n);
  for (int j = 0; j <= n; ++j) part.offsets[j] = j * count;
  reduceScatterRing(static_cast<const char*>(in), part, t, op, nullptr, static_cast<char*>(out),
                    "reduceScatter", Deadline(ctx_.timeout));
  if (op == ReduceOp::kAvg) divideBy(t, out, count, n);
}

void TcpRing::barrier() {
  if (size() == 1) return;
  std::vector<char> buf(size(), 1);
  std::vector<size_t> bytes(size(), 1);
  allGather(&buf[ctx_.me], buf.data(), bytes);
}

}  // namespace ddprun::runtime
