// The client side of the status endpoint, for `ddprun status HOST:PORT`:
// one HTTP GET with a deadline, and the /status JSON as a table.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace ddprun::status {

struct HttpAnswer {
  unsigned status = 0;  // 200, 404, ...
  std::string body;
};

// GETs `target` from host:port (a name or an IP literal), all of it within
// `timeout`. Throws IoError (cannot resolve, connect, or read: the message
// names host:port and why) or TimeoutError. Any HTTP status is an answer.
HttpAnswer httpGet(const std::string& host, uint16_t port, const std::string& target,
                   std::chrono::milliseconds timeout);

// The /status JSON as a short table: a header (run id, node, group rank,
// attempt, restarts left, round and its members), then one line per
// worker (local rank, global rank, pid, state, started, exit code). Throws
// ProtocolError naming the first field missing or of the wrong type.
std::string formatStatusTable(const nlohmann::json& status);

}  // namespace ddprun::status
