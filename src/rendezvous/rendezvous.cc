#include "ddprun/rendezvous/rendezvous.h"

#include "ddprun/common/error.h"
#include "ddprun/common/net.h"
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
                                                 std::vector<store::LeaseRule> leases) {
  store::TcpStoreServerOptions opts;
  opts.host = bindHost;
  opts.port = port;
  opts.authToken = secret;
  opts.leases = std::move(leases);
  try {
    return store::TcpStoreServer::start(opts);
  } catch (const IoError& e) {
    bool inUse = port != 0 && e.message().find("in use") != std::string::npos;
    if (!inUse) DDPRUN_THROW(IoError, role, " cannot start: ", e.message());
    auto holder = net::findListeningProcess(port);
    DDPRUN_THROW(IoError, role, " cannot listen on port ", port, ": it is in use",
                 holder ? " by " + *holder : " (by a process this user cannot see)", "; ",
                 fix);
  }
}

}  // namespace detail
}  // namespace ddprun::rendezvous
