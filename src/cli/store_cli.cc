#include "ddprun/cli/store_cli.h"

#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <limits>

#include "ddprun/common/error.h"
#include "ddprun/common/log.h"
#include "ddprun/common/net.h"
#include "ddprun/common/strings.h"
#include "ddprun/common/user_input.h"
#include "ddprun/store/auth.h"
#include "ddprun/version.h"

namespace ddprun::cli {

uint64_t parseByteSize(const std::string& text, const std::string& flag) {
  const std::string shown = str::escape(text);
  const char* forms = "expected a number of bytes > 0, optionally with K, M or G";
  // The number, then the unit: "64K" -> "64", "K".
  size_t pos = text.find_first_not_of("+-0123456789");
  if (pos == std::string::npos) pos = text.size();
  uint64_t value = 0;
  auto problem = input::parseNumber(std::string_view(text).substr(0, pos), value, 1);
  if (problem != input::NumberProblem::kNone)
    DDPRUN_THROW(InvalidArgument, flag, ": invalid size '", shown,
                 "': ", input::describe(problem), "; ", forms);
  std::string unit = text.substr(pos);
  uint64_t mult = 1;
  if (unit == "K" || unit == "k" || unit == "KiB") mult = 1ull << 10;
  else if (unit == "M" || unit == "m" || unit == "MiB") mult = 1ull << 20;
  else if (unit == "G" || unit == "g" || unit == "GiB") mult = 1ull << 30;
  else if (!unit.empty())
    DDPRUN_THROW(InvalidArgument, flag, ": invalid size '", shown, "': unknown unit '",
                 str::escape(unit), "' (use K, M or G)");
  if (value > std::numeric_limits<uint64_t>::max() / mult ||
      value * mult > std::numeric_limits<size_t>::max())
    DDPRUN_THROW(InvalidArgument, flag, ": size '", shown,
                 "' is too large (at most 16 EiB; try a smaller number)");
  return value * mult;
}

namespace {
// A count > 0 (connections, keys per request...), as `size_t`.
size_t parseCount(const std::string& text, const char* flag) {
  return static_cast<size_t>(input::numberFlag<uint64_t>(
      flag, text, 1, std::numeric_limits<size_t>::max(), "an integer > 0"));
}

// Seconds as milliseconds, in [min, max] (max <= a year): 0 stays 0 (off),
// anything above rounds to at least 1 ms, so that no value > 0 becomes "off".
std::chrono::milliseconds parseMillis(const std::string& text, const char* flag,
                                      double min, double max,
                                      const std::string& expected) {
  double s = input::numberFlag<double>(flag, text, min, max, expected);
  if (s == 0) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(std::max<int64_t>(1, std::llround(s * 1000.0)));
}

// The secret from --token-file, else from the environment, else none.
void readToken(const std::string& tokenFile, StoreCliConfig& out) {
  if (!tokenFile.empty()) {
    out.server.authToken = store::auth::loadSecret(tokenFile);
    out.tokenSource = "--token-file " + tokenFile;
  } else if (auto secret = store::auth::secretFromEnv()) {
    out.server.authToken = std::move(*secret);
    out.tokenSource = store::auth::kTokenEnv;
  }
}
}  // namespace

int parseStoreCli(int argc, const char* const* argv, StoreCliConfig& out) {
  CLI::App app{
      "ddprun-store: a c10d-compatible TCP key-value store server.\n"
      "PyTorch TCPStore clients (1.13 and >= 2.2) and ddprun agents can use it."};
  app.set_version_flag("--version", std::string(kVersionDescription));
  auto& opts = out.server;
  auto& lim = opts.limits;
  std::string port = "29500";
  std::string keyBytes = std::to_string(lim.wire.maxKeyBytes);
  std::string valueBytes = std::to_string(lim.wire.maxValueBytes);
  std::string requestBytes = std::to_string(lim.wire.maxRequestBytes);
  std::string memory = std::to_string(lim.maxMemoryBytes);
  std::string unsentBytes = std::to_string(lim.maxUnsentBytes);
  std::string replyBytes = std::to_string(lim.maxReplyBytes);
  // Numbers are taken as text and read by input::parseNumber: CLI11 alone
  // takes nan for a double, saturates 18446744073709551616 to 2^64-1 and
  // reads 010 as 8.
  std::string keysPerRequest = std::to_string(lim.wire.maxKeysPerRequest);
  std::string waitKeys = std::to_string(lim.maxWaitKeys);
  std::string watchKeys = std::to_string(lim.maxWatchKeys);
  std::string connections = std::to_string(lim.maxConnections);
  app.add_option("--host", opts.host,
                 "Address to listen on (default: all IPv6 and IPv4 addresses)");
  app.add_option("--port,-p", port, "TCP port; 0 picks a free one (default 29500)");
  app.add_option("--max-key-bytes", keyBytes, "Largest key accepted (default 64K)");
  app.add_option("--max-value-bytes", valueBytes,
                 "Largest value accepted (default 64M)");
  app.add_option("--max-request-bytes", requestBytes,
                 "Largest request accepted, all fields together (default 128M)");
  app.add_option("--max-keys-per-request", keysPerRequest,
                 "Most keys in one CHECK/WAIT/MULTI_* request (default 131072)");
  app.add_option("--max-memory", memory,
                 "Most bytes held for all clients together: stored keys, values and "
                 "queues, partial requests, unsent replies, waiter registrations "
                 "(default 1G)");
  app.add_option("--max-unsent-bytes", unsentBytes,
                 "Per connection: stop processing a client's requests while this much "
                 "output waits for it (default 4M)");
  app.add_option("--max-reply-bytes", replyBytes,
                 "Largest single reply (GET, MULTI_GET, LIST_KEYS, QUEUE_POP); a larger "
                 "one closes its client (default 128M)");
  app.add_option("--max-wait-keys", waitKeys,
                 "Most keys one connection may WAIT on at once (default 131072)");
  app.add_option("--max-watch-keys", watchKeys,
                 "Most WATCH_KEY registrations per connection (default 4096)");
  std::string idleSeconds = std::to_string(opts.idleTimeout.count() / 1000.0);
  app.add_option("--idle-timeout", idleSeconds,
                 "Close a connection that holds a partial request for longer than this "
                 "many seconds, at most 31536000 (default 0: never, as in PyTorch)");
  app.add_option("--max-connections", connections,
                 "Most concurrent client connections (default 16384)");
  std::string busyPollUs = std::to_string(opts.busyPoll.count());
  app.add_option("--busy-poll-us", busyPollUs,
                 "Keep polling this many microseconds after a request before sleeping; "
                 "cuts round-trip latency, costs CPU only right after activity "
                 "(default 100, 0 disables, at most 1000000)");
  std::string tokenFile;
  app.add_option(
      "--token-file", tokenFile,
      "File holding a shared secret clients must prove they know before the "
      "store serves them (not readable by others; default: $DDPRUN_RDZV_TOKEN, "
      "else no authentication)");
  std::string authSeconds = std::to_string(opts.authTimeout.count() / 1000.0);
  app.add_option("--auth-timeout", authSeconds,
                 "With a token: close a connection that has not authenticated this many "
                 "seconds after it connected, 0.001 to 86400 (default 30)");
  app.add_option("--log-level", out.logLevel, "debug, info, warning, error or off")
      ->check(CLI::IsMember({"debug", "info", "warning", "error", "off"}));
  try {
    app.parse(argc, argv);
    input::refuseControlChars("--host", opts.host, "host name");
    input::refuseControlChars("--token-file", tokenFile, "path");
    opts.port = net::parsePort(port, "--port");
    lim.wire.maxKeyBytes = parseByteSize(keyBytes, "--max-key-bytes");
    lim.wire.maxValueBytes = parseByteSize(valueBytes, "--max-value-bytes");
    lim.wire.maxRequestBytes = parseByteSize(requestBytes, "--max-request-bytes");
    lim.maxMemoryBytes = parseByteSize(memory, "--max-memory");
    lim.maxUnsentBytes = parseByteSize(unsentBytes, "--max-unsent-bytes");
    lim.maxReplyBytes = parseByteSize(replyBytes, "--max-reply-bytes");
    lim.wire.maxKeysPerRequest = parseCount(keysPerRequest, "--max-keys-per-request");
    lim.maxWaitKeys = parseCount(waitKeys, "--max-wait-keys");
    lim.maxWatchKeys = parseCount(watchKeys, "--max-watch-keys");
    lim.maxConnections = parseCount(connections, "--max-connections");
    opts.idleTimeout = parseMillis(idleSeconds, "--idle-timeout", 0, 86400.0 * 365,
                                   "a number of seconds from 0 (never) to 31536000");
    opts.busyPoll = std::chrono::microseconds(input::numberFlag<int64_t>(
        "--busy-poll-us", busyPollUs, 0, 1'000'000,
        "an integer number of microseconds from 0 (off) to 1000000"));
    opts.authTimeout = parseMillis(authSeconds, "--auth-timeout", 0.001, 86400.0,
                                   "a number of seconds from 0.001 to 86400");
    readToken(tokenFile, out);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "ddprun-store: error: " << e.what()
              << "\nRun 'ddprun-store --help' for the accepted flags.\n";
    return kExitUsage;
  } catch (const InvalidArgument& e) {
    std::cerr << "ddprun-store: error: " << e.message()
              << "\nRun 'ddprun-store --help' for the accepted flags.\n";
    return kExitUsage;
  }
  return -1;
}

int runStoreCli(int argc, const char* const* argv) {
  setLogTag("ddprun-store");
  StoreCliConfig cfg;
  int rc = parseStoreCli(argc, argv, cfg);
  if (rc >= 0) return rc;
  setLogLevel(parseLogLevel(cfg.logLevel));
  // Block the shutdown signals before any thread starts, then take them
  // synchronously here: the io thread never sees them.
  sigset_t sigs;
  sigemptyset(&sigs);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&sigs, s);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::unique_ptr<store::TcpStoreServer> server;
  try {
    server = store::TcpStoreServer::start(cfg.server);
  } catch (const IoError& e) {
    std::cerr << "ddprun-store: error: " << e.message() << "\n";
    return kExitListen;
  }
  if (!cfg.tokenSource.empty())
    DDPRUN_INFO("clients must authenticate with the secret from ", cfg.tokenSource);
  std::printf("ddprun-store listening on %s\n", server->address().c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&sigs, &sig);
  DDPRUN_INFO("received ", strsignal(sig), ", shutting down");
  auto st = server->stats();
  server->stop();
  DDPRUN_INFO("served ", st.requests, " requests; ", st.keys, " keys held; ",
              st.connectionsRejected, " connections closed for errors");
  return kExitOk;
}

}  // namespace ddprun::cli
