// `ddprun status HOST:PORT`: one GET /status from an agent's endpoint
// (--status-port), printed as a table or, with --json, as it came.
#include <iostream>
#include <string>
#include <vector>

#include "ddprun/agent/agent.h"
#include "ddprun/cli/launch_cli.h"
#include "ddprun/common/error.h"
#include "ddprun/common/net.h"
#include "ddprun/common/strings.h"
#include "ddprun/status/client.h"

namespace ddprun::cli {

namespace {
constexpr const char* kUsage =
    "usage: ddprun status [--json] [--timeout SECONDS] HOST:PORT\n\n"
    "Prints the status of a running ddprun agent started with --status-port: the job,\n"
    "the rendezvous round and one line per worker. --json prints /status as it is.\n"
    "Exit codes: 0 ok, 2 bad arguments, 3 no answer or not a ddprun status endpoint.\n";

struct StatusArgs {
  bool json = false;
  bool help = false;
  double timeoutSeconds = 10;
  net::HostPort where;
};

StatusArgs parseStatusArgs(int argc, const char* const* argv) {
  StatusArgs a;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string w = argv[i];
    if (w == "--json") {
      a.json = true;
    } else if (w == "-h" || w == "--help") {
      a.help = true;
    } else if (w == "--timeout" || str::startsWith(w, "--timeout=")) {
      std::string v = w.size() > 9 ? w.substr(10) : (i + 1 < argc ? argv[++i] : "");
      if (!str::parseDouble(v, a.timeoutSeconds) || !(a.timeoutSeconds > 0))
        DDPRUN_THROW(InvalidArgument, "--timeout: invalid value '", str::escape(v),
                     "': expected a number of seconds > 0");
    } else if (str::startsWith(w, "-") && w != "-") {
      DDPRUN_THROW(InvalidArgument, "unknown flag '", str::escape(w),
                   "'; run 'ddprun status --help'");
    } else {
      positional.push_back(w);
    }
  }
  if (a.help) return a;
  if (positional.size() != 1)
    DDPRUN_THROW(InvalidArgument, "expected one HOST:PORT (the agent's --status-port), got ",
                 positional.size(), " arguments");
  const std::string& text = positional.front();
  try {
    a.where = net::parseHostPort(text, 0);
  } catch (const InvalidArgument&) {
    a.where.port = 0;
  }
  if (a.where.port == 0 || a.where.host.empty())
    DDPRUN_THROW(InvalidArgument, "'", str::escape(text),
                 "' is not HOST:PORT; give the address and port of an agent's --status-port, "
                 "e.g. 127.0.0.1:8080 or [::1]:8080");
  return a;
}

int fetchAndPrint(const StatusArgs& a) {
  const std::string where = net::formatHostPort(a.where.host, a.where.port);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(a.timeoutSeconds * 1000));
  const status::HttpAnswer answer = status::httpGet(a.where.host, a.where.port, "/status", timeout);
  if (answer.status != 200)
    DDPRUN_THROW(ProtocolError, where, " answered HTTP ", answer.status,
                 " to GET /status; is it a ddprun --status-port?");
  if (a.json) {
    std::cout << answer.body;
    if (answer.body.empty() || answer.body.back() != '\n') std::cout << '\n';
    return 0;
  }
  const auto parsed = nlohmann::json::parse(answer.body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded())
    DDPRUN_THROW(ProtocolError, where, " did not answer JSON to GET /status; is it a ddprun "
                 "--status-port?");
  std::cout << status::formatStatusTable(parsed);
  return 0;
}
}  // namespace

int runStatusCli(int argc, const char* const* argv) {
  StatusArgs args;
  try {
    args = parseStatusArgs(argc, argv);
  } catch (const InvalidArgument& e) {
    std::cerr << "ddprun status: error: " << e.message() << "\n";
    return agent::kExitUsage;
  }
  if (args.help) {
    std::cout << kUsage;
    return 0;
  }
  try {
    return fetchAndPrint(args);
  } catch (const Error& e) {
    std::cerr << "ddprun status: error: " << e.message() << "\n";
  }
  return agent::kExitSetup;
}

}  // namespace ddprun::cli
