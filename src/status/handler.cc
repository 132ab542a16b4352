#include "ddprun/status/handler.h"

namespace ddprun::status {

namespace http = boost::beast::http;

namespace {
Response make(http::status status, unsigned version, const std::string& type,
              std::string body) {
  Response res{status, version};
  res.set(http::field::server, "ddprun");
  res.set(http::field::content_type, type);
  res.set(http::field::cache_control, "no-store");
  res.keep_alive(false);
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

// The path of an origin-form target, without its query string; "" when the
// target is not one.
std::string pathOf(boost::beast::string_view target) {
  if (target.empty() || target.front() != '/') return "";
  const auto q = target.find_first_of("?#");
  return std::string(target.substr(0, q));
}
}  // namespace

Response errorResponse(http::status status, const std::string& why, unsigned version) {
  return make(status, version, "text/plain; charset=utf-8", why + "\n");
}

Response handle(const Request& req, const Snapshot& snapshot) {
  const unsigned v = req.version() == 10 ? 10 : 11;
  const std::string path = pathOf(req.target());
  if (path.empty())
    return errorResponse(http::status::bad_request,
                         "bad request target: expected a path such as /status", v);
  if (path != "/status" && path != "/healthz" && path != "/metrics")
    return errorResponse(http::status::not_found,
                         "no such path; try /status, /healthz or /metrics", v);
  const bool head = req.method() == http::verb::head;
  if (req.method() != http::verb::get && !head) {
    Response res = errorResponse(http::status::method_not_allowed,
                                 "method not allowed; use GET or HEAD", v);
    res.set(http::field::allow, "GET, HEAD");
    return res;
  }
  Response res;
  if (path == "/status")
    // A run id or host name that is not UTF-8 must not make the dump throw.
    res = make(http::status::ok, v, "application/json",
               toJson(snapshot).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) +
                   "\n");
  else if (path == "/healthz")
    res = make(http::status::ok, v, "text/plain; charset=utf-8", "ok\n");
  else
    res = make(http::status::ok, v, "text/plain; version=0.0.4; charset=utf-8",
               toPrometheus(snapshot));
  if (head) {  // the headers of GET, Content-Length included; no body
    const auto length = res.body().size();
    res.body().clear();
    res.content_length(length);
  }
  return res;
}

}  // namespace ddprun::status
