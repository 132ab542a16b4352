// The status endpoint's answers, as a pure function of a request and the
// latest snapshot: no sockets, so every path and error is unit-tested.
//
//   GET|HEAD /status   200, application/json (toJson)
//   GET|HEAD /healthz  200, "ok"
//   GET|HEAD /metrics  200, Prometheus text format 0.0.4 (toPrometheus)
//   another path       404
//   another method     405 with Allow: GET, HEAD
//   a target that is not an absolute path ("*", "http://...")  400
// A query string is ignored. Every response says Connection: close.
//
// Threading: pure, thread-safe.
#pragma once

// <utility> first: Boost 1.74's Asio under C++20 with g++ 12.
#include <utility>

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <string>

#include "ddprun/status/snapshot.h"

namespace ddprun::status {

using Request = boost::beast::http::request<boost::beast::http::string_body>;
using Response = boost::beast::http::response<boost::beast::http::string_body>;

Response handle(const Request& req, const Snapshot& snapshot);

// A plain-text error response (for what the parser rejects before any
// request exists: 400, 431); `version` 10 or 11.
Response errorResponse(boost::beast::http::status status, const std::string& why,
                       unsigned version = 11);

}  // namespace ddprun::status
