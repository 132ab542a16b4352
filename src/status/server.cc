// <utility> first: Boost 1.74's Asio under C++20 with g++ 12.
#include <utility>

#include "ddprun/status/server.h"

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <thread>

#include "ddprun/common/error.h"
#include "ddprun/common/log.h"
#include "ddprun/common/net.h"
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

struct StatusServer::Impl {
  ServerOptions opts;
  std::shared_ptr<const Publisher> publisher;
  int active = 0;  // connections open; only the io thread touches it
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  asio::steady_timer retry{io};
  uint16_t boundPort = 0;
  std::thread thread;
  std::once_flag stopped;

  void accept();
  void run();
};

namespace {
// One connection: read one request (bounded), answer, close.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const ServerOptions& opts,
          std::shared_ptr<const Publisher> publisher, int& active)
      : stream_(std::move(socket)), publisher_(std::move(publisher)), active_(active) {
    ++active_;
    parser_.header_limit(static_cast<std::uint32_t>(opts.maxHeaderBytes));
    parser_.body_limit(opts.maxBodyBytes);
    stream_.expires_after(opts.deadline);
  }
  ~Session() { --active_; }

  void start() {
    http::async_read(stream_, buffer_, parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->onRead(ec);
                     });
  }

 private:
  void onRead(beast::error_code ec) {
    if (ec) {
      auto res = parseErrorResponse(ec);
      if (!res) return close();
      return respond(std::move(*res));
    }
    respond(answer(parser_.get()));
  }

  Response answer(const Request& req) const {
    try {
      return handle(req, *publisher_->latest());
    } catch (const std::exception& e) {
      DDPRUN_WARN("status endpoint: cannot answer ", std::string(req.target()), ": ",
                  e.what());
      return errorResponse(http::status::internal_server_error, "internal error");
    }
  }

  void respond(Response res) {
    res_ = std::move(res);
    http::async_write(stream_, res_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->close();
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      self->drain();
    });
  }

  // Until the client closes, kDrainBytes or the deadline, whichever first.
  void drain() {
    stream_.async_read_some(asio::buffer(sink_),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->drained_ += n;
                              if (ec || self->drained_ >= kDrainBytes) return self->close();
                              self->drain();
                            });
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().close(ignored);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_{8 * 1024};
  http::request_parser<http::string_body> parser_;
  Response res_;
  std::array<char, 4096> sink_{};
  size_t drained_ = 0;
  std::shared_ptr<const Publisher> publisher_;
  int& active_;
};
}  // namespace

void StatusServer::Impl::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) {
      // Out of descriptors, say: try again shortly rather than spin.
      DDPRUN_DEBUG("status endpoint: accept: ", ec.message());
      retry.expires_after(std::chrono::milliseconds(100));
      retry.async_wait([this](beast::error_code e) {
        if (!e) accept();
      });
      return;
    }
    if (active >= opts.maxConnections) {
      DDPRUN_DEBUG("status endpoint: ", active, " connections open; closing a new one");
      beast::error_code ignored;
      socket.close(ignored);
    } else {
      std::make_shared<Session>(std::move(socket), opts, publisher, active)->start();
    }
    accept();
  });
}

// A handler that throws (it should not) ends only that handler.
void StatusServer::Impl::run() {
  for (;;) {
    try {
      io.run();
      return;
    } catch (const std::exception& e) {
      DDPRUN_WARN("status endpoint: ", e.what());
    }
  }
}

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
      if (auto who = net::findListeningProcess(impl_->opts.port)) holder = " (held by " + *who + ")";
    DDPRUN_THROW(IoError, "cannot listen on ", where, ": ", ec.message(), holder);
  }
  impl_->boundPort = a.local_endpoint().port();
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
