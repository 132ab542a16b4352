// `ddprun status HOST:PORT`: one GET /status from an agent's endpoint
// (--status-port), printed as a table or, with --json, as it came.
#include <CLI/CLI.hpp>
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
struct StatusArgs {
  bool json = false;
  double timeoutSeconds = 10;
  net::HostPort where;
};

// HOST:PORT as an agent's --status-port is reached; throws InvalidArgument.
net::HostPort parseWhere(const std::string& text) {
  net::HostPort where;
  try {
    where = net::parseHostPort(text, 0);
  } catch (const InvalidArgument&) {
    where.port = 0;
  }
  if (where.port == 0 || where.host.empty())
    DDPRUN_THROW(InvalidArgument, "'", str::escape(text),
                 "' is not HOST:PORT; give the address and port of an agent's --status-port, "
                 "e.g. 127.0.0.1:8080 or [::1]:8080");
  return where;
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
  CLI::App app{
      "ddprun status: prints the status of a running ddprun agent started with "
      "--status-port: the job, the rendezvous round and one line per worker.\n"
      "Exit codes: 0 ok, 2 bad arguments, 3 no answer or not a ddprun status endpoint.",
      "ddprun status"};
  StatusArgs args;
  std::string where;
  app.add_option("HOST:PORT", where, "The agent's --status-port address")->required();
  app.add_flag("--json", args.json, "Print /status as it is");
  app.add_option("--timeout", args.timeoutSeconds, "Seconds to wait for the answer (default 10)")
      ->check(CLI::Range(0.001, 86400.0));
  try {
    app.parse(argc, argv);
    args.where = parseWhere(where);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "ddprun status: error: " << e.what()
              << "\nRun 'ddprun status --help'; give one HOST:PORT.\n";
    return agent::kExitUsage;
  } catch (const InvalidArgument& e) {
    std::cerr << "ddprun status: error: " << e.message() << "\n";
    return agent::kExitUsage;
  }
  try {
    return fetchAndPrint(args);
  } catch (const Error& e) {
    std::cerr << "ddprun status: error: " << e.message() << "\n";
  }
  return agent::kExitSetup;
}

}  // namespace ddprun::cli
