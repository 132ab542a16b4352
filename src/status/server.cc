// <utility> first: Boost 1.74's Asio under C++20 with g++ 12.
#include <utility>

#include "ddprun/status/server.h"

#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>
#include <unordered_map>

#include "ddprun/common/error.h"
#include "ddprun/common/log.h"
#include "ddprun/common/net.h"
#include "ddprun/status/admission.h"
#include "ddprun/status/handler.h"

namespace ddprun::status {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {
// What a client may still send after its response (its oversized headers,
// say) is read and dropped before closing, so that closing with unread data
// does not reset the connection and lose the response.
constexpr size_t kDrainBytes = 64 * 1024;

// The descriptors open now, this process's (/proc/self/fd; 0 without /proc).
uint64_t openDescriptors() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  uint64_t n = 0;
  while (const dirent* e = ::readdir(dir)) n += e->d_name[0] != '.';
  ::closedir(dir);
  return n > 0 ? n - 1 : 0;  // less the directory's own
}

// The policy's limits from the options, the connection cap bounded by the
// descriptors the agent leaves the endpoint.
AdmissionLimits admissionLimits(const ServerOptions& opts) {
  rlimit nofile{};
  DescriptorNeeds needs;
  needs.limit = getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY
                    ? nofile.rlim_cur
                    : uint64_t{1} << 20;
  needs.open = openDescriptors();
  needs.localWorkers = static_cast<uint64_t>(std::max(opts.localWorkers, 1));
  needs.nodes = static_cast<uint64_t>(std::max(opts.nodes, 1));
  AdmissionLimits l;
  l.maxConnections = connectionCapacity(static_cast<size_t>(opts.maxConnections), needs);
  l.maxPerAddress = static_cast<size_t>(opts.maxConnectionsPerAddress);
  l.headerDeadline = opts.requestDeadline;
  l.deadline = opts.deadline;
  if (l.maxConnections < static_cast<size_t>(opts.maxConnections))
    DDPRUN_DEBUG("status endpoint: at most ", l.maxConnections, " connections (RLIMIT_NOFILE ",
                 needs.limit, ", ", reservedDescriptors(needs), " kept for the agent)");
  return l;
}

// Connections reach accept(2) once their first bytes arrived (or after
// `wait`): a client that connects and sends nothing costs no descriptor and
// no eviction for that long, and a request is there to read when accepted.
void deferAccept(tcp::acceptor& acceptor, std::chrono::milliseconds wait) {
  const int seconds = static_cast<int>(std::max<int64_t>(
      1, std::chrono::ceil<std::chrono::seconds>(wait).count()));
  if (::setsockopt(acceptor.native_handle(), IPPROTO_TCP, TCP_DEFER_ACCEPT, &seconds,
                   sizeof seconds) != 0)
    DDPRUN_DEBUG("status endpoint: TCP_DEFER_ACCEPT: ", std::strerror(errno));
}

// Why the parser stopped: a response for the client, or none when there is
// nobody to answer (closed, timed out, cancelled).
std::optional<Response> parseErrorResponse(beast::error_code ec) {
  if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
      ec == asio::error::operation_aborted || ec == asio::error::connection_reset ||
      ec == asio::error::eof)
    return std::nullopt;
  if (ec == http::error::header_limit)
    return errorResponse(http::status::request_header_fields_too_large,
                         "request headers too large");
  if (ec == http::error::body_limit)
    return errorResponse(http::status::payload_too_large, "request body too large");
  if (ec.category() == http::make_error_code(http::error::bad_target).category())
    return errorResponse(http::status::bad_request, "bad request: " + ec.message());
  return std::nullopt;  // a socket error
}
}  // namespace

namespace {
class Session;

// The server's state and its io-thread side: accepting, admitting, closing.
struct Endpoint {
  ServerOptions opts;
  std::shared_ptr<const Publisher> publisher;
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  asio::steady_timer retry{io};
  asio::steady_timer sweep{io};                  // at admission.nextDeadline()
  std::optional<Admission::TimePoint> armedFor;  // when sweep fires, if waiting
  std::unique_ptr<Admission> admission;          // only the io thread touches it
  std::unordered_map<Admission::Id, std::shared_ptr<Session>> sessions;
  std::array<char, 4096> sink{};  // what lingering clients still send, discarded
  uint16_t boundPort = 0;
  bool paused = false;         // over capacity: not accepting until one ends
  bool promotePosted = false;  // a promote() pass is queued
  std::thread thread;
  std::once_flag stopped;

  void accept();
  void onAcceptError(beast::error_code ec);
  void admit(tcp::socket socket);
  bool waitsOnClient(Admission::Id id) const;
  void closeHeld(Admission::Id id);
  void ended(Admission::Id id);
  void roomMayHaveAppeared();
  void promote();
  void resumeIfRoom();
  void armSweep();
  void run();
};

// The session's read side as Beast's stream: each read is tried at once
// without blocking, and only when nothing is there does it wait for the
// socket to become readable. So the server knows when a connection waits on
// its client (waiting(): every byte it sent was read) as opposed to owing
// it a read, and a read never completes behind the server's back: bytes
// taken from the socket are parsed in the same pass.
class ReadSide {
 public:
  using executor_type = tcp::socket::executor_type;
  ReadSide(tcp::socket& socket, std::function<void()> onWaiting)
      : socket_(socket), onWaiting_(std::move(onWaiting)) {}
  executor_type get_executor() { return socket_.get_executor(); }
  bool waiting() const { return waiting_; }

  template <class Buffers, class Handler>
  auto async_read_some(const Buffers& buffers, Handler&& handler) {
    return asio::async_initiate<Handler, void(beast::error_code, size_t)>(
        [this](auto h, const Buffers& b) {
          if (auto done = readNow(b)) {
            asio::post(socket_.get_executor(),
                       beast::bind_front_handler(std::move(h), done->first, done->second));
            return;
          }
          waitThenRead(b, std::move(h));
        },
        handler, buffers);
  }

 private:
  // What the read gave; nullopt when nothing was there (now waiting).
  template <class Buffers>
  std::optional<std::pair<beast::error_code, size_t>> readNow(const Buffers& b) {
    beast::error_code ec;
    const size_t n = socket_.read_some(b, ec);  // the socket is non-blocking
    if (ec == asio::error::would_block || ec == asio::error::try_again) {
      if (!waiting_) {
        waiting_ = true;
        onWaiting_();
      }
      return std::nullopt;
    }
    waiting_ = false;
    return std::make_pair(ec, n);
  }

  template <class Buffers, class Handler>
  void waitThenRead(const Buffers& b, Handler h) {
    socket_.async_wait(tcp::socket::wait_read,
                       [this, b, h = std::move(h)](beast::error_code ec) mutable {
                         if (ec) {
                           waiting_ = false;
                           return h(ec, size_t{0});
                         }
                         if (auto done = readNow(b)) return h(done->first, done->second);
                         waitThenRead(b, std::move(h));
                       });
  }

  tcp::socket& socket_;
  std::function<void()> onWaiting_;
  bool waiting_ = false;
};

// One connection: read one request (bounded), answer, close. Its deadlines
// and eviction are the Admission's; the server closes its socket for them.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, Admission::Id id, Endpoint& server)
      : socket_(std::move(socket)),
        id_(id),
        server_(server),
        read_(socket_, [&server] { server.roomMayHaveAppeared(); }) {
    parser_.header_limit(static_cast<std::uint32_t>(server.opts.maxHeaderBytes));
    parser_.body_limit(server.opts.maxBodyBytes);
  }

  // Reads its request (the Admission admitted or promoted it).
  void start() {
    beast::error_code ec;
    socket_.non_blocking(true, ec);
    if (ec) return end();
    http::async_read(
        read_, buffer_, parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->onRead(ec); });
  }

  // Everything its client sent is read and its request is incomplete:
  // nothing waits in the socket, and no read is under way.
  bool waitsOnClient() const {
    if (!read_.waiting()) return false;
    beast::error_code ec;
    return socket_.available(ec) == 0 || ec;
  }

  // Closes the socket now (its descriptor is free on return); pending
  // handlers end with operation_aborted.
  void close() {
    beast::error_code ignored;
    socket_.close(ignored);
  }

 private:
  void onRead(beast::error_code ec) {
    if (ec) {
      auto res = parseErrorResponse(ec);
      if (!res) return end();
      return respond(std::move(*res));
    }
    respond(answer(parser_.get()));
  }

  Response answer(const Request& req) const {
    try {
      return handle(req, *server_.publisher->latest());
    } catch (const std::exception& e) {
      DDPRUN_WARN("status endpoint: cannot answer ", std::string(req.target()), ": ",
                  e.what());
      return errorResponse(http::status::internal_server_error, "internal error");
    }
  }

  void respond(Response res) {
    if (!socket_.is_open()) return end();  // evicted while its request was parsed
    server_.admission->answering(id_);
    res_ = std::move(res);
    http::async_write(socket_, res_,
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec) return self->end();
                        beast::error_code ignored;
                        self->socket_.shutdown(tcp::socket::shutdown_send, ignored);
                        self->server_.admission->lingering(self->id_);
                        self->server_.roomMayHaveAppeared();
                        self->drain();
                      });
  }

  // Until the client closes, kDrainBytes, the deadline or an eviction,
  // whichever comes first.
  void drain() {
    socket_.async_read_some(asio::buffer(server_.sink),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->drained_ += n;
                              if (ec || self->drained_ >= kDrainBytes) return self->end();
                              self->drain();
                            });
  }

  void end() {
    close();
    server_.ended(id_);
  }

  tcp::socket socket_;
  Admission::Id id_;
  Endpoint& server_;
  ReadSide read_;
  beast::flat_buffer buffer_{8 * 1024};
  http::request_parser<http::string_body> parser_;
  Response res_;
  size_t drained_ = 0;
};

// One accept at a time; none while over capacity (resumeIfRoom restarts it).
void Endpoint::accept() {
  if (admission->overCapacity()) {
    paused = true;
    return;
  }
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) return onAcceptError(ec);
    admit(std::move(socket));
    accept();
  });
}

// Never spins, never ends the acceptor: out of descriptors, it closes a held
// connection (the policy's choice) and accepts again; with none to close, or
// after an unknown error, it tries again shortly.
void Endpoint::onAcceptError(beast::error_code ec) {
  DDPRUN_DEBUG("status endpoint: accept: ", ec.message());
  const auto action = ec.category() == asio::error::get_system_category()
                          ? acceptAction(ec.value())
                          : AcceptAction::kWait;
  if (action == AcceptAction::kAgain) return accept();
  if (action == AcceptAction::kFreeDescriptor) {
    if (auto victim = admission->evictOne([this](auto id) { return waitsOnClient(id); })) {
      closeHeld(*victim);
      roomMayHaveAppeared();
      return accept();
    }
  }
  retry.expires_after(std::chrono::milliseconds(100));
  retry.async_wait([this](beast::error_code e) {
    if (!e) accept();
  });
}

void Endpoint::admit(tcp::socket socket) {
  beast::error_code ec;
  const auto peer = socket.remote_endpoint(ec);
  if (ec) return;  // gone already; the socket closes here
  auto admitted = admission->admit(peer.address().to_string(),
                                   Admission::TimePoint::clock::now(),
                                   [this](auto id) { return waitsOnClient(id); });
  for (auto id : admitted.evicted) closeHeld(id);
  auto session = std::make_shared<Session>(std::move(socket), admitted.id, *this);
  sessions.emplace(admitted.id, session);
  if (admitted.read) session->start();
  armSweep();
}

bool Endpoint::waitsOnClient(Admission::Id id) const {
  auto it = sessions.find(id);
  return it == sessions.end() || it->second->waitsOnClient();
}

// A connection the policy no longer holds (evicted, expired): closed now.
void Endpoint::closeHeld(Admission::Id id) {
  auto it = sessions.find(id);
  if (it == sessions.end()) return;
  it->second->close();
  sessions.erase(it);
}

// A connection that ended by itself.
void Endpoint::ended(Admission::Id id) {
  admission->closed(id);
  sessions.erase(id);
  roomMayHaveAppeared();
}

// A connection ended, was answered or went idle: waiting connections may
// have room, and the acceptor may resume. Done in a pass of its own (posted,
// once), never inside the handler that noticed.
void Endpoint::roomMayHaveAppeared() {
  if (promotePosted || (admission->waiting() == 0 && !paused)) return;
  promotePosted = true;
  asio::post(io, [this] {
    promotePosted = false;
    promote();
  });
}

void Endpoint::promote() {
  auto promoted = admission->promote([this](auto id) { return waitsOnClient(id); });
  for (auto id : promoted.evicted) closeHeld(id);
  for (auto id : promoted.started)
    if (auto it = sessions.find(id); it != sessions.end()) it->second->start();
  resumeIfRoom();
}

void Endpoint::resumeIfRoom() {
  if (!paused || admission->overCapacity()) return;
  paused = false;
  accept();
}

void Endpoint::armSweep() {
  const auto next = admission->nextDeadline();
  if (!next || (armedFor && *armedFor <= *next)) return;
  armedFor = next;
  sweep.expires_at(*next);
  sweep.async_wait([this](beast::error_code ec) {
    if (ec) return;  // re-armed earlier, or stopping
    armedFor.reset();
    for (auto id : admission->expired(Admission::TimePoint::clock::now())) closeHeld(id);
    roomMayHaveAppeared();
    armSweep();
  });
}

// A handler that throws (it should not) ends only that handler.
void Endpoint::run() {
  for (;;) {
    try {
      io.run();
      return;
    } catch (const std::exception& e) {
      DDPRUN_WARN("status endpoint: ", e.what());
    }
  }
}
}  // namespace

struct StatusServer::Impl : Endpoint {};

StatusServer::StatusServer(ServerOptions opts, std::shared_ptr<const Publisher> publisher)
    : impl_(std::make_unique<Impl>()) {
  DDPRUN_CHECK(publisher != nullptr, "a status server needs a publisher");
  impl_->opts = std::move(opts);
  impl_->publisher = std::move(publisher);
  beast::error_code ec;
  const auto addr = asio::ip::make_address(impl_->opts.address, ec);
  if (ec)
    DDPRUN_THROW(InvalidArgument, "'", impl_->opts.address,
                 "' is not an IP address (give one such as 127.0.0.1 or 0.0.0.0)");
  const tcp::endpoint ep(addr, impl_->opts.port);
  const std::string where = net::formatHostPort(impl_->opts.address, impl_->opts.port);
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) deferAccept(a, impl_->opts.requestDeadline);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    std::string holder;
    if (ec == asio::error::address_in_use)
      if (auto who = net::findListeningProcess(impl_->opts.port))
        holder = " (held by " + *who + ")";
    DDPRUN_THROW(IoError, "cannot listen on ", where, ": ", ec.message(), holder);
  }
  impl_->boundPort = a.local_endpoint().port();
  impl_->admission = std::make_unique<Admission>(admissionLimits(impl_->opts));
  impl_->accept();
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

StatusServer::~StatusServer() { stop(); }

uint16_t StatusServer::port() const { return impl_->boundPort; }

std::string StatusServer::url() const {
  return "http://" + net::formatHostPort(impl_->opts.address, impl_->boundPort);
}

void StatusServer::stop() {
  std::call_once(impl_->stopped, [this] {
    impl_->io.stop();
    if (impl_->thread.joinable()) impl_->thread.join();
  });
}

}  // namespace ddprun::status
