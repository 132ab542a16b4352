#include "ddprun/rendezvous/rendezvous.h"

#include <cmath>

#include "ddprun/common/clock.h"
#include "ddprun/common/error.h"
#include "ddprun/common/net.h"
#include "ddprun/common/strings.h"
#include "hosting.h"

namespace ddprun::rendezvous {

const char* toString(RoundEnd kind) {
  switch (kind) {
    case RoundEnd::kFinished: return "finished";
    case RoundEnd::kFailed: return "failed";
    case RoundEnd::kClosed: return "closed";
    case RoundEnd::kMembershipChanged: return "membership changed";
    case RoundEnd::kStoreLost: return "store lost";
  }
  return "unknown";
}

std::string describe(const JoinProgress& p) {
  auto secs = [](double s) {
    return formatDuration(std::chrono::milliseconds(std::llround(std::max(0.0, s) * 1000)));
  };
  std::string out = "round " + std::to_string(p.round) + ": " + std::to_string(p.joined) +
                    " of " + std::to_string(p.maxNodes) + " nodes joined";
  if (p.minNodes != p.maxNodes)
    out += " (at least " + std::to_string(p.minNodes) + " needed)";
  if (!p.waitingFor.empty()) out += "; waiting for " + p.waitingFor;
  if (p.lastCallSeconds >= 0) out += "; the last call completes it in " + secs(p.lastCallSeconds);
  if (p.missingCount > 0) {
    out += "; expected but missing: " + str::join(p.missing, ", ");
    const int unlisted = p.missingCount - static_cast<int>(p.missing.size());
    if (unlisted > 0) out += " and " + std::to_string(unlisted) + " more";
  }
  return out;
}

RankLayout assignRanks(const std::vector<int>& localWorldSizes) {
  RankLayout layout;
  for (int n : localWorldSizes) {
    DDPRUN_CHECK(n > 0, "a node reported ", n, " local workers");
    layout.baseRanks.push_back(layout.worldSize);
    layout.worldSize += n;
  }
  return layout;
}

namespace detail {

// The server's own message for a port in use advises "another port (or 0)",
// in terms of ddprun-store; a rendezvous knows the flag, so it says that.
std::unique_ptr<store::TcpStoreServer> hostStore(const std::string& bindHost, uint16_t port,
                                                 const std::string& role,
                                                 const std::string& fix,
                                                 const std::string& secret,
                                                 std::vector<store::LeaseRule> leases,
                                                 bool nameHolder) {
  store::TcpStoreServerOptions opts;
  opts.nameHolder = nameHolder;
  opts.host = bindHost;
  opts.port = port;
  opts.authToken = secret;
  opts.leases = std::move(leases);
  try {
    return store::TcpStoreServer::start(opts);
  } catch (const IoError& e) {
    bool inUse = port != 0 && e.message().find("in use") != std::string::npos;
    if (!inUse) DDPRUN_THROW(IoError, role, " cannot start: ", e.message());
    auto holder = nameHolder ? net::findListeningProcess(port) : std::nullopt;
    DDPRUN_THROW(IoError, role, " cannot listen on port ", port, ": it is in use",
                 holder         ? " by " + *holder
                 : nameHolder   ? " (by a process this user cannot see)"
                                : "",
                 "; ", fix);
  }
}

}  // namespace detail
}  // namespace ddprun::rendezvous
