// <utility> first: Boost 1.74's Asio under C++20 with g++ 12.
#include <utility>

#include "ddprun/status/server.h"

#include <sys/resource.h>

#include <array>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
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

// The policy's limits from the options, the connection cap bounded by the
// descriptors this process may open.
AdmissionLimits admissionLimits(const ServerOptions& opts) {
  rlimit nofile{};
  const uint64_t soft =
      getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY
          ? nofile.rlim_cur
          : uint64_t{1} << 20;
  AdmissionLimits l;
  l.maxConnections = connectionCapacity(static_cast<size_t>(opts.maxConnections), soft);
  l.maxPerAddress = static_cast<size_t>(opts.maxConnectionsPerAddress);
  l.headerDeadline = opts.requestDeadline;
  l.deadline = opts.deadline;
  return l;
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
  std::thread thread;
  std::once_flag stopped;

  void accept();
  void onAcceptError(beast::error_code ec);
  void admit(tcp::socket socket);
  void closeHeld(Admission::Id id);
  void ended(Admission::Id id);
  void armSweep();
  void run();
};

// One connection: read one request (bounded), answer, close. Its deadlines
// and eviction are the Admission's; the server closes its socket for them.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, Admission::Id id, Endpoint& server)
      : socket_(std::move(socket)), id_(id), server_(server) {
    parser_.header_limit(static_cast<std::uint32_t>(server.opts.maxHeaderBytes));
    parser_.body_limit(server.opts.maxBodyBytes);
  }

  void start() {
    http::async_read(
        socket_, buffer_, parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->onRead(ec); });
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
  beast::flat_buffer buffer_{8 * 1024};
  http::request_parser<http::string_body> parser_;
  Response res_;
  size_t drained_ = 0;
};

void Endpoint::accept() {
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
    if (auto victim = admission->evictOne()) {
      closeHeld(*victim);
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
  auto admitted =
      admission->admit(peer.address().to_string(), Admission::TimePoint::clock::now());
  for (auto id : admitted.evicted) closeHeld(id);
  auto session = std::make_shared<Session>(std::move(socket), admitted.id, *this);
  sessions.emplace(admitted.id, session);
  session->start();
  armSweep();
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
