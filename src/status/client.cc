// <utility> first: Boost 1.74's Asio under C++20 with g++ 12.
#include <utility>

#include "ddprun/status/client.h"

#include <algorithm>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdio>
#include <optional>
#include <sstream>
#include <vector>

#include "ddprun/common/error.h"
#include "ddprun/common/net.h"

namespace ddprun::status {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// Asynchronous steps on one io_context, so that tcp_stream's deadline bounds
// connecting, writing and reading alike.
HttpAnswer httpGet(const std::string& host, uint16_t port, const std::string& target,
                   std::chrono::milliseconds timeout) {
  const std::string where = net::formatHostPort(host, port);
  asio::io_context io;
  tcp::resolver resolver(io);
  beast::error_code rec;
  auto endpoints = resolver.resolve(host, std::to_string(port), rec);
  if (rec) DDPRUN_THROW(IoError, "cannot resolve ", host, ": ", rec.message());
  beast::tcp_stream stream(io);
  stream.expires_after(timeout);
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, where);
  req.set(http::field::user_agent, "ddprun status");
  req.keep_alive(false);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64 * 1024 * 1024);
  beast::error_code err;
  const char* step = "connect to";
  stream.async_connect(endpoints, [&](beast::error_code ec, const tcp::endpoint&) {
    if (ec) return void(err = ec);
    step = "send the request to";
    http::async_write(stream, req, [&](beast::error_code ec2, size_t) {
      if (ec2) return void(err = ec2);
      step = "read the answer of";
      http::async_read(stream, buffer, parser,
                       [&](beast::error_code ec3, size_t) { err = ec3; });
    });
  });
  io.run();
  if (err == beast::error::timeout)
    DDPRUN_THROW(TimeoutError, "cannot ", step, " ", where, ": no answer within ",
                 timeout.count() / 1000.0, " s");
  if (err) DDPRUN_THROW(IoError, "cannot ", step, " ", where, ": ", err.message());
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  return {parser.get().result_int(), parser.get().body()};
}

namespace {
const nlohmann::json& field(const nlohmann::json& j, const char* name) {
  if (!j.is_object() || !j.contains(name))
    DDPRUN_THROW(ProtocolError, "the status has no field '", name, "'");
  return j.at(name);
}

std::string text(const nlohmann::json& j, const char* name) {
  const auto& v = field(j, name);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_null()) return "-";
  DDPRUN_THROW(ProtocolError, "the status field '", name, "' is neither text nor a number");
}

int64_t integer(const nlohmann::json& j, const char* name) {
  const auto& v = field(j, name);
  if (!v.is_number_integer())
    DDPRUN_THROW(ProtocolError, "the status field '", name, "' is not an integer");
  return v.get<int64_t>();
}

std::string members(const nlohmann::json& round) {
  const auto& list = field(round, "members");
  if (!list.is_array()) DDPRUN_THROW(ProtocolError, "the status field 'members' is not a list");
  std::vector<std::string> parts;
  for (const auto& m : list) {
    const int64_t n = integer(m, "local_world_size"), base = integer(m, "base_rank");
    parts.push_back("node " + text(m, "group_rank") + " ranks " + std::to_string(base) +
                    (n > 1 ? "-" + std::to_string(base + n - 1) : ""));
  }
  std::ostringstream o;
  for (size_t i = 0; i < parts.size(); ++i) o << (i ? ", " : "") << parts[i];
  return parts.empty() ? "-" : o.str();
}

std::string exitOf(const nlohmann::json& w) {
  const auto& sig = field(w, "signal");
  if (sig.is_string()) return sig.get<std::string>();
  return text(w, "exit_code");
}

// A number of the optional "progress" object as text, "-" when absent or
// null; `format` is printf's for a double.
std::string progressCell(const nlohmann::json& progress, const char* name,
                         const char* format) {
  if (!progress.is_object() || !progress.contains(name)) return "-";
  const auto& v = progress.at(name);
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (!v.is_number()) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v.get<double>());
  return buf;
}

// "3h 02m", "4m 05s", "12s": a duration for people.
std::string humanSeconds(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[64];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh %02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%lldm %02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  return buf;
}

// Whether any worker has reported progress (the table then has its columns).
bool anyProgress(const nlohmann::json& workers) {
  for (const auto& w : workers)
    if (w.is_object() && w.contains("progress") && w.at("progress").is_object())
      return true;
  return false;
}

// The progress columns of one worker (an agent without them: "-").
std::vector<std::string> progressCells(const nlohmann::json& w) {
  static const nlohmann::json kNone;
  const auto& p = w.is_object() && w.contains("progress") ? w.at("progress") : kNone;
  std::string last = progressCell(p, "seconds_since_progress", "%.1f");
  if (last != "-") last += " s ago";
  return {progressCell(p, "step", "%.0f"), progressCell(p, "epoch", "%.0f"),
          progressCell(p, "loss", "%.4g"), progressCell(p, "samples_per_second", "%.1f"),
          last};
}

// Rows of cells, left-aligned, two spaces between columns.
std::string columns(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], r[i].size());
    }
  std::ostringstream o;
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i)
      line += i + 1 < r.size() ? r[i] + std::string(width[i] - r[i].size() + 2, ' ') : r[i];
    o << line << '\n';
  }
  return o.str();
}
}  // namespace

std::string formatStatusTable(const nlohmann::json& s) {
  const auto& round = field(s, "rendezvous");
  std::ostringstream o;
  o << columns({
      {"run id:", text(s, "run_id"), "node:", text(s, "node")},
      {"state:", text(s, "state"), "group rank:",
       text(s, "group_rank") + " of " + text(s, "group_world_size")},
      {"attempt:", text(s, "attempt"), "restarts left:",
       text(s, "restarts_left") + " of " + text(s, "max_restarts")},
      {"round:", text(round, "round"), "world size:", text(round, "world_size")},
  });
  o << "members: " << members(round) << "\n";
  // An agent waiting in its join says where the round stands (newer agents).
  if (round.is_object() && round.contains("join") && round.at("join").is_object()) {
    const auto& j = round.at("join");
    if (j.contains("text") && j.at("text").is_string()) {
      o << "joining: " << j.at("text").get<std::string>();
      if (j.contains("waiting_seconds") && j.at("waiting_seconds").is_number())
        o << " (waiting " << humanSeconds(j.at("waiting_seconds").get<double>()) << ")";
      o << "\n";
    }
  }
  // Fields of newer agents: optional, so that an older agent's status prints.
  if (s.contains("eta_seconds") && s.at("eta_seconds").is_number())
    o << "eta:     " << humanSeconds(s.at("eta_seconds").get<double>())
      << " (at the slowest rank's rate)\n";
  if (s.contains("progress_timeout") && s.at("progress_timeout").is_number())
    o << "progress timeout: " << progressCell(s, "progress_timeout", "%g") << " s\n";
  o << "\n";
  const auto& workers = field(s, "workers");
  if (!workers.is_array()) DDPRUN_THROW(ProtocolError, "the status field 'workers' is not a list");
  const bool progress = anyProgress(workers);
  std::vector<std::vector<std::string>> rows = {
      {"LOCAL_RANK", "RANK", "PID", "STATE", "STARTED", "EXIT"}};
  if (progress)
    rows[0].insert(rows[0].end(), {"STEP", "EPOCH", "LOSS", "SAMPLES/S", "LAST STEP"});
  for (const auto& w : workers) {
    rows.push_back({text(w, "local_rank"), text(w, "global_rank"), text(w, "pid"),
                    text(w, "state"), text(w, "started"), exitOf(w)});
    if (progress) {
      auto cells = progressCells(w);
      rows.back().insert(rows.back().end(), cells.begin(), cells.end());
    }
  }
  o << columns(rows);
  return o.str();
}

}  // namespace ddprun::status
